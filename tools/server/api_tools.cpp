// api_tools.cpp — the tool and reasoning fields of a chat request (api.h, ChatExtras;
// docs/server.md "Tools and reasoning"): tools, tool_choice, parallel_tool_calls,
// chat_template_kwargs, reasoning_effort, and the messages with their tool fields, kept in
// the client's key order (templates print tools as sent).
#include <cctype>

#include "api.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`
namespace {

ApiError bad_field(const std::string & param, const std::string & message) {
    ApiError e;
    e.param = param;
    e.message = "'" + param + "' " + message;
    return e;
}

bool valid_tool_name(const std::string & n) {
    if (n.empty() || n.size() > 64) return false;
    for (unsigned char c : n)
        if (!std::isalnum(c) && c != '_' && c != '-') return false;
    return true;
}

std::optional<ApiError> parse_tools(const ojson & j, ChatExtras * x) {
    auto it = j.find("tools");
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_array()) return bad_field("tools", "must be an array of tools");
    for (size_t i = 0; i < it->size(); ++i) {
        const ojson & t = (*it)[i];
        const std::string p = "tools[" + std::to_string(i) + "]";
        if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
            !t["function"].is_object())
            return bad_field(p, "must be {\"type\": \"function\", \"function\": {...}}");
        for (auto f = t.begin(); f != t.end(); ++f)
            if (f.key() != "type" && f.key() != "function")
                return bad_field(p + "." + f.key(), "is not a field of a tool");
        const ojson & fn = t["function"];
        if (!fn.contains("name") || !fn["name"].is_string() ||
            !valid_tool_name(fn["name"].get<std::string>()))
            return bad_field(p + ".function.name",
                             "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -");
        for (auto f = fn.begin(); f != fn.end(); ++f)
            if (f.key() != "name" && f.key() != "description" && f.key() != "parameters" &&
                f.key() != "strict")
                return bad_field(p + ".function." + f.key(), "is not a field of a function");
        if (fn.contains("description") && !fn["description"].is_string())
            return bad_field(p + ".function.description", "must be a string");
        if (fn.contains("parameters") && !fn["parameters"].is_object())
            return bad_field(p + ".function.parameters", "must be a JSON schema object");
        for (size_t k = 0; k < i; ++k)
            if (x->tools[k]["function"]["name"] == fn["name"])
                return bad_field(p + ".function.name",
                                 "repeats the name of tools[" + std::to_string(k) + "]");
        x->tools.push_back(t);
    }
    return std::nullopt;
}

