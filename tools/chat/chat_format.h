// chat_format.h — the model's chat template as serve and chat use it (docs/server.md, "Chat
// template", "Tools and reasoning"): every prompt is the template's own rendering
// (chat_jinja.h: minja, python3-jinja2 where minja falls short), checked byte for byte against
// llama-server's (tests/api/template_fidelity.py); the reply syntax of the families whose tool
// calls and thinking moestream parses, learned by rendering a probe call through the template
// (load_chat_format), and the grammar of a forced call.
//
// Invariants: render output depends only on its inputs and the date; a reply parsed by
// ReplyParser is split into content, reasoning and tool calls without losing or duplicating
// text.
// Thread-safety: a loaded ChatFormat is immutable and shared; a ReplyParser is used by one
// thread at a time.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moestream::chat {

class JinjaTemplate;  // chat_jinja.h

using ojson = nlohmann::ordered_json;  // key order as the client sent it (templates print it)

enum class ChatFamily {
    kNone, kHermes, kLlama3, kMistral, kHarmony, kXml,
    kGlm, kDeepseek, kKimi, kMinimax, kDsml, kSeed, kLfm2,  // chat_format_marked.cpp (kSeed: _xml.cpp)
    kCommandR  // chat_format_command_r.cpp
};

struct ChatFormat {
    ChatFamily family = ChatFamily::kNone;
    std::string name;       // "qwen3 (hermes tool calls, <think>)", ... ; "" for kNone
    bool tools = false;     // the family has tool-call syntax
    bool thinking = false;  // the template has a thinking block (reasoning_content)
    std::string bos_token;  // the model's start and end token texts (templates write them)
    std::string eos_token;
    bool bos_added = false; // the engine puts the start token before a prompt itself
    // The template itself, run by minja (chat_jinja.h): every prompt is rendered by it.
    std::shared_ptr<const JinjaTemplate> jinja;
    bool thinking_default = true;  // enable_thinking when a request leaves it unset
    // A template outside the parsed families whose thinking block is <think>...</think>.
    bool think_tags = false;
    // The generation prompt with thinking on ends by opening the thinking block (DeepSeek
    // V3.1, GLM-4.7, Qwen3.5: "<think>"): the reply starts inside it.
    bool think_opened = false;
    bool effort = false;           // the template reads reasoning_effort
    bool date_string = false;      // the template reads date_string (given today, "%d %b %Y")
    ojson default_kwargs = ojson::object();  // template variables set unless a request sets them
};

// The model's chat template, parsed by minja, with what it does derived by rendering probe
// conversations through it (docs/server.md, "Chat templates"): the reply family from where a
// known tool call lands (kNone: prompts render, replies are not split), whether it has
// thinking (enable_thinking changes the prompt) and reasoning effort, the thinking default
// llama-server gives it, and a variable that keeps earlier turns' reasoning when the template
// has one. source "" = the model carries no template: ChatML (kChatmlTemplate), as llama-server.
// False with *err (naming minja's construct and line) when minja cannot parse the template.
bool load_chat_format(const std::string & source, const std::string & bos_token,
                      const std::string & eos_token, bool bos_added, ChatFormat * out,
                      std::string * err);
// ChatML as a Jinja template (what a model without a template is rendered with).
extern const char kChatmlTemplate[];

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // JSON text of an object
};

// One chat message with the fields tool use needs.
struct ChatTurn {
    std::string role;  // system | user | assistant | tool
    std::string content;
    std::string reasoning;  // assistant: reasoning_content
    std::vector<ToolCall> tool_calls;
    std::string tool_call_id;  // tool
};

struct RenderInput {
    std::vector<ChatTurn> messages;
    // The messages as the client sent them (OpenAI JSON, with content parts, name, ...); when
    // null, the template gets `messages` above.
    ojson messages_json;
    ojson kwargs = ojson::object();  // chat_template_kwargs other than the two below
    ojson tools = ojson::array();  // the request's tools, as sent
    bool add_generation_prompt = true;
    bool enable_thinking = true;
    std::string reasoning_effort;  // "low" | "medium" | "high" ("": the template's default)
};

