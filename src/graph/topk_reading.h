// topk_reading.h — reading a MoE layer's routing out of llama.cpp's graph: the expert ids of
// its `ffn_moe_topk-<il>` node and the layout of its final router weights.
//
// Contract (docs/seam.md): `ffn_moe_topk-<il>` is a VIEW of the argsort: i32, ne = [k, n_rows],
// nb[1] = the argsort's row stride (n_expert * 4), so ids are read through the strides, never
// flat. The final weights are f32 shaped [k, n_rows] or [1, k, n_rows], also read through their
// strides. Nothing here keeps a pointer into the graph: ids are copied out (the buffer is
// reused across layers).
//
// Thread-safety: pure functions; a Routing is a plain value.
#pragma once

#include <cstdint>
#include <vector>

#include "status.h"

struct ggml_tensor;

namespace moestream {

// The routing of one MoE layer for one ubatch.
struct Routing {
    uint32_t layer = 0;        // il, from the node name
    int k = 0;                 // experts per row
    int n_rows = 0;            // tokens routed (outputs only, on the last layer)
    std::vector<int32_t> ids;  // [n_rows][k], row-major, in the router's rank order
    // Empty, or [n_rows][k]: 1 where --substitute-experts replaced the routed expert by the
    // resident one now in ids (NodeObserver::on_select).
    std::vector<uint8_t> substituted;
    // Empty, or [n_rows][k]: 1 where --miss-fallback computes the routed expert from its
    // low-bit copy (set with the final weights, before the routing is loaded).
    std::vector<uint8_t> fallback;
};

// The prefix every routing node's name starts with (the hot-path check of ask mode).
inline constexpr char kTopkPrefix[] = "ffn_moe_topk-";
inline constexpr size_t kTopkPrefixLen = sizeof(kTopkPrefix) - 1;

// Parses "ffn_moe_topk-<il>". Returns false for any other name.
bool parse_topk_name(const char * name, uint32_t * il);

// Reads the ids of a topk node through its strides and validates 0 <= id < n_expert.
Status read_routing(const ggml_tensor * t, uint32_t layer, uint32_t n_expert, Routing * out);

// Byte strides (per slot, per row) of final weights shaped [k, rows] or [1, k, rows]; false
// for any other shape or type. The caller checks their alignment before reading floats.
bool final_weight_strides(const ggml_tensor * t, int k, int rows, int64_t * w_slot,
                          int64_t * w_row);

}  // namespace moestream
