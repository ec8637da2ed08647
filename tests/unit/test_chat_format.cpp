// test_chat_format.cpp — the chat-format library (tools/chat/, shared by `serve` and `chat`):
// the template run by minja and what loading it learns, template-style JSON, and the reply
// parser, which must split a reply the same way however it is cut into pieces. Rendering
// itself is checked against llama-server by tests/api/template_fidelity.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "chat_format.h"
#include "chat_jinja.h"
#include "test_util.h"

namespace moestream::chat {
namespace {

// A file's text ("" when it cannot be read).
std::string read_text(const std::string & path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
std::string read_template(const std::string & name) {
    return read_text(moestream::test::src_dir() + "/tests/api/templates/" + name);
}
std::string hermes_template() {
    return read_template("hermes-qwen3.jinja");
}
// The chat format a template loads as (load_chat_format: the family from a probe call),
// loaded once per template text (the parser tests split thousands of replies).
ChatFormat format_of(const std::string & tmpl) {
    static std::map<std::string, ChatFormat> loaded;
    auto it = loaded.find(tmpl);
    if (it != loaded.end()) return it->second;
    ChatFormat f;
    std::string err;
    EXPECT_TRUE(load_chat_format(tmpl, "<s>", "</s>", false, &f, &err)) << err;
    return loaded[tmpl] = f;
}

TEST(ChatFormat, TemplateJsonIsPythonStyleInOrder) {
    const ojson j = ojson::parse(R"({"b": [1, 2.5, {"x": null}], "a": "é\"\n", "c": {}})");
    EXPECT_EQ(template_json(j), R"({"b": [1, 2.5, {"x": null}], "a": "é\"\n", "c": {}})");
}

struct Split {
    std::string content, reasoning;
    std::vector<ToolCall> calls;
};

Split parse(const std::string & reply, size_t piece, bool tools, bool thinking,
            const std::string & tmpl = hermes_template()) {
    ReplyParser p(format_of(tmpl), tools, thinking);
    Split s;
    auto add = [&](const ReplyDelta & d) {
        s.content += d.content;
        s.reasoning += d.reasoning;
        for (const auto & c : d.calls) s.calls.push_back(c);
    };
    for (size_t i = 0; i < reply.size(); i += piece) add(p.push(reply.substr(i, piece)));
    add(p.finish());
    return s;
}

// Every reply at several piece sizes splits into what is wanted.
struct SplitCase {
    std::string reply;
    bool tools, thinking;
    Split want;
};
void expect_splits(const std::vector<SplitCase> & cases, const std::string & tmpl) {
    for (const SplitCase & c : cases) {
        for (size_t piece : {size_t(1), size_t(2), size_t(7), c.reply.size()}) {
            const Split s = parse(c.reply, piece, c.tools, c.thinking, tmpl);
            EXPECT_EQ(s.content, c.want.content) << c.reply << " / piece " << piece;
            EXPECT_EQ(s.reasoning, c.want.reasoning) << c.reply << " / piece " << piece;
            ASSERT_EQ(s.calls.size(), c.want.calls.size()) << c.reply << " / piece " << piece;
            for (size_t k = 0; k < s.calls.size(); ++k) {
                EXPECT_EQ(s.calls[k].id, c.want.calls[k].id);
                EXPECT_EQ(s.calls[k].name, c.want.calls[k].name);
                EXPECT_EQ(s.calls[k].arguments, c.want.calls[k].arguments);
            }
        }
    }
}

TEST(ChatFormat, ReplyParserSplitsAlikeForEveryPieceSize) {
    const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                             "{\"city\": \"Paris\"}}\n</tool_call>";
    expect_splits({
        {"<think>\nhm, <thi\n</think>\n\nHello <b>", false, true, {"Hello <b>", "hm, <thi", {}}},
        {"<think>\nplan\n</think>\n\n" + call + "\n" + call, true, true,
         {"", "plan", {{"call_0", "get_weather", "{\"city\":\"Paris\"}"},
                       {"call_1", "get_weather", "{\"city\":\"Paris\"}"}}}},
        {"Let me check.\n" + call + "\nDone.", true, false,
         {"Let me check.Done.", "", {{"call_0", "get_weather", "{\"city\":\"Paris\"}"}}}},
        {"x <tool_call>\n{\"name\": 3}\n</tool_call>", true, false,
         {"x<tool_call>\n{\"name\": 3}\n</tool_call>", "", {}}},  // not a call: kept as text
        {"a " + call.substr(0, 30), true, false, {"a" + call.substr(0, 30), "", {}}},  // cut
        {"No thinking here", false, true, {"No thinking here", "", {}}},
    }, hermes_template());
    // Negative control: without tools offered, a call is left in the content.
    const Split off = parse(call, 3, false, false);
    EXPECT_TRUE(off.calls.empty());
    EXPECT_EQ(off.content, call);
}

TEST(ChatFormat, HarmonyTemplateIsTheHarmonyFamily) {
    const ChatFormat f = format_of(read_template("harmony.jinja"));
    ASSERT_EQ(f.family, ChatFamily::kHarmony) << f.name;
    EXPECT_TRUE(f.tools);
    EXPECT_TRUE(f.thinking);
    EXPECT_TRUE(f.effort);
    EXPECT_TRUE(one_call_per_reply(f));
    EXPECT_NE(format_of(hermes_template()).family, ChatFamily::kHarmony) << "control";
}

TEST(ChatFormat, Llama3ReplyIsOneJsonCallOrText) {
    const std::string t = read_template("llama3.jinja");
    const ChatFormat f = format_of(t);
    ASSERT_EQ(f.family, ChatFamily::kLlama3) << f.name;
    EXPECT_FALSE(f.thinking);
    EXPECT_EQ(format_of(hermes_template()).family, ChatFamily::kHermes) << "not llama3";
    const std::string call = "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}";
    for (size_t piece : {size_t(1), size_t(5), call.size()}) {
        Split s = parse(call, piece, true, false, t);
        ASSERT_EQ(s.calls.size(), 1u) << piece;
        EXPECT_EQ(s.calls[0].name, "add");
        EXPECT_EQ(s.calls[0].arguments, "{\"a\":1,\"b\":2}");
        EXPECT_EQ(s.content, "");
        s = parse("<|python_tag|>" + call, piece, true, false, t);
        EXPECT_EQ(s.calls.size(), 1u) << "with the python tag, piece " << piece;
        s = parse("{not a call}", piece, true, false, t);
        EXPECT_TRUE(s.calls.empty());
        EXPECT_EQ(s.content, "{not a call}");
        s = parse("It is 3. " + call, piece, true, false, t);
        EXPECT_TRUE(s.calls.empty()) << "a call is the whole reply";
        s = parse(call, piece, false, false, t);  // control: no tools offered
        EXPECT_TRUE(s.calls.empty());
        EXPECT_EQ(s.content, call);
    }
}

TEST(ChatFormat, MistralReplyIsTheMarkedCallList) {
    const std::string t = read_template("mistral.jinja");
    ASSERT_EQ(format_of(t).family, ChatFamily::kMistral);
    const std::string calls = "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1}}, "
                              "{\"name\": \"get_weather\", \"arguments\": {}}]";
    for (size_t piece : {size_t(1), size_t(4), calls.size()}) {
        Split s = parse(calls, piece, true, false, t);
        ASSERT_EQ(s.calls.size(), 2u) << piece;
        EXPECT_EQ(s.calls[0].name, "add");
        EXPECT_EQ(s.calls[1].arguments, "{}");
        EXPECT_EQ(s.content, "");
        s = parse("{\"name\": \"add\", \"arguments\": {}}", piece, true, false, t);
        EXPECT_TRUE(s.calls.empty()) << "no [TOOL_CALLS] marker: text";
        s = parse("[TOOL_CALLS] [oops", piece, true, false, t);
        EXPECT_TRUE(s.calls.empty());
        EXPECT_EQ(s.content, "[TOOL_CALLS] [oops") << "not calls: as generated";
    }
}

// A Qwen3-Coder-style template: calls as <function=NAME> with <parameter=KEY> values.
const char kXmlTemplate[] =
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{%- if m.tool_calls %}"
    "{%- for tc in m.tool_calls %}\n<tool_call>\n<function={{ tc.function.name }}>\n"
    "{%- for k, v in tc.function.arguments|items %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n"
    "{%- endfor %}</function>\n</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";

TEST(ChatFormat, XmlFunctionCallsAreParsed) {
    ASSERT_EQ(format_of(kXmlTemplate).family, ChatFamily::kXml) << format_of(kXmlTemplate).name;
    std::string other = kXmlTemplate;  // control: another call syntax is not the family
    other.replace(other.find("<function="), 10, "<func=");
    EXPECT_EQ(format_of(other).family, ChatFamily::kNone);
    const std::string call =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
    for (size_t piece : {size_t(1), size_t(7), call.size()}) {
        Split s = parse("Checking.\n" + call, piece, true, false, kXmlTemplate);
        ASSERT_EQ(s.calls.size(), 1u) << piece;
        EXPECT_EQ(s.calls[0].name, "get_weather");
        EXPECT_EQ(s.calls[0].arguments, "{\"city\":\"Paris\",\"days\":2}");
        EXPECT_EQ(s.content, "Checking.");
        // Negative controls: another family's call text is no call, either way round.
        const std::string hermes_call =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        s = parse(hermes_call, piece, true, false, kXmlTemplate);
        EXPECT_TRUE(s.calls.empty()) << piece;
        EXPECT_EQ(s.content, hermes_call) << "not a call: as generated";
        s = parse(call, piece, true, false, hermes_template());
        EXPECT_TRUE(s.calls.empty()) << piece;
        s = parse(call, piece, false, false, kXmlTemplate);  // control: no tools offered
        EXPECT_TRUE(s.calls.empty());
    }
}

TEST(ChatFormat, HarmonyReplySplitsChannelsAlikeForEveryPieceSize) {
    const std::string t = read_template("harmony.jinja");
    const std::string call = "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                             "<|message|>{\"city\": \"Paris\"}";
    expect_splits({
        {"<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant<|channel|>final"
         "<|message|>Hello <| there\n<|return|>",
         false, true, {"Hello <| there", "Think <b>.", {}}},
        // A model whose end tokens are not printed: the next <|start|> ends a message.
        {"<|channel|>analysis<|message|> Think. <|start|>assistant<|channel|>final<|message|>Hi",
         false, true, {"Hi", "Think.", {}}},
        {"<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant" + call + "<|call|>",
         true, true, {"", "Need it.", {{"call_0", "get_weather", "{\"city\":\"Paris\"}"}}}},
        {call, true, true, {"", "", {{"call_0", "get_weather", "{\"city\":\"Paris\"}"}}}},  // ends the reply
        {" to=functions.add<|channel|>commentary json<|message|>{\"a\": 1}", true, true,
         {"", "", {{"call_0", "add", "{\"a\":1}"}}}},
        {"<|channel|>commentary to=functions.add <|constrain|>json<|message|>{oops<|call|>", true, true,
         {"<|channel|>commentary to=functions.add <|constrain|>json<|message|>{oops", "", {}}},
        {"Just text, no header", true, true, {"Just text, no header", "", {}}},
        {"<|channel|>analysis<|message|>cut he", false, true, {"", "cut he", {}}},
    }, t);
    // Negative control: without tools offered, a call is left in the content as generated.
    const Split off = parse(call + "<|call|>", 3, false, true, t);
    EXPECT_TRUE(off.calls.empty());
    EXPECT_EQ(off.content, call);
}

// A llama3.x or mistral call is sent as soon as its JSON object is complete (while the reply
// still streams), not when the reply ends; text after the calls is content.
TEST(ChatFormat, JsonCallsAreSentOnceComplete) {
    struct Case {
        const char * tmpl;
        std::string reply;
        size_t calls_before_end;  // calls push() gave before finish()
        Split want;
    };
    const std::string l3 = "{\"name\": \"add\", \"parameters\": {\"a\": \"}{\\\"\"}}";
    const std::string ms = "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": [1]}}, "
                           "{\"name\": \"now\", \"arguments\": {}}]";
    const std::vector<Case> cases = {
        {"llama3.jinja", l3 + "\n", 1, {"", "", {{"call_0", "add", "{\"a\":\"}{\\\"\"}"}}}},
        {"llama3.jinja", l3 + " and more", 1, {"and more", "", {{"call_0", "add", "{\"a\":\"}{\\\"\"}"}}}},
        {"mistral.jinja", ms + " ", 2,
         {"", "", {{"call_0", "add", "{\"a\":[1]}"}, {"call_1", "now", "{}"}}}},
        // The second element is not a call: the first was sent, the rest is content.
        {"mistral.jinja", "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {}}, {\"x\": 1}]", 1,
         {"{\"x\": 1}]", "", {{"call_0", "add", "{}"}}}},
        {"mistral.jinja", "[TOOL_CALLS]oops", 0, {"[TOOL_CALLS]oops", "", {}}},
    };
    for (const Case & c : cases) {
        const std::string t = read_template(c.tmpl);
        for (size_t piece : {size_t(1), size_t(3), c.reply.size()}) {
            ReplyParser p(format_of(t), true, false);
            Split s;
            size_t before_end = 0;
            for (size_t i = 0; i < c.reply.size(); i += piece) {
                const ReplyDelta d = p.push(c.reply.substr(i, piece));
                s.content += d.content;
                for (const auto & k : d.calls) s.calls.push_back(k);
            }
            before_end = s.calls.size();
            const ReplyDelta d = p.finish();
            s.content += d.content;
            for (const auto & k : d.calls) s.calls.push_back(k);
            EXPECT_EQ(before_end, c.calls_before_end) << c.reply << " / piece " << piece;
            EXPECT_EQ(s.content, c.want.content) << c.reply << " / piece " << piece;
            ASSERT_EQ(s.calls.size(), c.want.calls.size()) << c.reply << " / piece " << piece;
            for (size_t k = 0; k < s.calls.size(); ++k) {
                EXPECT_EQ(s.calls[k].name, c.want.calls[k].name);
                EXPECT_EQ(s.calls[k].arguments, c.want.calls[k].arguments);
            }
        }
    }
}