// Renders a conversation with the model's template (f.jinja). False with *err when the
// template raises on it (its own raise_exception: e.g. roles that do not alternate).
bool render_chat_format(const ChatFormat & f, const RenderInput & in, std::string * out,
                        std::string * err);
// The rendered text as the engine takes it: without the start token's text when the engine
// adds the start token itself (ChatFormat::bos_added).
std::string engine_prompt(const ChatFormat & f, const std::string & rendered);

// What a conversation asks of the template's thinking, and how the caller names those two
// settings in its refusals (the server: the request fields; `moestream chat`: its flags).
struct ThinkingRequest {
    std::optional<bool> enable_thinking;  // unset: the template's default (on when it has thinking)
    std::string reasoning_effort;         // "low" | "medium" | "high"; "" = the template's default
    std::string thinking_name = "chat_template_kwargs.enable_thinking";
    std::string effort_name = "reasoning_effort";
};
// Whether the template can do what t asks: "" when it can, else the refusal (naming tmpl_name,
// "none" when empty) with *param set to the setting refused (thinking_name or effort_name).
// Refused: thinking on for a template without thinking; an effort for a template other than
// harmony; thinking off for harmony (which cannot turn it off).
std::string check_thinking(const ChatFormat & f, const std::string & tmpl_name,
                           const ThinkingRequest & t, std::string * param);

// A GBNF grammar that makes the reply one or more tool calls (forced_name: only that
// function; one_call: exactly one), after an optional thinking block when think_first and the
// family has one. Argument objects follow each tool's "parameters" when the schema is in the
// structured-output subset (json_schema_grammar.h), bounds included; else the same once value
// bounds (multipleOf, uniqueItems...) are left out; else, where it is a flat object, its required
// string/number/integer/boolean/enum properties; else any JSON object.
std::string tool_call_grammar(const ChatFormat & f, const ojson & tools,
                              const std::string & forced_name, bool one_call,
                              bool think_first = false);
// Whether the family writes at most one call per reply (a reply ends with its call).
bool one_call_per_reply(const ChatFormat & f);

// What one piece of a reply adds.
struct ReplyDelta {
    std::string content;
    std::string reasoning;
    std::vector<ToolCall> calls;  // completed calls (ids assigned in order: call_0, call_1...)
    bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
};

// Splits a reply as it streams: text inside the thinking block goes to reasoning, tool calls
// (when tools were offered) are cut out and parsed, the rest is content. Text that could be
// the start of a marker is held back until it is decided.
class ReplyParser {
public:
    ReplyParser(const ChatFormat & f, bool tools, bool thinking);
    ReplyDelta push(const std::string & text);
    // The end of the reply: held-back text is released (an unfinished tool call becomes
    // content, as generated).
    ReplyDelta finish();
    int n_calls() const { return n_calls_; }

private:
    ReplyDelta step(bool final);
    ReplyDelta harmony_step(bool final);  // chat_format_harmony.cpp
    // Text of one field (content or reasoning), with blank text at its start dropped and
    // blank text at the end of a piece held until more text follows.
    void add_text(std::string * dst, bool * started, std::string * held, const std::string & s);
    ChatFormat f_;
    bool tools_;
    enum class State { kStart, kThink, kContent, kCall, kJson } state_;
    std::string buf_;
    bool content_started_ = false;
    bool reasoning_started_ = false;
    bool json_marker_ = false;  // kJson: the reply began with call_open
    bool json_list_ = false;    // kJson (a marked call list): its '[' was read
    std::string json_eaten_;    // ... and the text up to it
    bool json_done_ = false;    // the reply's calls are over: the rest is content
    int n_calls_ = 0;
    int block_calls_ = 0;       // kCall in a calls block (ReplyMarkers::call_end): calls sent
    // Harmony: the message being read (its header, and the body of a tool call).
    bool h_body_ = false;       // in a message's body (else its header)
    bool h_first_ = true;       // nothing read yet (a header is not required)
    std::string h_header_, h_channel_, h_recipient_, h_call_;
    std::string held_content_, held_reasoning_;  // blank text held by add_text
};

// Python-style JSON as chat templates print it (`tojson`): ", " and ": " separators, key order
// kept, UTF-8 unescaped.
std::string template_json(const ojson & j);

}  // namespace moestream::chat
