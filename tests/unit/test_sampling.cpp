// test_sampling.cpp — Engine::generate(GenerateRequest) sampling and stopping on a synth model
// (byte-level vocabulary: one token per byte, so every multi-byte string spans tokens):
// penalties, logit_bias, ignore_eos, grammar, stop strings, near-zero temperatures, the
// context limit, and the validation of every field. Each test has a negative control: the
// same request without the feature behaves as the baseline, so the assertion can fail.
#include <cmath>
#include <limits>
#include <memory>

#include "moestream/moestream.h"
#include "moestream/utf8.h"
#include "sampler.h"
#include "stop_strings.h"
#include "test_util.h"

namespace moestream::test {
namespace {

constexpr const char * kPrompt = "Once upon a time there was";

class Sampling : public ::testing::Test {
public:
    static void SetUpTestSuite() {
        RunOptions o;
        o.model_path = synth_model("tiny", "qwen3moe", "q4_k");
        o.n_ctx = 128;
        Status st = Engine::open(o, &engine_);
        ASSERT_TRUE(st.ok()) << st.message();
    }
    static void TearDownTestSuite() { engine_.reset(); }

    static GenerateRequest req(int n = 24) {
        GenerateRequest r;
        r.prompt = kPrompt;
        r.n_predict = n;
        return r;
    }
    static GenerateResult run(const GenerateRequest & r, std::string * streamed = nullptr) {
        GenerateResult g;
        Status st = engine_->generate(
            r,
            [&](const std::string & piece) {
                if (streamed) *streamed += piece;
                return true;
            },
            &g);
        EXPECT_TRUE(st.ok()) << st.message();
        return g;
    }
    static Status status_of(const GenerateRequest & r) {
        GenerateResult g;
        return engine_->generate(r, nullptr, &g);
    }
    static std::unique_ptr<Engine> engine_;
};
std::unique_ptr<Engine> Sampling::engine_;

// ---- StopMatcher (pure) -----------------------------------------------------------------

TEST(StopMatcher, MatchAcrossPiecesReleasesOnlyTheTextBefore) {
    StopMatcher m({"o W"});
    std::string out = m.push("Hel");
    out += m.push("lo");  // "o" may start the stop string: held back
    EXPECT_EQ(out, "Hell");
    out += m.push(" Wor");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.matched(), "o W");
    EXPECT_EQ(out + m.flush(), "Hell");
    // Control: without stop strings the same pieces pass through whole.
    StopMatcher none;
    EXPECT_EQ(none.push("Hel") + none.push("lo") + none.push(" Wor"), "Hello Wor");
    EXPECT_FALSE(none.stopped());
}

TEST(StopMatcher, HeldBackPrefixIsReleasedWhenItDoesNotMatch) {
    StopMatcher m({"abc"});
    EXPECT_EQ(m.push("xab"), "x");
    EXPECT_EQ(m.push("d"), "abd");
    EXPECT_EQ(m.push("ab"), "");
    EXPECT_EQ(m.flush(), "ab") << "the end of the stream releases what was held";
    EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopStringsWins) {
    StopMatcher m({"cd", "bcx", "b"});
    EXPECT_EQ(m.push("abcd"), "a");
    EXPECT_EQ(m.matched(), "b");
}

// ---- Engine ---------------------------------------------------------------------------

// GenerateRequest::on_prefill: called once per prompt micro-batch (-b 8: a 60-token prompt is
// 8 of them) with the tokens done; returning false at the first stops there, before the
// second micro-batch, with nothing generated, and the next generation (reusing the KV it can)
// gives the same tokens as an uninterrupted one. The stop is a callback's answer, not a time.
TEST(Prefill, OnPrefillSeesEachMicroBatchAndFalseStopsBeforeTheNext) {
    RunOptions o;
    o.model_path = synth_model("tiny", "qwen3moe", "q4_k");
    o.n_ctx = 128;
    o.n_batch = 8;
    std::unique_ptr<Engine> e;
    ASSERT_TRUE(Engine::open(o, &e).ok());
    GenerateRequest r;
    r.prompt = std::string(60, 'a');
    r.n_predict = 4;
    std::vector<std::pair<int, int>> calls;
    r.on_prefill = [&](int done, int total) {
        calls.emplace_back(done, total);
        return true;
    };
    GenerateResult full;
    ASSERT_TRUE(e->generate(r, nullptr, &full).ok());
    ASSERT_EQ(calls.size(), 8u) << "control: eight micro-batches of 8 for 60 tokens";
    EXPECT_EQ(calls[0], std::make_pair(8, 60));
    EXPECT_EQ(calls.back(), std::make_pair(60, 60));
    EXPECT_EQ(full.tokens.size(), 4u);
    calls.clear();
    r.on_prefill = [&](int done, int total) {
        calls.emplace_back(done, total);
        return false;  // as Ctrl-C after the first micro-batch
    };
    GenerateResult stopped;
    ASSERT_TRUE(e->generate(r, nullptr, &stopped).ok());
    EXPECT_EQ(calls.size(), 1u) << "stopped before the second micro-batch";
    EXPECT_EQ(stopped.finish, FinishReason::kCancelled);
    EXPECT_TRUE(stopped.tokens.empty());
    EXPECT_EQ(e->stats().n_generated, 0);
    r.on_prefill = nullptr;
    r.reuse_prefix = true;
    GenerateResult again;
    ASSERT_TRUE(e->generate(r, nullptr, &again).ok());
    EXPECT_EQ(again.tokens, full.tokens) << "the partial KV was not taken for a prompt";
}

TEST_F(Sampling, StopStringAcrossTokensEndsBeforeIt) {
    const GenerateResult base = run(req());
    ASSERT_GE(base.text.size(), 12u);
    const std::string stop = base.text.substr(6, 3);  // three tokens of the greedy output
    const size_t at = base.text.find(stop);
    GenerateRequest r = req();
    r.stop = {stop};
    std::string streamed;
    const GenerateResult g = run(r, &streamed);
    EXPECT_EQ(g.finish, FinishReason::kStop);
    EXPECT_EQ(g.stop_string, stop);
    EXPECT_EQ(g.text, base.text.substr(0, at));
    EXPECT_EQ(streamed, g.text) << "on_piece saw exactly the released text";
    EXPECT_EQ(g.tokens.size(), at + stop.size()) << "generation ends at the stop's last token";
    // Control: a stop string that never occurs changes nothing.
    r.stop = {"\x01\x02\x03 not in the output"};
    const GenerateResult c = run(r, nullptr);
    EXPECT_EQ(c.text, base.text);
    EXPECT_EQ(c.finish, FinishReason::kLength);
}

TEST_F(Sampling, HeldBackTextIsReleasedAtTheEnd) {
    const GenerateResult base = run(req(8));
    // A stop string that begins with the output's last two bytes and then differs.
    GenerateRequest r = req(8);
    r.stop = {base.text.substr(6, 2) + "\x01"};
    std::string streamed;
    const GenerateResult g = run(r, &streamed);
    EXPECT_EQ(g.finish, FinishReason::kLength);
    EXPECT_EQ(g.text, base.text);
    EXPECT_EQ(streamed, base.text);
}

// `off` must give the greedy baseline (the negative control) and `on` another output.
void expect_changes_output(const GenerateRequest & off, const GenerateRequest & on) {
    const GenerateResult base = Sampling::run(Sampling::req());
    EXPECT_EQ(Sampling::run(off).tokens, base.tokens) << "control";
    EXPECT_NE(Sampling::run(on).tokens, base.tokens);
}

TEST_F(Sampling, RepeatPenaltyChangesGreedyOutput) {
    GenerateRequest off = req(), on = req();
    off.sampling.repeat_penalty = 1.0f;  // 1 = off
    on.sampling.repeat_penalty = 2.0f;
    expect_changes_output(off, on);
}

TEST_F(Sampling, FrequencyPenaltyChangesGreedyOutput) {
    GenerateRequest off = req(), on = req();
    off.sampling.frequency_penalty = 0.0f;
    on.sampling.frequency_penalty = 2.0f;
    expect_changes_output(off, on);
}

TEST_F(Sampling, PresencePenaltyChangesGreedyOutput) {
    GenerateRequest off = req(), on = req();
    off.sampling.presence_penalty = on.sampling.presence_penalty = 2.0f;
    off.sampling.repeat_last_n = 0;  // an empty window turns every penalty off
    expect_changes_output(off, on);
}

TEST_F(Sampling, LogitBiasForcesAndBansTokens) {
    const GenerateResult base = run(req(6));
    GenerateRequest r = req(6);
    r.sampling.logit_bias = {{'Z', 0.0f}};  // control: no bias
    EXPECT_EQ(run(r).tokens, base.tokens);
    r.sampling.logit_bias = {{'Z', 1000.0f}};
    EXPECT_EQ(run(r).text, "ZZZZZZ");
    r.sampling.logit_bias = {{base.tokens[0], -std::numeric_limits<float>::infinity()}};
    const GenerateResult banned = run(r);
    for (int32_t t : banned.tokens) EXPECT_NE(t, base.tokens[0]);
}

TEST_F(Sampling, IgnoreEosKeepsGoingPastEndOfGeneration) {
    GenerateRequest r = req(6);
    r.sampling.logit_bias = {{256, 1000.0f}};  // <|endoftext|>, the synth model's EOS
    const GenerateResult eos = run(r);
    EXPECT_EQ(eos.finish, FinishReason::kEos);
    EXPECT_TRUE(eos.tokens.empty());
    r.sampling.ignore_eos = true;
    const GenerateResult g = run(r);
    EXPECT_EQ(g.finish, FinishReason::kLength);
    EXPECT_EQ(g.tokens.size(), 6u);
}

TEST_F(Sampling, GrammarConstrainsOutput) {
    GenerateRequest r = req(12);
    const GenerateResult base = run(r);
    EXPECT_NE(base.text.find_first_not_of("ab"), std::string::npos) << "control: free output";
    r.sampling.grammar = "root ::= [ab]+ \"!\"";
    const GenerateResult g = run(r);
    EXPECT_FALSE(g.text.empty());
    EXPECT_EQ(g.text.find_first_not_of("ab!"), std::string::npos) << g.text;
    if (g.finish == FinishReason::kEos) {  // the grammar ends only after its "!"
        EXPECT_EQ(g.text.back(), '!') << g.text;
    }
}

TEST_F(Sampling, FiniteGrammarEndsWithEndOfGeneration) {
    GenerateRequest r = req(12);
    r.sampling.grammar = "root ::= \"yes\" | \"no\"";
    r.sampling.temp = 1.0f;
    const GenerateResult g = run(r);
    EXPECT_TRUE(g.text == "yes" || g.text == "no") << g.text;
    EXPECT_EQ(g.finish, FinishReason::kEos);
}

TEST_F(Sampling, BadGrammarIsRefusedByName) {
    GenerateRequest r = req(4);
    r.sampling.grammar = "root ::= (\"a\"";
    Status st = status_of(r);
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_NE(st.message().find("grammar"), std::string::npos) << st.message();
    r.sampling.grammar = "other ::= \"a\"";  // no root rule
    EXPECT_EQ(status_of(r).code(), ErrorCode::kUsage);
    r.sampling.grammar = "root ::= \"a\"";  // control
    EXPECT_TRUE(status_of(r).ok());
}

// llama.cpp's grammar parser recurses per nested group: 20,000 levels overflowed the stack
// (a server died of one request). The limit is checked before llama.cpp sees the text.
TEST_F(Sampling, GrammarNestedDeeperThanTheLimitIsRefusedByName) {
    auto nested = [](int depth) {
        return "root ::= " + std::string(size_t(depth), '(') + "\"a\"" +
               std::string(size_t(depth), ')');
    };
    GenerateRequest r = req(2);
    r.sampling.grammar = nested(20000);
    Status st = status_of(r);
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_EQ(st.message().rfind("grammar: groups nest more than 256 deep at line 1, column 266", 0), 0u)
        << st.message();
    r.sampling.grammar = nested(257);
    EXPECT_EQ(status_of(r).code(), ErrorCode::kUsage);
    // Controls: the limit itself, and parentheses that are text, a class or a comment.
    r.sampling.grammar = nested(256);
    EXPECT_TRUE(status_of(r).ok()) << status_of(r).message();
    r.sampling.grammar = "root ::= \"" + std::string(300, '(') + "\\\"\" [(\\]] # " +
                         std::string(300, '(') + "\n";
    EXPECT_TRUE(check_grammar_limits(r.sampling.grammar).ok())
        << check_grammar_limits(r.sampling.grammar).message();
}

TEST_F(Sampling, GrammarLargerThanTheLimitIsRefusedByName) {
    std::string g = "root ::= \"a\"\n";
    g += "# " + std::string(kMaxGrammarBytes - g.size() - 3, 'x') + "\n";
    EXPECT_TRUE(check_grammar_limits(g).ok());  // control: the limit itself
    g += "x";
    Status st = check_grammar_limits(g);
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_EQ(st.message().rfind("grammar: 1048577 bytes", 0), 0u) << st.message();
}

TEST_F(Sampling, GrammarWithEveryTokenBannedIsAnErrorNotAnAbort) {
    GenerateRequest r = req(4);
    r.sampling.grammar = "root ::= \"a\"+";
    const std::string free_text = run(r).text;
    EXPECT_TRUE(!free_text.empty() && free_text.find_first_not_of('a') == std::string::npos)
        << "control: the grammar alone produces a's: " << free_text;
    r.sampling.logit_bias = {{'a', -std::numeric_limits<float>::infinity()}};
    for (float temp : {0.0f, 1.0f}) {
        r.sampling.temp = temp;
        Status st = status_of(r);
        EXPECT_EQ(st.code(), ErrorCode::kBadInput) << st.message();
        EXPECT_NE(st.message().find("no token is allowed"), std::string::npos) << st.message();
    }
}

TEST_F(Sampling, TinyTemperatureIsGreedy) {
    const GenerateResult greedy = run(req());
    GenerateRequest r = req();
    r.sampling.temp = 1e-45f;
    r.sampling.seed = 3;
    EXPECT_EQ(run(r).tokens, greedy.tokens);
    r.sampling.temp = 1.5f;  // control: a real temperature draws something else
    EXPECT_NE(run(r).tokens, greedy.tokens);
}

TEST_F(Sampling, MinPOneIsGreedy) {
    const GenerateResult greedy = run(req());
    GenerateRequest r = req();
    r.sampling.temp = 1.5f;
    r.sampling.seed = 3;
    const GenerateResult drawn = run(r);
    EXPECT_NE(drawn.tokens, greedy.tokens) << "control: the draw differs from greedy";
    r.sampling.min_p = 1.0f;  // only the most likely token survives
    EXPECT_EQ(run(r).tokens, greedy.tokens);
}

TEST_F(Sampling, UntilTheContextIsFull) {
    GenerateRequest r = req(-1);
    r.sampling.ignore_eos = true;
    const GenerateResult g = run(r);
    const int n_prompt = engine_->stats().n_prompt;
    EXPECT_EQ(int(g.tokens.size()), 128 - n_prompt);
    EXPECT_EQ(g.finish, FinishReason::kLength);
    r.n_predict = 1000;  // more than the context holds
    EXPECT_EQ(status_of(r).code(), ErrorCode::kUsage);
    r.clamp_to_context = true;
    EXPECT_EQ(run(r).tokens.size(), g.tokens.size());
    r.n_predict = 4;  // control: a request that fits is not clamped
    EXPECT_EQ(run(r).tokens.size(), 4u);
}

TEST_F(Sampling, PromptLongerThanTheContextIsBadInput) {
    GenerateRequest r = req(1);
    r.prompt = std::string(200, 'x');
    Status st = status_of(r);
    EXPECT_EQ(st.code(), ErrorCode::kBadInput);
    EXPECT_NE(st.message().find("does not fit the context (128 tokens)"), std::string::npos)
        << st.message();
    r.prompt = std::string(100, 'x');  // control
    EXPECT_TRUE(status_of(r).ok());
}

struct BadField {
    const char * field;
    void (*set)(GenerateRequest &);
};

TEST_F(Sampling, EveryFieldIsValidatedByName) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    static float s_nan;
    s_nan = nan;
    const BadField cases[] = {
        {"temperature", [](GenerateRequest & r) { r.sampling.temp = -0.5f; }},
        {"temperature", [](GenerateRequest & r) { r.sampling.temp = s_nan; }},
        {"top_k", [](GenerateRequest & r) { r.sampling.top_k = -1; }},
        {"top_p", [](GenerateRequest & r) { r.sampling.top_p = 0.0f; }},
        {"min_p", [](GenerateRequest & r) { r.sampling.min_p = 1.5f; }},
        {"repeat_penalty", [](GenerateRequest & r) { r.sampling.repeat_penalty = 0.0f; }},
        {"repeat_last_n", [](GenerateRequest & r) { r.sampling.repeat_last_n = -2; }},
        {"presence_penalty", [](GenerateRequest & r) { r.sampling.presence_penalty = 2.5f; }},
        {"frequency_penalty", [](GenerateRequest & r) { r.sampling.frequency_penalty = s_nan; }},
        {"logit_bias", [](GenerateRequest & r) { r.sampling.logit_bias = {{259 + 100000, 1}}; }},
        {"logit_bias", [](GenerateRequest & r) { r.sampling.logit_bias = {{-1, 1}}; }},
        {"logit_bias", [](GenerateRequest & r) { r.sampling.logit_bias = {{'a', s_nan}}; }},
        {"ignore_eos", [](GenerateRequest & r) {
             r.sampling.ignore_eos = true;
             r.sampling.grammar = "root ::= \"a\"";
         }},
        {"stop[1]", [](GenerateRequest & r) { r.stop = {"x", ""}; }},
        {"n_predict", [](GenerateRequest & r) { r.n_predict = -2; }},
    };
    EXPECT_TRUE(status_of(req(2)).ok()) << "control: the defaults are valid";
    for (const BadField & c : cases) {
        GenerateRequest r = req(2);
        c.set(r);
        Status st = status_of(r);
        EXPECT_EQ(st.code(), ErrorCode::kUsage) << c.field;
        EXPECT_NE(st.message().find(c.field), std::string::npos)
            << c.field << ": " << st.message();
    }
}

}  // namespace
}  // namespace moestream::test

