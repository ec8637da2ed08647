// chat_format_families.h — what chat_format.cpp asks of each family (internal to this library):
// its reply syntax (the prompt is always the model's template, chat_jinja.h). One
// chat_format_<family>.cpp per family.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "chat_format.h"

namespace moestream::chat {

// The markers of a family's replies ("" = the family has none).
struct ReplyMarkers {
    std::string think_open, think_close;  // the thinking block
    std::string call_open, call_close;    // one tool call, or (call_end set) the calls block
    // The end of one call inside the calls block (DeepSeek, Kimi, MiniMax, DeepSeek V4): each
    // call is sent as soon as it ends, not when the block closes. "" = one call per marker pair.
    std::string call_end;
    // Markers around the answer that are not part of it (Command-R's <|START_RESPONSE|>).
    std::vector<std::string> dropped;
    bool json_reply = false;  // a reply that starts with '{' (or call_open) is its calls
    bool marker_required = false;  // ... only when it starts with call_open
    bool parallel = true;     // several calls per reply
    // A forced reply's grammar: open, calls joined by separator, close (GBNF literals).
    std::string grammar_open, grammar_separator, grammar_close;
};
ReplyMarkers reply_markers(const ChatFormat & f);
// The text between call_open and call_close -> its calls' names and arguments (compact JSON);
// false when it is not calls.
bool parse_call_body(const ChatFormat & f, const std::string & body, std::vector<ToolCall> * out);
// A whole reply of a json_reply family -> its calls; false when it is not calls.
bool parse_json_reply(const ChatFormat & f, const std::string & body, std::vector<ToolCall> * out);
// A JSON list of calls, each an object with the name (a string) under name_key and the
// arguments (an object) under args_key (Mistral, Command-R); false when body is not one.
bool parse_json_call_list(const std::string & body, const char * name_key, const char * args_key,
                          std::vector<ToolCall> * out);
// GBNF (right-hand side) of one call of `name` whose arguments match rule args_rule.
// params: the tool's "parameters" (families that write key/value pairs enforce its flat part).
std::string call_rule(const ChatFormat & f, const std::string & name, const std::string & args_rule,
                      const ojson & params);

namespace gbnf {
std::string literal(const std::string & s);  // a GBNF string literal for s
// The required properties of a flat object schema, in order, each as pair(key, value rule,
// whether the value is a string) writes it (a text value: a string's text, an enum's values, a
// number...); "" when params is not such a schema (the family's generic pairs then).
std::string kv_pairs(const ojson & params,
                     const std::function<std::string(const std::string &, const std::string &, bool)> & pair);
extern const char kTextValue[];  // text that does not close a tag: ( [^<] | "<" [^/] )*
}

// Today in local time, as strftime formats it (what llama.cpp gives templates).
std::string local_date(const char * strftime_format);

namespace hermes {  // Qwen3 / Qwen2.5 / Hermes 2 Pro: <tool_call> JSON </tool_call>, <think>
bool parse_call(const std::string & body, ToolCall * out);
std::string call_rule(const std::string & name, const std::string & args_rule);
}  // namespace hermes

namespace llama3 {  // Llama 3.1 / 3.2 / 3.3: {"name", "parameters"} turns, ipython results
bool parse_call(const std::string & body, ToolCall * out);
std::string call_rule(const std::string & name, const std::string & args_rule);
}  // namespace llama3

namespace mistral {  // [INST] turns, [AVAILABLE_TOOLS], [TOOL_CALLS] [...], [TOOL_RESULTS]
bool parse_calls(const std::string & body, std::vector<ToolCall> * out);
std::string call_rule(const std::string & name, const std::string & args_rule);
}  // namespace mistral

namespace xml {  // Qwen3-Coder / Qwen3.5 / Nemotron-3: <tool_call><function=..><parameter=..>
bool parse_call(const std::string & body, ToolCall * out);
std::string call_rule(const std::string & name, const ojson & params);
}  // namespace xml

namespace seed {  // Seed-OSS: the xml-function call inside <seed:tool_call>, values without newlines
std::string call_rule(const std::string & name, const ojson & params);
}  // namespace seed

namespace glm {  // GLM-4.5/4.6/4.7: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>
bool parse_call(const std::string & body, ToolCall * out);
std::string call_rule(const std::string & name, const ojson & params);
}  // namespace glm

namespace deepseek {  // DeepSeek V3.1/V3.2: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>
extern const char kCallsBegin[], kCallsEnd[];  // the calls block
bool parse_calls(const std::string & body, std::vector<ToolCall> * out);
std::string call_rule(const std::string & name, const std::string & args_rule);
}  // namespace deepseek

namespace kimi {  // Kimi-K2: <|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{..}
extern const char kCallsBegin[], kCallsEnd[];  // the calls block
bool parse_calls(const std::string & body, std::vector<ToolCall> * out);
std::string call_rule(const std::string & name, const std::string & args_rule);
}  // namespace kimi

namespace lfm2 {  // LFM2: <|tool_call_start|>[NAME(K="V", ...), ...]<|tool_call_end|>
bool parse_calls(const std::string & body, std::vector<ToolCall> * out);
std::string call_rule(const std::string & name, const ojson & params);
}  // namespace lfm2

// MiniMax-M2 (prefix "") / DeepSeek V4 (prefix "｜DSML｜"): <invoke name=..><parameter name=..>
namespace invoke {
bool parse_calls(const std::string & body, const std::string & prefix, std::vector<ToolCall> * out);
std::string call_rule(const std::string & name, const std::string & prefix, const ojson & params);
}  // namespace invoke

namespace command_r {  // Command-R7B / Cohere2: <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]
bool parse_calls(const std::string & body, std::vector<ToolCall> * out);
std::string call_rule(const std::string & name, const std::string & args_rule);
}  // namespace command_r

namespace harmony {  // gpt-oss: <|start|>role<|message|>...<|end|>, channels, namespace functions
std::string call_rule(const std::string & name, const std::string & args_rule);
std::string think_rule();  // an analysis message before the call
}  // namespace harmony

}  // namespace moestream::chat
