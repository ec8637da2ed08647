// chat_format_mistral.cpp — the reply syntax of the Mistral family (chat_format_families.h):
// calls as [TOOL_CALLS] [{"name", "arguments"}, ...]. The prompt is the model's template's
// (chat_jinja.h).
#include <cctype>
#include <cstdint>

#include "chat_format_families.h"

namespace moestream::chat {
namespace mistral {
bool parse_calls(const std::string & body, std::vector<ToolCall> * out) {
    return parse_json_call_list(body, "name", "arguments", out);
}

std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("{\"name\": \"" + name + "\", \"arguments\": ") + " " + args + " " +
           gbnf::literal("}");
}

}  // namespace mistral
}  // namespace moestream::chat
