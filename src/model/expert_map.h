// expert_map.h — the expert map: which tensors hold a MoE layer's routed experts, where
// expert e's slice of each is, and the totals the streamer plans with (expert and dense
// bytes, one token's working set). Also the layers llama.cpp does not build (NextN / MTP),
// whose tensors are flagged unused and left out of the map and the totals.
//
// Invariants of a map built here (gguf_index.h states them for ModelIndex): per MoE layer,
// gate/up/down (or fused gate_up, or up/down) expert tensors with consistent shapes against
// n_embd (or a declared latent width), the layer's n_ff and n_expert; ascending layer order.
// Failures are ParseError naming the tensor's record in its shard. Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <string>

#include "hparam_rules.h"
#include "index_context.h"

namespace moestream::gguf {

// "blk.<N>." with a canonical decimal N (no leading zeros): the layer index; false otherwise.
bool parse_layer(const std::string & name, uint32_t * layer);
// "blk.<N>.ffn_{gate,up,down,gate_up}_exps.weight"; false otherwise.
bool parse_expert_name(const std::string & name, uint32_t * layer, Projection * proj);

// NextN/MTP layers: the last <arch>.nextn_predict_layers layers, which llama.cpp loads
// without building them into the graph (HparamRules::check checked the value < block_count).
void mark_unused_layers(IndexContext & c);
// Builds c.m.moe_layers and c.m.expert_tensor_names from every used tensor; `end_offset` is
// where "not a MoE model" is reported (the end of the tensor infos).
void build_expert_map(IndexContext & c, const HparamRules & h, uint64_t end_offset);
// expert_bytes_total, token_working_set_bytes and dense_bytes_total (after the map).
void sum_totals(IndexContext & c);

}  // namespace moestream::gguf
