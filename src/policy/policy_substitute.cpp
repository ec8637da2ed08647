// policy_substitute.cpp — the substitution decision, its observer and the cache-debug check
// of the experts each MUL_MAT_ID reads (see policy_substitute.h).
#include "policy_substitute.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "ggml.h"
#include "moestream/log.h"
#include "router_hook.h"

namespace moestream {

int substitute_row(int k, int n, int32_t * sorted, int32_t * ids, int64_t id_stride,
                   const std::function<float(int32_t)> & score, double margin,
                   const std::function<bool(int32_t)> & resident, uint8_t * substituted,
                   SubstituteCounters * counters) {
    if (k <= 0) return 0;
    counters->routed += uint64_t(k);
    if (!(margin > 0) || k >= n) return 0;
    int replaced = 0;
    int next = k;  // candidates are taken in the router's order; a taken one is selected
    for (int j = 1; j < k; ++j) {  // rank 0, the top expert, is never replaced
        if (next >= n) break;  // no candidate left
        const int32_t e = sorted[j];
        const float se = score(e);
        // sorted[next..n) is in the router's order (untouched by earlier swaps), so no
        // candidate is closer than the first: outside the margin, e cannot be substituted and
        // neither its residency nor the candidates' need asking (a margin that never fires
        // costs one score per routed slot).
        if (double(se) - double(score(sorted[next])) >= margin) continue;
        if (resident(e)) continue;
        for (int r = next; r < n; ++r) {
            const int32_t c = sorted[r];
            if (!resident(c)) continue;
            const double lost = double(se) - double(score(c));
            if (lost < margin) {
                // Swap ranks j and r: the row stays a permutation, so c is selected once and
                // e is no longer selected.
                sorted[r] = e;
                sorted[j] = c;
                ids[j * id_stride] = c;
                if (substituted) substituted[j] = 1;
                counters->substituted++;
                counters->score_lost += lost;
                ++replaced;
                next = r + 1;
            }
            break;  // the best resident candidate: if it is outside the margin, all are
        }
    }
    return replaced;
}

void SubstituteObserver::begin_graph(const GraphInfo & g, RouterHook & /*hook*/) {
    decode_ = g.decode;
}

bool router_scores(const Routing & r, ggml_tensor * topk, ggml_tensor ** argsort,
                   ggml_tensor ** scores) {
    // topk = VIEW(argsort(scores)) (docs/seam.md).
    ggml_tensor * a = topk->view_src ? topk->view_src : topk->src[0];
    if (!a || a->op != GGML_OP_ARGSORT || a->type != GGML_TYPE_I32 || a->data == nullptr)
        return false;
    ggml_tensor * s = a->src[0];
    if (!s || s->type != GGML_TYPE_F32 || s->data == nullptr || s->ne[0] != a->ne[0] ||
        s->ne[1] != a->ne[1] || a->nb[0] != 4 || s->nb[0] != 4 || a->nb[1] % 4 != 0 ||
        s->nb[1] % 4 != 0 || a->ne[1] != r.n_rows || topk->nb[1] != a->nb[1] ||
        topk->data != a->data)
        return false;
    *argsort = a;
    *scores = s;
    return true;
}

Status SubstituteObserver::on_select(Routing & r, ggml_tensor * topk, RouterHook & hook) {
    if (!(margin_ > 0) || !decode_) return Status::Ok();
    ggml_tensor * a = nullptr;
    ggml_tensor * s = nullptr;
    if (!router_scores(r, topk, &a, &s)) {
        c_.no_scores++;
        if (!warned_)
            MS_LOG_WARN("layer %u: the router's scores are not readable at '%s'; "
                        "--substitute-experts leaves such routings unchanged",
                        r.layer, topk->name);
        warned_ = true;
        return Status::Ok();
    }
    const int n = int(a->ne[0]);
    const uint64_t before = c_.substituted;
    r.substituted.assign(r.ids.size(), 0);
    for (int row = 0; row < r.n_rows; ++row) {
        auto * sorted =
            reinterpret_cast<int32_t *>(static_cast<char *>(a->data) + size_t(row) * a->nb[1]);
        const auto * sc = reinterpret_cast<const float *>(static_cast<const char *>(s->data) +
                                                          size_t(row) * s->nb[1]);
        int32_t * rid = r.ids.data() + size_t(row) * size_t(r.k);
        auto score = [&](int32_t e) { return sc[e]; };
        if (plant_) {  // tests only: a planted bug (see the header)
            for (int j = 1; j < r.k; ++j)
                for (int q = r.k; q < n; ++q)
                    if (!hook.sink().is_resident(r.layer, sorted[q])) {
                        std::swap(sorted[j], sorted[q]);  // the graph reads it; r.ids does not
                        c_.substituted++;
                        break;
                    }
            continue;
        }
        substitute_row(
            r.k, n, sorted, rid, 1, score, margin_,
            [&](int32_t e) { return hook.sink().is_resident(r.layer, e); },
            r.substituted.data() + size_t(row) * size_t(r.k), &c_);
    }
    c_.bytes_avoided += (c_.substituted - before) * hook.sink().expert_bytes(r.layer);
    return Status::Ok();
}

bool ExpertUseCheck::on_ask(ggml_tensor * t, RouterHook & hook) {
    if (t->op != GGML_OP_MUL_MAT_ID) return false;
    const ggml_tensor * w = t->src[0];
    ggml_tensor * ids = t->src[2];
    uint32_t il = 0;
    if (!w || !ids || std::strncmp(w->name, "blk.", 4) != 0 || ids->type != GGML_TYPE_I32 ||
        ids->data == nullptr || ids->nb[0] != 4 || streamed_.count(w->name) == 0)
        return false;
    il = uint32_t(std::strtoul(w->name + 4, nullptr, 10));
    for (int64_t row = 0; row < ids->ne[1]; ++row) {
        auto * p = reinterpret_cast<int32_t *>(static_cast<char *>(ids->data) +
                                               size_t(row) * ids->nb[1]);
        for (int64_t j = 0; j < ids->ne[0]; ++j) {
            ++checked_;
            if (hook.sink().is_resident(il, p[j])) continue;
            hook.fail(Status::Runtime("cache-debug: " + std::string(t->name) + " (" +
                                      std::string(w->name) + ") of layer " +
                                      std::to_string(il) + " would read expert " +
                                      std::to_string(p[j]) + " (row " + std::to_string(row) +
                                      ", slot " + std::to_string(j) +
                                      "), which is not resident"));
            p[j] = p[0];  // the rank-0 expert is staged: what still runs reads loaded memory
        }
    }
    return false;
}

}  // namespace moestream
