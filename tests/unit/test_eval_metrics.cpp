// test_eval_metrics.cpp — the measures of `moestream eval` (include/moestream/eval.h) on hand-made logits,
// and the reference-logits file: round trip and every mismatch refused with its offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <vector>

#include "moestream/eval.h"
#include "test_util.h"

using namespace moestream;

TEST(EvalMetrics, IdenticalLogitsAgreeExactly) {
    const std::vector<float> a = {1.0f, 3.0f, -2.0f, 0.5f};
    const PositionMetrics m = compare_logits(a.data(), a.data(), 4, 1);
    EXPECT_EQ(m.kl, 0.0);
    EXPECT_TRUE(m.top1);
    EXPECT_DOUBLE_EQ(m.nll_run, m.nll_ref);
    // -log softmax(a)[1] by hand.
    double z = 0;
    for (float v : a) z += std::exp(double(v));
    EXPECT_NEAR(m.nll_ref, std::log(z) - 3.0, 1e-12);
}

TEST(EvalMetrics, KlAndTop1OnAKnownPair) {
    // ref = (0.5, 0.5), run = (0.8, 0.2): KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2).
    const std::vector<float> ref = {0.0f, 0.0f};
    const std::vector<float> run = {float(std::log(0.8)), float(std::log(0.2))};
    const PositionMetrics m = compare_logits(ref.data(), run.data(), 2, 1);
    EXPECT_NEAR(m.kl, 0.5 * std::log(0.5 / 0.8) + 0.5 * std::log(0.5 / 0.2), 1e-6);
    EXPECT_NEAR(m.nll_run, -std::log(0.2), 1e-6);
    EXPECT_TRUE(m.top1);  // ties resolve to the first index on both sides
    const std::vector<float> flipped = {float(std::log(0.2)), float(std::log(0.8))};
    EXPECT_FALSE(compare_logits(run.data(), flipped.data(), 2, 0).top1);
}

TEST(EvalMetrics, NonFiniteLogitsAreATotalMissNotACrash) {
    const std::vector<float> ref = {1.0f, 2.0f, 3.0f};
    std::vector<float> bad = ref;
    bad[1] = std::numeric_limits<float>::quiet_NaN();
    const PositionMetrics m = compare_logits(ref.data(), bad.data(), 3, 2);
    EXPECT_TRUE(std::isinf(m.kl));
    EXPECT_TRUE(std::isinf(m.nll_run));
    EXPECT_FALSE(m.top1);
    // A token outside the vocabulary is a miss too.
    EXPECT_TRUE(std::isinf(compare_logits(ref.data(), ref.data(), 3, 7).nll_run));
}

TEST(EvalMetrics, SummaryIntervalsAreDeterministicAndContainTheValue) {
    std::vector<PositionMetrics> pos;
    for (int i = 0; i < 200; ++i) {
        PositionMetrics m;
        m.nll_run = 1.0 + 0.01 * (i % 17);
        m.nll_ref = 1.0;
        m.kl = 0.001 * (i % 5);
        m.top1 = i % 10 != 0;
        pos.push_back(m);
    }
    EvalSummary a, b;
    ASSERT_TRUE(summarize_eval(pos, 500, &a).ok());
    ASSERT_TRUE(summarize_eval(pos, 500, &b).ok());
    EXPECT_EQ(a.positions, 200u);
    EXPECT_NEAR(a.top1_pct.value, 90.0, 1e-9);
    EXPECT_NEAR(a.ppl_ref.value, std::exp(1.0), 1e-9);
    EXPECT_EQ(a.mean_kl.lo, b.mean_kl.lo);
    EXPECT_EQ(a.ppl_run.hi, b.ppl_run.hi);
    for (const Interval * iv : {&a.ppl_run, &a.mean_kl, &a.top1_pct}) {
        EXPECT_LE(iv->lo, iv->value);
        EXPECT_GE(iv->hi, iv->value);
        EXPECT_LT(iv->lo, iv->hi);
    }
    EXPECT_FALSE(summarize_eval({}, 100, &a).ok());
}

