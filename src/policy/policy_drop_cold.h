// policy_drop_cold.h — the opt-in lossy policy --drop-cold-experts F (docs/lossy-knobs.md).
//
// Spend quality only where it buys I/O: during decode, a routed expert is skipped only when
// it is a cache MISS (it would cost a flash read) and its FINAL router weight is below
// F x (1 / k_eff). Rules, exactly:
//  - the routing's top-weighted expert (argmax of the final weights; first slot on ties) is
//    never dropped, so no routing is emptied at any threshold;
//  - a dropped slot's weight becomes exactly 0 and its expert id is repointed at the
//    routing's top expert (which is staged for certain), so MUL_MAT_ID is handed memory that
//    is certainly loaded and multiplies it by exactly zero;
//  - remaining weights are not renormalized unless renorm (--drop-renorm): then they are
//    scaled so that the row's weight sum is unchanged.
// drop_cold_row() is the decision for one row, independent of ggml, so it is unit-tested
// directly. DropColdObserver applies it to the graph's tensors, as a router hook observer:
//
// Deferred loading. The decision needs the FINAL router weights, which appear several nodes
// after the topk. So, when the policy applies (decode, or prefill with --drop-in-prefill), the
// layer's load is deferred from the topk to the terminal node of its weight chain (learned by
// the router hook, node_learning.h); there the policy rewrites the weights and ids in the
// graph's memory before any expert matmul reads them, and the routing is loaded with the
// repointed ids. Until a layer's terminal is known the layer loads at the topk, unchanged. If
// a learned terminal fails to arrive before the layer's first MUL_MAT_ID (seen in ask mode),
// or does not look like the final weights, the pending routing is loaded right there without
// dropping and the terminal is forgotten and re-learned.
//
// Thread-safety: drop_cold_row is a pure function; a DropColdObserver is driven from the
// llama_decode thread only (configure() between graphs).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "node_observer.h"

namespace moestream {

struct DropColdConfig {
    double frac = 0;          // F in (0, 1]; 0 = off
    bool in_prefill = false;  // --drop-in-prefill
    bool renorm = false;      // --drop-renorm
    // --miss-fallback (miss_fallback.h), decode only: a slot other than the row's top
    // expert whose final weight is below fallback_w and whose expert fallback_ok(il, e)
    // accepts (not resident in full) is marked in Routing::fallback. 0 = off.
    double fallback_w = 0;
    std::function<bool(uint32_t, int32_t)> fallback_ok;
};

// Marks the fallback slots of one row (k slots, weights w[j * w_stride], ids[j * id_stride])
// in fb[0..k) by the rule of DropColdConfig::fallback_w. Returns the number marked.
int fallback_row(int k, const int32_t * ids, int64_t id_stride, const float * w,
                 int64_t w_stride, double threshold, const std::function<bool(int32_t)> & ok,
                 uint8_t * fb);

struct DropCounters {
    uint64_t routed = 0;         // slots seen (experts routed) where the policy was applied
    uint64_t dropped = 0;        // slots dropped
    double weight_total = 0;     // sum of final router weights over routed slots
    double weight_dropped = 0;   // sum of the weights that were dropped
    uint64_t bytes_avoided = 0;  // expert bytes not read because of drops
};

// Applies the policy to one row of k slots. ids[j * id_stride] and w[j * w_stride] are the
// slot's expert id and final weight (modified in place). resident(e) tells whether expert
// e would be a cache hit. Returns the number of slots dropped.
int drop_cold_row(int k, int32_t * ids, int64_t id_stride, float * w, int64_t w_stride,
                  int k_eff, const DropColdConfig & cfg,
                  const std::function<bool(int32_t)> & resident, DropCounters * counters);

class DropColdObserver final : public NodeObserver {
public:
    explicit DropColdObserver(const DropColdConfig & cfg) : cfg_(cfg) {}
    // A new setting (frac 0 = off) for the next graphs; the terminals are learned afresh.
    void configure(const DropColdConfig & cfg) {
        cfg_ = cfg;
        relearn_ = true;
    }
    const DropCounters & counters() const { return drop_; }
    uint64_t deferred() const { return deferred_; }    // routings loaded at their terminal
    uint64_t fallbacks() const { return fallbacks_; }  // loaded at MUL_MAT_ID: it never came

    void begin_graph(const GraphInfo & g, RouterHook & hook) override;
    bool wants_terminals() const override { return cfg_.frac > 0 || cfg_.fallback_w > 0; }
    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    Status on_node(ggml_tensor * t, RouterHook & hook) override;
    Status on_routing(const Routing & r, ggml_tensor * topk, RouterHook & hook,
                      bool * defer) override;

private:
    bool applies() const {
        return (cfg_.frac > 0 && (decode_ || cfg_.in_prefill)) || (cfg_.fallback_w > 0 && decode_);
    }
    Status load_at_terminal(ggml_tensor * t, RouterHook & hook);
    Status load_unchanged(RouterHook & hook);

    DropColdConfig cfg_;
    DropCounters drop_;
    uint64_t deferred_ = 0, fallbacks_ = 0;
    bool relearn_ = false;  // configure() was called: reset the terminals at the next graph
    bool decode_ = false;   // the running graph is a decode
    bool pending_ = false;  // a routing waits for its terminal node
    ggml_tensor * pending_topk_ = nullptr;
    Routing pending_routing_;
};

}  // namespace moestream
