// test_overlap_waiter.cpp — the overlap waiter (src/stream/overlap_waiter.h) against a fake
// graph run the way ggml's eval-callback loop runs one: every node of a range is asked about
// before any of it computes, the range ends at the first node an observer asks for, which is
// then delivered. For both orders of the gate and up matmuls: the waiter learns which comes
// first and tells the sink; the second projection's wait comes before the second matmul
// computes and the down wait before the down matmul, always; once the nodes are learned, the
// second wait comes after the first matmul computed and the down wait after the second (the
// overlap). Negative control: with the learned node renamed in a later layer, the wait falls
// back to the matmul's ask (still before it computes) and the name is forgotten.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ggml.h"
#include "moestream/gguf_index.h"
#include "overlap_waiter.h"
#include "router_hook.h"

using namespace moestream;

namespace {

struct FakeSink final : RouteSink {
    std::vector<std::string> * log;
    int first = -1;
    bool pending = false, second = false;
    explicit FakeSink(std::vector<std::string> * l) : log(l) {}
    Status on_routing(const Routing & r) override {
        pending = true;
        second = first >= 0;  // like the streamer: three stages once the order is known
        log->push_back("route:" + std::to_string(r.layer));
        return Status::Ok();
    }
    bool has_pending() const override { return pending; }
    bool has_pending_second() const override { return pending && second; }
    Status finish_second() override {
        if (second) log->push_back("wait2");
        second = false;
        return Status::Ok();
    }
    Status finish_pending() override {
        if (pending) log->push_back("waitall");
        pending = second = false;
        return Status::Ok();
    }
    void set_first_projection(int p) override { first = p; }
};

struct Graph {
    std::vector<ggml_tensor> nodes;  // reserved up front: src pointers stay valid
    std::vector<int32_t> ids{1, 5};
    ggml_tensor weights[3];          // gate, up, down expert tensors
};

ggml_tensor named(const std::string & name, ggml_op op) {
    ggml_tensor t{};
    std::strncpy(t.name, name.c_str(), sizeof t.name - 1);
    t.op = op;
    t.type = GGML_TYPE_F32;
    for (int i = 0; i < GGML_MAX_DIMS; ++i) t.ne[i] = 1;
    return t;
}

// One MoE layer: topk, first matmul, second matmul, swiglu, down; `first_name_override`
// renames the first matmul (so a name learned from it does not arrive).
void add_layer(Graph * g, int il, bool gate_first, const std::string & first_name_override = "") {
    const std::string l = std::to_string(il);
    ggml_tensor topk = named("ffn_moe_topk-" + l, GGML_OP_VIEW);
    topk.type = GGML_TYPE_I32;
    topk.ne[0] = 2;
    topk.nb[0] = sizeof(int32_t);
    topk.nb[1] = 2 * sizeof(int32_t);
    topk.data = g->ids.data();
    g->nodes.push_back(topk);
    const char * a = gate_first ? "gate" : "up";
    const char * b = gate_first ? "up" : "gate";
    ggml_tensor m1 = named(first_name_override.empty() ? std::string("ffn_moe_") + a + "-" + l
                                                       : first_name_override,
                           GGML_OP_MUL_MAT_ID);
    m1.src[0] = &g->weights[gate_first ? 0 : 1];
    g->nodes.push_back(m1);
    ggml_tensor m2 = named(std::string("ffn_moe_") + b + "-" + l, GGML_OP_MUL_MAT_ID);
    m2.src[0] = &g->weights[gate_first ? 1 : 0];
    g->nodes.push_back(m2);
    g->nodes.push_back(named("ffn_moe_swiglu-" + l, GGML_OP_GLU));
    ggml_tensor down = named("ffn_moe_down-" + l, GGML_OP_MUL_MAT_ID);
    down.src[0] = &g->weights[2];
    g->nodes.push_back(down);
}

// ggml_backend_sched_compute_splits' loop: ask j0..j1 until one is wanted, compute the range
// (logged), deliver the wanted one.
void run(Graph & g, RouterHook & hook, std::vector<std::string> * log) {
    for (ggml_tensor & t : g.nodes)
        if (std::strncmp(t.name, "ffn_moe_down-", 13) == 0) t.src[1] = &t - 1;  // the swiglu
    size_t j0 = 0;
    const size_t n = g.nodes.size();
    while (j0 < n) {
        size_t j1 = j0;
        bool need = hook.on_ask(&g.nodes[j1]);
        while (!need && j1 + 1 < n) need = hook.on_ask(&g.nodes[++j1]);
        for (size_t j = j0; j <= j1; ++j) log->push_back(std::string("compute:") + g.nodes[j].name);
        if (need) {
            EXPECT_TRUE(hook.on_node(&g.nodes[j1]));
        }
        j0 = j1 + 1;
    }
    EXPECT_TRUE(hook.end_graph().ok());
}

size_t at(const std::vector<std::string> & log, const std::string & what, size_t from = 0) {
    for (size_t i = from; i < log.size(); ++i)
        if (log[i] == what) return i;
    return SIZE_MAX;
}

class OverlapWaiterOrder : public ::testing::TestWithParam<bool> {};

TEST_P(OverlapWaiterOrder, WaitsBeforeEachMatmulAndOverlapsOnceLearned) {
    const bool gate_first = GetParam();
    const char * a = gate_first ? "gate" : "up";
    const char * b = gate_first ? "up" : "gate";
    std::vector<std::string> log;
    FakeSink sink(&log);
    OverlapWaiter waiter;
    RouterHook hook(8, 4, sink, {&waiter});
    Graph g;
    g.nodes.reserve(64);
    std::strcpy(g.weights[0].name, "blk.0.ffn_gate_exps.weight");
    std::strcpy(g.weights[1].name, "blk.0.ffn_up_exps.weight");
    std::strcpy(g.weights[2].name, "blk.0.ffn_down_exps.weight");
    for (int il = 0; il < 4; ++il) add_layer(&g, il, gate_first);
    run(g, hook, &log);
    EXPECT_EQ(sink.first, int(gate_first ? Projection::kGate : Projection::kUp));
    for (int il = 0; il < 4; ++il) {
        SCOPED_TRACE(il);
        const std::string l = std::to_string(il);
        const size_t route = at(log, "route:" + l);
        ASSERT_NE(route, SIZE_MAX);
        const size_t c1 = at(log, std::string("compute:ffn_moe_") + a + "-" + l, route);
        const size_t c2 = at(log, std::string("compute:ffn_moe_") + b + "-" + l, route);
        const size_t cd = at(log, "compute:ffn_moe_down-" + l, route);
        const size_t wall = at(log, "waitall", route);
        ASSERT_LT(wall, cd) << "the down matmul computed before its reads were waited for";
        if (il == 0) continue;  // layer 0: the order is learned there (two stages)
        const size_t w2 = at(log, "wait2", route);
        ASSERT_LT(w2, c2) << "the second matmul computed before its reads were waited for";
        if (il >= 2) {  // the wait points learned at layer 1's matmuls
            EXPECT_GT(w2, c1) << "no overlap with the first matmul";
            EXPECT_GT(wall, c2) << "no overlap with the second matmul";
        }
    }
    const OverlapWaiter::Counters & c = waiter.counters();
    EXPECT_EQ(c.second_waits_at_matmul, 1u);  // layer 1, learning
    EXPECT_EQ(c.second_waits_at_input, 2u);   // layers 2, 3
    EXPECT_EQ(hook.nodes().second_input_kind(), std::string("ffn_moe_") + a);

    // Negative control: the learned node does not arrive in a later graph (renamed): the wait
    // falls back to the second matmul's ask, still before it computes, and the name is dropped.
    log.clear();
    Graph g2;
    g2.nodes.reserve(16);
    std::memcpy(g2.weights, g.weights, sizeof g.weights);
    add_layer(&g2, 2, gate_first, "renamed-2");
    run(g2, hook, &log);
    const size_t w2 = at(log, "wait2"), c1 = at(log, "compute:renamed-2");
    const size_t c2 = at(log, std::string("compute:ffn_moe_") + b + "-2");
    ASSERT_LT(w2, c2);
    EXPECT_LT(w2, c1) << "waited in the ask of the second matmul: before the range computes";
    EXPECT_EQ(waiter.counters().second_waits_at_matmul, 2u);
    EXPECT_TRUE(hook.nodes().second_input_kind().empty());
}

INSTANTIATE_TEST_SUITE_P(Orders, OverlapWaiterOrder, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool> & i) {
                             return i.param ? std::string("GateFirst") : std::string("UpFirst");
                         });

}  // namespace
