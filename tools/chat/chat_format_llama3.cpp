// chat_format_llama3.cpp — the reply syntax of the Llama 3.1 / 3.2 / 3.3 family
// (chat_format_families.h): a call as the whole reply {"name": ..., "parameters": {...}} (one
// per reply). The prompt is the model's template's (chat_jinja.h).
#include "chat_format_families.h"

namespace moestream::chat {
namespace llama3 {
bool parse_call(const std::string & body, ToolCall * out) {
    ojson j = ojson::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    const char * key = j.contains("parameters") ? "parameters" : "arguments";
    if (!j.contains(key) || !j[key].is_object()) return false;
    out->name = j["name"].get<std::string>();
    out->arguments = j[key].dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
}

std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("{\"name\": \"" + name + "\", \"parameters\": ") + " " + args + " " +
           gbnf::literal("}");
}

}  // namespace llama3
}  // namespace moestream::chat
