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

std::string hermes_template() {
    const char * e = std::getenv("MOESTREAM_SRC");
    std::ifstream f(std::string(e && *e ? e : MOESTREAM_TEST_SRC) +
                    "/tests/api/templates/hermes-qwen3.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
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

Split parse(const std::string & reply, size_t piece, bool tools, bool thinking) {
    ReplyParser p(detect_chat_format(hermes_template()), tools, thinking);
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

}  // namespace
}  // namespace moestream::server
