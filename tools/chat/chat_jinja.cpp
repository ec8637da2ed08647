// chat_jinja.cpp — see chat_jinja.h. The only file that includes minja (its headers are heavy
// and declare a global `json` alias, so this file stays out of unity batches).
#include "chat_jinja.h"

#include <minja/chat-template.hpp>

#include <exception>

#include "jinja2_helper.h"

namespace moestream::chat {

struct JinjaTemplate::Impl {
    std::unique_ptr<minja::chat_template> t;  // null: minja cannot parse it (python3-jinja2 renders)
    std::string minja_error;                  // ... why
    std::string source, bos, eos;
    // Python's Jinja (the process's one helper): renders what minja cannot parse or raises
    // on, and checks minja's rendering at parse().
    Jinja2Helper & py = Jinja2Helper::shared();
};

JinjaTemplate::JinjaTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void JinjaTemplate::prestart_python() {
    Jinja2Helper::shared().prestart();
}
JinjaTemplate::~JinjaTemplate() = default;

std::shared_ptr<const JinjaTemplate> JinjaTemplate::parse(const std::string & source,
                                                          const std::string & bos_token,
                                                          const std::string & eos_token,
                                                          std::string * err, bool cross_check) {
    auto impl = std::make_unique<Impl>();
    impl->source = source;
    impl->bos = bos_token;
    impl->eos = eos_token;
    try {
        // The constructor parses the template and probes what it does with tools, system
        // messages and tool calls (rendering small conversations through it).
        impl->t = std::make_unique<minja::chat_template>(source, bos_token, eos_token);
    } catch (const std::exception & e) {
        impl->minja_error = e.what();
    }
    std::shared_ptr<const JinjaTemplate> t(new JinjaTemplate(std::move(impl)));
    if (t->impl_->t && cross_check) t->cross_check();
    if (!t->impl_->t) {  // python3-jinja2 must at least parse it
        std::string out, perr;
        const ojson user = ojson::array({{{"role", "user"}, {"content", "U"}}});
        if (!t->render(user, ojson(), true, ojson{{"enable_thinking", true}}, &out, &perr)) {
            *err = perr;
            return nullptr;
        }
    }
    return t;
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
    std::string minja_err = impl_->minja_error;
    if (impl_->t) {
        try {
            *out = impl_->t->apply(in, opts);
            return true;
        } catch (const std::exception & e) {
            minja_err = e.what();
        }
    }
    // What minja cannot do (a construct it lacks, or the template's own error): Python's Jinja
    // renders it with the same variables, or says why not.
    ojson ctx = in.extra_context;
    ctx["messages"] = in.messages;
    if (!in.tools.is_null()) ctx["tools"] = in.tools;
    ctx["add_generation_prompt"] = add_generation_prompt;
    ctx["bos_token"] = impl_->bos;
    ctx["eos_token"] = impl_->eos;
    std::string perr;
    if (impl_->py.render(impl_->source, ctx, out, &perr)) return true;
    *err = "minja: " + minja_err + "; python3-jinja2: " + perr;
    return false;
}

void JinjaTemplate::cross_check() const {
    // Conversations that reach a template's main branches: plain turns, a system message,
    // tools with a described parameter, a tool call and its result, reasoning in the history.
    const ojson probes = ojson::parse(R"([
      [{"role": "user", "content": "U"}],
      [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
       {"role": "assistant", "content": "A", "reasoning_content": "R"},
       {"role": "user", "content": "V"}],
      [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
       {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
         "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
       {"role": "tool", "tool_call_id": "call00001", "content": "2"}]
    ])");
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f",
      "description": "Adds one.", "parameters": {"type": "object", "properties": {"a":
      {"type": "integer", "description": "a number"}}, "required": ["a"]}}}])");
    const ojson kw = {{"enable_thinking", true}};
    for (const auto & msgs : probes)
        for (const ojson & tl : {ojson(), tools}) {
            std::string by_minja, by_python, err;
            minja::chat_template_inputs in;
            in.messages = ojson::array();
            for (const auto & m : msgs) in.messages.push_back(template_message(m));
            in.tools = tl;
            in.extra_context = kw;
            minja::chat_template_options opts;
            opts.apply_polyfills = false;
            try {
                by_minja = impl_->t->apply(in, opts);
            } catch (const std::exception &) {
                continue;  // minja raises: python3-jinja2 renders that request anyway
            }
            ojson ctx = kw;
            ctx["messages"] = in.messages;
            if (!tl.is_null()) ctx["tools"] = tl;
            ctx["add_generation_prompt"] = true;
            ctx["bos_token"] = impl_->bos;
            ctx["eos_token"] = impl_->eos;
            if (!impl_->py.render(impl_->source, ctx, &by_python, &err)) {
                if (err.rfind("python3-jinja2 helper", 0) == 0 || err.find("not installed") !=
                                                                       std::string::npos)
                    return;  // no Python to compare with: minja renders it
                continue;
            }
            if (by_minja != by_python) {
                impl_->t.reset();
                impl_->minja_error = "minja renders it differently from python3-jinja2";
                return;
            }
        }
}

std::string JinjaTemplate::renderer() const {
    return impl_->t ? "minja" : "python3-jinja2";
}

const std::string & JinjaTemplate::source() const { return impl_->source; }
const std::string & JinjaTemplate::bos_token() const { return impl_->bos; }
const std::string & JinjaTemplate::eos_token() const { return impl_->eos; }
// Without minja's probes (a template only python3-jinja2 parses): from the template's text.
bool JinjaTemplate::supports_tools() const {
    return impl_->t ? impl_->t->original_caps().supports_tools
                    : impl_->source.find("tools") != std::string::npos;
}
bool JinjaTemplate::supports_tool_calls() const {
    return impl_->t ? impl_->t->original_caps().supports_tool_calls
                    : impl_->source.find("tool_calls") != std::string::npos;
}
bool JinjaTemplate::supports_system_role() const {
    return impl_->t ? impl_->t->original_caps().supports_system_role : true;
}

}  // namespace moestream::chat
