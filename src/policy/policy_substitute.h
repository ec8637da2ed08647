// policy_substitute.h — the opt-in lossy policy --substitute-experts M (docs/lossy-knobs.md),
// and the cache-debug check that every expert a MUL_MAT_ID is about to read is resident.
//
// Substitution spends quality only where it buys I/O: when a routed expert is a cache MISS
// and a RESIDENT expert of the same layer that the router did not select scored almost as
// high, the resident one is computed instead. Rules, exactly, per token (row):
//  - the score of an expert is the value the router ranks experts by: the input of the
//    layer's argsort (softmax probability for softmax gating, sigmoid for sigmoid gating,
//    plus the selection bias where the model has one);
//  - the routing's top expert (rank 0) is never replaced;
//  - a routed expert e of rank >= 1 that is not resident is replaced by the best-scoring
//    expert c ranked below the top-k that is resident, not already selected for that token
//    (routed or substituted) and scores within the margin: score(e) - score(c) < M
//    (absolute difference; strict, so M = 0 never substitutes). The first such candidate in
//    the router's order is taken; if it is outside the margin, no lower one is inside it;
//  - the substitution is made in the graph's selected-experts tensor before the router
//    weights are gathered from it, so the substitute carries its OWN router probability
//    through the model's own gating (normalised with the others where the model normalises
//    its top-k): nothing else is rewritten;
//  - the routing handed to the streamer names the substitute, so it is staged (and pinned)
//    with the rest of the layer: a substitute evicted by the layer's other misses is read
//    again, never used unloaded.
// M <= 0 is off. Decode only (prefill computes every routed expert, as with drop-cold).
//
// substitute_row() is the decision for one row, independent of ggml, so it is unit-tested
// directly. SubstituteObserver applies it at each routing node (NodeObserver::on_select).
//
// Thread-safety: substitute_row is a pure function; the observers are driven from the
// llama_decode thread only.
#pragma once

#include <string>
#include <unordered_set>
#include <utility>

#include <cstdint>
#include <functional>
#include <vector>

#include "node_observer.h"

namespace moestream {

struct SubstituteCounters {
    uint64_t routed = 0;         // slots seen where the policy was applied
    uint64_t substituted = 0;    // slots whose expert was replaced by a resident one
    double score_lost = 0;       // sum over substitutions of score(e) - score(c)
    uint64_t bytes_avoided = 0;  // expert bytes not read because of substitutions
    uint64_t no_scores = 0;      // routings left unchanged: the scores were not readable
};

// One row. sorted[0..n) is the router's order of all n experts (rank 0 first); the first k
// are the routed slots (ids[j * id_stride] mirrors sorted[j] and is rewritten in place, as
// is sorted[j]). score(e) is expert e's router score. resident(e): a cache hit now.
// substituted (k entries, may be null) gets 1 for a replaced slot. Returns the number
// replaced.
int substitute_row(int k, int n, int32_t * sorted, int32_t * ids, int64_t id_stride,
                   const std::function<float(int32_t)> & score, double margin,
                   const std::function<bool(int32_t)> & resident, uint8_t * substituted,
                   SubstituteCounters * counters);

// The router's full order and scores of the routing r read at `topk`: topk is a view of
// *argsort (I32, all experts per row, rank order), whose input *scores (F32, by expert id)
// is what substitute_row compares. False when the graph does not have that shape; the
// observer then leaves the routing unchanged (and a route trace records no scores for it).
bool router_scores(const Routing & r, ggml_tensor * topk, ggml_tensor ** argsort,
                   ggml_tensor ** scores);

class SubstituteObserver final : public NodeObserver {
public:
    // margin: M (<= 0 = off). plant_unrouted (tests only): the negative control of the
    // residency check: substitutes a NON-resident expert in the graph without naming it in
    // the routing handed to the streamer, so a matmul would read an unloaded expert.
    SubstituteObserver(double margin, bool plant_unrouted)
        : margin_(margin), plant_(plant_unrouted) {}
    void configure(double margin) { margin_ = margin; }
    double margin() const { return margin_; }
    const SubstituteCounters & counters() const { return c_; }

    void begin_graph(const GraphInfo & g, RouterHook & hook) override;
    Status on_select(Routing & r, ggml_tensor * topk, RouterHook & hook) override;

private:
    double margin_;
    bool plant_;
    bool decode_ = false;
    bool warned_ = false;
    SubstituteCounters c_;
    std::vector<uint8_t> in_row_;  // scratch: expert selected for the current row
};

// --cache-debug: at every MUL_MAT_ID (ask mode, before it computes), every expert id in its
// ids operand must be resident in the streamer's store. A failure is one error naming the
// matmul, layer and expert; the offending ids are repointed at the row's first (rank 0,
// staged) expert so that the matmul that may still run before the abort reads loaded memory.
// Only the matmuls of streamed expert tensors are checked (`streamed`: their names, e.g.
// "blk.3.ffn_up_exps.weight"); other MUL_MAT_IDs (attention experts) compute from RAM.
class ExpertUseCheck final : public NodeObserver {
public:
    explicit ExpertUseCheck(std::unordered_set<std::string> streamed)
        : streamed_(std::move(streamed)) {}
    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    uint64_t checked() const { return checked_; }

private:
    std::unordered_set<std::string> streamed_;
    uint64_t checked_ = 0;
};

}  // namespace moestream
