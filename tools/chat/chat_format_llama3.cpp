// chat_format_llama3.cpp — the Llama 3.1 / 3.2 / 3.3 family (chat_format_families.h):
// header-delimited turns, a system turn with "Environment: ipython" and the date, the tools
// (indented JSON) and their instructions in the first user turn, a call as the whole
// assistant turn {"name": ..., "parameters": {...}} (one per turn), results in an `ipython`
// turn as a JSON string.
#include "chat_format_families.h"

namespace moestream::chat {
namespace llama3 {
namespace {

const char kGiven[] =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n";
const char kRespond[] =
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
    "name and its value}.Do not use variables.\n\n";

const char * const kFingerprint[] = {
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "Environment: ipython",
    "Cutting Knowledge Date: December 2023", "Today Date: ", "date_string",
    "tools_in_user_message", "bos_token",
    "Given the following functions, please respond with a JSON for a function call",
    "with its proper arguments that best answers the given prompt.",
    "dictionary of argument name and its value}.", "Do not use variables.", "ipython",
    "tojson(indent=4)"};


// JSON as `tojson(indent=4)` prints it (Python's json.dumps with indent 4).
std::string indented_json(const ojson & j, int depth) {
    const std::string in(size_t(4 * (depth + 1)), ' '), out(size_t(4 * depth), ' ');
    if (j.is_object() && !j.empty()) {
        std::string s = "{";
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            s += (first ? "\n" : ",\n") + in + ojson(it.key()).dump() + ": " +
                 indented_json(it.value(), depth + 1);
            first = false;
        }
        return s + "\n" + out + "}";
    }
    if (j.is_array() && !j.empty()) {
        std::string s = "[";
        for (size_t i = 0; i < j.size(); ++i)
            s += (i ? ",\n" : "\n") + in + indented_json(j[i], depth + 1);
        return s + "\n" + out + "]";
    }
    return template_json(j);
}

std::string header(const std::string & role) {
    return "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
}

// Today as llama.cpp gives templates their date_string ("%d %b %Y", local time).
std::string today() {
    return local_date("%d %b %Y");
}

}  // namespace

bool matches(const std::string & src) {
    return holds_all(src, kFingerprint);
}

ChatFormat format(const std::string &) {
    ChatFormat f;
    f.family = ChatFamily::kLlama3;
    f.tools = true;
    f.thinking = false;
    f.name = "llama3.x (header turns, JSON tool calls, ipython results; moestream's renderer)";
    return f;
}

bool render(const ChatFormat & f, const RenderInput & in, std::string * out, std::string * err) {
    std::string o = f.bos_token;
    size_t i = 0;
    const auto & ms = in.messages;
    std::string system;
    if (!ms.empty() && ms[0].role == "system") system = trim_blank(ms[i++].content);
    o += header("system");
    if (!in.tools.empty()) o += "Environment: ipython\n";
    o += "Cutting Knowledge Date: December 2023\nToday Date: " + today() + "\n\n";
    o += system + "<|eot_id|>";
    if (!in.tools.empty()) {
        if (i == ms.size()) {
            *err = "messages: with tools this template needs a first user message to put them in";
            return false;
        }
        o += header("user") + kGiven + kRespond;
        for (const auto & t : in.tools) o += indented_json(t, 0) + "\n\n";
        o += trim_blank(ms[i++].content) + "<|eot_id|>";
    }
    for (; i < ms.size(); ++i) {
        const ChatTurn & m = ms[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (m.role == "tool") {
            o += header("ipython") + template_json(ojson(m.content)) + "<|eot_id|>";
        } else if (!m.tool_calls.empty()) {
            if (m.tool_calls.size() != 1) {
                *err = where + ".tool_calls: this template takes one call per assistant turn";
                return false;
            }
            const ToolCall & c = m.tool_calls[0];
            const ojson args = ojson::parse(c.arguments, nullptr, false);
            o += header("assistant") + "{\"name\": \"" + c.name +
                 "\", \"parameters\": " + template_json(args) + "}<|eot_id|>";
        } else {
            o += header(m.role) + trim_blank(m.content) + "<|eot_id|>";
        }
    }
    if (in.add_generation_prompt) o += header("assistant");
    *out = std::move(o);
    return true;
}

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
