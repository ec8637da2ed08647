// chat_format.cpp — rendering through the model's template, the shared JSON printing and the
// grammar helpers of chat_format.h; each family's reply syntax is in chat_format_<family>.cpp,
// the template's loading and probing in chat_format_load.cpp.
#include "chat_format.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>

#include "chat_format_families.h"
#include "chat_jinja.h"
#include "json_schema_grammar.h"

namespace moestream::chat {

std::string local_date(const char * fmt) {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[64];
    return std::strftime(buf, sizeof buf, fmt, &tm) ? buf : "";
}

std::string template_json(const ojson & j) {
    if (j.is_object()) {
        std::string s = "{";
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (!first) s += ", ";
            first = false;
            s += ojson(it.key()).dump() + ": " + template_json(it.value());
        }
        return s + "}";
    }
    if (j.is_array()) {
        std::string s = "[";
        for (size_t i = 0; i < j.size(); ++i) s += (i ? ", " : "") + template_json(j[i]);
        return s + "]";
    }
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

namespace {

// ChatTurns as OpenAI chat messages (what a template reads).
ojson turns_json(const std::vector<ChatTurn> & turns) {
    ojson a = ojson::array();
    for (const ChatTurn & t : turns) {
        ojson m = {{"role", t.role}, {"content", t.content}};
        if (!t.reasoning.empty()) m["reasoning_content"] = t.reasoning;
        if (!t.tool_calls.empty()) {
            ojson calls = ojson::array();
            for (const ToolCall & c : t.tool_calls)
                calls.push_back({{"id", c.id},
                                 {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
            m["tool_calls"] = calls;
        }
        if (!t.tool_call_id.empty()) m["tool_call_id"] = t.tool_call_id;
        a.push_back(std::move(m));
    }
    return a;
}

}  // namespace

bool render_chat_format(const ChatFormat & f, const RenderInput & in, std::string * out,
                        std::string * err) {
    if (f.jinja) {
        ojson kw = f.default_kwargs;
        kw["enable_thinking"] = in.enable_thinking;
        if (!in.reasoning_effort.empty()) kw["reasoning_effort"] = in.reasoning_effort;
        if (f.date_string) kw["date_string"] = local_date("%d %b %Y");
        for (auto it = in.kwargs.begin(); in.kwargs.is_object() && it != in.kwargs.end(); ++it)
            kw[it.key()] = *it;
        const ojson msgs = in.messages_json.is_array() ? in.messages_json : turns_json(in.messages);
        if (f.jinja->render(msgs, in.tools, in.add_generation_prompt, kw, out, err)) return true;
        *err = "the chat template raised an error on these messages: " + *err;
        return false;
    }
    *err = "no chat template was loaded (load_chat_format)";
    return false;
}

std::string engine_prompt(const ChatFormat & f, const std::string & rendered) {
    if (f.bos_added && !f.bos_token.empty() && rendered.rfind(f.bos_token, 0) == 0)
        return rendered.substr(f.bos_token.size());
    return rendered;
}

std::string check_thinking(const ChatFormat & f, const std::string & tmpl_name,
                           const ThinkingRequest & t, std::string * param) {
    const std::string name = tmpl_name.empty() ? "none" : tmpl_name;
    const bool harmony = f.family == ChatFamily::kHarmony;
    const bool effort = f.jinja ? f.effort : harmony;
    if (t.enable_thinking && *t.enable_thinking && !f.thinking) {
        *param = t.thinking_name;
        return "this model's chat template has no thinking to enable (" + name + ")";
    }
    if (!t.reasoning_effort.empty() && !effort) {
        *param = t.effort_name;
        return "this model's chat template has no reasoning effort (" + name +
               "); templates with thinking take " + t.thinking_name;
    }
    if (harmony && t.enable_thinking && !*t.enable_thinking) {
        *param = t.thinking_name;
        return "this model's chat template cannot turn its thinking off (" + name + "); " +
               t.effort_name + " \"low\" makes it short";
    }
    return "";
}

ReplyMarkers reply_markers(const ChatFormat & f) {
    ReplyMarkers m;
    if (f.family == ChatFamily::kHermes || f.family == ChatFamily::kXml) {
        m.think_open = "<think>", m.think_close = "</think>";
        m.call_open = "<tool_call>", m.call_close = "</tool_call>";
        m.grammar_separator = gbnf::literal("\n");
    } else if (f.family == ChatFamily::kGlm || f.family == ChatFamily::kSeed) {
        const bool seed = f.family == ChatFamily::kSeed;
        m.think_open = seed ? "<seed:think>" : "<think>";
        m.think_close = seed ? "</seed:think>" : "</think>";
        m.call_open = seed ? "<seed:tool_call>" : "<tool_call>";
        m.call_close = seed ? "</seed:tool_call>" : "</tool_call>";
        m.grammar_separator = gbnf::literal("\n");
    } else if (f.family == ChatFamily::kDeepseek || f.family == ChatFamily::kKimi) {
        // One calls block holding every call (each between its own markers).
        const bool ds = f.family == ChatFamily::kDeepseek;
        if (ds) m.think_open = "<think>", m.think_close = "</think>";
        m.call_open = ds ? deepseek::kCallsBegin : kimi::kCallsBegin;
        m.call_close = ds ? deepseek::kCallsEnd : kimi::kCallsEnd;
        m.call_end = ds ? "<｜tool▁call▁end｜>" : "<|tool_call_end|>";
        m.grammar_open = gbnf::literal(m.call_open);
        m.grammar_close = gbnf::literal(m.call_close);
    } else if (f.family == ChatFamily::kMinimax || f.family == ChatFamily::kDsml) {
        const bool mm = f.family == ChatFamily::kMinimax;
        m.think_open = "<think>", m.think_close = "</think>";
        m.call_open = mm ? "<minimax:tool_call>" : "<｜DSML｜tool_calls>";
        m.call_close = mm ? "</minimax:tool_call>" : "</｜DSML｜tool_calls>";
        m.call_end = mm ? "</invoke>" : "</｜DSML｜invoke>";
        m.grammar_open = gbnf::literal(m.call_open + "\n");
        m.grammar_close = gbnf::literal(m.call_close);
    } else if (f.family == ChatFamily::kLfm2) {
        m.call_open = "<|tool_call_start|>", m.call_close = "<|tool_call_end|>";
        m.parallel = false;  // one list per reply (it holds the calls)
    } else if (f.family == ChatFamily::kLlama3) {
        m.call_open = "<|python_tag|>";
        m.json_reply = true;
        m.parallel = false;
    } else if (f.family == ChatFamily::kMistral) {
        m.call_open = "[TOOL_CALLS]";
        m.json_reply = m.marker_required = true;
        m.grammar_open = gbnf::literal("[TOOL_CALLS] [");
        m.grammar_separator = gbnf::literal(", ");
        m.grammar_close = gbnf::literal("]");
    } else if (f.family == ChatFamily::kHarmony) {
        m.parallel = false;  // a call ends the reply (<|call|>)
    } else if (f.family == ChatFamily::kCommandR) {
        m.think_open = "<|START_THINKING|>", m.think_close = "<|END_THINKING|>";
        m.call_open = "<|START_ACTION|>", m.call_close = "<|END_ACTION|>";
        m.dropped = {"<|START_RESPONSE|>", "<|END_RESPONSE|>"};
        m.grammar_open = gbnf::literal("<|START_ACTION|>[\n    ");
        m.grammar_separator = gbnf::literal(",\n    ");
        m.grammar_close = gbnf::literal("\n]<|END_ACTION|>");
    }
    if (f.family == ChatFamily::kNone && f.think_tags)
        m.think_open = "<think>", m.think_close = "</think>";
    return m;
}

bool one_call_per_reply(const ChatFormat & f) {
    return !reply_markers(f).parallel;
}

bool parse_call_body(const ChatFormat & f, const std::string & body, std::vector<ToolCall> * out) {
    switch (f.family) {
        case ChatFamily::kDeepseek:
            return deepseek::parse_calls(body, out);
        case ChatFamily::kKimi:
            return kimi::parse_calls(body, out);
        case ChatFamily::kLfm2:
            return lfm2::parse_calls(body, out);
        case ChatFamily::kMinimax:
            return invoke::parse_calls(body, "", out);
        case ChatFamily::kDsml:
            return invoke::parse_calls(body, "｜DSML｜", out);
        case ChatFamily::kCommandR:
            return command_r::parse_calls(body, out);
        default:
            break;
    }
    ToolCall c;
    const bool ok = f.family == ChatFamily::kXml || f.family == ChatFamily::kSeed ? xml::parse_call(body, &c)
                    : f.family == ChatFamily::kGlm                             ? glm::parse_call(body, &c)
                    : f.family == ChatFamily::kHermes && hermes::parse_call(body, &c);
    if (ok) out->assign(1, c);
    return ok;
}

bool parse_json_call_list(const std::string & body, const char * name_key, const char * args_key,
                          std::vector<ToolCall> * out) {
    const ojson j = ojson::parse(body, nullptr, false);
    if (!j.is_array() || j.empty()) return false;
    std::vector<ToolCall> calls;
    for (const auto & c : j) {
        if (!c.is_object() || !c.contains(name_key) || !c[name_key].is_string() ||
            !c.contains(args_key) || !c[args_key].is_object())
            return false;
        ToolCall t;
        t.name = c[name_key].get<std::string>();
        t.arguments = c[args_key].dump(-1, ' ', false, ojson::error_handler_t::replace);
        calls.push_back(std::move(t));
    }
    *out = std::move(calls);
    return true;
}

bool parse_json_reply(const ChatFormat & f, const std::string & body, std::vector<ToolCall> * out) {
    if (f.family == ChatFamily::kMistral) return mistral::parse_calls(body, out);
    ToolCall c;
    if (f.family != ChatFamily::kLlama3 || !llama3::parse_call(body, &c)) return false;
    out->assign(1, c);
    return true;
}

std::string call_rule(const ChatFormat & f, const std::string & name, const std::string & args,
                      const ojson & params) {
    switch (f.family) {
        case ChatFamily::kLlama3:
            return llama3::call_rule(name, args);
        case ChatFamily::kMistral:
            return mistral::call_rule(name, args);
        case ChatFamily::kHarmony:
            return harmony::call_rule(name, args);
        case ChatFamily::kXml:
            return xml::call_rule(name, params);
        case ChatFamily::kSeed:
            return seed::call_rule(name, params);
        case ChatFamily::kGlm:
            return glm::call_rule(name, params);
        case ChatFamily::kDeepseek:
            return deepseek::call_rule(name, args);
        case ChatFamily::kKimi:
            return kimi::call_rule(name, args);
        case ChatFamily::kLfm2:
            return lfm2::call_rule(name, params);
        case ChatFamily::kMinimax:
            return invoke::call_rule(name, "", params);
        case ChatFamily::kDsml:
            return invoke::call_rule(name, "｜DSML｜", params);
        case ChatFamily::kCommandR:
            return command_r::call_rule(name, args);
        default:
            return hermes::call_rule(name, args);
    }
}

namespace gbnf {

std::string literal(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\')
            o += '\\', o += char(c);
        else if (c == '\n')
            o += "\\n";
        else if (c == '\r')
            o += "\\r";
        else if (c == '\t')
            o += "\\t";
        else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02X", c);
            o += b;
        } else
            o += char(c);
    }
    return o + "\"";
}

const char kJsonRules[] = R"gbnf(
json-value  ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ( json-string ": " json-value ( ", " json-string ": " json-value )* )? "}"
json-array  ::= "[" ( json-value ( ", " json-value )* )? "]"
json-string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
json-number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
json-int    ::= "-"? ( "0" | [1-9] [0-9]* )
)gbnf";

// `s` without value bounds (numeric bounds, string patterns and formats, property counts,
// unique items): when a tool's schema is outside the converter's subset only because of a
// bound (multipleOf, a pattern with a look-ahead...), its arguments keep their structure
// enforced while the bounds are left to the model.
ojson without_bounds(const ojson & s) {
    static const char * const kBounds[] = {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern",
        "format", "minProperties", "maxProperties", "uniqueItems"};
    if (!s.is_object()) return s;
    ojson o = ojson::object();
    for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string & k = it.key();
        bool bound = false;
        for (const char * b : kBounds) bound = bound || k == b;
        if (bound) continue;
        if ((k == "properties" || k == "$defs" || k == "definitions") && it->is_object()) {
            ojson m = ojson::object();
            for (auto p = it->begin(); p != it->end(); ++p) m[p.key()] = without_bounds(*p);
            o[k] = m;
        } else if ((k == "anyOf" || k == "oneOf") && it->is_array()) {
            ojson a = ojson::array();
            for (const auto & b : *it) a.push_back(without_bounds(b));
            o[k] = a;
        } else if (k == "items") {
            o[k] = without_bounds(*it);
        } else {
            o[k] = *it;
        }
    }
    return o;
}

// The rules of json_schema_to_gbnf's grammar for `params` with every rule name prefixed (so
// several tools' grammars live in one), appended to *rules; returns the renamed root rule, or
// "" when the schema is not an object schema in the converter's subset.
std::string schema_rules(const ojson & params, const std::string & prefix, std::string * rules) {
    if (!params.is_object() || !params.contains("type") || params["type"] != "object") return "";
    std::string g;
    SchemaError e;
    if (!json_schema_to_gbnf(params, &g, &e) && !json_schema_to_gbnf(without_bounds(params), &g, &e))
        return "";
    std::vector<std::string> names;
    for (size_t a = 0; a < g.size();) {  // "name ::= body" lines
        const size_t sp = g.find(" ::= ", a);
        names.push_back(g.substr(a, sp - a));
        a = g.find('\n', a) + 1;
    }
    auto is_name = [&](const std::string & w) {
        for (const auto & n : names)
            if (n == w) return true;
        return false;
    };
    std::string out;
    for (size_t i = 0; i < g.size();) {
        const char c = g[i];
        if (c == '"' || c == '[') {  // a literal or a character class: copied as is
            const char close = c == '"' ? '"' : ']';
            size_t j = i + 1;
            while (j < g.size() && g[j] != close) j += g[j] == '\\' ? 2 : 1;
            out += g.substr(i, j + 1 - i);
            i = j + 1;
        } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-') {
            size_t j = i;
            while (j < g.size() && (std::isalnum(static_cast<unsigned char>(g[j])) || g[j] == '-')) ++j;
            const std::string w = g.substr(i, j - i);
            out += is_name(w) ? prefix + w : w;
            i = j;
        } else {
            out += c;
            ++i;
        }
    }
    *rules += out;
    return prefix + "root";
}

