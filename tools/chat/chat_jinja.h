// chat_jinja.h — a model's chat template run as the Jinja program it is, by minja (Debian's
// libminja-dev, the engine llama.cpp's --jinja was built on), with the inputs llama-server
// gives it: messages (content, tool_calls, reasoning_content, tool_call_id, name), tools,
// add_generation_prompt, bos_token / eos_token, enable_thinking and the other
// chat_template_kwargs, strftime_now and raise_exception. docs/server.md, "Chat templates".
//
// What minja cannot parse or raises on, and a template minja renders differently from Python's
// own Jinja on probe conversations at parse(), is rendered by Python's Jinja (jinja2_helper.h,
// Debian's python3-jinja2 set up as Hugging Face transformers renders templates).
//
// Invariants: a template neither parses is refused at parse() with both messages (naming the
// construct and where); render() never aborts: a template error (raise_exception, a type
// error) is returned as *err. render() output depends only on its inputs and the date.
// Thread-safety: a parsed JinjaTemplate is immutable; render() may run on several threads.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace moestream::chat {

using ojson = nlohmann::ordered_json;

class JinjaTemplate {
public:
    // Parses source (the template text) with the model's start and end token texts. Null with
    // *err ("minja: ...; python3-jinja2: ...": the construct and its line) when neither minja
    // parses it nor python3-jinja2 renders one user message with it.
    // cross_check false: minja's rendering is not compared with Python's (only for a template
    // whose agreement a test proves: moestream's own chatml, kChatmlTemplate).
    static std::shared_ptr<const JinjaTemplate> parse(const std::string & source,
                                                      const std::string & bos_token,
                                                      const std::string & eos_token,
                                                      std::string * err,
                                                      bool cross_check = true);
    ~JinjaTemplate();
    // Starts Python's Jinja (the helper every template shares) in the background, so that
    // parse()'s cross-check does not wait for Python to start: `serve` and `chat` call it
    // before loading the model, which its start then overlaps.
    static void prestart_python();

    // Renders messages (OpenAI chat messages, as sent) with tools (an array, or empty/null for
    // none) and kwargs (chat_template_kwargs: enable_thinking, reasoning_effort, any other key,
    // passed to the template as variables). False with *err when the template raises.
    bool render(const ojson & messages, const ojson & tools, bool add_generation_prompt,
                const ojson & kwargs, std::string * out, std::string * err) const;

    const std::string & source() const;
    // "minja", or "python3-jinja2" for a template minja cannot parse.
    std::string renderer() const;
    const std::string & bos_token() const;
    const std::string & eos_token() const;
    // What the template does with its inputs (minja's probes of it).
    bool supports_tools() const;       // it reads `tools`
    bool supports_tool_calls() const;  // it renders an assistant message's tool_calls
    bool supports_system_role() const;

    struct Impl;

private:
    explicit JinjaTemplate(std::unique_ptr<Impl> impl);
    // Renders probe conversations with minja and with python3-jinja2; where they differ, the
    // template is python3-jinja2's from then on (it is the engine templates are written for).
    void cross_check() const;
    std::unique_ptr<Impl> impl_;
};

}  // namespace moestream::chat
