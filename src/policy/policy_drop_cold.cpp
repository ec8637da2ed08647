// policy_drop_cold.cpp — the drop-cold decision and its observer (see policy_drop_cold.h).
#include "policy_drop_cold.h"

#include <string>

#include "ggml.h"
#include "moestream/log.h"
#include "router_hook.h"

namespace moestream {

int drop_cold_row(int k, int32_t * ids, int64_t id_stride, float * w, int64_t w_stride,
                  int k_eff, const DropColdConfig & cfg,
                  const std::function<bool(int32_t)> & resident, DropCounters * counters) {
    if (k <= 0) return 0;
    int top = 0;
    for (int j = 1; j < k; ++j)
        if (w[j * w_stride] > w[top * w_stride]) top = j;
    const double threshold = cfg.frac / double(k_eff > 0 ? k_eff : k);
    const int32_t top_id = ids[top * id_stride];
    double sum_before = 0, sum_after = 0;
    int dropped = 0;
    for (int j = 0; j < k; ++j) {
        float & wj = w[j * w_stride];
        sum_before += wj;
        counters->routed++;
        counters->weight_total += wj;
        if (j != top && double(wj) < threshold && !resident(ids[j * id_stride])) {
            counters->dropped++;
            counters->weight_dropped += wj;
            wj = 0.0f;
            ids[j * id_stride] = top_id;
            ++dropped;
        }
        sum_after += wj;
    }
    if (cfg.renorm && dropped > 0 && sum_after > 0) {
        const float scale = float(sum_before / sum_after);
        for (int j = 0; j < k; ++j) w[j * w_stride] *= scale;
    }
    return dropped;
}

int fallback_row(int k, const int32_t * ids, int64_t id_stride, const float * w,
                 int64_t w_stride, double threshold, const std::function<bool(int32_t)> & ok,
                 uint8_t * fb) {
    int top = 0;
    for (int j = 1; j < k; ++j)
        if (w[j * w_stride] > w[top * w_stride]) top = j;
    int marked = 0;
    for (int j = 0; j < k; ++j) {
        fb[j] = j != top && double(w[j * w_stride]) < threshold && ok(ids[j * id_stride]) ? 1 : 0;
        marked += fb[j];
    }
    return marked;
}

void DropColdObserver::begin_graph(const GraphInfo & g, RouterHook & hook) {
    decode_ = g.decode;
    pending_ = false;
    if (relearn_) hook.nodes().reset_terminals();
    relearn_ = false;
}

bool DropColdObserver::on_ask(ggml_tensor * t, RouterHook & hook) {
    if (!pending_) return false;
    const std::string & term = hook.nodes().terminal(pending_routing_.layer);
    if (term == t->name) return true;
    if (t->op == GGML_OP_MUL_MAT_ID) {
        // The learned terminal did not arrive before the expert matmul: load now, lossless
        // for this layer, and re-learn. (The matmul has not run: ask precedes compute.)
        ++fallbacks_;
        MS_LOG_INFO(
            "layer %u: terminal node '%s' did not arrive; loading at the matmul and "
            "re-learning",
            pending_routing_.layer, term.c_str());
        hook.nodes().forget_terminal(pending_routing_.layer);
        hook.fail(load_unchanged(hook));
    }
    return false;
}

Status DropColdObserver::on_node(ggml_tensor * t, RouterHook & hook) {
    if (!pending_) return Status::Ok();
    if (hook.nodes().terminal(pending_routing_.layer) == t->name)
        return load_at_terminal(t, hook);
    // The previous layer's terminal never came and no matmul of it was seen either.
    uint32_t il = 0;
    if (parse_topk_name(t->name, &il)) return load_unchanged(hook);
    return Status::Ok();
}

Status DropColdObserver::on_routing(const Routing & r, ggml_tensor * topk, RouterHook & hook,
                                    bool * defer) {
    if (!applies() || hook.nodes().terminal(r.layer).empty()) return Status::Ok();
    // Defer the load to the terminal node of this layer's weight chain.
    pending_ = true;
    pending_topk_ = topk;
    pending_routing_ = r;
    *defer = true;
    return Status::Ok();
}

Status DropColdObserver::load_unchanged(RouterHook & hook) {
    pending_ = false;
    return hook.load(pending_routing_);
}

Status DropColdObserver::load_at_terminal(ggml_tensor * t, RouterHook & hook) {
    pending_ = false;
    Routing & r = pending_routing_;
    ggml_tensor * topk = pending_topk_;
    int64_t w_slot = 0, w_row = 0;
    if (!final_weight_strides(t, r.k, r.n_rows, &w_slot, &w_row)) {
        MS_LOG_INFO("layer %u: '%s' does not look like the final weights; re-learning", r.layer,
                    t->name);
        hook.nodes().forget_terminal(r.layer);
        return hook.load(r);
    }
    if (w_slot % 4 != 0 || w_row % 4 != 0 || topk->nb[0] % 4 != 0 || topk->nb[1] % 4 != 0)
        return Status::Runtime(std::string("unaligned weights or ids at '") + t->name + "'");
    ++deferred_;
    const uint64_t eb = hook.sink().expert_bytes(r.layer);
    const uint64_t dropped_before = drop_.dropped;
    const int64_t id_stride = int64_t(topk->nb[0] / 4);
    for (int row = 0; row < r.n_rows; ++row) {
        auto * ids = reinterpret_cast<int32_t *>(static_cast<char *>(topk->data) +
                                                 size_t(row) * topk->nb[1]);
        auto * w =
            reinterpret_cast<float *>(static_cast<char *>(t->data) + size_t(row) * size_t(w_row));
        if (cfg_.frac > 0 && (decode_ || cfg_.in_prefill))
            drop_cold_row(
                r.k, ids, id_stride, w, w_slot / 4, r.k, cfg_,
                [&](int32_t e) { return hook.sink().is_resident(r.layer, e); }, &drop_);
        if (cfg_.fallback_w > 0 && decode_) {
            r.fallback.resize(r.ids.size(), 0);
            fallback_row(
                r.k, ids, id_stride, w, w_slot / 4, cfg_.fallback_w,
                [&](int32_t e) { return cfg_.fallback_ok(r.layer, e); },
                r.fallback.data() + size_t(row) * size_t(r.k));
        }
        for (int j = 0; j < r.k; ++j)  // a dropped slot now names the top expert
            r.ids[size_t(row) * size_t(r.k) + size_t(j)] = ids[size_t(j) * size_t(id_stride)];
    }
    drop_.bytes_avoided += (drop_.dropped - dropped_before) * eb;
    return hook.load(r);
}

}  // namespace moestream