// The grammar of one tool's arguments object (rule text), from its "parameters": a flat
// object schema gets its required properties in order with typed values; anything else is
// any JSON object.
std::string arguments_rule(const ojson & params) {
    if (!params.is_object() || !params.contains("type") || params["type"] != "object" ||
        !params.contains("properties") || !params["properties"].is_object())
        return "json-object";
    const ojson & props = params["properties"];
    std::vector<std::string> keys;
    if (params.contains("required") && params["required"].is_array()) {
        for (const auto & k : params["required"])
            if (k.is_string() && props.contains(k.get<std::string>()))
                keys.push_back(k.get<std::string>());
    }
    if (keys.empty() && !props.empty()) return "json-object";
    std::string rule = "\"{\"";
    bool first = true;
    for (const std::string & k : keys) {
        const ojson & p = props[k];
        std::string v;
        if (p.contains("enum") && p["enum"].is_array() && !p["enum"].empty()) {
            for (const auto & e : p["enum"]) v += (v.empty() ? "" : " | ") + literal(e.dump());
            v = "( " + v + " )";
        } else {
            // "type" may be a list of types (or anything a client sends): only a string counts.
            const std::string t = p.is_object() && p.contains("type") && p["type"].is_string()
                                      ? p["type"].get<std::string>()
                                      : "";
            v = t == "string"    ? "json-string"
                : t == "integer" ? "json-int"
                : t == "number"  ? "json-number"
                : t == "boolean" ? "( \"true\" | \"false\" )"
                                 : "json-value";
        }
        rule += std::string(first ? " " : " \", \" ") + literal(ojson(k).dump()) + " \": \" " + v;
        first = false;
    }
    return rule + " \"}\"";
}

