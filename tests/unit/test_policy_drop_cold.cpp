// test_policy_drop_cold.cpp — the drop-cold decision for one routing row, exactly as
// docs/lossy-knobs.md states it.
#include <gtest/gtest.h>

#include <set>

#include "policy_drop_cold.h"

using namespace moestream;

namespace {
DropColdConfig cfg(double f, bool renorm = false) {
    DropColdConfig c;
    c.frac = f;
    c.renorm = renorm;
    return c;
}
}  // namespace

TEST(DropCold, DropsOnlyColdMissesBelowThreshold) {
    int32_t ids[4] = {7, 3, 9, 1};
    float w[4] = {0.5f, 0.3f, 0.15f, 0.05f};
    std::set<int32_t> resident = {1};  // expert 1 is a hit: never dropped
    DropCounters c;
    // threshold = 1.0 / 4 = 0.25: slots 2 (0.15, miss) dropped, slot 3 (0.05, hit) kept.
    int n = drop_cold_row(4, ids, 1, w, 1, 4, cfg(1.0),
                          [&](int32_t e) { return resident.count(e) > 0; }, &c);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(ids[2], 7);  // repointed at the top expert
    EXPECT_EQ(w[2], 0.0f);
    EXPECT_EQ(ids[3], 1);
    EXPECT_FLOAT_EQ(w[3], 0.05f);
    EXPECT_EQ(ids[1], 3);  // 0.3 >= 0.25 kept
    EXPECT_EQ(c.routed, 4u);
    EXPECT_EQ(c.dropped, 1u);
    EXPECT_NEAR(c.weight_dropped, 0.15, 1e-6);
    EXPECT_NEAR(c.weight_total, 1.0, 1e-6);
}

TEST(DropCold, TopExpertNeverDroppedEvenWhenBelowThreshold) {
    // Sigmoid-style weights, all tiny: every slot is below the threshold and a miss.
    int32_t ids[3] = {4, 5, 6};
    float w[3] = {0.01f, 0.02f, 0.015f};
    DropCounters c;
    int n = drop_cold_row(3, ids, 1, w, 1, 3, cfg(1.0), [](int32_t) { return false; }, &c);
    EXPECT_EQ(n, 2);
    EXPECT_EQ(ids[0], 5);
    EXPECT_EQ(ids[1], 5);  // the argmax slot (not slot 0) survives
    EXPECT_EQ(ids[2], 5);
    EXPECT_FLOAT_EQ(w[1], 0.02f);
}

TEST(DropCold, TopKOneIsANoOp) {
    int32_t ids[1] = {3};
    float w[1] = {0.01f};
    DropCounters c;
    EXPECT_EQ(drop_cold_row(1, ids, 1, w, 1, 1, cfg(1.0), [](int32_t) { return false; }, &c), 0);
    EXPECT_EQ(ids[0], 3);
    EXPECT_FLOAT_EQ(w[0], 0.01f);
}

TEST(DropCold, ThresholdTracksEffectiveK) {
    int32_t ids[2] = {0, 1};
    float w[2] = {0.7f, 0.3f};
    DropCounters c;
    // k_eff = 2: threshold 0.5 -> slot 1 dropped. k_eff = 4 (model k): 0.25 -> kept.
    int32_t ids2[2] = {0, 1};
    float w2[2] = {0.7f, 0.3f};
    EXPECT_EQ(drop_cold_row(2, ids, 1, w, 1, 2, cfg(1.0), [](int32_t) { return false; }, &c), 1);
    EXPECT_EQ(drop_cold_row(2, ids2, 1, w2, 1, 4, cfg(1.0), [](int32_t) { return false; }, &c), 0);
}

TEST(DropCold, RenormKeepsRowSum) {
    int32_t ids[3] = {0, 1, 2};
    float w[3] = {0.6f, 0.3f, 0.1f};
    DropCounters c;
    drop_cold_row(3, ids, 1, w, 1, 3, cfg(0.5, true), [](int32_t) { return false; }, &c);
    EXPECT_EQ(w[2], 0.0f);
    EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
}

TEST(DropCold, StridedAccess) {
    // ids with stride 2 (a view of a wider argsort row), weights with stride 3.
    int32_t ids[6] = {9, -1, 8, -1, 7, -1};
    float w[9] = {0.8f, 9, 9, 0.15f, 9, 9, 0.05f, 9, 9};
    DropCounters c;
    EXPECT_EQ(drop_cold_row(3, ids, 2, w, 3, 3, cfg(1.0), [](int32_t) { return false; }, &c), 2);
    EXPECT_EQ(ids[2], 9);
    EXPECT_EQ(ids[4], 9);
    EXPECT_EQ(ids[1], -1);  // untouched padding
    EXPECT_EQ(w[1], 9.0f);
}

// --miss-fallback's slot rule (DropColdConfig::fallback_w): below the threshold, not the top
// expert, and only where ok() accepts the expert (a miss, or a lossy copy).
TEST(MissFallbackRow, MarksLowWeightMissesButNeverTheTop) {
    const int32_t ids[4] = {5, 6, 7, 8};
    const float w[4] = {0.1f, 0.5f, 0.25f, 0.15f};  // the top is slot 1
    uint8_t fb[4];
    auto miss = [](int32_t) { return true; };
    EXPECT_EQ(fallback_row(4, ids, 1, w, 1, 0.2, miss, fb), 2);
    EXPECT_EQ(fb[0], 1);
    EXPECT_EQ(fb[1], 0);
    EXPECT_EQ(fb[2], 0);  // 0.25 is not below 0.2
    EXPECT_EQ(fb[3], 1);
    // Strict: a weight equal to the threshold stays full.
    EXPECT_EQ(fallback_row(4, ids, 1, w, 1, 0.15, miss, fb), 1);
    EXPECT_EQ(fb[3], 0);
    // Threshold 1: every slot but the top, and the ids are never rewritten.
    EXPECT_EQ(fallback_row(4, ids, 1, w, 1, 1.0, miss, fb), 3);
    EXPECT_EQ(fb[1], 0);
    // Resident experts (ok() false) stay full: the control that ok() is consulted.
    EXPECT_EQ(fallback_row(4, ids, 1, w, 1, 1.0, [](int32_t e) { return e == 8; }, fb), 1);
    EXPECT_EQ(fb[3], 1);
    EXPECT_EQ(fb[0], 0);
}
