// responses.cpp — see responses.h.
#include "responses.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

ApiError refuse(const std::string & param, const std::string & msg) { return bad_request(param, msg); }

// Fields taken as they are by the chat completions body.
const char * const kPassed[] = {"model", "temperature", "top_p", "stream", "parallel_tool_calls",
                                "store", "metadata", "user", "service_tier",
                                "chat_template_kwargs"};  // llama-server's extension
// Fields with no effect here (what SDKs send), accepted.
const char * const kNoEffect[] = {"prompt_cache_key", "safety_identifier"};

// The text of a message's content: a string, or input_text / output_text parts.
std::optional<ApiError> content_text(const ojson & c, const std::string & at, ojson * out) {
    if (c.is_string()) {
        *out = c;
        return std::nullopt;
    }
    if (!c.is_array()) return refuse(at, "'" + at + "' must be a string or an array of text parts");
    ojson parts = ojson::array();
    for (size_t k = 0; k < c.size(); ++k) {
        const std::string pk = at + "[" + std::to_string(k) + "]";
        const ojson & p = c[k];
        const std::string type = p.is_object() && p.contains("type") && p["type"].is_string()
                                     ? p["type"].get<std::string>()
                                     : "";
        if (type != "input_text" && type != "output_text")
            return refuse(pk, "'" + pk + ".type' " + (type.empty() ? "is missing" : "'" + type + "'") +
                               ": only input_text and output_text parts are supported (text only)");
        if (!p.contains("text") || !p["text"].is_string())
            return refuse(pk, "'" + pk + ".text' must be a string");
        parts.push_back({{"type", "text"}, {"text", p["text"]}});
    }
    *out = parts;
    return std::nullopt;
}

std::optional<ApiError> input_messages(const ojson & input, ojson * messages) {
    if (input.is_string()) {
        messages->push_back({{"role", "user"}, {"content", input}});
        return std::nullopt;
    }
    if (!input.is_array() || input.empty())
        return refuse("input", "'input' must be a string or a non-empty array of items");
    for (size_t i = 0; i < input.size(); ++i) {
        const std::string at = "input[" + std::to_string(i) + "]";
        const ojson & it = input[i];
        if (!it.is_object()) return refuse(at, "'" + at + "' must be an object");
        const std::string type = it.contains("type") && it["type"].is_string()
                                     ? it["type"].get<std::string>()
                                     : "message";
        if (type == "message") {
            if (!it.contains("role") || !it["role"].is_string())
                return refuse(at, "'" + at + ".role' must be a string");
            ojson content;
            if (!it.contains("content")) return refuse(at, "'" + at + ".content' is missing");
            if (auto e = content_text(it["content"], at + ".content", &content)) return e;
            messages->push_back({{"role", it["role"]}, {"content", content}});
        } else if (type == "function_call") {
            for (const char * k : {"call_id", "name", "arguments"})
                if (!it.contains(k) || !it[k].is_string())
                    return refuse(at, "'" + at + "." + k + "' must be a string");
            const ojson call{{"id", it["call_id"]},
                             {"type", "function"},
                             {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
            // Consecutive calls are one assistant turn (parallel calls).
            if (!messages->empty() && messages->back()["role"] == "assistant" &&
                messages->back().contains("tool_calls"))
                messages->back()["tool_calls"].push_back(call);
            else
                messages->push_back({{"role", "assistant"}, {"content", nullptr},
                                     {"tool_calls", ojson::array({call})}});
        } else if (type == "function_call_output") {
            if (!it.contains("call_id") || !it["call_id"].is_string())
                return refuse(at, "'" + at + ".call_id' must be a string");
            if (!it.contains("output") || !it["output"].is_string())
                return refuse(at, "'" + at + ".output' must be a string");
            messages->push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", it["output"]}});
        } else if (type == "reasoning") {
            // An earlier reply's reasoning: left out of the prompt, as chat templates leave
            // earlier reasoning out.
        } else {
            return refuse(at, "'" + at + ".type' '" + type +
                               "' is not supported (message, function_call, function_call_output, "
                               "reasoning)");
        }
    }
    return std::nullopt;
}

}  // namespace

std::optional<ApiError> responses_to_chat(const std::string & body, std::string * chat_body) {
    const ojson j = ojson::parse(body, nullptr, false);
    if (j.is_discarded()) return refuse("", "the request body is not valid JSON");
    if (!j.is_object()) return refuse("", "the request body must be a JSON object");
    ojson chat = ojson::object();
    ojson messages = ojson::array();
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string & k = it.key();
        bool passed = false, no_effect = false;
        for (const char * p : kPassed) passed = passed || k == p;
        for (const char * p : kNoEffect) no_effect = no_effect || k == p;
        if (passed) {
            chat[k] = *it;
        } else if (no_effect || k == "input" || k == "instructions" || k == "tools" ||
                   k == "tool_choice" || k == "text" || k == "reasoning" ||
                   k == "max_output_tokens") {
            // below
        } else if (k == "previous_response_id" || k == "conversation") {
            if (!it->is_null())
                return refuse(k, "'" + k + "' is not supported: this server keeps no responses; send "
                              "the conversation in 'input'");
        } else if (k == "truncation") {
            if (!it->is_null() && *it != "disabled")
                return refuse(k, "'truncation' " + it->dump() + " is not supported (only \"disabled\")");
        } else if (k == "include") {
            if (!it->is_null() && !(it->is_array() && it->empty()))
                return refuse(k, "'include' is not supported (nothing extra can be included)");
        } else if (k == "background") {
            if (!it->is_null() && *it != false)
                return refuse(k, "'background' is not supported (responses are not stored)");
        } else {
            return refuse(k, "unknown field '" + k + "' for responses (docs/server.md lists the "
                          "fields this server takes)");
        }
    }
    if (!j.contains("input")) return refuse("input", "'input' is required");
    if (j.contains("instructions") && !j["instructions"].is_null()) {
        if (!j["instructions"].is_string())
            return refuse("instructions", "'instructions' must be a string");
        messages.push_back({{"role", "system"}, {"content", j["instructions"]}});
    }
    if (auto e = input_messages(j["input"], &messages)) return e;
    chat["messages"] = messages;
    if (j.contains("max_output_tokens") && !j["max_output_tokens"].is_null())
        chat["max_tokens"] = j["max_output_tokens"];
    if (j.contains("tools") && !j["tools"].is_null()) {
        if (!j["tools"].is_array()) return refuse("tools", "'tools' must be an array");
        ojson tools = ojson::array();
        for (size_t i = 0; i < j["tools"].size(); ++i) {
            const ojson & t = j["tools"][i];
            const std::string at = "tools[" + std::to_string(i) + "]";
            if (!t.is_object() || t.value("type", "") != "function")
                return refuse(at, "'" + at + ".type' must be \"function\" (function tools only)");
            ojson fn = ojson::object();
            for (auto f = t.begin(); f != t.end(); ++f)
                if (f.key() != "type") fn[f.key()] = f.value();
            tools.push_back({{"type", "function"}, {"function", fn}});
        }
        chat["tools"] = tools;
    }
    if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
        const ojson & tc = j["tool_choice"];
        if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name"))
            chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
        else
            chat["tool_choice"] = tc;
    }
    if (j.contains("text") && !j["text"].is_null()) {
        const ojson & t = j["text"];
        if (!t.is_object()) return refuse("text", "'text' must be an object");
        for (auto f = t.begin(); f != t.end(); ++f)
            if (f.key() != "format" && !(f.key() == "verbosity" && (f->is_null() || *f == "medium")))
                return refuse("text." + f.key(), "'text." + f.key() + "' is not supported");
        if (t.contains("format") && !t["format"].is_null()) {
            const ojson & f = t["format"];
            const std::string type = f.is_object() ? f.value("type", "") : "";
            if (type == "json_schema") {
                ojson js = ojson::object();
                for (auto g = f.begin(); g != f.end(); ++g)
                    if (g.key() != "type") js[g.key()] = g.value();
                chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
            } else if (type == "json_object" || type == "text") {
                chat["response_format"] = {{"type", type}};
            } else {
                return refuse("text.format", "'text.format.type' must be text, json_object or json_schema");
            }
        }
    }
    if (j.contains("reasoning") && !j["reasoning"].is_null()) {
        const ojson & r = j["reasoning"];
        if (!r.is_object()) return refuse("reasoning", "'reasoning' must be an object");
        for (auto f = r.begin(); f != r.end(); ++f) {
            if (f.key() == "effort") {
                if (!f->is_null()) chat["reasoning_effort"] = *f;
            } else if (!f->is_null()) {
                return refuse("reasoning." + f.key(), "'reasoning." + f.key() + "' is not supported (only effort)");
            }
        }
    }
    *chat_body = chat.dump();
    return std::nullopt;
}

