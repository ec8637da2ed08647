// test_prefix_reuse.cpp — Engine::generate(GenerateRequest) with reuse_prefix: the KV cache of
// the previous generation is kept and only the tokens after the common prefix are prefilled.
// Reused KV was computed in other batch shapes (prefill of turn 1, single-token decodes), so
// logits match a from-scratch run up to float rounding, not bit for bit: the test bounds the
// difference, with a negative control showing what a wrong context looks like. Also: the old
// generate(prompt, ...) is unaffected by a previous reuse, and per-request sampling works.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "moestream/moestream.h"
#include "test_util.h"

using nlohmann::json;

namespace moestream::test {
namespace {

// drop_cold_later: the LRU cache holds the budget, so set_drop_cold can turn drop-cold on.
std::unique_ptr<Engine> open_tiny(bool drop_cold_later = false) {
    RunOptions o;
    o.model_path = synth_model("tiny", "qwen3moe", "q4_k");
    o.drop_cold_later = drop_cold_later;
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    EXPECT_TRUE(st.ok()) << st.message();
    return e;
}

double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        d = std::max(d, double(std::fabs(a[i] - b[i])));
    return d;
}

double max_abs(const std::vector<float> & a) {
    double m = 0;
    for (float x : a) m = std::max(m, double(std::fabs(x)));
    return m;
}

GenerateRequest req(const std::string & prompt, int n, bool reuse) {
    GenerateRequest r;
    r.prompt = prompt;
    r.n_predict = n;
    r.reuse_prefix = reuse;
    return r;
}

TEST(PrefixReuse, SecondTurnReusesPrefixAndMatchesFromScratchLogits) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    GenerateResult g1;
    ASSERT_TRUE(e->generate(req("The story begins in a small town", 6, true), nullptr, &g1).ok());
    EXPECT_EQ(e->stats().n_prompt_reused, 0);  // nothing before it
    const std::string turn2 = "The story begins in a small town" + g1.text + " and then";

    GenerateResult reused, fresh, other;
    ASSERT_TRUE(e->generate(req(turn2, 1, true), nullptr, &reused).ok());
    const int n_reused = e->stats().n_prompt_reused;
    EXPECT_GT(n_reused, 5);
    EXPECT_LT(n_reused, e->stats().n_prompt);
    ASSERT_TRUE(e->generate(req(turn2, 1, false), nullptr, &fresh).ok());
    EXPECT_EQ(e->stats().n_prompt_reused, 0);
    ASSERT_TRUE(
        e->generate(req("A different beginning of a story" + g1.text + " and then", 1, false),
                    nullptr, &other)
            .ok());

    const double scale = max_abs(fresh.final_logits);
    const double d = max_abs_diff(reused.final_logits, fresh.final_logits);
    const double d_other = max_abs_diff(other.final_logits, fresh.final_logits);
    std::fprintf(
        stderr,
        "prefix reuse: max |logit diff| %.3g (reused vs fresh), %.3g (other context), scale %.3g\n",
        d, d_other, scale);
    EXPECT_LT(d, 0.02 * scale) << "reused-prefix logits vs from scratch (scale " << scale << ")";
    EXPECT_GT(d_other, 10 * d) << "negative control: another context must differ much more";
}

TEST(PrefixReuse, IdenticalPromptReusesAllButTheLastToken) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    GenerateResult a, b;
    ASSERT_TRUE(e->generate(req("Hello there my friend", 4, true), nullptr, &a).ok());
    const int n = e->stats().n_prompt;
    ASSERT_TRUE(e->generate(req("Hello there my friend", 4, true), nullptr, &b).ok());
    EXPECT_EQ(e->stats().n_prompt_reused, n - 1);
    EXPECT_EQ(a.tokens.size(), b.tokens.size());
}

TEST(PrefixReuse, PlainGenerateAfterReuseEqualsFreshEngine) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    GenerateResult warm, after;
    ASSERT_TRUE(e->generate(req("Once upon a time there was", 5, true), nullptr, &warm).ok());
    ASSERT_TRUE(e->generate("Once upon a time", 8, nullptr, &after).ok());
    EXPECT_EQ(e->stats().n_prompt_reused, 0);
    auto f = open_tiny();
    GenerateResult ref;
    ASSERT_TRUE(f->generate("Once upon a time", 8, nullptr, &ref).ok());
    EXPECT_EQ(after.tokens, ref.tokens);
    EXPECT_EQ(after.final_logits, ref.final_logits);
}

TEST(PrefixReuse, PerRequestSamplingIsSeededAndValidated) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    GenerateRequest r = req("Once upon a time", 12, false);
    r.sampling.temp = 1.5f;
    r.sampling.seed = 7;
    GenerateResult a, b, c;
    ASSERT_TRUE(e->generate(r, nullptr, &a).ok());
    ASSERT_TRUE(e->generate(r, nullptr, &b).ok());
    EXPECT_EQ(a.tokens, b.tokens) << "same seed, same draw";
    r.sampling.seed = 8;
    ASSERT_TRUE(e->generate(r, nullptr, &c).ok());
    EXPECT_NE(a.tokens, c.tokens) << "another seed draws differently";
    r.sampling.top_p = 0.0f;
    EXPECT_EQ(e->generate(r, nullptr, &c).code(), ErrorCode::kUsage);
    r.sampling.top_p = 1.0f;
    r.sampling.temp = -1.0f;
    EXPECT_EQ(e->generate(r, nullptr, &c).code(), ErrorCode::kUsage);
}

