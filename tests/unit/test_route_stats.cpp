// test_route_stats.cpp — routing statistics (include/moestream/route_stats.h) on hand-made traces whose
// answers are known: a sticky routing reuses, an alternating one does not, a shuffle of a
// sticky routing loses its reuse, uniform usage has entropy 1.
#include <gtest/gtest.h>

#include <vector>

#include "moestream/route_stats.h"

using namespace moestream;

namespace {

// One MoE layer, k = 2 of 8 experts; one decode row per given expert pair.
RouteTrace make_trace(const std::vector<std::vector<int32_t>> & rows, bool decode = true) {
    RouteTrace t;
    t.header.n_expert = 8;
    t.header.k = t.header.k_model = 2;
    t.header.n_layer = 1;
    TraceLayerShape L;
    L.layer = 0;
    L.slice_bytes = {4096};
    t.header.moe_layers.push_back(L);
    for (const auto & r : rows) {
        TraceRouting tr;
        tr.decode = decode ? 1 : 0;
        tr.n_rows = 1;
        tr.k = 2;
        tr.first_slot = t.expert.size();
        t.routings.push_back(tr);
        for (int32_t e : r) t.expert.push_back(e);
    }
    return t;
}

}  // namespace

TEST(RouteStats, StickyRoutingReusesAndItsShuffleDoesNot) {
    std::vector<std::vector<int32_t>> rows;
    for (int i = 0; i < 50; ++i) rows.push_back({0, 1});
    for (int i = 0; i < 50; ++i) rows.push_back({2, 3});
    RoutingStats s;
    ASSERT_TRUE(routing_stats(make_trace(rows), 1, &s).ok());
    ASSERT_EQ(s.layers.size(), 1u);
    EXPECT_NEAR(s.layers[0].reuse, 98.0 / 99.0, 1e-12);  // one change of set in 99 steps
    EXPECT_LT(s.layers[0].reuse_shuffled, 0.7);          // about one half
    EXPECT_GT(s.layers[0].reuse_shuffled, 0.3);
    EXPECT_EQ(s.layers[0].unused_experts, 4u);
    EXPECT_NEAR(s.layers[0].top_expert_share, 0.25, 1e-12);
    EXPECT_NEAR(s.reuse_uniform, 0.25, 1e-12);
}

TEST(RouteStats, AlternatingRoutingNeverReuses) {
    std::vector<std::vector<int32_t>> rows;
    for (int i = 0; i < 64; ++i)
        rows.push_back(i % 4 == 0   ? std::vector<int32_t>{0, 1}
                       : i % 4 == 1 ? std::vector<int32_t>{2, 3}
                       : i % 4 == 2 ? std::vector<int32_t>{4, 5}
                                    : std::vector<int32_t>{6, 7});
    RoutingStats s;
    ASSERT_TRUE(routing_stats(make_trace(rows), 1, &s).ok());
    EXPECT_EQ(s.layers[0].reuse, 0.0);
    EXPECT_GT(s.layers[0].reuse_shuffled, 0.0);
    EXPECT_NEAR(s.layers[0].entropy_norm, 1.0, 1e-12);  // every expert equally often
    EXPECT_EQ(s.layers[0].unused_experts, 0u);
}

TEST(RouteStats, PrefillRowsAndShortTracesAreNotCounted) {
    std::vector<std::vector<int32_t>> rows(10, std::vector<int32_t>{0, 1});
    RoutingStats s;
    EXPECT_FALSE(routing_stats(make_trace(rows, /*decode=*/false), 1, &s).ok());
    EXPECT_FALSE(routing_stats(make_trace({{0, 1}}), 1, &s).ok());
}