// Random replies made of each family's markers and text split the same way whatever the piece
// size (the streamed split equals the whole-reply split), for every family.
TEST(ChatFormat, RandomRepliesSplitAlikeAtEveryPieceSize) {
    const std::vector<std::string> bits = {
        "<|channel|>", "analysis", "final", "commentary", " to=functions.add", " <|constrain|>json",
        "<|message|>", "<|end|>", "<|start|>", "assistant", "<|call|>", "<|return|>", "<think>\n",
        "</think>", "<tool_call>\n", "</tool_call>", "{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
        "{\"name\": \"add\", \"parameters\": {}}", "[TOOL_CALLS] [", "]", ", ", "{", "}", "\"",
        "<|python_tag|>", "<", "|", " ", "\n", "text", "é"};
    uint32_t seed = 12345;
    auto next = [&] { return seed = seed * 1103515245u + 12345u; };
    int compared = 0;
    for (const char * tmpl : {"hermes-qwen3.jinja", "llama3.jinja", "mistral.jinja", "harmony.jinja"}) {
        const std::string t = read_template(tmpl);
        for (int n = 0; n < 300; ++n) {
            std::string reply;
            const size_t len = 1 + (next() >> 8) % 12;
            for (size_t i = 0; i < len; ++i) reply += bits[(next() >> 8) % bits.size()];
            for (bool tools : {false, true}) {
                const Split whole = parse(reply, reply.size(), tools, true, t);
                for (size_t piece : {size_t(1), size_t(2), size_t(5)}) {
                    const Split s = parse(reply, piece, tools, true, t);
                    ASSERT_EQ(s.content, whole.content) << tmpl << ": " << reply << " / " << piece;
                    ASSERT_EQ(s.reasoning, whole.reasoning) << tmpl << ": " << reply << " / " << piece;
                    ASSERT_EQ(s.calls.size(), whole.calls.size()) << tmpl << ": " << reply << " / " << piece;
                    for (size_t k = 0; k < s.calls.size(); ++k)
                        ASSERT_EQ(s.calls[k].arguments, whole.calls[k].arguments) << reply;
                    ++compared;
                }
            }
        }
    }
    EXPECT_EQ(compared, 4 * 300 * 2 * 3);
}

}  // namespace
}  // namespace moestream::chat

