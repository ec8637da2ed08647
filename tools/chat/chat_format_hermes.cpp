// chat_format_hermes.cpp — the reply syntax of the Hermes / Qwen family
// (chat_format_families.h): calls as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
// and a <think> block. The prompt is the model's template's (chat_jinja.h).
#include "chat_format_families.h"

namespace moestream::chat {
namespace hermes {
bool parse_call(const std::string & body, ToolCall * out) {
    ojson j = ojson::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() ||
        !j.contains("arguments"))
        return false;
    ojson args = j["arguments"];
    if (args.is_string()) args = ojson::parse(args.get<std::string>(), nullptr, false);
    if (!args.is_object()) return false;
    out->name = j["name"].get<std::string>();
    out->arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
}

std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ") + " " +
           args + " " + gbnf::literal("}\n</tool_call>");
}

}  // namespace hermes
}  // namespace moestream::chat