namespace {

std::string write_ref(const std::string & path, int n_vocab, const std::vector<int32_t> & next,
                      uint64_t hash, uint64_t model_bytes) {
    RefLogitsFile w;
    Status st = w.create(path, n_vocab, uint32_t(next.size()), /*window=*/64, hash, model_bytes);
    if (!st.ok()) return st.message();
    std::vector<float> lg(static_cast<size_t>(n_vocab));
    for (size_t p = 0; p < next.size(); ++p) {
        for (int v = 0; v < n_vocab; ++v) lg[size_t(v)] = float(p) + 0.25f * float(v);
        st = w.append(next[p], lg.data());
        if (!st.ok()) return st.message();
    }
    st = w.finish();
    return st.ok() ? "" : st.message();
}

}  // namespace

TEST(EvalRefFile, RoundTripsAndRefusesEveryMismatch) {
    const std::string path = moestream::test::models_dir() + "/evalref-" + std::to_string(getpid());
    const std::vector<int32_t> next = {3, 1, 4, 1, 5};
    const uint64_t h = hash_tokens(next);
    ASSERT_EQ(write_ref(path, 8, next, h, 1234), "");
    {
        RefLogitsFile r;
        ASSERT_TRUE(r.open(path, 8, 5, 64, h, 1234).ok());
        std::vector<float> lg;
        for (size_t p = 0; p < next.size(); ++p) {
            ASSERT_TRUE(r.read(next[p], &lg).ok());
            EXPECT_EQ(lg[7], float(p) + 1.75f);
        }
    }
    struct Case {
        int n_vocab;
        uint32_t n_pos, window;
        uint64_t hash, bytes;
        const char * expect;
    };
    const Case cases[] = {
        {9, 5, 64, h, 1234, "offset 12: vocabulary"},
        {8, 4, 64, h, 1234, "offset 16: 5 positions"},
        {8, 5, 0, h, 1234, "offset 20: recorded with --window 64, this run uses no --window"},
        {8, 5, 32, h, 1234, "offset 20: recorded with --window 64, this run uses --window 32"},
        {8, 5, 64, h + 1, 1234, "offset 24: recorded for other text"},
        {8, 5, 64, h, 999, "offset 32: recorded with a model file"},
    };
    for (const Case & c : cases) {
        RefLogitsFile r;
        const Status st = r.open(path, c.n_vocab, c.n_pos, c.window, c.hash, c.bytes);
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
        EXPECT_NE(st.message().find(path), std::string::npos);
    }
    {  // a record predicting another token than the text's
        RefLogitsFile r;
        ASSERT_TRUE(r.open(path, 8, 5, 64, h, 1234).ok());
        std::vector<float> lg;
        ASSERT_TRUE(r.read(3, &lg).ok());
        const Status st = r.read(2, &lg);
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.message().find("position 1 predicts token 1"), std::string::npos)
            << st.message();
    }
    {  // truncated by one byte; bad magic
        std::ifstream in(path, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::ofstream(path + ".cut", std::ios::binary) << bytes.substr(0, bytes.size() - 1);
        std::ofstream(path + ".bad", std::ios::binary) << "NOTAREF!" << bytes.substr(8);
        RefLogitsFile r1, r2;
        const Status a = r1.open(path + ".cut", 8, 5, 64, h, 1234);
        EXPECT_NE(a.message().find("truncated"), std::string::npos) << a.message();
        const Status b = r2.open(path + ".bad", 8, 5, 64, h, 1234);
        EXPECT_NE(b.message().find("offset 0: not a moestream eval reference"), std::string::npos)
            << b.message();
    }
    std::remove(path.c_str());
    std::remove((path + ".cut").c_str());
    std::remove((path + ".bad").c_str());
}