// --- The template run by minja (chat_jinja.h) and what load_chat_format learns by probing it.
namespace moestream::chat {
namespace {

ChatFormat load_ok(const std::string & src) {
    ChatFormat f;
    std::string err;
    EXPECT_TRUE(load_chat_format(src, "<s>", "</s>", false, &f, &err)) << err;
    return f;
}

TEST(ChatTemplateLoad, FamilyIsWhereAProbeCallLands) {
    const std::string t = hermes_template();
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(load_ok(t).family, ChatFamily::kHermes);
    // Negative control: the same template writing its calls under another tag is no family.
    std::string other = t;
    for (size_t at; (at = other.find("<tool_call>")) != std::string::npos;)
        other.replace(at, 11, "<tool_use>");
    EXPECT_EQ(load_ok(other).family, ChatFamily::kNone);
}

TEST(ChatTemplateLoad, UnparsableTemplateIsRefusedNamingTheConstruct) {
    ChatFormat f;
    std::string err;
    EXPECT_FALSE(load_chat_format("{{ nothing minja parses }}", "", "", false, &f, &err));
    EXPECT_NE(err.find("Expected closing expression tag"), std::string::npos) << err;
    // A template that raises on one user message renders nothing: refused too.
    err.clear();
    EXPECT_FALSE(load_chat_format("{{ raise_exception('no way') }}", "", "", false, &f, &err));
    EXPECT_NE(err.find("no way"), std::string::npos) << err;
    // Control: a template that renders loads.
    EXPECT_TRUE(load_chat_format("{{ messages[0].content }}", "", "", false, &f, &err)) << err;
}

TEST(ChatTemplateLoad, ThinkingDefaultIsOnWhereTheSwitchChangesAMarker) {
    const ChatFormat marker =
        load_ok("{{ messages[0].content }}{% if enable_thinking %}<think>{% else %}</think>{% endif %}");
    EXPECT_TRUE(marker.thinking);
    EXPECT_TRUE(marker.thinking_default);
    const ChatFormat words = load_ok(
        "Deliberation: {% if enable_thinking %}enabled{% else %}disabled{% endif %}\n"
        "{{ messages[0].content }}");
    EXPECT_TRUE(words.thinking);
    EXPECT_FALSE(words.thinking_default);
    // Control: a template that never reads enable_thinking has no thinking.
    EXPECT_FALSE(load_ok("{{ messages[0].content }}").thinking);
}

TEST(ChatTemplateLoad, VariableThatKeepsEarlierReasoningIsSet) {
    const std::string drops =
        "{% for m in messages %}{% if m.reasoning_content and drop_thinking is defined and not "
        "drop_thinking %}[{{ m.reasoning_content }}]{% endif %}{{ m.content }}|{% endfor %}";
    const ChatFormat f = load_ok(drops);
    EXPECT_EQ(f.default_kwargs.value("drop_thinking", ojson()), ojson(false)) << f.default_kwargs.dump();
    // Controls: a template that always drops it has no such variable, and one that keeps it
    // only when a variable is true is left alone (as llama-server leaves it).
    EXPECT_TRUE(load_ok("{% for m in messages %}{{ m.content }}|{% endfor %}").default_kwargs.empty());
    const std::string keeps_when_true =
        "{% for m in messages %}{% if m.reasoning_content and preserved_thinking is defined and "
        "preserved_thinking %}[{{ m.reasoning_content }}]{% endif %}{{ m.content }}|{% endfor %}";
    EXPECT_TRUE(load_ok(keeps_when_true).default_kwargs.empty());
}

TEST(ChatJinja, MessagesReachTheTemplateAsLlamaServerGivesThem) {
    std::string err;
    auto t = JinjaTemplate::parse(
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}"
        "={{ m.tool_calls[0].function.arguments.city }}{% endif %};{% endfor %}{{ bos_token }}",
        "<s>", "</s>", &err);
    ASSERT_TRUE(t) << err;
    const ojson msgs = ojson::parse(
        R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]}])");
    std::string out;
    ASSERT_TRUE(t->render(msgs, ojson(), false, ojson::object(), &out, &err)) << err;
    // Parts joined, null content as "", arguments as the object they hold.
    EXPECT_EQ(out, "user:ab;assistant:=Paris;<s>");
    // Control: a template error is returned, not thrown.
    auto bad = JinjaTemplate::parse("{{ raise_exception('stop here') }}", "", "", &err);
    ASSERT_TRUE(bad) << err;
    EXPECT_FALSE(bad->render(msgs, ojson(), true, ojson::object(), &out, &err));
    EXPECT_NE(err.find("stop here"), std::string::npos) << err;
}

