// test_chat_format.cpp — the server's chat-format layer (tools/server/chat_format*): family
// recognition by fingerprint, template-style JSON, and the reply parser, which must split a
// reply the same way however it is cut into pieces. Rendering itself is checked against
// llama-server by tests/api/template_fidelity.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "chat_format.h"

namespace moestream::server {
namespace {

std::string read_template(const std::string & name) {
    const char * e = std::getenv("MOESTREAM_SRC");
    std::ifstream f(std::string(e && *e ? e : MOESTREAM_TEST_SRC) + "/tests/api/templates/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
std::string hermes_template() {
    return read_template("hermes-qwen3.jinja");
}

TEST(ChatFormat, HermesRecognisedOnlyWithEveryFingerprintPiece) {
    const std::string t = hermes_template();
    ASSERT_FALSE(t.empty());
    const ChatFormat f = detect_chat_format(t);
    EXPECT_EQ(f.family, ChatFamily::kHermes);
    EXPECT_TRUE(f.tools);
    EXPECT_TRUE(f.thinking);
    EXPECT_EQ(f.name.rfind("hermes-qwen3", 0), 0u) << f.name;
    // Reworded tool prompt: not the family (the renderer would write other words).
    std::string reworded = t;
    const std::string s = "You may call one or more functions";
    reworded.replace(reworded.find(s), s.size(), "You can call functions");
    EXPECT_EQ(detect_chat_format(reworded).family, ChatFamily::kNone);
    // Without the thinking pieces: the family without thinking.
    std::string no_think = t;
    for (size_t p; (p = no_think.find("enable_thinking")) != std::string::npos;)
        no_think.replace(p, 15, "other_flag");
    const ChatFormat nt = detect_chat_format(no_think);
    EXPECT_EQ(nt.family, ChatFamily::kHermes);
    EXPECT_FALSE(nt.thinking);
    EXPECT_EQ(detect_chat_format("{{ messages }}").family, ChatFamily::kNone);
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
    ReplyParser p(detect_chat_format(tmpl), tools, thinking);
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

TEST(ChatFormat, ReplyParserSplitsAlikeForEveryPieceSize) {
    const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                             "{\"city\": \"Paris\"}}\n</tool_call>";
    struct Case {
        std::string reply;
        bool tools, thinking;
        Split want;
    };
    const std::vector<Case> cases = {
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
    };
    for (const Case & c : cases) {
        for (size_t piece : {size_t(1), size_t(2), size_t(7), c.reply.size()}) {
            const Split s = parse(c.reply, piece, c.tools, c.thinking);
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
    // Negative control: without tools offered, a call is left in the content.
    const Split off = parse(call, 3, false, false);
    EXPECT_TRUE(off.calls.empty());
    EXPECT_EQ(off.content, call);
}

TEST(ChatFormat, Llama3ReplyIsOneJsonCallOrText) {
    const std::string t = read_template("llama3.jinja");
    const ChatFormat f = detect_chat_format(t);
    ASSERT_EQ(f.family, ChatFamily::kLlama3) << f.name;
    EXPECT_FALSE(f.thinking);
    EXPECT_EQ(detect_chat_format(hermes_template()).family, ChatFamily::kHermes) << "not llama3";
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
    ASSERT_EQ(detect_chat_format(t).family, ChatFamily::kMistral);
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

}  // namespace
}  // namespace moestream::server
