// router_hook.h — the seam with llama.cpp's graph: the eval callback that stops the graph at
// every MoE layer's routing node and hands the selected expert ids to the streamer.
//
// Contract (docs/seam.md): ask mode returns true only for `ffn_moe_topk-<il>` (the check is
// a few byte compares: it runs for every node of every decode). ggml then computes that node
// alone, synchronizes, and calls back non-ask with the ids readable in t->data, before any
// later node (the layer's MUL_MAT_IDs) runs. `ffn_moe_topk-<il>` is a VIEW of the argsort:
// i32, ne = [k, n_rows], nb[1] = the argsort's row stride (n_expert * 4), so ids are read
// through the strides, never flat. The buffer is reused across layers: ids are consumed
// inside the callback.
//
// Errors: an invalid id or a failed load is recorded in the hook; the non-ask callback then
// returns false (the rest of the split, and so every expert matmul, is skipped) and the abort
// callback returns true (ggml aborts the remaining computation; llama_decode reports it).
// The engine checks failed() after every llama_decode: llama_decode alone may return 0.
//
// Thread-safety: callbacks arrive on the thread running llama_decode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy_drop_cold.h"
#include "status.h"

struct ggml_tensor;

namespace moestream {

class WeightBinder;
class RouteTracer;
class RoutePredictor;

// The routing of one MoE layer for one ubatch.
struct Routing {
    uint32_t layer = 0;        // il, from the node name
    int k = 0;                 // experts per row
    int n_rows = 0;            // tokens routed (outputs only, on the last layer)
    std::vector<int32_t> ids;  // [n_rows][k], row-major, in the router's rank order
};

// Parses "ffn_moe_topk-<il>". Returns false for any other name.
bool parse_topk_name(const char * name, uint32_t * il);

// Reads the ids of a topk node through its strides and validates 0 <= id < n_expert.
Status read_routing(const ggml_tensor * t, uint32_t layer, uint32_t n_expert, Routing * out);

class RouteSink {
public:
    virtual ~RouteSink() = default;
    // Called for every MoE layer's routing; must make the routed experts resident.
    virtual Status on_routing(const Routing & r) = 0;
    // Whether expert e of graph layer il is resident now (a routing of it would be a hit).
    virtual bool is_resident(uint32_t il, int32_t e) const { return false; }
    // Bytes of one expert of graph layer il over all its projections.
    virtual uint64_t expert_bytes(uint32_t il) const { return 0; }
    // Whether the last routing left reads in flight that only the down matmul needs; the hook
    // then calls finish_pending() before that matmul runs (streamer.h, "Overlap").
    virtual bool has_pending() const { return false; }
    virtual Status finish_pending() { return Status::Ok(); }
    // Prefetch (streamer.h): the experts predicted for MoE layer il, to read behind the next
    // routing's own reads. Consumed (or dropped) by the next on_routing().
    virtual void set_prefetch(uint32_t /*il*/, const std::vector<uint32_t> & /*experts*/) {}
    // Completes every read still in flight, speculative ones included (end of a graph).
    virtual Status drain() { return finish_pending(); }
};

// Deferred loading for --drop-cold-experts (docs/lossy-knobs.md). The drop decision needs
// the FINAL router weights, which appear several nodes after the topk. So, when the policy
// applies, the layer's load is deferred from the topk to the terminal node of its weight
// chain. Which node is terminal depends on the gating (softmax+norm, no norm, sigmoid,
// scaled): it is learned from the graph — in ask mode, at `ffn_moe_weighted-<il>` (the MUL of
// expert outputs by weights), the weights operand is followed through views/reshapes to the
// op that produced it. Until a layer's terminal is known the layer loads at the topk. If a
// learned terminal fails to arrive before the layer's first MUL_MAT_ID (seen in ask mode),
// the pending routing is loaded right there without dropping, the terminal is forgotten and
// re-learned.
struct DropState {
    std::vector<std::string> terminal;  // per graph layer: learned terminal node name
    std::vector<uint8_t> relearns;      // per graph layer: times the terminal failed to arrive
    uint64_t deferred = 0;              // routings loaded at their terminal node
    uint64_t fallbacks = 0;             // routings loaded at MUL_MAT_ID because it did not arrive
};

class RouterHook {
public:
    // binder (optional): while active, every node's operands are handed to it in ask mode
    // (before the node computes) to be rebound off the file mapping; see model_loader.h.
    RouterHook(RouteSink * sink, uint32_t n_expert, WeightBinder * binder = nullptr)
        : sink_(sink), n_expert_(n_expert), binder_(binder) {}