const char kTextValue[] = "( [^<] | \"<\" [^/] )*";

std::string kv_pairs(const ojson & params,
                     const std::function<std::string(const std::string &, const std::string &, bool)> & pair) {
    if (!params.is_object() || !params.contains("properties") || !params["properties"].is_object() ||
        !params.contains("required") || !params["required"].is_array())
        return "";
    const ojson & props = params["properties"];
    std::string out;
    for (const auto & k : params["required"]) {
        if (!k.is_string() || !props.contains(k.get<std::string>())) return "";
        const ojson & p = props[k.get<std::string>()];
        const std::string t = p.is_object() && p.contains("type") && p["type"].is_string()
                                  ? p["type"].get<std::string>()
                                  : "";
        std::string v;
        if (p.is_object() && p.contains("enum") && p["enum"].is_array() && !p["enum"].empty()) {
            for (const auto & e : p["enum"])
                v += (v.empty() ? "" : " | ") + literal(e.is_string() ? e.get<std::string>() : e.dump());
            v = "( " + v + " )";
        } else {
            v = t == "integer"   ? "json-int"
                : t == "number"  ? "json-number"
                : t == "boolean" ? "( \"true\" | \"false\" )"
                                 : kTextValue;
        }
        out += (out.empty() ? "" : " ") + pair(k.get<std::string>(), v, t == "string");
    }
    return out;
}

}  // namespace gbnf

