// hparam_rules.h — llama.cpp's hyperparameter rules: the model parameters the index keeps
// (architecture, expert counts, layers, widths, vocabulary size) and the checks of the
// metadata llama.cpp asserts on or divides by (float scales finite, epsilons and rope bases
// positive, head counts that divide, rope dimensions that fit the head, gating function ids,
// NextN and dense-layer counts). An architecture's own rule is added here.
//
// Invariants after read_params(): 2 <= n_expert, 1 <= n_expert_used <= n_expert, n_layer in
// [1, kMaxLayers], n_ff_layer has n_layer entries. Every failure is a ParseError at the
// offending key's record (IndexContext::fail). Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "index_context.h"

namespace moestream::gguf {

struct HparamRules {
    std::vector<uint32_t> n_ff_layer;    // expert FFN width per layer from the KV (0 = any)
    std::vector<int64_t> latent_widths;  // allowed expert input widths besides n_embd

    // Reads and range-checks the model parameters into c.m (and the two vectors above).
    void read_params(IndexContext & c);
    // The hyperparameter checks (after read_params).
    void check(IndexContext & c) const;
};

}  // namespace moestream::gguf
