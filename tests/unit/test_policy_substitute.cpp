// test_policy_substitute.cpp — the --substitute-experts decision for one routing row, exactly
// as docs/lossy-knobs.md states it (policy_substitute.h): the top expert is never replaced, a
// substitute is resident, unselected and within the margin (strictly), the best-scoring such
// candidate is taken, and the row stays a permutation of the experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "policy_substitute.h"

using namespace moestream;

namespace {

struct Row {
    std::vector<float> score;    // per expert
    std::vector<int32_t> sorted; // router order
    std::vector<int32_t> ids;    // the first k of sorted
    std::vector<uint8_t> subst;
    SubstituteCounters c;

    Row(std::vector<float> s, int k) : score(std::move(s)) {
        sorted.resize(score.size());
        std::iota(sorted.begin(), sorted.end(), 0);
        std::stable_sort(sorted.begin(), sorted.end(),
                         [&](int32_t a, int32_t b) { return score[a] > score[b]; });
        ids.assign(sorted.begin(), sorted.begin() + k);
        subst.assign(size_t(k), 0);
    }
    int run(double margin, const std::set<int32_t> & resident) {
        return substitute_row(
            int(ids.size()), int(sorted.size()), sorted.data(), ids.data(), 1,
            [&](int32_t e) { return score[size_t(e)]; }, margin,
            [&](int32_t e) { return resident.count(e) > 0; }, subst.data(), &c);
    }
};

// Experts by score: 0 (.40), 1 (.25), 2 (.15), 3 (.12), 4 (.05), 5 (.03); k = 3.
std::vector<float> scores() { return {0.40f, 0.25f, 0.15f, 0.12f, 0.05f, 0.03f}; }

}  // namespace

TEST(Substitute, ReplacesAMissByTheBestResidentCandidateWithinTheMargin) {
    Row r(scores(), 3);
    // 2 is a miss; 3 and 4 are resident: 3 (0.15 - 0.12 = 0.03 < 0.05) is the best.
    const int n = r.run(0.05, {3, 4});
    EXPECT_EQ(n, 1);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 3}));
    EXPECT_EQ(r.subst, (std::vector<uint8_t>{0, 0, 1}));
    EXPECT_EQ(r.c.substituted, 1u);
    EXPECT_EQ(r.c.routed, 3u);
    EXPECT_NEAR(r.c.score_lost, 0.03, 1e-6);
    // The graph's router order stays a permutation with the substitute selected.
    std::vector<int32_t> p = r.sorted;
    std::sort(p.begin(), p.end());
    EXPECT_EQ(p, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(std::vector<int32_t>(r.sorted.begin(), r.sorted.begin() + 3), r.ids);
}

TEST(Substitute, OutsideTheMarginNothingChanges) {
    Row r(scores(), 3);
    // Negative control of the margin: 0.03 is not < 0.03 (strict) nor < 0.02.
    EXPECT_EQ(r.run(0.02, {3, 4}), 0);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
    // The best resident candidate (4: 0.15 - 0.05 = 0.10) is outside 0.05: no lower one is
    // tried (3 is not resident).
    Row r2(scores(), 3);
    EXPECT_EQ(r2.run(0.05, {4, 5}), 0);
    EXPECT_EQ(r2.ids, (std::vector<int32_t>{0, 1, 2}));
    // Margin 0 never substitutes, even for an exact tie.
    Row r3({0.4f, 0.2f, 0.2f, 0.2f}, 2);
    EXPECT_EQ(r3.run(0.0, {0, 2, 3}), 0);
    EXPECT_EQ(r3.c.routed, 2u);
}

TEST(Substitute, TopExpertIsNeverReplaced) {
    Row r(scores(), 3);
    // Only the top expert 0 is a miss, and resident 3 is within any margin: untouched.
    EXPECT_EQ(r.run(1.0, {1, 2, 3, 4, 5}), 0);
    EXPECT_EQ(r.ids[0], 0);
    // Control: the same margin does replace a non-top miss.
    Row r2(scores(), 3);
    EXPECT_EQ(r2.run(1.0, {0, 2, 3, 4, 5}), 1);
    EXPECT_EQ(r2.ids, (std::vector<int32_t>{0, 3, 2}));
}

TEST(Substitute, ASubstituteIsNeverAnAlreadySelectedExpert) {
    Row r(scores(), 3);
    // 1 and 2 miss; resident: 0 (selected, the top) and 3, 4. Each miss gets its own
    // candidate, in order: 1 -> 3, 2 -> 4; never 0, never 3 twice.
    EXPECT_EQ(r.run(1.0, {0, 3, 4}), 2);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 3, 4}));
    std::set<int32_t> uniq(r.ids.begin(), r.ids.end());
    EXPECT_EQ(uniq.size(), 3u);
    // Only one resident candidate for two misses: the second miss stays.
    Row r2(scores(), 3);
    EXPECT_EQ(r2.run(1.0, {0, 5}), 1);
    EXPECT_EQ(r2.ids, (std::vector<int32_t>{0, 5, 2}));
}

TEST(Substitute, ResidentSlotsAndFullRowsAreLeftAlone) {
    Row r(scores(), 3);
    EXPECT_EQ(r.run(1.0, {0, 1, 2, 3}), 0);  // every routed expert is a hit
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
    Row all(scores(), 6);  // k == n: no unselected expert exists
    EXPECT_EQ(all.run(1.0, {}), 0);
    EXPECT_EQ(all.c.routed, 6u);
}

TEST(Substitute, StridedIdsAreRewrittenThroughTheirStride) {
    std::vector<float> s = scores();
    std::vector<int32_t> sorted = {0, 1, 2, 3, 4, 5};
    int32_t ids[6] = {0, -1, 1, -1, 2, -1};  // stride 2: the -1 are not slots
    SubstituteCounters c;
    EXPECT_EQ(substitute_row(
                  3, 6, sorted.data(), ids, 2, [&](int32_t e) { return s[size_t(e)]; }, 0.05,
                  [](int32_t e) { return e == 3; }, nullptr, &c),
              1);
    EXPECT_EQ(ids[4], 3);
    EXPECT_EQ(ids[1], -1);
    EXPECT_EQ(ids[3], -1);
    EXPECT_EQ(ids[5], -1);
}

// A margin nothing qualifies for asks no residency at all: each routed slot is ruled out by
// one comparison with the best unselected score (the scan would find nothing either). The
// decision is the same as with the scan; control: a margin that can fire asks.
TEST(Substitute, AMarginThatCannotFireAsksNoResidency) {
    for (double margin : {1e-9, 0.02}) {  // 0.15 - 0.12 = 0.03 is the closest routed/unrouted gap
        Row r(scores(), 3);
        int asked = 0;
        const int n = substitute_row(
            3, 6, r.sorted.data(), r.ids.data(), 1, [&](int32_t e) { return r.score[size_t(e)]; },
            margin, [&](int32_t) { ++asked; return false; }, r.subst.data(), &r.c);
        EXPECT_EQ(n, 0);
        EXPECT_EQ(asked, 0) << margin;
        EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
    }
    Row r(scores(), 3);
    int asked = 0;
    const int n = substitute_row(
        3, 6, r.sorted.data(), r.ids.data(), 1, [&](int32_t e) { return r.score[size_t(e)]; },
        0.05, [&](int32_t e) { ++asked; return e == 3; }, r.subst.data(), &r.c);
    EXPECT_EQ(n, 1);  // 2 -> 3, as ReplacesAMissByTheBestResidentCandidateWithinTheMargin
    EXPECT_GT(asked, 0);
}
