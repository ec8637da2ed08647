// test_chat_template.cpp — the library's chat template choice (src/engine/chat_template):
// a recognised template is used and named after its llama.cpp family, a model without one
// gets chatml and says so, and an unrecognised one is refused, never replaced by chatml.
#include <gtest/gtest.h>

#include "chat_template.h"

namespace moestream::test {
namespace {

const std::vector<ChatMessage> kChat = {{"system", "S"}, {"user", "Hi"}};

TEST(ChatTemplate, RecognisedTemplateIsUsedAndNamed) {
    // The shape of Llama 3's template: llama.cpp recognises it by its header tokens.
    const char * llama3 =
        "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>"
        "\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}";
    const ChatTemplate t = choose_chat_template(llama3);
    ASSERT_TRUE(t.usable) << t.why;
    EXPECT_EQ(t.name.rfind("llama3", 0), 0u) << t.name;
    std::string out;
    ASSERT_TRUE(render_chat(t, kChat, true, &out).ok());
    EXPECT_NE(out.find("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("<|im_start|>"), std::string::npos) << "not chatml";
}

TEST(ChatTemplate, NoTemplateIsChatmlAndSaysSo) {
    const ChatTemplate t = choose_chat_template(nullptr);
    ASSERT_TRUE(t.usable);
    EXPECT_NE(t.name.find("no chat template"), std::string::npos) << t.name;
    std::string out;
    ASSERT_TRUE(render_chat(t, kChat, true, &out).ok());
    EXPECT_EQ(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n");
}

TEST(ChatTemplate, UnrecognisedTemplateIsRefusedNotChatml) {
    const ChatTemplate t = choose_chat_template("{{ something llama.cpp has never seen }}");
    EXPECT_FALSE(t.usable);
    std::string out = "untouched";
    Status st = render_chat(t, kChat, true, &out);
    EXPECT_EQ(st.code(), ErrorCode::kBadInput);
    EXPECT_NE(st.message().find("not one of the families"), std::string::npos) << st.message();
    EXPECT_EQ(out, "untouched");
}

TEST(ChatTemplate, NulInAMessageIsRefusedByIndex) {
    const ChatTemplate t = choose_chat_template(nullptr);
    std::vector<ChatMessage> m = kChat;
    std::string out;
    EXPECT_TRUE(render_chat(t, m, true, &out).ok()) << "control";
    m[1].content = std::string("a\0b", 3);
    Status st = render_chat(t, m, true, &out);
    EXPECT_EQ(st.code(), ErrorCode::kBadInput);
    EXPECT_NE(st.message().find("messages[1]"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace moestream::test