    // Connects the sink and binder once they exist (the context, which holds a pointer to
    // this hook, is created first so the cache budget can account for it).
    void attach(RouteSink * sink, WeightBinder * binder) {
        sink_ = sink;
        binder_ = binder;
    }

    // Turns the drop-cold policy on (frac > 0). n_layer sizes the per-layer state.
    void enable_drop_cold(const DropColdConfig & cfg, uint32_t n_layer);
    // --route-trace (docs/route-trace.md): every routing is handed to the tracer; the final
    // weights are read at the layer's learned terminal node (asked for while a record waits),
    // or, with drop-cold deferral, where the policy reads them. Loading is not moved.
    void enable_trace(RouteTracer * tracer, uint32_t n_layer);
    // Prefetch (prefetch.h, streamer.h): at every one-token routing the predictor guesses the
    // next MoE layer's experts and hands them to the sink to read ahead. Not with drop-cold.
    void enable_prefetch(RoutePredictor * predictor) { predictor_ = predictor; }
    // The engine says whether the next llama_decode is prefill or decode.
    // Called before every llama_decode: nothing may stay pending across graphs.
    void set_decode_phase(bool decode);
    const DropCounters & drop_counters() const { return drop_; }
    // Overlap of the down reads with the gate/up matmuls (streamer.h, "Overlap").
    struct OverlapCounters {
        uint64_t waits_at_input = 0;   // waited at the learned node feeding the down matmul
        uint64_t waits_at_matmul = 0;  // waited in ask mode at the down matmul (no overlap)
        int relearns = 0;              // the learned node failed to arrive
    };
    const OverlapCounters & overlap_counters() const { return overlap_; }
    // Completes reads still in flight (the engine calls it after every llama_decode, before
    // anything that could release their destinations). Also records a failure as error().
    Status end_graph();
    const DropState & drop_state() const { return drop_state_; }
    // The learned terminal node of layer il with its "-<il>" suffix removed ("" if none).
    std::string terminal_kind(uint32_t il) const;

    // ggml_backend_sched_eval_callback and ggml_abort_callback trampolines; user data = this.
    static bool eval_callback(ggml_tensor * t, bool ask, void * user_data);
    static bool abort_callback(void * user_data);

    bool failed() const { return !error_.ok(); }
    const Status & error() const { return error_; }
    void clear_error() { error_ = Status::Ok(); }
    uint64_t routings_seen() const { return routings_; }

private:
    bool on_node(ggml_tensor * t);
    bool ask_drop(ggml_tensor * t);
    void learn_terminal(const ggml_tensor * weighted);
    Status load_pending_at_terminal(ggml_tensor * t);
    Status load_pending_unchanged();
    bool policy_applies() const {
        return drop_cfg_.frac > 0 && (decode_phase_ || drop_cfg_.in_prefill);
    }

    bool ask_bind(ggml_tensor * t);
    bool ask_io(ggml_tensor * t);
    Status route_to_sink(const Routing & r);  // on_routing + overlap bookkeeping
    Status finish_io();
    bool tracing() const;
    void trace_weights(const ggml_tensor * t);

    RouteSink * sink_;
    uint32_t n_expert_;
    WeightBinder * binder_;
    Status error_;
    uint64_t routings_ = 0;
    Routing scratch_;

    // --drop-cold-experts
    DropColdConfig drop_cfg_;
    DropCounters drop_;
    DropState drop_state_;
    bool decode_phase_ = false;
    bool pending_ = false;  // a routing waits for its terminal node
    ggml_tensor * pending_topk_ = nullptr;
    Routing pending_routing_;

    RouteTracer * tracer_ = nullptr;  // --route-trace
    RoutePredictor * predictor_ = nullptr;  // prefetch (null: off)
    std::vector<uint32_t> hint_;            // scratch: the predicted experts

    // Overlap: a layer's down reads in flight; the learned node feeding its down matmul.
    bool io_pending_ = false;
    uint32_t io_il_ = 0;
    std::string pre_down_kind_;  // e.g. "ffn_moe_swiglu" ("" = not learned)
    std::string pre_down_name_;  // pre_down_kind_ + "-<il>" of the pending layer
    OverlapCounters overlap_;
};

}  // namespace moestream
