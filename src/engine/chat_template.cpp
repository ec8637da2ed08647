// chat_template.cpp — see chat_template.h.
#include "chat_template.h"

#include "llama.h"

namespace moestream {
namespace {

// Renders with llama.cpp; false when it does not recognise `tmpl`.
bool apply(const std::string & tmpl, const std::vector<ChatMessage> & messages, bool add_ass,
           std::string * out) {
    std::vector<llama_chat_message> chat;
    size_t total = 0;
    for (const auto & m : messages) {
        chat.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::vector<char> buf(2 * total + 256);
    int32_t n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_ass,
                                          buf.data(), int32_t(buf.size()));
    if (n > int32_t(buf.size())) {
        buf.resize(size_t(n));
        n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_ass,
                                      buf.data(), int32_t(buf.size()));
    }
    if (n < 0) return false;
    out->assign(buf.data(), size_t(n));
    return true;
}

}  // namespace

ChatTemplate choose_chat_template(const char * model_tmpl) {
    ChatTemplate t;
    if (model_tmpl == nullptr || *model_tmpl == '\0') {
        t.usable = true;
        t.tmpl = "chatml";
        t.name = "chatml (the model carries no chat template)";
        return t;
    }
    const std::vector<ChatMessage> probe = {{"system", "S"}, {"user", "U1"},
                                            {"assistant", "A1"}, {"user", "U2"}};
    std::string model_out;
    if (!apply(model_tmpl, probe, true, &model_out)) {
        t.why =
            "the model's chat template is not one of the families llama.cpp renders "
            "(llama_chat_apply_template); format the prompt yourself and use completions";
        return t;
    }
    t.usable = true;
    t.tmpl = model_tmpl;
    // Name the family: the first built-in template that renders the probe the same way.
    std::vector<const char *> names(size_t(llama_chat_builtin_templates(nullptr, 0)));
    llama_chat_builtin_templates(names.data(), names.size());
    for (const char * n : names) {
        std::string out;
        if (apply(n, probe, true, &out) && out == model_out) {
            t.name = std::string(n) + " (recognised from the model's template)";
            return t;
        }
    }
    t.name = "the model's template (recognised by llama.cpp)";
    return t;
}

Status render_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages,
                   bool add_assistant, std::string * out) {
    if (!t.usable) return Status::BadInput(t.why);
    for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].content.find('\0') != std::string::npos ||
            messages[i].role.find('\0') != std::string::npos)
            return Status::BadInput("messages[" + std::to_string(i) +
                                    "] contains a NUL byte, which a chat template cannot carry");
    if (!apply(t.tmpl, messages, add_assistant, out))
        return Status::BadInput("llama.cpp could not apply the chat template (" + t.name + ")");
    return Status::Ok();
}

}  // namespace moestream