std::string responses_param(const std::string & p) {
    if (p == "max_tokens") return "max_output_tokens";
    if (p == "response_format" || p == "json_schema") return "text.format";
    if (p == "reasoning_effort") return "reasoning.effort";
    if (p.rfind("messages", 0) == 0) return "input";
    return p;
}

std::string message_item_id(const ResponseState & r) { return "msg_" + r.id.substr(5); }
std::string reasoning_item_id(const ResponseState & r) { return "rs_" + r.id.substr(5); }
std::string call_item_id(const ResponseState & r, size_t i) {
    return "fc_" + r.id.substr(5) + "_" + std::to_string(i);
}

json message_item(const ResponseState & r, const std::string & status) {
    json content = json::array();
    if (status != "in_progress")
        content.push_back({{"type", "output_text"}, {"text", r.text}, {"annotations", json::array()}});
    return json{{"type", "message"}, {"id", message_item_id(r)}, {"status", status},
                {"role", "assistant"}, {"content", content}};
}

json reasoning_item(const ResponseState & r) {
    return json{{"type", "reasoning"},
                {"id", reasoning_item_id(r)},
                {"summary", json::array()},
                {"content", json::array({{{"type", "reasoning_text"}, {"text", r.reasoning}}})}};
}

json call_item(const ResponseState & r, size_t i) {
    const ToolCall & c = r.calls[i];
    return json{{"type", "function_call"}, {"id", call_item_id(r, i)}, {"call_id", c.id},
                {"name", c.name},          {"arguments", c.arguments},  {"status", "completed"}};
}

json response_json(const ResponseState & r) {
    json output = json::array();
    if (!r.reasoning.empty()) output.push_back(reasoning_item(r));
    if (!r.text.empty() || r.calls.empty())
        output.push_back(message_item(r, r.status == "completed" ? "completed" : "incomplete"));
    for (size_t i = 0; i < r.calls.size(); ++i) output.push_back(call_item(r, i));
    const bool done = r.status != "in_progress";
    return json{{"id", r.id},
                {"object", "response"},
                {"created_at", r.created},
                {"status", r.status},
                {"model", r.model},
                {"output", done ? output : json::array()},
                {"incomplete_details", r.length_cut ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
                {"error", nullptr},
                {"usage", done ? json{{"input_tokens", r.input_tokens},
                                      {"input_tokens_details", {{"cached_tokens", 0}}},
                                      {"output_tokens", r.output_tokens},
                                      {"output_tokens_details", {{"reasoning_tokens", 0}}},
                                      {"total_tokens", r.input_tokens + r.output_tokens}}
                               : json(nullptr)}};
}

}  // namespace moestream::server