// load_chat_format skips the start-up cross-check for moestream's own chatml template only:
// the check itself finds minja and Python's Jinja agree on it (minja stays its renderer).
TEST(ChatJinja, BuiltInChatmlRendersAlikeInMinjaAndPython) {
    std::string err;
    auto t = JinjaTemplate::parse(kChatmlTemplate, "", "", &err);
    ASSERT_TRUE(t) << err;
    EXPECT_EQ(t->renderer(), "minja");
    // Negative control: the same check on a template minja renders differently (spaces before
    // a {{ ... }} that starts a line: minja drops them, Python's Jinja keeps them) hands it to
    // Python's Jinja.
    auto differs = JinjaTemplate::parse("A\n  {{ messages[0].content }}", "", "", &err);
    ASSERT_TRUE(differs) << err;
    EXPECT_EQ(differs->renderer(), "python3-jinja2");
}

}  // namespace
}  // namespace moestream::chat

namespace moestream::chat {
namespace {

// A real vendor template from ../shared/templates ("" when that folder is absent).
std::string shared_template(const std::string & file) {
    return read_text(moestream::test::src_dir() + "/../shared/templates/" + file);
}

// A call as a model of the family writes it, what it parses to, and another family's call.
struct FamilyCase {
    const char * file;
    ChatFamily family;
    std::string reply;  // "Checking." then the call(s)
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
    std::string reasoning;  // what the reply's thinking block holds
};

// The reply splits into content, reasoning and these calls at every piece size; another
// family's call text is no call (kept as content) and without tools nothing is a call.
// (The template: ../shared/templates/FILE, or `text` when given.)
void expect_family(const FamilyCase & c, const std::string & other_call, std::string t = "") {
    if (t.empty()) t = shared_template(c.file);
    if (t.empty()) GTEST_SKIP() << "../shared/templates/" << c.file << " is absent";
    const ChatFormat & f = format_of(t);
    ASSERT_EQ(f.family, c.family) << f.name;
    for (size_t piece : {size_t(1), size_t(5), c.reply.size()}) {
        Split s = parse(c.reply, piece, true, true, t);
        ASSERT_EQ(s.calls.size(), c.calls.size()) << piece << " " << s.content;
        for (size_t i = 0; i < c.calls.size(); ++i) {
            EXPECT_EQ(s.calls[i].name, c.calls[i].first);
            EXPECT_EQ(s.calls[i].arguments, c.calls[i].second);
        }
        EXPECT_EQ(s.reasoning, c.reasoning) << piece;
        EXPECT_EQ(s.content, "Checking.") << piece;
        s = parse(other_call, piece, true, false, t);  // negative control: another family
        EXPECT_TRUE(s.calls.empty()) << piece;
        s = parse(c.reply, piece, false, false, t);  // control: no tools offered
        EXPECT_TRUE(s.calls.empty()) << piece;
    }
}

const std::string kHermesCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const std::string kGlmCall =
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";

TEST(ChatFormatFamilies, GlmArgKeyCallsAreParsed) {
    expect_family({"GLM-4.6.jinja", ChatFamily::kGlm, "<think>Need weather.</think>\nChecking.\n" + kGlmCall,
                   {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}}, "Need weather."},
                  kHermesCall);
}

TEST(ChatFormatFamilies, DeepseekV31CallsAreParsedAfterThePromptsThinkOpener) {
    // The prompt ends with <think>: the reply starts inside the thinking block.
    expect_family({"deepseek-ai-DeepSeek-V3.1.jinja", ChatFamily::kDeepseek,
                   "Need weather.</think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                   "<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
                   "<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                   {{"get_weather", "{\"city\":\"Paris\"}"}, {"get_time", "{}"}}, "Need weather."},
                  kGlmCall);
}

