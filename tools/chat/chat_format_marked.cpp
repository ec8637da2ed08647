// chat_format_marked.cpp — the reply syntax of the families whose calls sit between their own
// markers inside a calls block (chat_format_families.h), each as its template renders a call:
//   glm      GLM-4.5/4.6/4.7: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>
//   deepseek DeepSeek V3.1/V3.2: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}<｜tool▁call▁end｜>
//   kimi     Kimi-K2: <|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{JSON}<|tool_call_end|>
//   lfm2     LFM2: <|tool_call_start|>[NAME(K="V", N=2)]<|tool_call_end|> (Python literals)
//   invoke   MiniMax-M2 (prefix "") and DeepSeek V4 (prefix "｜DSML｜"):
//            <invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>
// A parameter's value is the JSON it holds when it is JSON, else the text (DeepSeek V4 marks
// text values string="true"). The prompt is the model's template's (chat_jinja.h).
#include <cctype>

#include "chat_format_families.h"

namespace moestream::chat {
namespace {

bool blank(const std::string & s, size_t from = 0, size_t to = std::string::npos) {
    to = std::min(to, s.size());
    for (size_t i = from; i < to; ++i)
        if (!std::isspace(static_cast<unsigned char>(s[i]))) return false;
    return true;
}

// Reads `lit` at *p after blank text; false (leaving *p) when something else is there.
bool expect(const std::string & s, size_t * p, const std::string & lit) {
    size_t q = *p;
    while (q < s.size() && std::isspace(static_cast<unsigned char>(s[q]))) ++q;
    if (s.compare(q, lit.size(), lit) != 0) return false;
    *p = q + lit.size();
    return true;
}

// The text from *p up to `end` (moved past it); false when `end` does not follow.
bool until(const std::string & s, size_t * p, const std::string & end, std::string * text) {
    const size_t e = s.find(end, *p);
    if (e == std::string::npos) return false;
    *text = s.substr(*p, e - *p);
    *p = e + end.size();
    return true;
}

bool good_name(const std::string & n) {
    return !n.empty() && n.find_first_of(" \t\r\n<>\"") == std::string::npos;
}

ojson value_of(const std::string & text) {
    ojson v = ojson::parse(text, nullptr, false);
    return v.is_discarded() ? ojson(text) : v;
}

std::string compact(const ojson & j) {
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// Calls written as BEGIN head SEP {JSON object} END, one after another (blank between).
bool json_calls(const std::string & body, const std::string & begin, const std::string & sep,
                const std::string & end, std::string (*name_of)(const std::string &),
                std::vector<ToolCall> * out) {
    std::vector<ToolCall> calls;
    size_t p = 0;
    while (!blank(body, p)) {
        std::string head, args;
        if (!expect(body, &p, begin) || !until(body, &p, sep, &head) || !until(body, &p, end, &args))
            return false;
        const ojson a = ojson::parse(args, nullptr, false);
        ToolCall c;
        c.name = name_of(head);
        if (!good_name(c.name) || !a.is_object()) return false;
        c.arguments = compact(a);
        calls.push_back(std::move(c));
    }
    if (calls.empty()) return false;
    *out = std::move(calls);
    return true;
}

std::string trimmed(const std::string & s) {
    const size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string::npos) return "";
    return s.substr(a, s.find_last_not_of(" \t\r\n") + 1 - a);
}

}  // namespace

namespace glm {
bool parse_call(const std::string & body, ToolCall * out) {
    const size_t k = body.find("<arg_key>");
    ToolCall c;
    c.name = trimmed(body.substr(0, k));
    if (!good_name(c.name)) return false;
    ojson args = ojson::object();
    size_t p = k == std::string::npos ? body.size() : k;
    while (!blank(body, p)) {
        std::string key, value;
        if (!expect(body, &p, "<arg_key>") || !until(body, &p, "</arg_key>", &key) ||
            !expect(body, &p, "<arg_value>") || !until(body, &p, "</arg_value>", &value))
            return false;
        args[key] = value_of(value);
    }
    c.arguments = compact(args);
    *out = std::move(c);
    return true;
}

std::string call_rule(const std::string & name, const ojson & params) {
    std::string pairs = gbnf::kv_pairs(params, [](const std::string & k, const std::string & v, bool) {
        return gbnf::literal("<arg_key>" + k + "</arg_key>\n<arg_value>") + " " + v + " " +
               gbnf::literal("</arg_value>\n");
    });
    if (pairs.empty())
        pairs = "( " + gbnf::literal("<arg_key>") + " [a-zA-Z0-9_.-]+ " +
                gbnf::literal("</arg_key>\n<arg_value>") + " " + gbnf::kTextValue + " " +
                gbnf::literal("</arg_value>\n") + " )*";
    return gbnf::literal("<tool_call>" + name + "\n") + " " + pairs + " " + gbnf::literal("</tool_call>");
}
}  // namespace glm

namespace deepseek {
const char kCallsBegin[] = "<｜tool▁calls▁begin｜>", kCallsEnd[] = "<｜tool▁calls▁end｜>";
bool parse_calls(const std::string & body, std::vector<ToolCall> * out) {
    return json_calls(body, "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                      [](const std::string & h) { return h; }, out);
}
std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>") + " " + args + " " +
           gbnf::literal("<｜tool▁call▁end｜>");
}
}  // namespace deepseek

namespace kimi {
const char kCallsBegin[] = "<|tool_calls_section_begin|>", kCallsEnd[] = "<|tool_calls_section_end|>";
bool parse_calls(const std::string & body, std::vector<ToolCall> * out) {
    // The head is functions.NAME:INDEX.
    return json_calls(body, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                      [](const std::string & h) -> std::string {
                          const std::string t = trimmed(h);
                          const size_t colon = t.rfind(':');
                          if (t.rfind("functions.", 0) != 0 || colon == std::string::npos ||
                              colon + 1 == t.size() ||
                              t.find_first_not_of("0123456789", colon + 1) != std::string::npos)
                              return "";
                          return t.substr(10, colon - 10);
                      },
                      out);
}
std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("<|tool_call_begin|>functions." + name + ":") + " [0-9] [0-9]? [0-9]? " +
           gbnf::literal("<|tool_call_argument_begin|>") + " " + args + " " +
           gbnf::literal("<|tool_call_end|>");
}
}  // namespace kimi

