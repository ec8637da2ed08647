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
#include <vector>

#include "status.h"

struct ggml_tensor;

namespace moestream {

// The routing of one MoE layer for one ubatch.
struct Routing {
    uint32_t layer = 0;          // il, from the node name
    int k = 0;                   // experts per row
    int n_rows = 0;              // tokens routed (outputs only, on the last layer)
    std::vector<int32_t> ids;    // [n_rows][k], row-major, in the router's rank order
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
};

class RouterHook {
public:
    RouterHook(RouteSink * sink, uint32_t n_expert) : sink_(sink), n_expert_(n_expert) {}

    // ggml_backend_sched_eval_callback and ggml_abort_callback trampolines; user data = this.
    static bool eval_callback(ggml_tensor * t, bool ask, void * user_data);
    static bool abort_callback(void * user_data);

    bool failed() const { return !error_.ok(); }
    const Status & error() const { return error_; }
    void clear_error() { error_ = Status::Ok(); }
    uint64_t routings_seen() const { return routings_; }

private:
    bool on_node(ggml_tensor * t);

    RouteSink * sink_;
    uint32_t n_expert_;
    Status error_;
    uint64_t routings_ = 0;
    Routing scratch_;
};

}  // namespace moestream
