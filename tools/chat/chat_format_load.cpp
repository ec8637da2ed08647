// chat_format_load.cpp — load_chat_format (chat_format.h): the model's template parsed by minja,
// and what it does learned by rendering probe conversations through it, so that a family is
// known from where its tool call lands rather than from a list of template texts.
#include <cctype>
#include <set>

#include "chat_format.h"
#include "chat_format_families.h"
#include "chat_jinja.h"

namespace moestream::chat {

const char kChatmlTemplate[] =
    "{%- for message in messages -%}{{- '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- "
    "'<|im_start|>assistant\\n' -}}{%- endif -%}";

namespace {

// Renders, or "" when the template raises on the probe.
std::string probe(const JinjaTemplate & t, const ojson & messages, const ojson & tools, bool gen,
                  const ojson & kwargs) {
    std::string out, err;
    return t.render(messages, tools, gen, kwargs, &out, &err) ? out : "";
}

const char kProbeFn[] = "moestream_probe_fn";

// The reply family, from an assistant turn with one tool call rendered through the template.
ChatFamily family_of(const JinjaTemplate & t) {
    const std::string name = kProbeFn;
    const ojson tools = ojson::parse(
        R"([{"type": "function", "function": {"name": ")" + name +
        R"(", "description": "probe", "parameters": {"type": "object", "properties": {"a": )"
        R"({"type": "integer"}}}}}])");
    const ojson msgs = ojson::parse(
        R"([{"role": "user", "content": "U"}, {"role": "assistant", "content": "", "tool_calls": )"
        R"([{"id": "call00001", "type": "function", "function": {"name": ")" + name +
        R"(", "arguments": "{\"a\": 1}"}}]}])");
    const std::string out = probe(t, msgs, tools, false, ojson::object());
    auto has = [&](const std::string & s) { return out.find(s) != std::string::npos; };
    if (out.empty() || !has(name)) return ChatFamily::kNone;
    if (has("to=functions." + name) && has("<|channel|>")) return ChatFamily::kHarmony;
    if (has("[TOOL_CALLS]")) return ChatFamily::kMistral;
    // Calls between the markers of chat_format_marked.cpp, as the template wrote the probe.
    if (has("<tool_call>" + name) && has("<arg_key>a</arg_key>")) return ChatFamily::kGlm;
    if (has("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>")) return ChatFamily::kDeepseek;
    if (has("<|tool_call_begin|>functions." + name + ":")) return ChatFamily::kKimi;
    if (has("<minimax:tool_call>") && has("<invoke name=\"" + name + "\">"))
        return ChatFamily::kMinimax;
    if (has("<｜DSML｜invoke name=\"" + name + "\">")) return ChatFamily::kDsml;
    if (has("<seed:tool_call>") && has("<function=" + name + ">")) return ChatFamily::kSeed;
    // XML functions: <tool_call> around <function=NAME> with <parameter=KEY> values.
    if (has("<tool_call>") && has("<function=" + name + ">") && has("<parameter=a>"))
        return ChatFamily::kXml;
    // Command-R7B / Cohere2: a JSON list of {"tool_call_id", "tool_name", "parameters"}.
    if (has("<|START_ACTION|>") && has("\"tool_name\": \"" + name + "\""))
        return ChatFamily::kCommandR;
    // Hermes: the call is {"name": ..., "arguments": ...} JSON inside <tool_call></tool_call>.
    const size_t tc = out.find("<tool_call>");
    if (tc != std::string::npos && out.find("\"name\": \"" + name + "\"", tc) != std::string::npos)
        return ChatFamily::kHermes;
    if (has("<|start_header_id|>") && has("\"name\": \"" + name + "\"")) return ChatFamily::kLlama3;
    // LFM2's template prints no assistant call, only the tool list between its own markers
    // (the model writes <|tool_call_start|>[NAME(...)]<|tool_call_end|>).
    const size_t l = out.find("<|tool_list_start|>");
    if (l != std::string::npos && out.find(name, l) < out.find("<|tool_list_end|>", l))
        return ChatFamily::kLfm2;
    return ChatFamily::kNone;
}

// Identifiers the template tests with `NAME is defined` (its optional variables).
std::set<std::string> defined_tests(const std::string & src) {
    std::set<std::string> names;
    const std::string key = " is defined";
    for (size_t p = src.find(key); p != std::string::npos; p = src.find(key, p + 1)) {
        size_t b = p;
        while (b > 0 && (std::isalnum(static_cast<unsigned char>(src[b - 1])) || src[b - 1] == '_'))
            --b;
        if (b < p) names.insert(src.substr(b, p - b));
    }
    return names;
}

}  // namespace

