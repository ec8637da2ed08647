// slot_rewriter.h — the graph side of the fixed-slot cache (residency.h, make_slot_cache):
// points each MoE layer's expert tensors at where the layer's last stage placed its experts,
// and rewrites the graph's expert ids to slot indices when that stage used slots.
//
// Order within a layer (ask precedes compute, node_observer.h): the routing node computes,
// the streamer stages (slots chosen, reads started), then this observer asks for every node
// that reads the routed ids before the layer's first expert matmul (the GET_ROWS that gathers
// the router weights; some graphs gather by them twice), so each has computed when that
// matmul is asked about. There, before it computes, the ids (the topk node's data) are
// rewritten in place to slot indices, so every MUL_MAT_ID of the layer reads slot s where
// expert e sits. (Nodes between that were not asked for do not read the ids.) At each
// MUL_MAT_ID the weight's data pointer is set to the store's placement_base() for its layer.
//
// Warm start: in the prompt's last ubatch (GraphInfo::prompt_end), a layer whose routing was
// too wide for its slots (staged to the shared slots) has its slots filled from there once its
// matmuls have run, at the next layer's routing (or the graph's end): the experts of the
// ubatch's last tokens, most recent first, up to the slots per layer (ResidencyStore::
// warm_slots). Decode then starts with the slots holding what the prompt's end used instead of
// reading every routed expert of its first token.
//
// Refusal (the run stops with an error naming the layer and node, never a wrong result): any
// node other than a MUL_MAT_ID that reads the ids after they were rewritten and before the
// layer's last expert matmul (an expert bias added by id, as gpt-oss does).
// Thread-safety: one RouterHook's observer: the llama_decode thread only.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "moestream/gguf_index.h"
#include "node_observer.h"
#include "residency.h"

namespace moestream {

class Streamer;

class SlotRewriter final : public NodeObserver {
public:
    // index, store and streamer are not owned and must outlive the observer; the store has
    // slot placement (ResidencyStore::slot_placement(): the fixed slots).
    SlotRewriter(const ModelIndex & index, ResidencyStore * store, const Streamer * streamer);

    void begin_graph(const GraphInfo & g, RouterHook & hook) override;
    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    Status on_node(ggml_tensor * t, RouterHook & hook) override;
    Status on_routing(const Routing & r, ggml_tensor * topk, RouterHook & hook,
                      bool * defer) override;
    void on_loaded(const Routing & r, const Status & st, RouterHook & hook) override;
    void end_graph(RouterHook & hook) override;

    uint64_t rewrites() const { return rewrites_; }  // layers whose ids were rewritten
    // Tests only (MOESTREAM_DEBUG_SLOT_MISPLACE=1): every id is rewritten to the slot after
    // the right one (modulo the slots), the negative control of the rewrite.
    void plant_misplace(bool on) { misplace_ = on; }

private:
    int tensor_index(const ggml_tensor * w, size_t moe_idx);  // -1: not an expert tensor
    void flush_warm();  // the pending warm start, if any (its layer's matmuls have run)
    // Rewrites the layer's ids (`ids`: the MUL_MAT_ID's ids operand, I32 [k, n_rows]) in place
    // from expert ids to slot indices (the first time, keeping the expert ids); an error when
    // a routed expert has no slot. restore() puts the expert ids back.
    Status rewrite(const ggml_tensor * ids);
    void restore();

    const ModelIndex & index_;
    SlotPlacement * slots_;  // the store's slot placement
    const Streamer * streamer_;
    std::unordered_map<const ggml_tensor *, int> t_index_;  // weight -> tensor of its layer
    ggml_tensor * topk_ = nullptr;   // the routing node of the layer being computed
    const void * ids_ = nullptr;     // its data: the ids every expert node of the layer reads
    int64_t moe_ = -1;               // that layer's MoE index (-1: none yet in this graph)
    uint32_t layer_ = 0;             // that layer's graph index
    const int32_t * map_ = nullptr;  // per expert: its slot (null: canonical offsets)
    size_t matmuls_left_ = 0;       // expert matmuls of that layer not asked yet
    bool in_slots_ = false;         // the ids hold slot indices now
    bool seen_matmul_ = false;      // the layer's first expert matmul was asked
    bool want_matmuls_ = true;      // deliver the layer's expert matmuls (see on_loaded)
    bool late_readers_ = false;     // some layer read its ids between its expert matmuls
    bool graph_seen_ = false;       // a whole graph has run
    int64_t ids_ne_[2] = {-1, -1};  // the ids' shape and strides at the layer's first rewrite
    size_t ids_nb_[2] = {0, 0};
    std::vector<int32_t> expert_ids_;  // I32 [ne0 * ne1]: the routed expert ids, row-major
    uint64_t rewrites_ = 0;
    bool misplace_ = false;
    uint32_t n_slots_ = 1;  // slots per layer (the store's)
    bool prompt_end_ = false;      // this graph ends the prompt
    uint32_t graph_tokens_ = 0;    // tokens in this graph's batch
    uint64_t ubatch_tokens_ = 0;   // of those, routed so far at the first MoE layer
    bool last_ubatch_ = false;     // the ubatch computing now is the prompt's last
    int64_t warm_moe_ = -1;        // the MoE layer whose warm start is pending (-1: none)
    std::vector<uint32_t> warm_list_;  // its experts, most recent first
};

}  // namespace moestream
