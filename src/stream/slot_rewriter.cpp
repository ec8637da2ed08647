// slot_rewriter.cpp — SlotRewriter (see slot_rewriter.h).
#include "slot_rewriter.h"

#include <algorithm>
#include <string>

#include "ggml.h"
#include "router_hook.h"
#include "streamer.h"

namespace moestream {

SlotRewriter::SlotRewriter(const ModelIndex & index, ResidencyStore * store,
                           const Streamer * streamer)
    : index_(index),
      store_(store),
      streamer_(streamer),
      n_slots_(std::max<uint32_t>(1, store->cache_stats().slots_per_layer)) {}

void SlotRewriter::begin_graph(const GraphInfo & g, RouterHook &) {
    prompt_end_ = g.prompt_end && !g.decode;
    graph_tokens_ = g.n_tokens;
    ubatch_tokens_ = 0;
    last_ubatch_ = false;
    warm_moe_ = -1;
    topk_ = nullptr;
    ids_ = nullptr;
    moe_ = -1;
    map_ = nullptr;
    rewritten_ = false;
}

void SlotRewriter::end_graph(RouterHook & hook) {
    flush_warm();  // the graph's last MoE layer: nothing has reused the shared slots since
    begin_graph(GraphInfo{}, hook);
}

void SlotRewriter::flush_warm() {
    if (warm_moe_ < 0) return;
    store_->warm_slots(size_t(warm_moe_), warm_list_);
    warm_moe_ = -1;
}

Status SlotRewriter::on_routing(const Routing & r, ggml_tensor * topk, RouterHook &, bool *) {
    // The previous MoE layer's matmuls have run and this layer has not staged yet: the shared
    // slots still hold what that layer read.
    flush_warm();
    if (streamer_->moe_slot(r.layer) == 0) {  // a new ubatch starts at the first MoE layer
        ubatch_tokens_ += uint64_t(r.n_rows);
        last_ubatch_ = prompt_end_ && ubatch_tokens_ == graph_tokens_;
    }
    topk_ = topk;
    layer_ = r.layer;
    return Status::Ok();
}

void SlotRewriter::on_loaded(const Routing & r, const Status & st, RouterHook &) {
    if (!st.ok() || topk_ == nullptr || r.layer != layer_) return;
    moe_ = streamer_->moe_slot(r.layer);
    ids_ = topk_->data;
    map_ = moe_ >= 0 ? store_->slot_map(size_t(moe_)) : nullptr;
    matmuls_left_ = moe_ >= 0 ? index_.moe_layers[size_t(moe_)].tensors.size() : 0;
    rewritten_ = false;
    if (warm_ && last_ubatch_ && moe_ >= 0 && map_ == nullptr) {
        // Staged to the shared slots: once the matmuls have run, warm the layer's slots with
        // the experts of the ubatch's last tokens, most recent first.
        warm_list_.clear();
        std::vector<uint8_t> seen(index_.n_expert, 0);
        for (int row = r.n_rows - 1; row >= 0 && warm_list_.size() < n_slots_; --row)
            for (int j = 0; j < r.k && warm_list_.size() < n_slots_; ++j) {
                const int32_t e = r.ids[size_t(row) * size_t(r.k) + size_t(j)];
                if (e < 0 || uint32_t(e) >= index_.n_expert || seen[size_t(e)]) continue;
                seen[size_t(e)] = 1;
                warm_list_.push_back(uint32_t(e));
            }
        warm_moe_ = moe_;
    }
}

int SlotRewriter::tensor_index(const ggml_tensor * w, size_t moe_idx) {
    auto it = t_index_.find(w);
    if (it != t_index_.end()) return it->second;
    int found = -1;
    const MoeLayer & L = index_.moe_layers[moe_idx];
    for (size_t t = 0; t < L.tensors.size(); ++t)
        if (L.tensors[t].name == w->name) found = int(t);
    t_index_.emplace(w, found);
    return found;
}

bool SlotRewriter::on_ask(ggml_tensor * t, RouterHook & hook) {
    if (moe_ < 0 || ids_ == nullptr) return false;
    if (t->op == GGML_OP_MUL_MAT_ID && t->src[2] != nullptr && t->src[2]->data == ids_) {
        if (map_ != nullptr && !rewritten_) {
            hook.fail(
                Status::Runtime("fixed-slot cache: layer " + std::to_string(layer_) +
                                ": the expert matmul '" + t->name +
                                "' runs before the router weights are gathered, so its expert ids "
                                "cannot be rewritten; run without MOESTREAM_SLOT_CACHE"));
            return false;
        }
        ggml_tensor * w = t->src[0];
        ggml_tensor * root = w->view_src ? w->view_src : w;
        const int ti = tensor_index(root, size_t(moe_));
        if (ti < 0) return false;
        uint8_t * base = store_->placement_base(size_t(moe_), size_t(ti));
        root->data = base;
        if (w != root) w->data = base + w->view_offs;
        // After the layer's last expert matmul nothing reads its ids: stop watching them (the
        // allocator may give their memory to later nodes).
        if (matmuls_left_ > 0 && --matmuls_left_ == 0) ids_ = nullptr;
        return false;
    }
    if (map_ != nullptr && !rewritten_ && t->op == GGML_OP_GET_ROWS && t->src[1] != nullptr &&
        t->src[1]->data == ids_)
        return true;  // the router weights: rewrite the ids once they are gathered
    if (rewritten_) {
        for (const ggml_tensor * s : t->src) {
            if (s != nullptr && s->data == ids_) {
                hook.fail(Status::Runtime("fixed-slot cache: layer " + std::to_string(layer_) +
                                          ": node '" + t->name + "' (" + ggml_op_name(t->op) +
                                          ") reads the expert ids after they were "
                                          "rewritten to slots; run without MOESTREAM_SLOT_CACHE"));
                return false;
            }
        }
    }
    return false;
}

Status SlotRewriter::on_node(ggml_tensor * t, RouterHook &) {
    if (map_ == nullptr || rewritten_ || t->op != GGML_OP_GET_ROWS || t->src[1] == nullptr ||
        t->src[1]->data != ids_)
        return Status::Ok();
    const ggml_tensor * ids = t->src[1];
    auto * base = static_cast<uint8_t *>(const_cast<void *>(ids_));
    for (int64_t r = 0; r < ids->ne[1]; ++r) {
        for (int64_t j = 0; j < ids->ne[0]; ++j) {
            auto * p = reinterpret_cast<int32_t *>(base + r * ids->nb[1] + j * ids->nb[0]);
            const int32_t e = *p;
            const int32_t s = (e >= 0 && uint32_t(e) < index_.n_expert) ? map_[e] : -1;
            if (s < 0)
                return Status::Runtime("fixed-slot cache: layer " + std::to_string(layer_) +
                                       ": routed expert " + std::to_string(e) +
                                       " has no slot after staging");
            *p = misplace_ ? int32_t((uint32_t(s) + 1) % n_slots_) : s;
        }
    }
    rewritten_ = true;
    ++rewrites_;
    return Status::Ok();
}

}  // namespace moestream