namespace moestream::test {
namespace {

bool valid_utf8(const std::string & s) {
    return utf8_valid_upto(s) == long(s.size());
}

// With a grammar the output is valid UTF-8 even where the grammar's character class would
// let byte tokens form an invalid sequence; the control: the same draws without the grammar's
// UTF-8 rule (free text) are not.
TEST_F(Sampling, GrammarOutputIsValidUtf8) {
    int free_invalid = 0;
    for (uint32_t seed = 1; seed <= 3; ++seed) {
        GenerateRequest r = req(32);
        r.sampling.temp = 1.0f;
        r.sampling.seed = seed;
        free_invalid += !valid_utf8(run(r).text);
        r.sampling.grammar = "root ::= [^\\x00-\\x1F]{8}";  // at most 32 bytes, then the end
        r.n_predict = 40;
        const GenerateResult g = run(r);
        EXPECT_EQ(g.finish, FinishReason::kEos);
        EXPECT_TRUE(valid_utf8(g.text)) << "seed " << seed;
    }
    EXPECT_GT(free_invalid, 0) << "control: the model's byte tokens write invalid UTF-8";
}

// logprobs: one entry per token, the log softmax of the raw logits (all of them sum to 1),
// greedy picks the most likely one; with logit_bias the choice moves but the probability
// reported is still the model's (the control); out-of-range counts are refused.
TEST_F(Sampling, LogprobsAreTheModelsDistribution) {
    const int n_vocab = engine_->n_vocab();
    GenerateRequest r = req(6);
    r.logprobs = n_vocab;
    const GenerateResult g = run(r);
    ASSERT_EQ(g.logprobs.size(), g.tokens.size());
    for (size_t i = 0; i < g.logprobs.size(); ++i) {
        const TokenLogprob & l = g.logprobs[i];
        EXPECT_EQ(l.chosen.token, g.tokens[i]);
        ASSERT_EQ(l.top.size(), size_t(n_vocab));
        double mass = 0;
        for (size_t k = 0; k < l.top.size(); ++k) {
            mass += std::exp(double(l.top[k].logprob));
            if (k) {
                EXPECT_LE(l.top[k].logprob, l.top[k - 1].logprob);
            }
        }
        EXPECT_NEAR(mass, 1.0, 1e-4);
        EXPECT_EQ(l.top[0].token, l.chosen.token) << "greedy";
        EXPECT_EQ(l.top[0].logprob, l.chosen.logprob);
        EXPECT_LE(l.chosen.logprob, 0.0f);
    }
    EXPECT_TRUE(run(req(6)).logprobs.empty()) << "off by default";
    GenerateRequest b = req(6);
    b.logprobs = 2;
    b.sampling.logit_bias = {{'Q', 100.0f}};
    const GenerateResult q = run(b);
    int below = 0;
    for (const TokenLogprob & l : q.logprobs) {
        EXPECT_EQ(l.chosen.token, 'Q');
        EXPECT_EQ(l.top.size(), 2u);
        below += l.chosen.logprob < l.top[0].logprob;
    }
    EXPECT_GT(below, 0) << "the reported probability is before logit_bias";
    for (int bad : {-2, n_vocab + 1}) {
        GenerateRequest x = req(2);
        x.logprobs = bad;
        EXPECT_EQ(status_of(x).code(), ErrorCode::kUsage) << bad;
    }
}

}  // namespace
}  // namespace moestream::test