// The fixed-slot cache, the default store of a budget, runs drop-cold: set_drop_cold turns it
// on without a store switch (the control: with the cache off it is refused).
TEST(PrefixReuse, DropColdTurnsOnLaterOnTheFixedSlots) {
    auto slots = open_tiny();
    ASSERT_TRUE(slots);
    EXPECT_EQ(json::parse(slots->settings_json())["cache_store"], "fixed slots");
    EXPECT_FALSE(slots->lossy());
    Status st = slots->set_drop_cold(0.75);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_TRUE(slots->lossy());
    EXPECT_EQ(json::parse(slots->settings_json())["cache_store"], "fixed slots");
}

// drop_cold_block() names what set_drop_cold(F > 0) refuses, for each kind of engine, and
// set_drop_cold succeeds exactly where it says kNone (the LRU cache: the control).
TEST(PrefixReuse, DropColdBlockNamesWhatSetDropColdRefuses) {
    struct Case {
        const char * name;
        bool stream;
        int64_t cache_mb;
        bool drop_cold_later;
        DropColdBlock want;
    };
    for (const Case & c : {Case{"resident", false, -1, false, DropColdBlock::kResident},
                           Case{"cache off", true, 0, false, DropColdBlock::kCacheOff},
                           Case{"fixed slots", true, -1, false, DropColdBlock::kNone}}) {
        SCOPED_TRACE(c.name);
        RunOptions o;
        o.model_path = synth_model("tiny", "qwen3moe", "q4_k");
        o.stream = c.stream;
        o.cache_mb = c.cache_mb;
        o.drop_cold_later = c.drop_cold_later;
        o.n_ctx = 256;
        std::unique_ptr<Engine> e;
        Status st = Engine::open(o, &e);
        ASSERT_TRUE(st.ok()) << st.message();
        EXPECT_EQ(e->drop_cold_block(), c.want);
        st = e->set_drop_cold(0.75);
        EXPECT_EQ(st.ok(), c.want == DropColdBlock::kNone) << st.message();
        EXPECT_EQ(e->lossy(), c.want == DropColdBlock::kNone);
    }
}

TEST(PrefixReuse, DropColdCanBeSwitchedBetweenGenerations) {
    auto e = open_tiny(/*drop_cold_later=*/true);
    ASSERT_TRUE(e);
    EXPECT_FALSE(e->lossy());
    ASSERT_TRUE(e->set_drop_cold(0.75).ok());
    EXPECT_TRUE(e->lossy());
    GenerateResult g;
    ASSERT_TRUE(e->generate(req("Once upon a time", 8, false), nullptr, &g).ok());
    EXPECT_GT(e->stats().experts_routed, 0u);
    ASSERT_TRUE(e->set_drop_cold(0).ok());
    EXPECT_FALSE(e->lossy());
    ASSERT_TRUE(e->generate(req("Once upon a time", 8, false), nullptr, &g).ok());
    EXPECT_EQ(e->stats().experts_dropped, 0u);
    EXPECT_EQ(e->set_drop_cold(1.5).code(), ErrorCode::kUsage);
    EXPECT_EQ(e->chat_template(), "") << "synth models carry no chat template";
}

}  // namespace
}  // namespace moestream::test

namespace moestream::test {
namespace {

// A lossless turn that reuses KV computed by a lossy one is lossy; without reuse it is not.
TEST(PrefixReuse, ReusedLossyKvMakesTheResultLossy) {
    auto e = open_tiny(/*drop_cold_later=*/true);
    ASSERT_TRUE(e);
    ASSERT_TRUE(e->set_drop_cold(0.75).ok());
    GenerateResult g;
    ASSERT_TRUE(e->generate(req("Once upon a time there was", 4, true), nullptr, &g).ok());
    EXPECT_TRUE(g.lossy);
    ASSERT_TRUE(e->set_drop_cold(0).ok());
    ASSERT_TRUE(e->generate(req("Once upon a time there was a", 2, true), nullptr, &g).ok());
    EXPECT_GT(e->stats().n_prompt_reused, 0);
    EXPECT_TRUE(g.lossy) << "its KV prefix was computed with drop-cold on";
    ASSERT_TRUE(e->generate(req("Once upon a time there was a", 2, false), nullptr, &g).ok());
    EXPECT_FALSE(g.lossy) << "control: a fresh prefill with lossless settings";
    ASSERT_TRUE(e->generate(req("Once upon a time there was a", 2, true), nullptr, &g).ok());
    EXPECT_FALSE(g.lossy) << "the KV is lossless again";
}

// Drop counters describe one generation, not the engine's life.
TEST(PrefixReuse, DropCountersArePerGeneration) {
    auto e = open_tiny(/*drop_cold_later=*/true);
    ASSERT_TRUE(e);
    ASSERT_TRUE(e->set_drop_cold(0.75).ok());
    GenerateRequest r = req("Once upon a time", 6, false);
    r.sampling.ignore_eos = true;
    GenerateResult g;
    ASSERT_TRUE(e->generate(r, nullptr, &g).ok());
    const uint64_t routed1 = e->stats().experts_routed;
    EXPECT_GT(routed1, 0u) << "control: the policy saw routings";
    ASSERT_TRUE(e->generate(r, nullptr, &g).ok());
    EXPECT_EQ(e->stats().experts_routed, routed1) << "the same work counts the same, not twice";
}

}  // namespace
}  // namespace moestream::test
