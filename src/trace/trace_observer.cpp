// trace_observer.cpp — see trace_observer.h.
#include "trace_observer.h"

#include "ggml.h"
#include "policy_substitute.h"
#include "route_tracer.h"
#include "router_hook.h"

namespace moestream {

void TraceObserver::begin_graph(const GraphInfo & g, RouterHook & /*hook*/) {
    tracer_.begin_graph(g.decode, g.pos0, g.n_tokens, g.prompt_end);
    layer_ = -1;
}

void TraceObserver::end_graph(RouterHook & /*hook*/) {
    tracer_.end_graph();
    layer_ = -1;
}

bool TraceObserver::wants_terminals() const { return tracer_.active(); }

bool TraceObserver::on_ask(ggml_tensor * t, RouterHook & hook) {
    if (!tracer_.active()) return false;
    const int64_t w = tracer_.waiting_layer();
    if (w < 0) return false;
    const std::string & term = hook.nodes().terminal(uint32_t(w));
    return !term.empty() && term == t->name;
}

Status TraceObserver::on_select(Routing & r, ggml_tensor * topk, RouterHook & /*hook*/) {
    if (!tracer_.wants_scores()) return Status::Ok();
    ggml_tensor * a = nullptr;
    ggml_tensor * s = nullptr;
    if (!router_scores(r, topk, &a, &s)) return Status::Ok();  // recorded without scores
    tracer_.stash_scores(r.layer, r.n_rows, int(a->ne[0]), static_cast<const int32_t *>(a->data),
                         int64_t(a->nb[1] / 4), static_cast<const float *>(s->data),
                         int64_t(s->nb[1] / 4));
    return Status::Ok();
}

Status TraceObserver::on_routing(const Routing & r, ggml_tensor * /*topk*/, RouterHook & /*hook*/,
                                 bool * /*defer*/) {
    if (!tracer_.active()) return Status::Ok();
    tracer_.routing_start(r.layer, r.k, r.n_rows, r.ids.data());
    layer_ = int64_t(r.layer);
    k_ = r.k;
    n_rows_ = r.n_rows;
    routed_ = r.ids;
    for (size_t s = 0; s < r.substituted.size(); ++s)
        if (r.substituted[s]) tracer_.mark_substituted(int(s / size_t(k_)), int(s % size_t(k_)));
    return Status::Ok();
}

// The record's terminal node: record its final weights (loading happens elsewhere).
Status TraceObserver::on_node(ggml_tensor * t, RouterHook & hook) {
    if (!tracer_.active()) return Status::Ok();
    const int64_t L = tracer_.waiting_layer();
    if (L < 0 || L != layer_ || hook.nodes().terminal(uint32_t(L)) != t->name)
        return Status::Ok();
    int64_t w_slot = 0, w_row = 0;
    if (!final_weight_strides(t, k_, n_rows_, &w_slot, &w_row) || w_slot % 4 != 0 ||
        w_row % 4 != 0 || t->data == nullptr)
        return Status::Ok();  // weights stay NaN
    for (int row = 0; row < n_rows_; ++row) {
        const auto * w = reinterpret_cast<const float *>(static_cast<const char *>(t->data) +
                                                         size_t(row) * size_t(w_row));
        for (int j = 0; j < k_; ++j) tracer_.set_weight(row, j, w[size_t(j) * size_t(w_slot / 4)]);
    }
    tracer_.done_weights();
    return Status::Ok();
}

void TraceObserver::on_load(const Routing & r, RouterHook & /*hook*/) {
    if (!tracer_.active() || int64_t(r.layer) != layer_ || r.ids.size() != routed_.size()) return;
    for (size_t s = 0; s < routed_.size(); ++s)  // repointed = dropped
        if (r.ids[s] != routed_[s]) tracer_.mark_dropped(int(s / size_t(k_)), int(s % size_t(k_)));
    for (size_t s = 0; s < r.fallback.size() && s < routed_.size(); ++s)
        if (r.fallback[s]) tracer_.mark_fallback(int(s / size_t(k_)), int(s % size_t(k_)));
}

}  // namespace moestream
