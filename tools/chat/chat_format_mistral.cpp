// chat_format_mistral.cpp — the reply syntax of the Mistral family (chat_format_families.h):
// calls as [TOOL_CALLS] [{"name", "arguments"}, ...]. The prompt is the model's template's
// (chat_jinja.h).
#include <cctype>
#include <cstdint>

#include "chat_format_families.h"

namespace moestream::chat {
namespace mistral {
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