TEST(ChatFormatFamilies, DeepseekV4DsmlCallsAreParsed) {
    expect_family({"deepseek-ai-DeepSeek-V4.jinja", ChatFamily::kDsml,
                   "Need weather.</think>\n\nChecking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                   "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
                   "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
                   {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}}, "Need weather."},
                  "<minimax:tool_call>\n<invoke name=\"get_weather\">\n</invoke>\n</minimax:tool_call>");
}

TEST(ChatFormatFamilies, KimiK2SectionCallsAreParsed) {
    expect_family({"moonshotai-Kimi-K2.jinja", ChatFamily::kKimi,
                   "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                   "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
                   "<|tool_calls_section_end|>",
                   {{"get_weather", "{\"city\":\"Paris\"}"}}, ""},
                  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}"
                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
}

// DeepSeek and Kimi write all of a reply's calls in one block: each call is sent (a
// ReplyDelta with it) as soon as it ends, before the next one and the block's end are read.
// Templates that write a call the way each family's real one does (the family is where it lands).
TEST(ChatFormatFamilies, EachCallOfABlockIsSentWhenItEnds) {
    struct Case {
        std::string tmpl, open, first, second, close;
    };
    const std::string content = "{% else %}{{ m.content }}{% endif %}{% endfor %}";
    const Case cases[] = {
        {"{% for m in messages %}{% if m.tool_calls %}<｜tool▁calls▁begin｜>{% for c in m.tool_calls %}"
         "<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments | tojson }}"
         "<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>" + content,
         "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>",
         "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"},
        {"{% for m in messages %}{% if m.tool_calls %}<|tool_calls_section_begin|>{% for c in m.tool_calls %}"
         "<|tool_call_begin|>functions.{{ c.function.name }}:{{ loop.index0 }}<|tool_call_argument_begin|>"
         "{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>" + content,
         "<|tool_calls_section_begin|>",
         "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>",
         "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>",
         "<|tool_calls_section_end|>"},
    };
    for (const Case & c : cases) {
        const ChatFormat & f = format_of(c.tmpl);
        ASSERT_TRUE(f.family == ChatFamily::kDeepseek || f.family == ChatFamily::kKimi) << f.name;
        ReplyParser p(f, true, false);
        ReplyDelta d = p.push("Checking." + c.open + c.first);
        EXPECT_EQ(d.content, "Checking.");
        ASSERT_EQ(d.calls.size(), 1u) << f.name;
        EXPECT_EQ(d.calls[0].name, "get_weather");
        EXPECT_EQ(d.calls[0].arguments, "{\"city\":\"Paris\"}");
        d = p.push(c.second);
        ASSERT_EQ(d.calls.size(), 1u) << f.name;
        EXPECT_EQ(d.calls[0].name, "get_time");
        EXPECT_EQ(d.calls[0].id, "call_1");
        d = p.push(c.close + " Done.");
        const ReplyDelta end = p.finish();
        EXPECT_TRUE(d.calls.empty() && end.calls.empty());
        EXPECT_EQ(d.content + end.content, "Done.");
        // Negative control: text in the block that is not a call sends nothing and is content
        // as generated, marker included.
        ReplyParser q(f, true, false);
        const std::string bad = c.open + "not a call" + c.first + c.close;
        d = q.push(bad);
        const ReplyDelta bad_end = q.finish();
        EXPECT_TRUE(d.calls.empty() && bad_end.calls.empty()) << f.name;
        EXPECT_EQ(d.content + bad_end.content, bad);
    }
}

