// chat_format_xml.cpp — the reply syntax of the XML-function family (chat_format_families.h;
// Qwen3-Coder, Qwen3.5, Nemotron-3 style): a call as
// <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...\n</function>\n</tool_call>,
// each VALUE the JSON it holds when it is JSON, else the text. The prompt is the model's
// template's (chat_jinja.h).
#include <cctype>

#include "chat_format_families.h"

namespace moestream::chat {
namespace xml {
namespace {

// s without one newline at each end (the template writes VALUE between newlines).
std::string strip_newlines(std::string s) {
    if (!s.empty() && s.front() == '\n') s.erase(0, 1);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
}

bool blank(const std::string & s) {
    for (unsigned char c : s)
        if (!std::isspace(c)) return false;
    return true;
}

}  // namespace

bool parse_call(const std::string & body, ToolCall * out) {
    const std::string fn = "<function=", fn_end = "</function>";
    const size_t a = body.find(fn);
    if (a == std::string::npos || !blank(body.substr(0, a))) return false;
    const size_t name_end = body.find('>', a);
    const size_t close = body.rfind(fn_end);
    if (name_end == std::string::npos || close == std::string::npos || close < name_end ||
        !blank(body.substr(close + fn_end.size())))
        return false;
    const std::string name = body.substr(a + fn.size(), name_end - a - fn.size());
    if (name.empty() || name.find_first_of(" \n<") != std::string::npos) return false;
    ojson args = ojson::object();
    std::string rest = body.substr(name_end + 1, close - name_end - 1);
    for (;;) {
        const size_t p = rest.find("<parameter=");
        if (p == std::string::npos) {
            if (!blank(rest)) return false;  // text that is not a parameter: not a call
            break;
        }
        if (!blank(rest.substr(0, p))) return false;
        const size_t k_end = rest.find('>', p);
        const size_t v_end = rest.find("</parameter>", p);
        if (k_end == std::string::npos || v_end == std::string::npos || v_end < k_end) return false;
        const std::string key = rest.substr(p + 11, k_end - p - 11);
        const std::string text = strip_newlines(rest.substr(k_end + 1, v_end - k_end - 1));
        ojson v = ojson::parse(text, nullptr, false);
        args[key] = v.is_discarded() ? ojson(text) : v;
        rest.erase(0, v_end + 12);
    }
    out->name = name;
    out->arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
}

// A `<TAG>\n<function=NAME>\n` call of `<parameter=K>` pairs: the required parameters of a
// flat schema in order, else any by name with any text. inner: what stands after the
// parameter's opening tag and before its closing one ("\n" in Qwen3-Coder's format, "" in
// Seed-OSS's).
static std::string function_call_rule(const std::string & tag, const std::string & inner,
                                      const std::string & name, const ojson & params) {
    const std::string close = inner + "</parameter>\n";
    std::string pairs = gbnf::kv_pairs(params, [&](const std::string & k, const std::string & v, bool) {
        return gbnf::literal("<parameter=" + k + ">" + inner) + " " + v + " " + gbnf::literal(close);
    });
    if (pairs.empty())
        pairs = "( " + gbnf::literal("<parameter=") + " [a-zA-Z0-9_.-]+ " + gbnf::literal(">" + inner) +
                " " + gbnf::kTextValue + " " + gbnf::literal(close) + " )*";
    return gbnf::literal("<" + tag + ">\n<function=" + name + ">\n") + " " + pairs + " " +
           gbnf::literal("</function>\n</" + tag + ">");
}

std::string call_rule(const std::string & name, const ojson & params) {
    return function_call_rule("tool_call", "\n", name, params);
}

}  // namespace xml

namespace seed {
std::string call_rule(const std::string & name, const ojson & params) {
    return xml::function_call_rule("seed:tool_call", "", name, params);
}
}  // namespace seed
}  // namespace moestream::chat
