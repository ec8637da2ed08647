// prefetch.h — predicting the next MoE layer's routing, so its experts can be read ahead.
//
// Why: with a warm cache the disk sits idle while a token computes (0.24 s of compute per
// token on the 30B preset against ~0.07 s of reads at a 6000 MiB cache), yet every miss is
// read only once its layer's router has run, with the matmuls waiting. Reading the misses of
// layer L+1 while layer L computes uses that idle time. Nothing about the output changes: a
// prefetched expert is read from the same file bytes into its canonical place, and a routed
// expert is still waited for before its matmul (streamer.h, "Prefetch").
//
// The guess: layer L+1's router scores W_{L+1} · norm(h_{L+1}) and picks the top k. At layer
// L's routing, h_{L+1} is not computed yet, but layer L's own router input is: x_L =
// rmsnorm(h_L) ⊙ γ_L (`ffn_norm-L`, the second operand of `ffn_moe_logits-L`). The residual
// stream changes little from one layer to the next, so the prediction is the top k of
// W_{L+1} · (x_L ⊙ γ_{L+1} / γ_L): layer L+1's router applied to layer L's normalized state
// with layer L+1's norm weights (the RMS scale does not change a top-k). Prior art measured
// 80-89 % of such guesses right on a trained Qwen3-30B-A3B (../shared/reference/
// prior-art.md); accuracy() reports what this model and prompt give.
//
// Cost: the router weights are n_embd x n_expert f32 per layer (1 MiB on the 30B preset). The
// guess uses an int8 copy (one scale per expert row, made on the first guess of a layer:
// n_embd x n_expert bytes per layer, 12 MiB on the 30B preset) and an int8 input: an integer
// dot product (dot_i8.h), exact on every CPU, with an AVX2 (x86-64) or NEON (aarch64) path
// chosen at run time. A guess only needs the order of the top scores, not their values; the
// top k are selected in one pass (score descending, ties to the lower expert id).
//
// Prefill (set_prefill_rows, docs/prefetch.md "Prefill read-ahead"): at a multi-row routing the
// same guess is made for every row of the ubatch, and the sink gets the union of the rows'
// top k for the next MoE layer. It stops guessing once the union is the whole bank (the
// remaining rows could add nothing). A layer's router weights are learned from the graph (the
// first operand of its `ffn_moe_logits` node, seen when that node is asked for); in the first
// graph an engine runs the next layer's router is not seen yet, so prefill guesses use the
// router and norm weights handed over at open (preset_router: the dense weights read from the
// file, the same bytes the graph then uses). Decode guesses use only what the graph showed.
//
// Graph facts used (llama-0.7-facts.md; checked at every use, a mismatch turns the
// prediction off for that layer, never an error): `ffn_moe_logits-<il>` is a MUL_MAT of the
// router weights (f32, ne = [n_embd, n_expert], host memory) by `ffn_norm-<il>` (f32,
// ne = [n_embd, n_tokens]), itself a MUL of the normed state by γ (f32, ne = [n_embd]).
// The router input stays valid until the layer's expert matmuls, which read it.
//
// As a router hook observer (node_observer.h): in ask mode it records the router inputs; at
// every one-token routing of a decode it scores the previous guess and hands the sink
// (streamer.h, "Prefetch") the next MoE layer's guess to read ahead (unless
// set_decode_guess(false)); with set_prefill_rows(true), at every multi-row routing of a
// prompt it hands the sink the union of the rows' guesses. While disabled it does
// nothing at all. Off while drop-cold is on (the engine enables one of them: a deferred load
// would take the hint of a routing the policy has not decided yet).
//
// Thread-safety: driven from the eval callback (one thread); set_enabled() between graphs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "node_observer.h"

struct ggml_tensor;

namespace moestream {

struct PredictCounters {
    uint64_t predictions = 0;  // layers predicted
    uint64_t scored = 0;       // predicted experts whose layer was then routed
    uint64_t right = 0;        // of those, routed
    // Prefill (per-row guesses of multi-row routings):
    uint64_t row_layers = 0;   // layers whose union was handed to the sink
    uint64_t row_rows = 0;     // rows guessed
    uint64_t row_experts = 0;  // experts in those unions
    uint64_t row_full = 0;     // unions that reached the whole bank (guessing stopped there)
    double guess_s = 0;        // time in predict() and predict_rows() (the compute thread's)
};

class RoutePredictor final : public NodeObserver {
public:
    // Whether it predicts (and so prefetches) in the next graphs.
    void set_enabled(bool on) { enabled_ = on; }
    // Whether decode routings are guessed (prefetch; default on).
    void set_decode_guess(bool on) { decode_guess_ = on; }
    // Whether multi-row routings are guessed per row (prefill read-ahead; default off).
    void set_prefill_rows(bool on) { prefill_rows_ = on; }
    // Graph layer il's router, f32 [n_embd, n_expert] with contiguous rows, and its ffn_norm
    // weight (f32 [n_embd], may be null), known before the graph shows them: used by
    // predict_rows() for a layer the graph has not shown yet. Not owned; must outlive this.
    void preset_router(uint32_t il, const float * w, int64_t n_embd, int64_t n_expert,
                       const float * gamma);
    bool decode_guess() const { return decode_guess_; }
    bool prefill_rows() const { return prefill_rows_; }

