// router_hook.h — the seam with llama.cpp's graph: the eval callback that stops the graph at
// every MoE layer's routing node, reads the routing (topk_reading.h), learns the nodes later
// observers need (node_learning.h) and dispatches every event to a list of observers
// (node_observer.h); a routing nobody defers goes straight to the sink (the streamer).
//
// Contract (docs/seam.md): ask mode returns true for `ffn_moe_topk-<il>` (the check is a few
// byte compares: it runs for every node of every decode) and for what an observer asks for.
// ggml then computes that node alone, synchronizes, and calls back non-ask with its data
// readable in t->data, before any later node (the layer's MUL_MAT_IDs) runs.
//
// Errors: an invalid id, a failed load or an observer's error is recorded in the hook; the
// non-ask callback then returns false (the rest of the split, and so every expert matmul, is
// skipped) and the abort callback returns true (ggml aborts the remaining computation;
// llama_decode reports it). The engine checks failed() after every llama_decode: llama_decode
// alone may return 0.
//
// Thread-safety: callbacks arrive on the thread running llama_decode; the engine calls
// begin_graph / end_graph on that thread between graphs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "node_learning.h"
#include "node_observer.h"
#include "status.h"
#include "topk_reading.h"

struct ggml_tensor;

namespace moestream {

// Where routings go: it makes the routed experts resident (streamer.h).
class RouteSink {
public:
    virtual ~RouteSink() = default;
    // Called for every MoE layer's routing; must make the routed experts resident.
    virtual Status on_routing(const Routing & r) = 0;
    // Whether expert e of graph layer il is resident now (a routing of it would be a hit).
    virtual bool is_resident(uint32_t il, int32_t e) const { return false; }
    // Bytes of one expert of graph layer il over all its projections.
    virtual uint64_t expert_bytes(uint32_t il) const { return 0; }
    // Whether the last routing left reads in flight that only the down matmul needs; an
    // observer then calls finish_pending() before that matmul runs (streamer.h, "Overlap").
    virtual bool has_pending() const { return false; }
    virtual Status finish_pending() { return Status::Ok(); }
    // Three-stage overlap (streamer.h): whether the reads only the layer's SECOND expert
    // matmul needs are still in flight; an observer then calls finish_second() before that
    // matmul runs (the down reads may stay in flight past it).
    virtual bool has_pending_second() const { return false; }
    virtual Status finish_second() { return finish_pending(); }
    // The graph's order, learned from it: which projection's MUL_MAT_ID computes first in a
    // layer (a Projection value: gate or up). The next routings order their reads by it.
    virtual void set_first_projection(int /*proj*/) {}
    // Prefetch (streamer.h): the experts predicted for MoE layer il, to read behind the next
    // routing's own reads. Consumed (or dropped) by the next on_routing().
    virtual void set_prefetch(uint32_t /*il*/, const std::vector<uint32_t> & /*experts*/) {}
    // Completes every read still in flight, speculative ones included (end of a graph).
    virtual Status drain() { return finish_pending(); }
};

class RouterHook {
public:
    // n_expert: experts per MoE layer (ids are checked against it); n_layer: graph layers.
    // sink and observers are not owned and must outlive the hook; observers are called in
    // this order (node_observer.h).
    RouterHook(uint32_t n_expert, uint32_t n_layer, RouteSink & sink,
               std::vector<NodeObserver *> observers)
        : n_expert_(n_expert), sink_(sink), observers_(std::move(observers)), nodes_(n_layer) {}

    // --- engine, between graphs ---
    // Before every llama_decode: nothing may stay pending across graphs.
    void begin_graph(const GraphInfo & g);
    // After every llama_decode: drains the sink (no read stays in flight past the graph, nor
    // anything that could release their destinations), then ends the graph for every
    // observer. A failure is also recorded as error().
    Status end_graph();
    bool failed() const { return !error_.ok(); }
    const Status & error() const { return error_; }
    void clear_error() { error_ = Status::Ok(); }
    const LearnedNodes & nodes() const { return nodes_; }

    // --- observers, during an event ---
    // Hands r to the sink, with on_load / on_loaded around it.
    Status load(const Routing & r);
    LearnedNodes & nodes() { return nodes_; }
    RouteSink & sink() { return sink_; }
    // Records st unless a failure is already recorded (the abort callback stops the graph).
    void fail(const Status & st) {
        if (!st.ok() && error_.ok()) error_ = st;
    }

    // --- the eval callback (HookSlot) ---
    bool on_ask(ggml_tensor * t);   // true: deliver t
    bool on_node(ggml_tensor * t);  // false: skip the rest of the split

private:
    bool wants_terminals() const;

    uint32_t n_expert_;
    RouteSink & sink_;
    std::vector<NodeObserver *> observers_;
    LearnedNodes nodes_;
    Status error_;
    Routing routing_;  // the routing being read (scratch: its capacity is reused)
};

// The context's callbacks (ggml_backend_sched_eval_callback and ggml_abort_callback, user data
// = the slot). llama.cpp takes them when the context is created, which is before the store,
// the streamer and the observers exist (the cache budget accounts for the context): the
// engine creates the slot with the context and puts the hook in once it is built. A routing
// node computed while the slot is empty stops the graph (the abort callback fires).
// Thread-safety: set() between graphs; the callbacks on the llama_decode thread.
class HookSlot {
public:
    void set(RouterHook * hook) { hook_ = hook; }  // not owned
    static bool eval_callback(ggml_tensor * t, bool ask, void * slot);
    static bool abort_callback(void * slot);
    // Wall time spent inside the router hook's eval callbacks so far (steady clock; the
    // engine's time breakdown: llama_decode minus this is ggml computing).
    double callback_s() const { return callback_s_; }

private:
    RouterHook * hook_ = nullptr;
    double callback_s_ = 0;
    bool orphan_ = false;  // a routing node computed while the slot was empty
};

}  // namespace moestream