TEST(ChatFormatFamilies, MinimaxInvokeCallsAreParsed) {
    expect_family({"MiniMax-M2.jinja", ChatFamily::kMinimax,
                   "<think>\nNeed weather.\n</think>\n\nChecking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
                   "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n"
                   "</invoke>\n</minimax:tool_call>",
                   {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}}, "Need weather."},
                  kHermesCall);
}

TEST(ChatFormatFamilies, SeedOssCallsAreParsed) {
    expect_family({"ByteDance-Seed-OSS.jinja", ChatFamily::kSeed,
                   "<seed:think>Need weather.</seed:think>Checking.<seed:tool_call>\n<function=get_weather>\n"
                   "<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>",
                   {{"get_weather", "{\"city\":\"Paris\"}"}}, "Need weather."},
                  "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                  "</function>\n</tool_call>");
}

TEST(ChatFormatFamilies, Lfm2PythonCallListIsParsed) {
    // The template prints no assistant call: the family is known from its tool list markers.
    expect_family({"LFM2-8B-A1B.jinja", ChatFamily::kLfm2,
                   "Checking.<|tool_call_start|>[get_weather(city=\"Paris\", days=2, metric=True, "
                   "opts={'units': 'C', 'tags': ['a', \"b\"]}), get_time()]<|tool_call_end|>",
                   {{"get_weather", "{\"city\":\"Paris\",\"days\":2,\"metric\":true,\"opts\":{\"units\":"
                                    "\"C\",\"tags\":[\"a\",\"b\"]}}"},
                    {"get_time", "{}"}},
                   ""},
                  kHermesCall);
}

// Command-R7B's real template (tests/api/templates: the tool-use template of
// CohereForAI/c4ai-command-r7b-12-2024, as llama.cpp tests with it): its plan is reasoning, its
// action list the calls, and the markers around its answer are not content.
const char kCommandRTemplate[] = "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja";

TEST(ChatFormatFamilies, CommandRActionListIsParsed) {
    expect_family({kCommandRTemplate, ChatFamily::kCommandR,
                   "<|START_THINKING|>Need weather.<|END_THINKING|><|START_RESPONSE|>Checking."
                   "<|END_RESPONSE|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": "
                   "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}},\n    {\"tool_call_id\": "
                   "\"1\", \"tool_name\": \"get_time\", \"parameters\": {}}\n]<|END_ACTION|>",
                   {{"get_weather", "{\"city\":\"Paris\"}"}, {"get_time", "{}"}}, "Need weather."},
                  kHermesCall, read_template(kCommandRTemplate));
}

// The call parsed from a reply and its result go back to the model in its own syntax.
TEST(ChatFormatFamilies, CommandRCallAndResultRenderBack) {
    const ChatFormat & f = format_of(read_template(kCommandRTemplate));
    ASSERT_EQ(f.family, ChatFamily::kCommandR) << f.name;
    ReplyParser p(f, true, false);
    ReplyDelta d = p.push("<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
                          "\"parameters\": {\"city\": \"Paris\"}}]<|END_ACTION|>");
    ASSERT_EQ(d.calls.size(), 1u);
    RenderInput in;
    in.messages = {{"user", "Weather in Paris?", "", {}, ""},
                   {"assistant", "", "", d.calls, ""},
                   {"tool", "{\"temp_c\": 21}", "", {}, d.calls[0].id}};
    in.add_generation_prompt = true;
    std::string out, err;
    ASSERT_TRUE(render_chat_format(f, in, &out, &err)) << err;
    const size_t user = out.find("Weather in Paris?");
    ASSERT_NE(user, std::string::npos);
    EXPECT_NE(out.find("\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}", user),
              std::string::npos) << out.substr(user);
    const std::string result = "\"tool_call_id\": \"0\",\n        \"results\": {\n            \"0\": "
                               "\"{\\\"temp_c\\\": 21}\"";
    EXPECT_NE(out.find(result, user), std::string::npos) << out.substr(user);
    // Control: without the tool turn there is no result.
    in.messages.pop_back();
    ASSERT_TRUE(render_chat_format(f, in, &out, &err)) << err;
    EXPECT_EQ(out.find(result), std::string::npos);
}

// Where the generation prompt opens the thinking block (DeepSeek-R1 distills, QwQ,
// Nemotron-3: "<think>\n"), the reply up to </think> is reasoning, also for a template outside
// the parsed families; a template without thinking keeps such text as content.
TEST(ChatFormatFamilies, ReplyAfterAPromptThatOpensThinkingIsReasoning) {
    for (const char * file : {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "Qwen-QwQ-32B.jinja",
                              "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja"}) {
        const std::string t = shared_template(file);
        if (t.empty()) GTEST_SKIP() << "../shared/templates/" << file << " is absent";
        EXPECT_TRUE(format_of(t).think_opened) << file;
        for (size_t piece : {size_t(1), size_t(4), size_t(100)}) {
            const Split s = parse("Let me see.\n</think>\n\nHello.", piece, false, true, t);
            EXPECT_EQ(s.reasoning, "Let me see.") << file << " " << piece;
            EXPECT_EQ(s.content, "Hello.") << file << " " << piece;
        }
    }
    const std::string t = shared_template("Qwen-Qwen2.5-7B-Instruct.jinja");  // control
    if (t.empty()) GTEST_SKIP() << "../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja is absent";
    EXPECT_FALSE(format_of(t).think_opened);
    const Split s = parse("Let me see.\n</think>\n\nHello.", 3, false, true, t);
    EXPECT_EQ(s.reasoning, "");
    EXPECT_EQ(s.content, "Let me see.\n</think>\n\nHello.");
}

}  // namespace
}  // namespace moestream::chat