std::optional<ApiError> parse_tool_choice(const ojson & j, ChatExtras * x) {
    auto it = j.find("tool_choice");
    if (it != j.end() && !it->is_null()) {
        if (it->is_string()) {
            x->tool_choice = it->get<std::string>();
            if (x->tool_choice != "auto" && x->tool_choice != "none" &&
                x->tool_choice != "required")
                return bad_field("tool_choice",
                                 "must be \"auto\", \"none\", \"required\" or {\"type\": "
                                 "\"function\", \"function\": {\"name\": ...}}");
        } else if (it->is_object() && it->contains("type") && (*it)["type"] == "function" &&
                   it->contains("function") && (*it)["function"].is_object() &&
                   (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
            x->tool_choice = "function";
            x->tool_name = (*it)["function"]["name"].get<std::string>();
            bool known = false;
            for (const auto & t : x->tools) known = known || t["function"]["name"] == x->tool_name;
            if (!known)
                return bad_field("tool_choice", "names the function '" + x->tool_name +
                                                     "', which is not in 'tools'");
        } else {
            return bad_field("tool_choice",
                             "must be \"auto\", \"none\", \"required\" or {\"type\": "
                             "\"function\", \"function\": {\"name\": ...}}");
        }
        if (x->tools.empty() && x->tool_choice != "none" && x->tool_choice != "auto")
            return bad_field("tool_choice", "needs 'tools'");
    }
    if (auto p = j.find("parallel_tool_calls"); p != j.end() && !p->is_null()) {
        if (!p->is_boolean()) return bad_field("parallel_tool_calls", "must be true or false");
        x->parallel_tool_calls = p->get<bool>();  // how the template honours it: plan_chat
    }
    return std::nullopt;
}

std::optional<ApiError> parse_effort(const ojson & v, const std::string & param,
                                     ChatExtras * x) {
    if (v.is_null()) return std::nullopt;
    if (!v.is_string() || (v != "low" && v != "medium" && v != "high"))
        return bad_field(param, "must be \"low\", \"medium\" or \"high\"");
    if (!x->reasoning_effort.empty() && x->reasoning_effort != v.get<std::string>())
        return bad_field(param, "differs from chat_template_kwargs.reasoning_effort (\"" +
                                    x->reasoning_effort + "\")");
    x->reasoning_effort = v.get<std::string>();
    return std::nullopt;
}

std::optional<ApiError> parse_reasoning(const ojson & j, ChatExtras * x) {
    if (auto it = j.find("chat_template_kwargs"); it != j.end() && !it->is_null()) {
        if (!it->is_object()) return bad_field("chat_template_kwargs", "must be an object");
        for (auto k = it->begin(); k != it->end(); ++k) {
            if (k.key() == "reasoning_effort") {
                if (auto e = parse_effort(*k, "chat_template_kwargs.reasoning_effort", x)) return e;
                continue;
            }
            if (k.key() != "enable_thinking") {  // a variable of the template: plan_chat
                x->kwargs[k.key()] = *k;
                continue;
            }
            if (!k->is_boolean())
                return bad_field("chat_template_kwargs.enable_thinking", "must be true or false");
            x->enable_thinking = k->get<bool>();
        }
    }
    if (auto it = j.find("reasoning_effort"); it != j.end())
        if (auto e = parse_effort(*it, "reasoning_effort", x)) return e;
    return std::nullopt;
}

// messages[i] with its tool fields; role, content and the field checks are parse_messages'.
std::optional<ApiError> parse_turns(const ojson & j, ChatExtras * x) {
    const ojson & ms = j["messages"];
    x->messages_json = ms;
    for (auto & m : x->messages_json)  // as parse_messages names it
        if (m["role"] == "developer") m["role"] = "system";
    for (size_t i = 0; i < ms.size(); ++i) {
        const ojson & m = ms[i];
        const std::string pm = "messages[" + std::to_string(i) + "]";
        ChatTurn t;
        t.role = m["role"].get<std::string>();
        if (t.role == "developer") t.role = "system";
        if (m.contains("content") && !m["content"].is_null()) {
            const ojson & c = m["content"];
            if (c.is_string()) {
                t.content = c.get<std::string>();
            } else {
                for (const auto & part : c) t.content += part["text"].get<std::string>();
            }
        }
        if (auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
            if (!r->is_string() || t.role != "assistant")
                return bad_field(pm + ".reasoning_content",
                                 "must be a string, in an assistant message");
            t.reasoning = r->get<std::string>();
        }
        if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
            if (t.role != "assistant" || !tc->is_array())
                return bad_field(pm + ".tool_calls", "must be an array, in an assistant message");
            for (size_t k = 0; k < tc->size(); ++k) {
                const ojson & c = (*tc)[k];
                const std::string pc = pm + ".tool_calls[" + std::to_string(k) + "]";
                if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
                    !c["function"].contains("name") || !c["function"]["name"].is_string() ||
                    !valid_tool_name(c["function"]["name"].get<std::string>()))
                    return bad_field(pc, "must be {\"id\", \"type\": \"function\", \"function\": "
                                         "{\"name\", \"arguments\"}} with a valid name");
                ToolCall call;
                call.name = c["function"]["name"].get<std::string>();
                if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
                const ojson a = c["function"].value("arguments", ojson());
                ojson parsed = a.is_string() ? ojson::parse(a.get<std::string>(), nullptr, false)
                                             : a;
                if (!parsed.is_object())
                    return bad_field(pc + ".function.arguments",
                                     "must be a JSON object (as a string)");
                call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
                t.tool_calls.push_back(std::move(call));
            }
        }
        if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
            if (t.role != "tool" || !id->is_string())
                return bad_field(pm + ".tool_call_id", "must be a string, in a tool message");
            t.tool_call_id = id->get<std::string>();
        }
        if (t.role == "tool" && t.tool_call_id.empty())
            return bad_field(pm + ".tool_call_id", "is missing (a tool message answers a call)");
        x->turns.push_back(std::move(t));
    }
    return std::nullopt;
}

}  // namespace

bool ChatExtras::uses_tools() const {
    if (!tools.empty()) return true;
    for (const ChatTurn & t : turns)
        if (t.role == "tool" || !t.tool_calls.empty()) return true;
    return false;
}

bool ChatExtras::forces_call() const {
    return tool_choice == "required" || tool_choice == "function";
}

std::optional<ApiError> parse_chat_extras(const std::string & body, ChatExtras * x) {
    const ojson j = ojson::parse(body, nullptr, false);  // parse_request checked it
    if (auto e = parse_tools(j, x)) return e;
    if (auto e = parse_tool_choice(j, x)) return e;
    if (auto e = parse_reasoning(j, x)) return e;
    return parse_turns(j, x);
}

}  // namespace moestream::server