namespace lfm2 {
namespace {
struct Py {  // a reader of Python literals as LFM2 writes call arguments
    const std::string & s;
    size_t p = 0;
    void ws() {
        while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
    }
    bool eat(char c) {
        ws();
        if (p < s.size() && s[p] == c) return ++p, true;
        return false;
    }
    std::string ident() {
        ws();
        const size_t a = p;
        while (p < s.size() && (std::isalnum(static_cast<unsigned char>(s[p])) || s[p] == '_' ||
                                (p > a && (s[p] == '.' || s[p] == '-'))))
            ++p;
        return s.substr(a, p - a);
    }
    bool value(ojson * v) {
        ws();
        if (p >= s.size()) return false;
        const char c = s[p];
        if (c == '"' || c == '\'') {  // a string: \-escapes as in JSON
            std::string t = "\"";
            for (++p; p < s.size() && s[p] != c; ++p) {
                if (s[p] == '\\' && p + 1 < s.size()) {
                    if (s[p + 1] == '\'') t += '\'';
                    else t += s.substr(p, 2);
                    ++p;
                } else if (s[p] == '"') {
                    t += "\\\"";
                } else {
                    t += s[p];
                }
            }
            if (!eat(c)) return false;
            *v = ojson::parse(t + "\"", nullptr, false);
            return !v->is_discarded();
        }
        if (c == '[' || c == '{') {
            const bool list = c == '[';
            ++p;
            *v = list ? ojson::array() : ojson::object();
            if (eat(list ? ']' : '}')) return true;
            do {
                ojson k, x;
                if (!list && (!value(&k) || !k.is_string() || !eat(':'))) return false;
                if (!value(&x)) return false;
                if (list) v->push_back(x);
                else (*v)[k.get<std::string>()] = x;
            } while (eat(','));
            return eat(list ? ']' : '}');
        }
        const size_t a = p;  // a number, True, False or None
        while (p < s.size() && (std::isalnum(static_cast<unsigned char>(s[p])) || s[p] == '+' ||
                                s[p] == '-' || s[p] == '.'))
            ++p;
        const std::string tok = s.substr(a, p - a);
        if (tok == "True" || tok == "False" || tok == "None") {
            *v = tok == "True" ? ojson(true) : tok == "False" ? ojson(false) : ojson();
            return true;
        }
        *v = ojson::parse(tok, nullptr, false);
        return !v->is_discarded() && v->is_number();
    }
};
}  // namespace

bool parse_calls(const std::string & body, std::vector<ToolCall> * out) {
    Py r{body};
    if (!r.eat('[')) return false;
    std::vector<ToolCall> calls;
    do {
        ToolCall c;
        c.name = r.ident();
        if (!good_name(c.name) || !r.eat('(')) return false;
        ojson args = ojson::object();
        if (!r.eat(')')) {
            do {
                const std::string k = r.ident();
                ojson v;
                if (k.empty() || !r.eat('=') || !r.value(&v)) return false;
                args[k] = v;
            } while (r.eat(','));
            if (!r.eat(')')) return false;
        }
        c.arguments = compact(args);
        calls.push_back(std::move(c));
    } while (r.eat(','));
    if (!r.eat(']') || !blank(body, r.p)) return false;
    *out = std::move(calls);
    return true;
}

std::string call_rule(const std::string & name, const ojson & params) {
    bool first = true;  // a flat schema's required keywords in order, strings quoted
    const std::string pairs = gbnf::kv_pairs(params, [&](const std::string & k, const std::string & v, bool str) {
        const std::string q = str ? " \"\\\"\" " : " ";
        const std::string r = gbnf::literal((first ? "" : ", ") + k + "=") + q + v + q;
        first = false;
        return r;
    });
    if (!pairs.empty())
        return gbnf::literal("<|tool_call_start|>[" + name + "(") + " " + pairs + " " +
               gbnf::literal(")]<|tool_call_end|>");
    // Else keyword arguments with JSON-style literals.
    const std::string kw = "[a-zA-Z_] [a-zA-Z0-9_]* \"=\" ( json-string | json-number | \"True\" | "
                           "\"False\" | \"None\" )";
    return gbnf::literal("<|tool_call_start|>[" + name + "(") + " ( " + kw + " ( \", \" " + kw +
           " )* )? " + gbnf::literal(")]<|tool_call_end|>");
}
}  // namespace lfm2

