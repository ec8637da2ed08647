// trace_observer.h — the graph side of --route-trace (route_trace.h, docs/route-trace.md): a
// router hook observer (node_observer.h) that hands a RouteTracer each graph, each routing,
// its final router weights and the slots drop-cold dropped.
//
// Weights are read at the layer's learned terminal node (node_learning.h), asked for while the
// layer's record waits for them; the observer comes before drop-cold in the hook's list, so
// with drop-cold deferral it reads them at the same node before the policy rewrites them. A
// slot whose id the policy repointed is marked dropped just before the routing is loaded (so
// before the streamer reports which slots were hits). Loading is never moved by tracing, and
// nothing here changes the graph's data. Weights the observer cannot read stay NaN.
//
// Thread-safety: the llama_decode thread only, like the tracer.
#pragma once

#include <cstdint>
#include <vector>

#include "node_observer.h"

namespace moestream {

class RouteTracer;

class TraceObserver final : public NodeObserver {
public:
    explicit TraceObserver(RouteTracer & tracer) : tracer_(tracer) {}  // not owned

    void begin_graph(const GraphInfo & g, RouterHook & hook) override;
    bool wants_terminals() const override;
    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    // --route-trace-scores: the router's order and scores, before --substitute-experts
    // rewrites the order (the engine lists this observer before the substitution).
    Status on_select(Routing & r, ggml_tensor * topk, RouterHook & hook) override;
    Status on_node(ggml_tensor * t, RouterHook & hook) override;
    Status on_routing(const Routing & r, ggml_tensor * topk, RouterHook & hook,
                      bool * defer) override;
    void on_load(const Routing & r, RouterHook & hook) override;
    void end_graph(RouterHook & hook) override;

private:
    RouteTracer & tracer_;
    // The routing of the tracer's open record, as routed (-1: none this graph).
    int64_t layer_ = -1;
    int k_ = 0, n_rows_ = 0;
    std::vector<int32_t> routed_;
};

}  // namespace moestream