std::string tool_call_grammar(const ChatFormat & f, const ojson & tools,
                              const std::string & forced_name, bool one_call, bool think_first) {
    std::string alts, rules;
    int n = 0;
    for (const auto & t : tools) {
        const ojson & fn = t["function"];
        const std::string name = fn["name"].get<std::string>();
        if (!forced_name.empty() && name != forced_name) continue;
        const std::string r = "call" + std::to_string(n++);
        const ojson params = fn.contains("parameters") ? fn["parameters"] : ojson();
        std::string args = gbnf::schema_rules(params, "t" + std::to_string(n - 1) + "-", &rules);
        if (args.empty()) args = gbnf::arguments_rule(params);
        rules += r + " ::= " + call_rule(f, name, args, params) + "\n";
        alts += (alts.empty() ? "" : " | ") + r;
    }
    const ReplyMarkers m = reply_markers(f);
    if (!m.parallel) one_call = true;  // the family has one call per reply
    std::string think;  // an optional thinking block before the calls
    if (think_first && f.thinking && f.family == ChatFamily::kHarmony)
        think = harmony::think_rule();
    // The prompt opened the block (and thinking is on, or the template always thinks): the
    // reply closes it first, then calls (as ReplyParser reads it).
    const bool opened = f.think_opened && !m.think_open.empty() && (think_first || !f.thinking);
    if (opened)
        think = "( [^<] | \"<\" [^/] )* " + gbnf::literal(m.think_close) + " [\\n]*";
    else if (think_first && f.thinking && !m.think_open.empty())
        think = gbnf::literal(m.think_open + "\n") + " ( [^<] | \"<\" [^/] )* " +
                gbnf::literal(m.think_close + "\n\n");
    const char * think_use = think.empty() ? "" : opened ? "think " : "think? ";
    std::string g = std::string("root ::= ") + think_use + m.grammar_open + " call" +
                    (one_call ? "" : " ( " + m.grammar_separator + " call )*") + " " +
                    m.grammar_close + "\ncall ::= " + alts + "\n" +
                    (think.empty() ? "" : "think ::= " + think + "\n") + rules +
                    gbnf::kJsonRules;
    return g;
}

