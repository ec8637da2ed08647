// chat_jinja.cpp — see chat_jinja.h. The only file that includes minja (its headers are heavy
// and declare a global `json` alias, so this file stays out of unity batches).
#include "chat_jinja.h"

#include <minja/chat-template.hpp>

#include <exception>

namespace moestream::chat {

struct JinjaTemplate::Impl {
    std::unique_ptr<minja::chat_template> t;
    std::string source, bos, eos;
};

JinjaTemplate::JinjaTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JinjaTemplate::~JinjaTemplate() = default;

std::shared_ptr<const JinjaTemplate> JinjaTemplate::parse(const std::string & source,
                                                          const std::string & bos_token,
                                                          const std::string & eos_token,
                                                          std::string * err) {
    auto impl = std::make_unique<Impl>();
    impl->source = source;
    impl->bos = bos_token;
    impl->eos = eos_token;
    try {
        // The constructor parses the template and probes what it does with tools, system
        // messages and tool calls (rendering small conversations through it).
        impl->t = std::make_unique<minja::chat_template>(source, bos_token, eos_token);
    } catch (const std::exception & e) {
        *err = e.what();
        return nullptr;
    }
    return std::shared_ptr<const JinjaTemplate>(new JinjaTemplate(std::move(impl)));
}

namespace {

// A message as llama-server hands it to the template: content parts joined into one text
// (templates index content as a string), null content as "", a tool call's arguments as the
// JSON object they hold (templates iterate or print them), every other field as sent.
ojson template_message(const ojson & m) {
    ojson o = m;
    if (auto c = o.find("content"); c != o.end() && c->is_array()) {
        std::string text;
        for (const auto & part : *c)
            if (part.is_object() && part.contains("text") && part["text"].is_string())
                text += part["text"].get<std::string>();
        *c = text;
    }
    if (auto c = o.find("content"); c != o.end() && c->is_null()) *c = "";
    if (auto tcs = o.find("tool_calls"); tcs != o.end() && tcs->is_array())
        for (auto & tc : *tcs) {
            if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
            ojson & a = tc["function"]["arguments"];
            if (!a.is_string()) continue;
            ojson parsed = ojson::parse(a.get<std::string>(), nullptr, false);
            if (!parsed.is_discarded()) a = std::move(parsed);
        }
    return o;
}

}  // namespace

bool JinjaTemplate::render(const ojson & messages, const ojson & tools, bool add_generation_prompt,
                           const ojson & kwargs, std::string * out, std::string * err) const {
    minja::chat_template_inputs in;
    in.messages = ojson::array();
    for (const auto & m : messages) in.messages.push_back(template_message(m));
    in.tools = tools.is_array() && !tools.empty() ? tools : ojson();
    in.add_generation_prompt = add_generation_prompt;
    in.extra_context = ojson::object();
    if (kwargs.is_object())
        for (auto it = kwargs.begin(); it != kwargs.end(); ++it) in.extra_context[it.key()] = *it;
    // No polyfills: the template gets the conversation as it is (llama-server does not rewrite
    // it either); what a template cannot express, it renders or raises as written.
    minja::chat_template_options opts;
    opts.apply_polyfills = false;
    try {
        *out = impl_->t->apply(in, opts);
    } catch (const std::exception & e) {
        *err = e.what();
        return false;
    }
    return true;
}

const std::string & JinjaTemplate::source() const { return impl_->source; }
const std::string & JinjaTemplate::bos_token() const { return impl_->bos; }
const std::string & JinjaTemplate::eos_token() const { return impl_->eos; }
bool JinjaTemplate::supports_tools() const { return impl_->t->original_caps().supports_tools; }
bool JinjaTemplate::supports_tool_calls() const {
    return impl_->t->original_caps().supports_tool_calls;
}
bool JinjaTemplate::supports_system_role() const {
    return impl_->t->original_caps().supports_system_role;
}

}  // namespace moestream::chat
