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
      slots_(store->slot_placement()),
      streamer_(streamer),
      n_slots_(std::max<uint32_t>(1, store->slot_placement()
                                           ? store->slot_placement()->slot_stats().slots_per_layer
                                           : 0)) {}

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
    in_slots_ = false;
}

void SlotRewriter::end_graph(RouterHook & hook) {
    graph_seen_ = true;
    flush_warm();  // the graph's last MoE layer: nothing has reused the shared slots since
    begin_graph(GraphInfo{}, hook);
}

void SlotRewriter::flush_warm() {
    if (warm_moe_ < 0) return;
    slots_->warm_slots(size_t(warm_moe_), warm_list_);
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
    map_ = moe_ >= 0 ? slots_->slot_map(size_t(moe_)) : nullptr;
    matmuls_left_ = moe_ >= 0 ? index_.moe_layers[size_t(moe_)].tensors.size() : 0;
    in_slots_ = false;
    seen_matmul_ = false;
    ids_ne_[0] = ids_ne_[1] = -1;
    // Deliver the matmuls (one callback each) while a node may read the ids between them:
    // in the first graph, and for good once one did.
    want_matmuls_ = late_readers_ || !graph_seen_;
    if (last_ubatch_ && moe_ >= 0 && map_ == nullptr) {
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
    const bool matmul =
        t->op == GGML_OP_MUL_MAT_ID && t->src[2] != nullptr && t->src[2]->data == ids_;
    bool reads = matmul;
    for (const ggml_tensor * s : t->src) reads = reads || (s != nullptr && s->data == ids_);
    if (!reads) return false;
    if (!matmul) {  // e.g. the GET_ROWS that gathers the router weights by the expert ids
        if (seen_matmul_) late_readers_ = true;  // for the next layers and graphs
        if (map_ == nullptr) return false;       // nothing rewritten in this layer
        if (in_slots_) {
            if (!want_matmuls_) {  // an earlier matmul may not have computed: it needs slots
                hook.fail(Status::Runtime(
                    "fixed-slot cache: layer " + std::to_string(layer_) + ": node '" + t->name +
                    "' (" + ggml_op_name(t->op) +
                    ") reads the expert ids between the layer's expert matmuls, which this graph "
                    "did not expect; run with MOESTREAM_SLOT_CACHE=0"));
                return false;
            }
            restore();  // every matmul asked so far has computed (they were delivered)
        }
        return true;  // delivered: it computes before the next matmul's rewrite
    }
    seen_matmul_ = true;
    if (map_ != nullptr && !in_slots_) {  // every earlier reader of the ids has computed
        Status st = rewrite(t->src[2]);
        if (!st.ok()) {
            hook.fail(st);
            return false;
        }
    }
    ggml_tensor * w = t->src[0];
    ggml_tensor * root = w->view_src ? w->view_src : w;
    const int ti = tensor_index(root, size_t(moe_));
    if (ti >= 0) {
        uint8_t * base = slots_->placement_base(size_t(moe_), size_t(ti));
        root->data = base;
        if (w != root) w->data = base + w->view_offs;
    }
    if (matmuls_left_ > 0) --matmuls_left_;
    // Delivered while a later reader may need the expert ids back (on_node restores them
    // after the last one); else, after the layer's last expert matmul nothing reads its ids:
    // stop watching them (the allocator may give their memory to later nodes).
    const bool deliver = map_ != nullptr && want_matmuls_;
    if (matmuls_left_ == 0 && !deliver) ids_ = nullptr;
    return deliver;
}

Status SlotRewriter::on_node(ggml_tensor * t, RouterHook &) {
    if (ids_ == nullptr || matmuls_left_ > 0 || t->op != GGML_OP_MUL_MAT_ID ||
        t->src[2] == nullptr || t->src[2]->data != ids_)
        return Status::Ok();
    if (in_slots_) restore();  // the layer's last expert matmul has computed
    ids_ = nullptr;
    return Status::Ok();
}

Status SlotRewriter::rewrite(const ggml_tensor * ids) {
    const bool first = ids_ne_[0] < 0;  // the layer's first rewrite: keep the expert ids
    if (first) {
        for (int d = 0; d < 2; ++d) {
            ids_ne_[d] = ids->ne[d];
            ids_nb_[d] = ids->nb[d];
        }
        expert_ids_.clear();
    }
    auto * base = static_cast<uint8_t *>(const_cast<void *>(ids_));
    size_t i = 0;
    for (int64_t r = 0; r < ids_ne_[1]; ++r) {
        for (int64_t j = 0; j < ids_ne_[0]; ++j, ++i) {
            auto * p = reinterpret_cast<int32_t *>(base + r * ids_nb_[1] + j * ids_nb_[0]);
            const int32_t e = first ? *p : expert_ids_[i];
            if (first) expert_ids_.push_back(e);
            const int32_t s = (e >= 0 && uint32_t(e) < index_.n_expert) ? map_[e] : -1;
            if (s < 0)
                return Status::Runtime("fixed-slot cache: layer " + std::to_string(layer_) +
                                       ": routed expert " + std::to_string(e) +
                                       " has no slot after staging");
            *p = misplace_ ? int32_t((uint32_t(s) + 1) % n_slots_) : s;
        }
    }
    in_slots_ = true;
    if (first) ++rewrites_;
    return Status::Ok();
}

void SlotRewriter::restore() {
    auto * base = static_cast<uint8_t *>(const_cast<void *>(ids_));
    size_t i = 0;
    for (int64_t r = 0; r < ids_ne_[1]; ++r)
        for (int64_t j = 0; j < ids_ne_[0]; ++j, ++i)
            *reinterpret_cast<int32_t *>(base + r * ids_nb_[1] + j * ids_nb_[0]) = expert_ids_[i];
    in_slots_ = false;
}

}  // namespace moestream