ReplyParser::ReplyParser(const ChatFormat & f, bool tools, bool thinking)
    : f_(f), tools_(tools && f.tools),
      // A family that always thinks (MiniMax-M2: no switch in its template) has its block
      // split out whatever was asked.
      state_(f.think_opened && (thinking || !f.thinking) ? State::kThink
             : (thinking && f.thinking) || (!f.thinking && !reply_markers(f).think_open.empty())
                 ? State::kStart
                 : State::kContent) {}

ReplyDelta ReplyParser::push(const std::string & text) {
    buf_ += text;
    return step(false);
}

ReplyDelta ReplyParser::finish() {
    return step(true);
}

namespace {

// Length of the longest suffix of s that is a proper prefix of marker.
size_t partial_suffix(const std::string & s, const std::string & marker) {
    for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
        if (s.compare(s.size() - n, n, marker, 0, n) == 0) return n;
    return 0;
}

// Where the JSON object or array that starts at s[from] ends (one past its closing bracket);
// npos when it is not complete yet.
size_t json_value_end(const std::string & s, size_t from) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = from; i < s.size(); ++i) {
        const char c = s[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return i + 1;
        }
    }
    return std::string::npos;
}

// Erases the blank text at the start of *s; true when nothing else is left.
bool drop_leading_blank(std::string * s) {
    const size_t ws = s->find_first_not_of(" \t\r\n");
    s->erase(0, ws == std::string::npos ? s->size() : ws);
    return s->empty();
}

