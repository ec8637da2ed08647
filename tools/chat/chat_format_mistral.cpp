// chat_format_mistral.cpp — the Mistral family with [AVAILABLE_TOOLS] (chat_format_families.h):
// [INST] turns that alternate user/assistant, the system message in the last user turn, the
// tools before the last user turn, calls as [TOOL_CALLS] [{"name", "arguments", "id"}] and
// results as [TOOL_RESULTS] {"content", "call_id"}; call ids are 9 letters and digits.
#include <cctype>
#include <cstdint>

#include "chat_format_families.h"

namespace moestream::chat {
namespace mistral {
namespace {

const char * const kFingerprint[] = {
    "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "call_id", "bos_token", "eos_token", "user_messages",
    "length != 9", "[:-1]", "{\"type\": \"function\", \"function\": {"};

bool valid_id(const std::string & id) {
    if (id.size() != 9) return false;
    for (unsigned char c : id)
        if (!std::isalnum(c)) return false;
    return true;
}


// The tools as the template lists them: each function's fields in order, strings inserted
// as they are (the template does not escape them), other values as JSON.
std::string tools_block(const ojson & tools) {
    std::string o = "[AVAILABLE_TOOLS] [";
    for (size_t i = 0; i < tools.size(); ++i) {
        o += "{\"type\": \"function\", \"function\": {";
        bool first = true;
        for (auto it = tools[i]["function"].begin(); it != tools[i]["function"].end(); ++it) {
            if (it.key() == "return") continue;
            o += std::string(first ? "" : ", ") + "\"" + it.key() + "\": " +
                 (it->is_string() ? "\"" + it->get<std::string>() + "\"" : template_json(*it));
            first = false;
        }
        o += "}}";
        o += i + 1 < tools.size() ? ", " : "]";
    }
    return o + "[/AVAILABLE_TOOLS]";
}

}  // namespace

bool matches(const std::string & src) {
    return holds_all(src, kFingerprint);
}

ChatFormat format(const std::string &) {
    ChatFormat f;
    f.family = ChatFamily::kMistral;
    f.tools = true;
    f.name = "mistral (alternating [INST] turns, [AVAILABLE_TOOLS], [TOOL_CALLS]; moestream's "
             "renderer)";
    return f;
}

bool render(const ChatFormat & f, const RenderInput & in, std::string * out, std::string * err) {
    const auto & all = in.messages;
    size_t from = 0;
    std::string system;
    const bool has_system = !all.empty() && all[0].role == "system";
    if (has_system) system = all[from++].content;
    size_t n = 0, last_user = SIZE_MAX;
    for (size_t i = from; i < all.size(); ++i) {
        const ChatTurn & m = all[i];
        if (m.role == "user") last_user = i;
        if (m.role == "tool" || !m.tool_calls.empty()) continue;
        if ((m.role == "user") != (n++ % 2 == 0)) {
            *err = "messages[" + std::to_string(i) +
                   "]: after the optional first system message this template needs user and "
                   "assistant turns in alternation (tool calls and results aside)";
            return false;
        }
    }
    std::string o = f.bos_token;
    for (size_t i = from; i < all.size(); ++i) {
        const ChatTurn & m = all[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (m.role == "user") {
            // The template compares messages: a user turn equal to the last one gets the tools.
            if (!in.tools.empty() && m.content == all[last_user].content) o += tools_block(in.tools);
            o += "[INST] " + (i + 1 == all.size() && has_system ? system + "\n\n" : "") +
                 m.content + "[/INST]";
        } else if (m.role == "assistant" && !m.tool_calls.empty()) {
            o += "[TOOL_CALLS] [";
            for (size_t k = 0; k < m.tool_calls.size(); ++k) {
                const ToolCall & c = m.tool_calls[k];
                if (!valid_id(c.id)) {
                    *err = where + ".tool_calls[" + std::to_string(k) +
                           "].id: this template needs ids of 9 letters and digits";
                    return false;
                }
                ojson fn = ojson::object();
                fn["name"] = c.name;
                fn["arguments"] = ojson::parse(c.arguments, nullptr, false);
                std::string j = template_json(fn);
                j.pop_back();
                o += j + ", \"id\": \"" + c.id + "\"}" + (k + 1 < m.tool_calls.size() ? ", " : "]");
            }
            o += f.eos_token;
        } else if (m.role == "assistant") {
            o += " " + trim_blank(m.content) + f.eos_token;
        } else if (m.role == "tool") {
            if (!valid_id(m.tool_call_id)) {
                *err = where + ".tool_call_id: this template needs ids of 9 letters and digits";
                return false;
            }
            o += "[TOOL_RESULTS] {\"content\": " + m.content + ", \"call_id\": \"" +
                 m.tool_call_id + "\"}[/TOOL_RESULTS]";
        } else {
            *err = where + ": this template takes a system message only first";
            return false;
        }
    }
    *out = std::move(o);
    return true;
}

bool parse_calls(const std::string & body, std::vector<ToolCall> * out) {
    const ojson j = ojson::parse(body, nullptr, false);
    if (!j.is_array() || j.empty()) return false;
    std::vector<ToolCall> calls;
    for (const auto & c : j) {
        if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
            !c.contains("arguments") || !c["arguments"].is_object())
            return false;
        ToolCall t;
        t.name = c["name"].get<std::string>();
        t.arguments = c["arguments"].dump(-1, ' ', false, ojson::error_handler_t::replace);
        calls.push_back(std::move(t));
    }
    *out = std::move(calls);
    return true;
}

std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("{\"name\": \"" + name + "\", \"arguments\": ") + " " + args + " " +
           gbnf::literal("}");
}

}  // namespace mistral
}  // namespace moestream::chat
