// chat_format_harmony.cpp — the gpt-oss harmony family (chat_format_families.h): messages as
// <|start|>ROLE<|message|>TEXT<|end|>, a system message with the date and the reasoning effort,
// the client's system message and the tools (a TypeScript-like `namespace functions`) in a
// developer message, the assistant in channels (analysis = reasoning, final = the answer,
// commentary = preambles and tool calls `to=functions.NAME <|constrain|>json`), tool results
// as `functions.NAME to=assistant` messages. Also the reply parser for it (ReplyParser).
#include "chat_format_families.h"

namespace moestream::chat {
namespace harmony {
namespace {

const char kSystemIntro[] =
    "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
    "Current date: ";
const char kChannels[] =
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
const char kToolsChannel[] = "Calls to these tools must go to the commentary channel: 'functions'.";

// Literal pieces of what render() writes, as they appear in a template's source.
const char * const kFingerprint[] = {
    "<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|constrain|>", "<|call|>",
    "to=functions.", " to=assistant", "namespace functions {", "} // namespace functions",
    "You are ChatGPT, a large language model trained by OpenAI.", "Knowledge cutoff: 2024-06",
    "Current date: ", "strftime_now", "Reasoning: ", "reasoning_effort", kChannels,
    kToolsChannel, "# Instructions", "# Tools", "## functions", "=> any;", "(_: ",
    "// default: ", "analysis", "commentary", "final"};

// Today as a template's strftime_now("%Y-%m-%d") gives it (local time).
std::string today() {
    return local_date("%Y-%m-%d");
}

// Jinja truthiness of a JSON value.
bool truthy(const ojson & v) {
    if (v.is_null()) return false;
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
    if (v.is_number_integer()) return v.get<int64_t>() != 0;
    return v.is_number() ? v.get<double>() != 0 : true;
}
// A value as Jinja prints it ({{ v }}): strings as they are, the rest as JSON.
std::string printed(const ojson & v) {
    return v.is_string() ? v.get<std::string>() : template_json(v);
}

// The TypeScript-like type of a property schema (one level: arrays of a scalar type).
std::string scalar_type(const ojson & s) {
    if (!s.is_object()) return "any";
    if (s.contains("enum") && s["enum"].is_array()) {
        std::string o;
        for (size_t i = 0; i < s["enum"].size(); ++i)
            o += (i ? " | " : "") + template_json(s["enum"][i]);
        return o;
    }
    const ojson t = s.value("type", ojson());
    if (t == "string") return "string";
    if (t == "number" || t == "integer") return "number";
    if (t == "boolean") return "boolean";
    if (t == "null") return "null";
    if (t == "object") return "object";
    return "any";
}
std::string ts_type(const ojson & s) {
    if (!s.is_object() || s.value("type", ojson()) != "array" || s.contains("enum"))
        return scalar_type(s);
    if (!s.contains("items")) return "any[]";
    const ojson & it = s["items"];
    if (it.is_object() && it.contains("enum") && it["enum"].is_array() && it["enum"].size() > 1)
        return "(" + scalar_type(it) + ")[]";
    return scalar_type(it) + "[]";
}

std::string tools_block(const ojson & tools) {
    std::string o = "# Tools\n\n## functions\n\nnamespace functions {\n\n";
    for (const auto & t : tools) {
        const ojson & fn = t["function"];
        if (fn.contains("description") && truthy(fn["description"]))
            o += "// " + printed(fn["description"]) + "\n";
        const std::string name = fn["name"].get<std::string>();
        const ojson params = fn.value("parameters", ojson::object());
        const ojson props = params.is_object() ? params.value("properties", ojson()) : ojson();
        if (props.is_object() && !props.empty()) {
            const ojson req = params.value("required", ojson::array());
            o += "type " + name + " = (_: {\n";
            for (auto it = props.begin(); it != props.end(); ++it) {
                const ojson & p = it.value();
                if (p.is_object() && p.contains("description") && truthy(p["description"]))
                    o += "// " + printed(p["description"]) + "\n";
                bool required = false;
                if (req.is_array())
                    for (const auto & k : req) required = required || k == it.key();
                o += it.key() + (required ? "" : "?") + ": " + ts_type(p) + ",";
                if (p.is_object() && p.contains("default"))
                    o += " // default: " + template_json(p["default"]);
                o += "\n";
            }
            o += "}) => any;";
        } else {
            o += "type " + name + " = () => any;";
        }
        o += "\n\n";
    }
    return o + "} // namespace functions";
}

std::string message(const std::string & header, const std::string & body,
                    const char * end = "<|end|>") {
    return "<|start|>" + header + "<|message|>" + body + end;
}

}  // namespace

bool matches(const std::string & src) {
    return holds_all(src, kFingerprint);
}

ChatFormat format(const std::string &) {
    ChatFormat f;
    f.family = ChatFamily::kHarmony;
    f.tools = true;
    f.thinking = true;  // the analysis channel; its length is set by the reasoning effort
    f.name = "harmony (gpt-oss: channels, namespace functions tools, reasoning effort; "
             "moestream's renderer)";
    return f;
}

bool render(const ChatFormat &, const RenderInput & in, std::string * out, std::string * err) {
    const auto & ms = in.messages;
    const bool tools = !in.tools.empty();
    const std::string effort = in.reasoning_effort.empty() ? "medium" : in.reasoning_effort;
    std::string o = "<|start|>system<|message|>" + std::string(kSystemIntro) + today() +
                    "\n\nReasoning: " + effort + "\n\n" + kChannels;
    if (tools) o += std::string("\n") + kToolsChannel;
    o += "<|end|>";
    const size_t first = !ms.empty() && ms[0].role == "system" ? 1 : 0;
    if (first || tools) {
        std::string dev;
        if (first) dev = "# Instructions\n\n" + ms[0].content + (tools ? "\n\n" : "");
        if (tools) dev += tools_block(in.tools);
        o += message("developer", dev);
    }
    size_t last_user = SIZE_MAX;
    for (size_t i = 0; i < ms.size(); ++i)
        if (ms[i].role == "user") last_user = i;
    for (size_t i = first; i < ms.size(); ++i) {
        const ChatTurn & m = ms[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (m.role == "user") {
            o += message("user", m.content);
        } else if (m.role == "system") {
            o += message("developer", "# Instructions\n\n" + m.content);
        } else if (m.role == "assistant") {
            if (!m.reasoning.empty() && (last_user == SIZE_MAX || i > last_user))
                o += message("assistant<|channel|>analysis", m.reasoning);
            if (m.tool_calls.empty()) {
                o += message("assistant<|channel|>final", m.content);
                continue;
            }
            if (!m.content.empty()) o += message("assistant<|channel|>commentary", m.content);
            for (size_t k = 0; k < m.tool_calls.size(); ++k) {
                const ToolCall & c = m.tool_calls[k];
                const ojson args = ojson::parse(c.arguments, nullptr, false);
                if (args.is_discarded()) {
                    *err = where + ".tool_calls[" + std::to_string(k) +
                           "].function.arguments is not JSON";
                    return false;
                }
                o += message("assistant<|channel|>commentary to=functions." + c.name +
                                 " <|constrain|>json",
                             template_json(args), "<|call|>");
            }
        } else if (m.role == "tool") {
            std::string name;  // the call it answers (the last one with that id)
            for (size_t j = 0; j < i; ++j)
                for (const ToolCall & c : ms[j].tool_calls)
                    if (c.id == m.tool_call_id) name = c.name;
            if (name.empty()) {
                *err = where + ".tool_call_id '" + m.tool_call_id +
                       "' answers no tool call of an earlier assistant message (this template "
                       "names the function a result comes from)";
                return false;
            }
            o += message("functions." + name + " to=assistant<|channel|>commentary", m.content);
        } else {
            *err = where + ": role '" + m.role + "' has no place in this template";
            return false;
        }
    }
    if (in.add_generation_prompt) o += "<|start|>assistant";
    *out = std::move(o);
    return true;
}

std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("<|channel|>commentary to=functions." + name +
                         " <|constrain|>json<|message|>") +
           " " + args;
}

std::string think_rule() {
    return gbnf::literal("<|channel|>analysis<|message|>") + " ( [^<] | \"<\" [^|] )* " +
           gbnf::literal("<|end|><|start|>assistant");
}

}  // namespace harmony

// The reply after "<|start|>assistant": messages of headers (`<|channel|>NAME`, `to=R`,
// `<|constrain|>json`) and bodies, ended by <|end|>, <|return|>, <|call|> or the next
// <|start|> (a model whose end tokens are not printed gives only the latter). The analysis
// channel -> reasoning; a body addressed to functions.NAME -> a tool call; other text ->
// content. A reply that does not start with a header is content.
ReplyDelta ReplyParser::harmony_step(bool final) {
    static const char * const kEnds[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
    static const char * const kHeads[] = {"<|channel|>", "<|constrain|>", " to=", "to="};
    ReplyDelta d;
    for (;;) {
        if (!h_body_) {
            if (h_first_) {  // the reply's start: a header, or plain text
                bool head = false, maybe = false;
                for (const char * h : kHeads) {
                    const std::string hs = h;
                    head = head || buf_.compare(0, hs.size(), hs) == 0;
                    maybe = maybe || (buf_.size() < hs.size() && hs.compare(0, buf_.size(), buf_) == 0);
                }
                if (!head && maybe && !final) return d;
                h_first_ = false;
                if (!head) {  // plain text: the answer
                    h_body_ = true;
                    h_channel_ = "final";
                    h_recipient_.clear();
                    continue;
                }
            }
            // A message after the first opens with <|start|> (the role follows in the header).
            while (!h_first_ && buf_.compare(0, 9, "<|start|>") == 0) buf_.erase(0, 9);
            if (!h_first_ && !final && buf_.size() < 9 &&
                std::string("<|start|>").compare(0, buf_.size(), buf_) == 0)
                return d;
            const size_t e = buf_.find("<|message|>");
            if (e == std::string::npos) {
                if (final) {  // an unfinished header: as generated
                    add_text(&d.content, &content_started_, &held_content_, buf_);
                    buf_.clear();
                }
                return d;
            }
            h_header_ = buf_.substr(0, e);
            buf_.erase(0, e + 11);
            h_channel_.clear();
            h_recipient_.clear();
            auto word_after = [&](const std::string & key) {
                const size_t p = h_header_.find(key);
                if (p == std::string::npos) return std::string();
                const size_t b = p + key.size();
                const size_t q = h_header_.find_first_of(" <", b);
                return h_header_.substr(b, q == std::string::npos ? std::string::npos : q - b);
            };
            h_channel_ = word_after("<|channel|>");
            h_recipient_ = word_after("to=");
            h_body_ = true;
            h_call_.clear();
            held_content_.clear();
            held_reasoning_.clear();
            continue;
        }
        size_t e = std::string::npos, elen = 0;
        bool start_next = false;
        for (const char * t : kEnds) {
            const size_t p = buf_.find(t);
            if (p < e) e = p, elen = std::string(t).size(), start_next = std::string(t) == "<|start|>";
        }
        const bool call = h_recipient_.rfind("functions.", 0) == 0;
        size_t take = e;
        if (e == std::string::npos) {
            take = buf_.size();
            if (!final) {  // hold what could be the start of an end marker
                const size_t lt = buf_.rfind("<|");
                const size_t l1 = !buf_.empty() && buf_.back() == '<' ? buf_.size() - 1 : buf_.size();
                take = lt != std::string::npos && buf_.find("|>", lt) == std::string::npos ? lt : l1;
            }
        }
        const std::string text = buf_.substr(0, take);
        buf_.erase(0, take);
        if (call)
            h_call_ += text;
        else if (h_channel_ == "analysis")
            add_text(&d.reasoning, &reasoning_started_, &held_reasoning_, text);
        else
            add_text(&d.content, &content_started_, &held_content_, text);
        if (e == std::string::npos && !final) return d;
        // The message ended (or the reply did).
        if (call) {
            const ojson args = ojson::parse(h_call_, nullptr, false);
            if (tools_ && args.is_object()) {
                ToolCall c;
                c.id = "call_" + std::to_string(n_calls_++);
                c.name = h_recipient_.substr(10);
                c.arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
                d.calls.push_back(std::move(c));
            } else {  // not a call (or no tools offered): the message as generated
                add_text(&d.content, &content_started_, &held_content_,
                         h_header_ + "<|message|>" + h_call_);
            }
        }
        h_call_.clear();
        held_content_.clear();
        held_reasoning_.clear();
        h_body_ = false;
        if (e == std::string::npos) return d;  // final
        // <|start|> is left for the header (which drops it); <|end|> etc. are dropped here.
        if (!start_next) buf_.erase(0, elen);
    }
}

void ReplyParser::add_text(std::string * dst, bool * started, std::string * held,
                           const std::string & s) {
    std::string t = *held + s;
    held->clear();
    if (!*started) {
        const size_t ws = t.find_first_not_of(" \t\r\n");
        if (ws == std::string::npos) return;
        t.erase(0, ws);
        *started = true;
    }
    size_t end = t.size();
    while (end > 0 && (t[end - 1] == ' ' || t[end - 1] == '\t' || t[end - 1] == '\r' ||
                       t[end - 1] == '\n'))
        --end;
    *held = t.substr(end);
    *dst += t.substr(0, end);
}

}  // namespace moestream::chat