// Where the blank text that ends s[0, end) starts.
size_t blank_tail(const std::string & s, size_t end) {
    while (end > 0 && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
    return end;
}

}  // namespace

ReplyDelta ReplyParser::step(bool final) {
    if (f_.family == ChatFamily::kHarmony) return harmony_step(final);
    const ReplyMarkers m = reply_markers(f_);
    ReplyDelta d;
    for (;;) {
        if (state_ == State::kStart) {
            const size_t ws = buf_.find_first_not_of(" \t\r\n");
            if (ws == std::string::npos) {
                if (final) buf_.clear();
                return d;
            }
            const std::string rest = buf_.substr(ws);
            if (rest.compare(0, m.think_open.size(), m.think_open) == 0) {
                buf_ = rest.substr(m.think_open.size());
                if (!buf_.empty() && buf_[0] == '\n') buf_.erase(0, 1);
                state_ = State::kThink;
                continue;
            }
            if (!final && m.think_open.compare(0, rest.size(), rest) == 0) return d;
            buf_ = rest;
            state_ = State::kContent;
            continue;
        }
        if (state_ == State::kThink) {
            if (!reasoning_started_ && drop_leading_blank(&buf_)) return d;  // start of the block
            if (!reasoning_started_ && f_.think_opened && !m.think_open.empty()) {
                // The prompt opened the block; a model that opens it again has it dropped.
                if (buf_.compare(0, m.think_open.size(), m.think_open) == 0) {
                    buf_.erase(0, m.think_open.size());
                    continue;
                }
                if (!final && m.think_open.compare(0, buf_.size(), buf_) == 0) return d;
            }
            const size_t e = buf_.find(m.think_close);
            // Blank at the end of the block is dropped too: it waits until text follows it.
            size_t end = e != std::string::npos ? e
                         : final                ? buf_.size()
                                                : buf_.size() - partial_suffix(buf_, m.think_close);
            end = blank_tail(buf_, end);
            d.reasoning += buf_.substr(0, end);
            reasoning_started_ = reasoning_started_ || end > 0;
            if (e == std::string::npos) {
                buf_.erase(0, final ? buf_.size() : end);
                return d;
            }
            buf_.erase(0, e + m.think_close.size());
            state_ = State::kContent;
            content_started_ = false;
            continue;
        }
        if (state_ == State::kContent) {
            for (const std::string & x : m.dropped)  // markers around the answer: not content
                for (size_t at; (at = buf_.find(x)) != std::string::npos;) buf_.erase(at, x.size());
            if (!content_started_) {  // blank before the content or between calls: dropped
                if (drop_leading_blank(&buf_)) return d;
                if (tools_ && m.json_reply && !json_done_) {  // a reply that is its JSON calls
                    if (buf_.compare(0, m.call_open.size(), m.call_open) == 0) {
                        buf_.erase(0, m.call_open.size());
                        json_marker_ = true;
                        state_ = State::kJson;
                        continue;
                    }
                    if (buf_[0] == '{' && !m.marker_required) {
                        state_ = State::kJson;
                        continue;
                    }
                    if (!final && m.call_open.compare(0, buf_.size(), buf_) == 0) return d;
                }
            }
            const bool marked = tools_ && !m.json_reply;  // calls marked inside the text
            const size_t s = marked ? buf_.find(m.call_open) : std::string::npos;
            if (s == std::string::npos) {
                size_t hold = marked && !final ? partial_suffix(buf_, m.call_open) : 0;
                for (const std::string & x : m.dropped)  // what may become a dropped marker
                    if (!final) hold = std::max(hold, partial_suffix(buf_, x));
                size_t end = buf_.size() - hold;
                // Trailing blank waits until text follows it (blank before a call or at the
                // end is not content).
                end = blank_tail(buf_, end);
                d.content += buf_.substr(0, end);
                content_started_ = content_started_ || end > 0;
                buf_.erase(0, final ? buf_.size() : end);
                return d;
            }
            d.content += buf_.substr(0, blank_tail(buf_, s));
            buf_.erase(0, s + m.call_open.size());
            state_ = State::kCall;
            continue;
        }
        if (state_ == State::kJson) {
            // A JSON call (llama3.x) or a list of them after the marker (mistral): each call
            // is sent once its object is complete; text that is not a call ends the calls and
            // is content as generated (with the marker when no call came before it).
            auto not_calls = [&] {
                if (json_marker_ && n_calls_ == 0) {
                    d.content += m.call_open + json_eaten_;
                    content_started_ = true;
                }
                json_done_ = true;
                state_ = State::kContent;
            };
            const size_t ws = buf_.find_first_not_of(" \t\r\n");
            if (ws == std::string::npos) {
                if (!final) return d;
                not_calls();
                continue;
            }
            const char c = buf_[ws];
            if (m.marker_required && !json_list_) {  // the list's '['
                if (c != '[') {
                    not_calls();
                    continue;
                }
                json_list_ = true;
                json_eaten_ = buf_.substr(0, ws + 1);
                buf_.erase(0, ws + 1);
                continue;
            }
            if (json_list_ && n_calls_ > 0 && (c == ']' || c == ',')) {  // between calls
                buf_.erase(0, ws + 1);
                if (c == ']') {
                    json_done_ = true;
                    state_ = State::kContent;
                    content_started_ = false;
                }
                continue;
            }
            const size_t from = ws;
            const size_t end = buf_[from] == '{' ? json_value_end(buf_, from) : std::string::npos;
            if (end == std::string::npos && !final && buf_[from] == '{') return d;
            std::vector<ToolCall> calls;
            const std::string body = end == std::string::npos ? "" : buf_.substr(from, end - from);
            if (body.empty() || !parse_json_reply(f_, json_list_ ? "[" + body + "]" : body, &calls)) {
                not_calls();
                continue;
            }
            for (ToolCall & call : calls) {
                call.id = "call_" + std::to_string(n_calls_++);
                d.calls.push_back(std::move(call));
            }
            buf_.erase(0, end);
            if (!json_list_) {  // one call per reply: the rest is content
                json_done_ = true;
                state_ = State::kContent;
                content_started_ = false;
            }
            continue;
        }
        // kCall
        if (!m.call_end.empty()) {  // a calls block: each call is sent as soon as it ends
            const size_t ws = buf_.find_first_not_of(" \t\r\n");
            if (block_calls_ > 0 && ws != std::string::npos &&
                buf_.compare(ws, m.call_close.size(), m.call_close) == 0) {  // the block closes
                buf_.erase(0, ws + m.call_close.size());
                block_calls_ = 0;
                state_ = State::kContent;
                content_started_ = false;
                continue;
            }
            const size_t ce = buf_.find(m.call_end), cc = buf_.find(m.call_close);
            std::vector<ToolCall> calls;
            if (ce != std::string::npos && ce < cc &&
                parse_call_body(f_, buf_.substr(0, ce + m.call_end.size()), &calls)) {
                for (ToolCall & c : calls) {
                    c.id = "call_" + std::to_string(n_calls_++);
                    d.calls.push_back(std::move(c));
                }
                buf_.erase(0, ce + m.call_end.size());
                ++block_calls_;
                continue;
            }
            // Else: text that is not a call; the rest of the block is content, as below.
        }
        const std::string open = block_calls_ > 0 ? "" : m.call_open;  // calls already sent
        const size_t e = buf_.find(m.call_close);
        if (e == std::string::npos) {
            if (!final) return d;
            // Unfinished: what was generated (after calls already sent, blank text is none).
            if (block_calls_ == 0 || buf_.find_first_not_of(" \t\r\n") != std::string::npos)
                d.content += open + buf_;
            buf_.clear();
            block_calls_ = 0;
            return d;
        }
        std::vector<ToolCall> calls;
        const std::string body = buf_.substr(0, e);
        if (parse_call_body(f_, body, &calls)) {
            for (ToolCall & c : calls) {
                c.id = "call_" + std::to_string(n_calls_++);
                d.calls.push_back(std::move(c));
            }
        } else {
            d.content += open + body + m.call_close;
        }
        block_calls_ = 0;
        buf_.erase(0, e + m.call_close.size());
        state_ = State::kContent;
        content_started_ = false;
    }
}

}  // namespace moestream::chat
