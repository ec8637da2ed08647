// chat_format_hermes.cpp — the Hermes / Qwen family (chat_format_families.h): ChatML turns,
// the tools listed in the system turn inside <tools></tools>, calls as
// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, results in a user turn inside
// <tool_response></tool_response>, and (Qwen3) a <think> block that enable_thinking = false
// renders empty.
#include "chat_format_families.h"

namespace moestream::chat {
namespace hermes {
namespace {

const char kToolsIntro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const char kToolsOutro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

// Literal pieces of the output above as they appear in a template's source (without the
// newlines, which a template writes as escapes).
const char * const kFingerprint[] = {
    "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
    "</tool_response>", "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:",
    "<function-name>", "<args-json-object>"};
const char * const kThinkingFingerprint[] = {"<think>", "</think>", "enable_thinking",
                                             "reasoning_content"};


}  // namespace

bool matches(const std::string & src) {
    return holds_all(src, kFingerprint);
}

ChatFormat format(const std::string & src) {
    ChatFormat f;
    f.family = ChatFamily::kHermes;
    f.tools = true;
    f.thinking = holds_all(src, kThinkingFingerprint);
    f.name = f.thinking ? "hermes-qwen3 (ChatML, <tool_call> JSON, <think>; moestream's renderer)"
                        : "hermes (ChatML, <tool_call> JSON; moestream's renderer)";
    return f;
}

bool render(const ChatFormat & f, const RenderInput & in, std::string * out, std::string * err) {
    std::string o;
    const auto & ms = in.messages;
    size_t first = 0;
    if (!in.tools.empty()) {
        o += "<|im_start|>system\n";
        if (!ms.empty() && ms[0].role == "system") {
            o += ms[0].content + "\n\n";
            first = 1;
        }
        o += kToolsIntro;
        for (const auto & t : in.tools) o += "\n" + template_json(t);
        o += std::string(kToolsOutro) + "<|im_end|>\n";
    } else if (!ms.empty() && ms[0].role == "system") {
        o += "<|im_start|>system\n" + ms[0].content + "<|im_end|>\n";
        first = 1;
    }
    size_t last_user = 0;
    for (size_t i = 0; i < ms.size(); ++i)
        if (ms[i].role == "user") last_user = i;
    for (size_t i = first; i < ms.size(); ++i) {
        const ChatTurn & m = ms[i];
        if (m.role == "user" || m.role == "system") {
            o += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        } else if (m.role == "assistant") {
            o += "<|im_start|>assistant\n";
            if (f.thinking && i > last_user && !m.reasoning.empty())
                o += "<think>\n" + m.reasoning + "\n</think>\n\n";
            o += m.content;
            for (size_t k = 0; k < m.tool_calls.size(); ++k) {
                const ToolCall & c = m.tool_calls[k];
                if (k > 0 || !m.content.empty()) o += "\n";
                ojson args = ojson::parse(c.arguments, nullptr, false);
                if (args.is_discarded()) {
                    *err = "messages[" + std::to_string(i) + "].tool_calls[" +
                           std::to_string(k) + "].function.arguments is not JSON";
                    return false;
                }
                o += "<tool_call>\n{\"name\": \"" + c.name +
                     "\", \"arguments\": " + template_json(args) + "}\n</tool_call>";
            }
            o += "<|im_end|>\n";
        } else if (m.role == "tool") {
            if (i == 0 || ms[i - 1].role != "tool") o += "<|im_start|>user";
            o += "\n<tool_response>\n" + m.content + "\n</tool_response>";
            if (i + 1 == ms.size() || ms[i + 1].role != "tool") o += "<|im_end|>\n";
        } else {
            *err = "messages[" + std::to_string(i) + "]: role '" + m.role +
                   "' has no place in this template";
            return false;
        }
    }
    if (in.add_generation_prompt) {
        o += "<|im_start|>assistant\n";
        if (f.thinking && !in.enable_thinking) o += "<think>\n\n</think>\n\n";
    }
    *out = std::move(o);
    return true;
}

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
