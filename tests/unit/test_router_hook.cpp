// test_router_hook.cpp — the router hook as a dispatcher (src/graph/router_hook.h,
// node_observer.h): routing nodes read through their strides and handed to the sink, node
// events delivered to the observers in list order, a claim in ask mode ending the ask, a
// deferred routing loaded only by the observer that took it, terminal nodes learned only
// while an observer wants them, and an empty hook slot stopping the graph.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ggml.h"
#include "router_hook.h"

using namespace moestream;

namespace {

ggml_tensor node(const char * name, ggml_op op = GGML_OP_NONE, ggml_type type = GGML_TYPE_F32) {
    ggml_tensor t{};
    std::strncpy(t.name, name, sizeof t.name - 1);
    t.op = op;
    t.type = type;
    for (int i = 0; i < GGML_MAX_DIMS; ++i) t.ne[i] = 1;
    return t;
}

// A topk view: k ids per row, rows `row_stride` int32 apart (the argsort's n_expert).
struct Topk {
    std::vector<int32_t> buf;
    ggml_tensor t;
    Topk(const char * name, int k, int rows, int row_stride, std::vector<int32_t> ids)
        : buf(size_t(rows) * size_t(row_stride), -7), t(node(name, GGML_OP_VIEW, GGML_TYPE_I32)) {
        for (int r = 0; r < rows; ++r)
            for (int j = 0; j < k; ++j) buf[size_t(r * row_stride + j)] = ids[size_t(r * k + j)];
        t.ne[0] = k;
        t.ne[1] = rows;
        t.nb[0] = sizeof(int32_t);
        t.nb[1] = sizeof(int32_t) * size_t(row_stride);
        t.data = buf.data();
    }
};

struct Sink final : RouteSink {
    std::vector<Routing> got;
    std::vector<std::string> * log = nullptr;
    Status on_routing(const Routing & r) override {
        got.push_back(r);
        if (log) log->push_back("sink:" + std::to_string(r.layer));
        return Status::Ok();
    }
};

// Logs every event as "<name>:<event>[:<node>]"; claims `claim` in ask mode, defers routings
// while `defer`, and loads the deferred routing at the node named `load_at`.
struct Recorder final : NodeObserver {
    std::string name;
    std::vector<std::string> * log;
    std::string claim, load_at;
    bool defer = false, terminals = false;
    Routing held;
    Recorder(std::string n, std::vector<std::string> * l) : name(std::move(n)), log(l) {}

    void begin_graph(const GraphInfo &, RouterHook &) override { log->push_back(name + ":begin"); }
    bool wants_terminals() const override { return terminals; }
    bool on_ask(ggml_tensor * t, RouterHook &) override {
        log->push_back(name + ":ask:" + t->name);
        return claim == t->name;
    }
    Status on_node(ggml_tensor * t, RouterHook & hook) override {
        log->push_back(name + ":node:" + t->name);
        if (!load_at.empty() && load_at == t->name) return hook.load(held);
        return Status::Ok();
    }
    Status on_routing(const Routing & r, ggml_tensor *, RouterHook &, bool * d) override {
        log->push_back(name + ":routing:" + std::to_string(r.layer));
        if (defer) {
            held = r;
            *d = true;
        }
        return Status::Ok();
    }
    void on_load(const Routing & r, RouterHook &) override {
        log->push_back(name + ":load:" + std::to_string(r.layer));
    }
    void on_loaded(const Routing & r, const Status &, RouterHook &) override {
        log->push_back(name + ":loaded:" + std::to_string(r.layer));
    }
    void end_graph(RouterHook &) override { log->push_back(name + ":end"); }
};

}  // namespace

TEST(RouterHook, ReadsRoutingThroughStridesIntoTheSink) {
    Sink sink;
    RouterHook hook(8, 4, sink, {});
    // 2 rows of k = 2, rows 8 ids apart (a view of the argsort, not a flat array).
    Topk topk("ffn_moe_topk-3", 2, 2, 8, {5, 1, 7, 0});
    EXPECT_TRUE(hook.on_ask(&topk.t));
    ggml_tensor other = node("ffn_moe_logits-3", GGML_OP_MUL_MAT);
    EXPECT_FALSE(hook.on_ask(&other));  // no observer asks for it
    EXPECT_TRUE(hook.on_node(&topk.t));
    ASSERT_EQ(sink.got.size(), 1u);
    EXPECT_EQ(sink.got[0].layer, 3u);
    EXPECT_EQ(sink.got[0].k, 2);
    EXPECT_EQ(sink.got[0].n_rows, 2);
    EXPECT_EQ(sink.got[0].ids, (std::vector<int32_t>{5, 1, 7, 0}));
    EXPECT_FALSE(hook.failed());
}

TEST(RouterHook, InvalidIdStopsTheGraphAndReachesNoSink) {
    Sink sink;
    RouterHook hook(8, 4, sink, {});
    HookSlot slot;
    slot.set(&hook);
    Topk topk("ffn_moe_topk-1", 2, 1, 8, {3, 8});  // 8 is outside [0, 8)
    EXPECT_FALSE(HookSlot::eval_callback(&topk.t, false, &slot));
    EXPECT_TRUE(sink.got.empty());
    EXPECT_TRUE(hook.failed());
    EXPECT_NE(hook.error().message().find("expert id 8"), std::string::npos)
        << hook.error().message();
    EXPECT_TRUE(HookSlot::abort_callback(&slot));
    hook.clear_error();
    EXPECT_FALSE(HookSlot::abort_callback(&slot));  // control: no failure, no abort
}