bool load_chat_format(const std::string & source, const std::string & bos_token,
                      const std::string & eos_token, bool bos_added, ChatFormat * out,
                      std::string * err) {
    const std::string src = source.empty() ? std::string(kChatmlTemplate) : source;
    // moestream's own chatml needs no cross-check: minja and Python's Jinja render it alike
    // (tests/unit/test_chat_format.cpp, ChatJinja.BuiltInChatmlRendersAlikeInMinjaAndPython),
    // so a model without a template starts without Python.
    auto t = JinjaTemplate::parse(src, bos_token, eos_token, err, src != kChatmlTemplate);
    if (!t) return false;
    {  // a template that cannot render one user message renders nothing: refused now
        std::string o;
        if (!t->render(ojson::parse(R"([{"role": "user", "content": "U"}])"), ojson(), true,
                       ojson{{"enable_thinking", true}}, &o, err))
            return false;
    }
    ChatFormat f;
    f.jinja = t;
    f.bos_token = bos_token;
    f.eos_token = eos_token;
    f.bos_added = bos_added;
    f.family = family_of(*t);
    f.tools = f.family != ChatFamily::kNone;

    const ojson user = ojson::array({{{"role", "user"}, {"content", "U"}}});
    auto with = [](const char * k, const ojson & v) { return ojson{{k, v}}; };
    const std::string think_on = probe(*t, user, ojson(), true, with("enable_thinking", true));
    const std::string think_off = probe(*t, user, ojson(), true, with("enable_thinking", false));
    f.thinking = think_on != think_off || f.family == ChatFamily::kHarmony;
    // The default llama-server gives: on where the switch changes a marker of the reply
    // (<think>, [THINK], ...) rather than a sentence of the system prompt.
    f.thinking_default = true;
    if (think_on != think_off) {
        size_t a = 0;
        while (a < think_on.size() && a < think_off.size() && think_on[a] == think_off[a]) ++a;
        size_t e = 0;
        while (e < think_on.size() - a && e < think_off.size() - a &&
               think_on[think_on.size() - 1 - e] == think_off[think_off.size() - 1 - e])
            ++e;
        // The differing text widened to whole words ("<think>" vs "</think>", not "/").
        auto words = [&](const std::string & s) {
            auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
            size_t b = a, end = s.size() - e;
            while (b > 0 && !blank(s[b - 1])) --b;
            while (end < s.size() && !blank(s[end])) ++end;
            return s.substr(b, end - b);
        };
        auto marked = [](const std::string & d) {
            return d.find('<') != std::string::npos || d.find('[') != std::string::npos;
        };
        f.thinking_default = marked(words(think_on)) || marked(words(think_off));
    }
    f.think_tags = f.family == ChatFamily::kNone &&
                   src.find("<think>") != std::string::npos && src.find("</think>") != std::string::npos;
    {
        const std::string open = reply_markers(f).think_open;
        const size_t end = think_on.find_last_not_of(" \t\r\n");
        f.think_opened = !open.empty() && end != std::string::npos &&
                         end + 1 >= open.size() &&
                         think_on.compare(end + 1 - open.size(), open.size(), open) == 0;
    }
    f.date_string = src.find("date_string") != std::string::npos;
    f.effort = probe(*t, user, ojson(), true, with("reasoning_effort", "low")) !=
               probe(*t, user, ojson(), true, with("reasoning_effort", "high"));

    // Earlier turns' reasoning: where the template drops it by default but one of its optional
    // thinking variables set to false keeps it (truncate_history_thinking, drop_thinking),
    // llama-server sets it false; so does this. A variable that keeps it only when true
    // (Hy3's preserved_thinking) is left alone, as llama-server leaves it.
    const std::string thought = "moestream probe thought";
    const ojson history = ojson::array(
        {{{"role", "user"}, {"content", "U"}},
         {{"role", "assistant"}, {"content", "A"}, {"reasoning_content", thought}},
         {{"role", "user"}, {"content", "V"}}});
    const ojson base_kw = with("enable_thinking", f.thinking_default);
    if (probe(*t, history, ojson(), true, base_kw).find(thought) == std::string::npos) {
        for (const std::string & v : defined_tests(src)) {
            if (v == "enable_thinking" ||
                (v.find("think") == std::string::npos && v.find("reason") == std::string::npos))
                continue;
            ojson kw = base_kw;
            kw[v] = false;
            if (probe(*t, history, ojson(), true, kw).find(thought) != std::string::npos) {
                f.default_kwargs[v] = false;
                break;
            }
        }
    }

    static const char * const kFamilies[] = {"",       "hermes",   "llama3.x", "mistral",
                                             "harmony", "xml-function", "glm", "deepseek",
                                             "kimi",    "minimax", "deepseek-dsml", "seed", "lfm2",
                                             "command-r"};
    const std::string fam = kFamilies[static_cast<int>(f.family)];
    const std::string r = t->renderer();
    f.name = source.empty() ? "chatml (the model carries no chat template; " + r + ")"
             : fam.empty()  ? "the model's template (" + r + "; tool calls not parsed)"
                            : fam + " (the model's template, " + r + ")";
    *out = std::move(f);
    return true;
}

}  // namespace moestream::chat
