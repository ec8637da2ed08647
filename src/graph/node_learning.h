// node_learning.h — the graph nodes the router hook learns from llama.cpp's graph, for the
// observers that act later in a layer than its routing node.
//
// Terminal node (drop-cold, route traces): the last op of a layer's router-weight chain, where
// the FINAL weights appear. Which op that is depends on the gating (softmax+norm, no norm,
// sigmoid, scaled), so it is learned: in ask mode, at `ffn_moe_weighted-<il>` (the MUL of the
// expert outputs by the weights), the weights operand (ne[0] == 1) is followed through
// views/reshapes to the op that produced it; that op's name is the layer's terminal.
// Down input (overlap): the kind of node feeding the layer's down MUL_MAT_ID, learned at that
// matmul from its input's name "<kind>-<il>"; the same kind serves every layer.
//
// Invariants: a learned name is never re-learned while known; an observer that finds it did
// not arrive forgets it, which counts a relearn; after kMaxRelearns of a layer (or of the down
// input) nothing more is learned there, and the observer stays on its lossless path.
//
// Thread-safety: used from the llama_decode thread only (the eval callback).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct ggml_tensor;

namespace moestream {

class LearnedNodes {
public:
    static constexpr int kMaxRelearns = 3;

    // n_layer: graph layers (every MoE layer index is below it).
    explicit LearnedNodes(uint32_t n_layer) : terminal_(n_layer), relearns_(n_layer, 0) {}

    // Ask mode, any node: learns the terminal of layer il when t is `ffn_moe_weighted-<il>`.
    void learn_terminal(const ggml_tensor * t);
    // Layer il's learned terminal node name ("" if none).
    const std::string & terminal(uint32_t il) const;
    // The terminal of il did not arrive or was not usable: forget it, count a relearn.
    void forget_terminal(uint32_t il);
    // Forgets every terminal and its relearn count (a changed policy learns afresh).
    void reset_terminals();
    // The terminal of il with its "-<il>" suffix removed ("" if none).
    std::string terminal_kind(uint32_t il) const;

    // The learned kind of the down matmul's input (e.g. "ffn_moe_swiglu"; "" = not learned).
    const std::string & down_input_kind() const { return down_kind_; }
    // At layer il's down MUL_MAT_ID (ask mode): learns the kind from its input's name.
    void learn_down_input(const ggml_tensor * down_matmul, uint32_t il);
    // The learned down input did not arrive before the matmul: forget it, count a relearn.
    void forget_down_input() {
        down_kind_.clear();
        ++down_relearns_;
    }

private:
    std::vector<std::string> terminal_;  // per graph layer: learned terminal node name
    std::vector<uint8_t> relearns_;      // per graph layer: times the terminal was forgotten
    std::string down_kind_;
    int down_relearns_ = 0;
};

}  // namespace moestream