TEST(RouterHook, DispatchesEveryEventInListOrder) {
    std::vector<std::string> log;
    Sink sink;
    sink.log = &log;
    Recorder a("a", &log), b("b", &log);
    RouterHook hook(8, 4, sink, {&a, &b});
    hook.begin_graph(GraphInfo{true, 0, 1});
    Topk topk("ffn_moe_topk-2", 1, 1, 8, {4});
    EXPECT_TRUE(hook.on_ask(&topk.t));  // routing nodes: asked before any observer
    EXPECT_TRUE(hook.on_node(&topk.t));
    EXPECT_TRUE(hook.end_graph().ok());
    EXPECT_EQ(log, (std::vector<std::string>{
                       "a:begin", "b:begin",                                      //
                       "a:node:ffn_moe_topk-2", "b:node:ffn_moe_topk-2",          //
                       "a:routing:2", "b:routing:2",                              //
                       "a:load:2", "b:load:2", "sink:2", "a:loaded:2", "b:loaded:2",  //
                       "a:end", "b:end"}));
}

// Every observer sees every ask, in list order, also after an earlier one claimed the node
// (an observer that waits or rewrites at a node's ask must see it); the node is delivered when
// any observer claims it, and only then.
TEST(RouterHook, EveryObserverSeesEveryAskAndAnyClaimDelivers) {
    std::vector<std::string> log;
    Sink sink;
    Recorder a("a", &log), b("b", &log);
    a.claim = "x";
    b.claim = "z";
    RouterHook hook(8, 4, sink, {&a, &b});
    ggml_tensor x = node("x"), y = node("y"), z = node("z");
    EXPECT_TRUE(hook.on_ask(&x));
    EXPECT_FALSE(hook.on_ask(&y));
    EXPECT_TRUE(hook.on_ask(&z));
    EXPECT_EQ(log, (std::vector<std::string>{"a:ask:x", "b:ask:x", "a:ask:y", "b:ask:y",
                                             "a:ask:z", "b:ask:z"}));
}

TEST(RouterHook, DeferredRoutingIsLoadedOnlyByItsObserver) {
    std::vector<std::string> log;
    Sink sink;
    Recorder a("a", &log);
    a.defer = true;
    a.load_at = "term-5";
    RouterHook hook(8, 8, sink, {&a});
    Topk topk("ffn_moe_topk-5", 2, 1, 8, {6, 2});
    EXPECT_TRUE(hook.on_node(&topk.t));
    EXPECT_TRUE(sink.got.empty());  // deferred: the hook does not load it
    ggml_tensor term = node("term-5");
    EXPECT_TRUE(hook.on_node(&term));
    ASSERT_EQ(sink.got.size(), 1u);
    EXPECT_EQ(sink.got[0].layer, 5u);
    EXPECT_EQ(sink.got[0].ids, (std::vector<int32_t>{6, 2}));
}

TEST(RouterHook, LearnsTerminalsOnlyWhileAnObserverWantsThem) {
    std::vector<std::string> log;
    Sink sink;
    Recorder a("a", &log);
    RouterHook hook(8, 4, sink, {&a});
    // ffn_moe_weighted-2 = experts * reshape(norm-2): the weights operand has ne[0] == 1.
    ggml_tensor norm = node("ffn_moe_weights_norm-2", GGML_OP_DIV);
    ggml_tensor view = node("", GGML_OP_RESHAPE);
    view.src[0] = &norm;
    ggml_tensor experts = node("ffn_moe_down-2", GGML_OP_MUL_MAT_ID);
    experts.ne[0] = 16;
    ggml_tensor weighted = node("ffn_moe_weighted-2", GGML_OP_MUL);
    weighted.src[0] = &experts;
    weighted.src[1] = &view;
    EXPECT_FALSE(hook.on_ask(&weighted));
    EXPECT_EQ(hook.nodes().terminal(2), "");  // nobody wants terminals: nothing learned
    a.terminals = true;
    EXPECT_FALSE(hook.on_ask(&weighted));
    EXPECT_EQ(hook.nodes().terminal(2), "ffn_moe_weights_norm-2");
    EXPECT_EQ(hook.nodes().terminal_kind(2), "ffn_moe_weights_norm");
}

TEST(HookSlot, EmptySlotStopsAGraphThatRoutes) {
    HookSlot slot;
    ggml_tensor other = node("attn_norm-0", GGML_OP_MUL);
    EXPECT_FALSE(HookSlot::eval_callback(&other, true, &slot));
    EXPECT_FALSE(HookSlot::abort_callback(&slot));  // control: nothing routed yet
    Topk topk("ffn_moe_topk-0", 1, 1, 4, {1});
    EXPECT_TRUE(HookSlot::eval_callback(&topk.t, true, &slot));
    EXPECT_FALSE(HookSlot::eval_callback(&topk.t, false, &slot));
    EXPECT_TRUE(HookSlot::abort_callback(&slot));
}