    void begin_graph(const GraphInfo & g, RouterHook & hook) override;
    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    Status on_routing(const Routing & r, ggml_tensor * topk, RouterHook & hook,
                      bool * defer) override;

    // Ask mode, every node: records the operands of `ffn_moe_logits-<il>`. Cheap for others.
    void observe(const ggml_tensor * t);
    // A new graph: the previous graph's router inputs are gone.
    void new_graph() { std::fill(x_.begin(), x_.end(), nullptr); }
    // At the routing of layer il (one token): the k experts predicted for the next MoE layer.
    // False when it cannot predict (no next MoE layer, unsupported tensor types, batch > 1).
    bool predict(uint32_t il, int k, uint32_t * next_il, std::vector<uint32_t> * out);
    // At the routing of layer il (any number of rows): the union of every row's k predicted
    // experts for the next MoE layer, in first-guessed order. False when it cannot predict,
    // and when the next MoE layer is the last one seen (a prompt never reads that one ahead).
    bool predict_rows(uint32_t il, int k, uint32_t * next_il, std::vector<uint32_t> * out);
    // The routing of layer il arrived: scores the prediction made for it, if any.
    void score(uint32_t il, const int32_t * ids, int k);
    const PredictCounters & counters() const { return c_; }
    uint64_t copy_bytes() const;  // RAM held by the int8 router copies
    // What copy_bytes() reaches once every MoE layer has been guessed: an int8 row and a
    // float scale per expert and layer.
    static uint64_t copy_bytes_for(uint64_t n_moe_layers, uint64_t n_expert, uint64_t n_embd) {
        return n_moe_layers * n_expert * (n_embd + sizeof(float));
    }

private:
    struct Layer {
        const ggml_tensor * w = nullptr;      // router weights, f32 [n_embd, n_expert]
        const ggml_tensor * gamma = nullptr;  // ffn_norm weight, f32 [n_embd] (may be absent)
        std::vector<float> ratio;             // gamma of the next MoE layer / this gamma
        const void * ratio_for[2] = {nullptr, nullptr};  // the gamma data ratio was made of
        // int8 copy of w: row e = q[e * n_embd ...] * scale[e]
        std::vector<int8_t> q;
        std::vector<float> scale;
        const void * q_for = nullptr;  // the router data the copy was made of
        // preset_router(): the router and norm weights before the graph shows them.
        const float * pre_w = nullptr;
        const float * pre_gamma = nullptr;
        int64_t pre_embd = 0, pre_expert = 0;
    };
    void grow(uint32_t il);
    // With preset, a layer the graph has not shown may use preset_router()'s weights.
    bool has_router(uint32_t l, bool preset) const;
    const void * gamma_of(uint32_t l, int64_t n_embd, bool preset) const;
    void ratio_of(uint32_t il, uint32_t nl, int64_t n_embd, bool preset);
    void quantize(Layer & L, const void * w, size_t row_bytes, int64_t n_embd, int64_t n_expert);
    // The checks and one-time preparations shared by predict() (preset false) and
    // predict_rows() (true): the next MoE layer (*nl), the input x_[il] (*x) and the sizes.
    // False when it cannot predict.
    bool prepare(uint32_t il, int k, bool preset, uint32_t * nl, const ggml_tensor ** x,
                 int64_t * n_embd, int64_t * n_expert);
    // One row's guess: the top k of layer nl's router on the row xs (n_embd floats), in score
    // order, into top[0, k).
    void guess_row(uint32_t il, uint32_t nl, const float * xs, int64_t n_embd, int64_t n_expert,
                   int k, uint32_t * top);

    bool enabled_ = true;
    bool decode_guess_ = true;
    bool prefill_rows_ = false;
    bool decode_ = false;         // the running graph is a decode
    std::vector<uint32_t> hint_;  // scratch: the experts predicted for the next layer
    std::vector<Layer> layers_;
    std::vector<const ggml_tensor *> x_;  // per layer: this graph's router input
    std::vector<float> y_, scores_;       // scratch
    std::vector<int8_t> yq_;              // scratch: y_ in int8
    std::vector<int32_t> dots_;           // scratch: the router rows' integer dots with yq_
    std::vector<uint32_t> top_;           // scratch: one row's top k
    std::vector<uint8_t> in_union_;       // scratch: per expert, in the rows' union
    // The last prediction, scored when its layer routes.
    int64_t guess_il_ = -1;
    std::vector<uint32_t> guess_;
    PredictCounters c_;
};

}  // namespace moestream
