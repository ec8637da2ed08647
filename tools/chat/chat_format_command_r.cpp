// chat_format_command_r.cpp — the reply syntax of Command-R7B / Cohere2 (chat_format_families.h),
// as its template renders an assistant turn: a plan between <|START_THINKING|> and
// <|END_THINKING|>, the calls as one JSON list between <|START_ACTION|> and <|END_ACTION|>
// ([{"tool_call_id": "0", "tool_name": NAME, "parameters": {...}}, ...]), the answer between
// <|START_RESPONSE|> and <|END_RESPONSE|>. The prompt is the model's template's (chat_jinja.h).
#include "chat_format_families.h"

namespace moestream::chat {
namespace command_r {

bool parse_calls(const std::string & body, std::vector<ToolCall> * out) {
    return parse_json_call_list(body, "tool_name", "parameters", out);
}

std::string call_rule(const std::string & name, const std::string & args_rule) {
    return gbnf::literal("{\"tool_call_id\": \"") + " [0-9] [0-9]? [0-9]? " +
           gbnf::literal("\", \"tool_name\": \"" + name + "\", \"parameters\": ") + " " + args_rule +
           " " + gbnf::literal("}");
}

}  // namespace command_r
}  // namespace moestream::chat
