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
// This file holds the decision for one row, independent of ggml, so it is unit-tested
// directly; router_hook.cpp applies it to the graph's tensors.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>

namespace moestream {

struct DropColdConfig {
    double frac = 0;          // F in (0, 1]; 0 = off
    bool in_prefill = false;  // --drop-in-prefill
    bool renorm = false;      // --drop-renorm
};

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

}  // namespace moestream
