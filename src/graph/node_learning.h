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
// First projection (three-stage overlap): which of gate/up a layer's first expert MUL_MAT_ID
// after its routing multiplies, learned once from the graph (the same for every layer).
// Second input (three-stage overlap): the kind of the node computed just before the layer's
// second expert MUL_MAT_ID (the first matmul itself, or what follows it), learned at that
// matmul from the previously asked node's name "<kind>-<il>".
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

    // The projection (Projection value, gate or up) multiplied first in a layer; -1 = unknown.
    int first_projection() const { return first_proj_; }
    void learn_first_projection(int proj) { first_proj_ = proj; }
    // The learned kind of the node just before the second expert matmul ("" = not learned).
    const std::string & second_input_kind() const { return second_kind_; }
    // At layer il's second expert MUL_MAT_ID (ask mode): learns the kind from `before`, the
    // node asked just before it (null: nothing learned).
    void learn_second_input(const ggml_tensor * before, uint32_t il);
    void forget_second_input() {
        second_kind_.clear();
        ++second_relearns_;
    }

private:
    static bool kind_of(const char * name, uint32_t il, std::string * kind);
    std::vector<std::string> terminal_;  // per graph layer: learned terminal node name
    std::vector<uint8_t> relearns_;      // per graph layer: times the terminal was forgotten
    std::string down_kind_;
    int down_relearns_ = 0;
    int first_proj_ = -1;
    std::string second_kind_;
    int second_relearns_ = 0;
};

}  // namespace moestream