namespace invoke {
bool parse_calls(const std::string & body, const std::string & prefix, std::vector<ToolCall> * out) {
    const std::string inv = "<" + prefix + "invoke name=\"", inv_end = "</" + prefix + "invoke>";
    const std::string par = "<" + prefix + "parameter name=\"", par_end = "</" + prefix + "parameter>";
    std::vector<ToolCall> calls;
    size_t p = 0;
    while (!blank(body, p)) {
        ToolCall c;
        if (!expect(body, &p, inv) || !until(body, &p, "\">", &c.name) || !good_name(c.name))
            return false;
        ojson args = ojson::object();
        while (!expect(body, &p, inv_end)) {
            std::string key, attrs, value;
            if (!expect(body, &p, par) || !until(body, &p, "\"", &key) ||
                !until(body, &p, ">", &attrs) || !until(body, &p, par_end, &value))
                return false;
            args[key] = trimmed(attrs) == "string=\"true\"" ? ojson(value) : value_of(trimmed(value));
        }
        c.arguments = compact(args);
        calls.push_back(std::move(c));
    }
    if (calls.empty()) return false;
    *out = std::move(calls);
    return true;
}
std::string call_rule(const std::string & name, const std::string & prefix, const ojson & params) {
    // DeepSeek V4 marks each value string="true" (text) or "false" (JSON).
    std::string pairs = gbnf::kv_pairs(params, [&](const std::string & k, const std::string & v, bool str) {
        const std::string attr = prefix.empty() ? "" : str ? " string=\"true\"" : " string=\"false\"";
        return gbnf::literal("<" + prefix + "parameter name=\"" + k + "\"" + attr + ">") + " " + v + " " +
               gbnf::literal("</" + prefix + "parameter>\n");
    });
    if (pairs.empty())
        pairs = "( " + gbnf::literal("<" + prefix + "parameter name=\"") + " [a-zA-Z0-9_.-]+ " +
                (prefix.empty() ? "" : "( " + gbnf::literal("\" string=\"true") + " | " +
                                           gbnf::literal("\" string=\"false") + " ) ") +
                gbnf::literal("\">") + " " + gbnf::kTextValue + " " +
                gbnf::literal("</" + prefix + "parameter>\n") + " )*";
    return gbnf::literal("<" + prefix + "invoke name=\"" + name + "\">\n") + " " + pairs + " " +
           gbnf::literal("</" + prefix + "invoke>\n");
}
}  // namespace invoke

}  // namespace moestream::chat
