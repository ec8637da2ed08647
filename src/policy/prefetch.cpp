// prefetch.cpp — RoutePredictor (see prefetch.h).
#include "prefetch.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dot_i8.h"
#include "ggml-backend.h"
#include "moestream/sysinfo.h"
#include "ggml.h"
#include "router_hook.h"

namespace moestream {
namespace {

constexpr char kLogitsPrefix[] = "ffn_moe_logits-";
constexpr size_t kLogitsPrefixLen = sizeof(kLogitsPrefix) - 1;

bool host_f32(const ggml_tensor * t) {
    return t && t->type == GGML_TYPE_F32 && t->data && t->nb[0] == sizeof(float) &&
           (t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer));
}

// The leaf weight γ of `ffn_norm-<il>` (a MUL of the normed state by a [n_embd] vector).
const ggml_tensor * norm_weight(const ggml_tensor * norm, int64_t n_embd) {
    if (norm == nullptr || norm->op != GGML_OP_MUL) return nullptr;
    for (int i = 0; i < 2; ++i) {
        const ggml_tensor * g = norm->src[i];
        if (g && g->op == GGML_OP_NONE && g->ne[0] == n_embd && g->ne[1] == 1 && g->ne[2] == 1 &&
            g->type == GGML_TYPE_F32)
            return g;
    }
    return nullptr;
}

// The k best of scores[0, n) into top[0, k), best first: a higher score first, the lower id
// on a tie. One pass with an insertion into the k kept (k is small: 8 on the 30B preset).
void select_top(const float * scores, uint32_t n, int k, uint32_t * top) {
    int m = 0;  // kept so far
    for (uint32_t e = 0; e < n; ++e) {
        const float v = scores[e];
        if (m == k && !(v > scores[top[k - 1]])) continue;  // (an equal score keeps the lower id)
        int j = m < k ? m++ : k - 1;
        for (; j > 0 && v > scores[top[j - 1]]; --j) top[j] = top[j - 1];
        top[j] = e;
    }
}

}  // namespace

void RoutePredictor::grow(uint32_t il) {
    if (il >= layers_.size()) {
        layers_.resize(il + 1);
        x_.resize(il + 1, nullptr);
    }
}

void RoutePredictor::observe(const ggml_tensor * t) {
    if (std::strncmp(t->name, kLogitsPrefix, kLogitsPrefixLen) != 0) return;
    const char * p = t->name + kLogitsPrefixLen;
    uint32_t il = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 7; ++p, ++digits) il = il * 10 + uint32_t(*p - '0');
    if (digits == 0 || *p != '\0' || t->op != GGML_OP_MUL_MAT) return;
    const ggml_tensor * w = t->src[0];
    const ggml_tensor * x = t->src[1];
    if (w == nullptr || x == nullptr) return;
    grow(il);
    layers_[il].w = w;
    layers_[il].gamma = norm_weight(x, w->ne[0]);
    x_[il] = x;
}

void RoutePredictor::preset_router(uint32_t il, const float * w, int64_t n_embd,
                                   int64_t n_expert, const float * gamma) {
    grow(il);
    Layer & L = layers_[il];
    L.pre_w = w;
    L.pre_gamma = gamma;
    L.pre_embd = n_embd;
    L.pre_expert = n_expert;
}

bool RoutePredictor::has_router(uint32_t l, bool preset) const {
    return layers_[l].w != nullptr || (preset && layers_[l].pre_w != nullptr);
}

const void * RoutePredictor::gamma_of(uint32_t l, int64_t n_embd, bool preset) const {
    const ggml_tensor * g = layers_[l].gamma;
    if (host_f32(g) && g->ne[0] == n_embd) return g->data;
    return preset && layers_[l].w == nullptr && layers_[l].pre_embd == n_embd ? layers_[l].pre_gamma
                                                                              : nullptr;
}

void RoutePredictor::ratio_of(uint32_t il, uint32_t nl, int64_t n_embd, bool preset) {
    Layer & L = layers_[il];
    const void * g0 = gamma_of(il, n_embd, preset);
    const void * g1 = gamma_of(nl, n_embd, preset);
    if (g0 == nullptr || g1 == nullptr) {
        L.ratio.clear();  // predict with the plain router input
        return;
    }
    if (L.ratio.size() == size_t(n_embd) && L.ratio_for[0] == g0 && L.ratio_for[1] == g1) return;
    const auto * a = static_cast<const float *>(g0);
    const auto * b = static_cast<const float *>(g1);
    L.ratio.resize(size_t(n_embd));
    for (int64_t i = 0; i < n_embd; ++i) L.ratio[size_t(i)] = a[i] != 0.0f ? b[i] / a[i] : 0.0f;
    L.ratio_for[0] = g0;
    L.ratio_for[1] = g1;
}

void RoutePredictor::quantize(Layer & L, const void * w, size_t row_bytes, int64_t n_embd,
                              int64_t n_expert) {
    L.q.resize(size_t(n_embd) * size_t(n_expert));
    L.scale.resize(size_t(n_expert));
    const char * wb = static_cast<const char *>(w);
    for (int64_t e = 0; e < n_expert; ++e) {
        const auto * row = reinterpret_cast<const float *>(wb + size_t(e) * row_bytes);
        L.scale[size_t(e)] = quantize_i8(row, n_embd, L.q.data() + size_t(e) * size_t(n_embd));
    }
    L.q_for = w;
}

uint64_t RoutePredictor::copy_bytes() const {
    uint64_t b = 0;
    for (const Layer & L : layers_) b += L.q.size() + L.scale.size() * sizeof(float);
    return b;
}

bool RoutePredictor::prepare(uint32_t il, int k, bool preset, uint32_t * nl_out,
                             const ggml_tensor ** x_out, int64_t * n_embd_out,
                             int64_t * n_expert_out) {
    if (il >= layers_.size() || k <= 0) return false;
    uint32_t nl = il + 1;
    while (nl < layers_.size() && !has_router(nl, preset)) ++nl;
    if (nl >= layers_.size()) return false;
    const ggml_tensor * x = x_[il];
    if (!host_f32(x)) return false;
    const int64_t n_embd = x->ne[0];
    // The next layer's router: as seen in the graph, else (preset) as handed over at open.
    const ggml_tensor * w = layers_[nl].w;
    const Layer & P = layers_[nl];
    if (w != nullptr && (!host_f32(w) || w->ne[2] != 1)) return false;
    const void * wd = w ? w->data : P.pre_w;
    const int64_t w_embd = w ? w->ne[0] : P.pre_embd;
    const int64_t n_expert = w ? w->ne[1] : P.pre_expert;
    const size_t row_bytes = w ? w->nb[1] : size_t(P.pre_embd) * sizeof(float);
    if (x->ne[1] < 1 || x->ne[2] != 1 || x->ne[3] != 1 ||
        x->nb[1] < size_t(n_embd) * sizeof(float) || w_embd != n_embd || n_expert < k ||
        row_bytes < size_t(n_embd) * sizeof(float))
        return false;
    ratio_of(il, nl, n_embd, preset);
    Layer & N = layers_[nl];
    if (N.q_for != wd || N.q.size() != size_t(n_embd) * size_t(n_expert))
        quantize(N, wd, row_bytes, n_embd, n_expert);
    *nl_out = nl;
    *x_out = x;
    *n_embd_out = n_embd;
    *n_expert_out = n_expert;
    return true;
}

void RoutePredictor::guess_row(uint32_t il, uint32_t nl, const float * xs, int64_t n_embd,
                               int64_t n_expert, int k, uint32_t * top) {
    const std::vector<float> & r = layers_[il].ratio;
    y_.resize(size_t(n_embd));
    if (r.empty())
        std::copy(xs, xs + n_embd, y_.begin());
    else
        for (int64_t i = 0; i < n_embd; ++i) y_[size_t(i)] = xs[i] * r[size_t(i)];
    yq_.resize(size_t(n_embd));
    const float ys = quantize_i8(y_.data(), n_embd, yq_.data());
    const Layer & N = layers_[nl];
    dots_.resize(size_t(n_expert));
    dot_i8_rows(N.q.data(), size_t(n_embd), n_expert, yq_.data(), n_embd, dots_.data());
    scores_.resize(size_t(n_expert));
    for (int64_t e = 0; e < n_expert; ++e)
        scores_[size_t(e)] = N.scale[size_t(e)] * ys * float(dots_[size_t(e)]);
    select_top(scores_.data(), uint32_t(n_expert), k, top);
}

bool RoutePredictor::predict(uint32_t il, int k, uint32_t * next_il, std::vector<uint32_t> * out) {
    out->clear();
    guess_il_ = -1;
    const double t0 = now_s();
    uint32_t nl = 0;
    const ggml_tensor * x = nullptr;
    int64_t n_embd = 0, n_expert = 0;
    if (!prepare(il, k, /*preset=*/false, &nl, &x, &n_embd, &n_expert) || x->ne[1] != 1)
        return false;
    out->resize(size_t(k));
    guess_row(il, nl, static_cast<const float *>(x->data), n_embd, n_expert, k, out->data());
    *next_il = nl;
    guess_il_ = int64_t(nl);
    guess_ = *out;
    ++c_.predictions;
    c_.guess_s += now_s() - t0;
    return true;
}

bool RoutePredictor::predict_rows(uint32_t il, int k, uint32_t * next_il,
                                  std::vector<uint32_t> * out) {
    out->clear();
    const double t0 = now_s();
    uint32_t nl = 0;
    const ggml_tensor * x = nullptr;
    int64_t n_embd = 0, n_expert = 0;
    if (!prepare(il, k, /*preset=*/true, &nl, &x, &n_embd, &n_expert)) return false;
    // The last MoE layer is never read ahead in a prompt (streamer.h): no guess for it.
    uint32_t after = nl + 1;
    while (after < layers_.size() && !has_router(after, true)) ++after;
    if (after >= layers_.size()) return false;
    in_union_.assign(size_t(n_expert), 0);
    top_.resize(size_t(k));
    const char * base = static_cast<const char *>(x->data);
    int64_t row = 0;
    for (; row < x->ne[1] && out->size() < size_t(n_expert); ++row) {
        guess_row(il, nl, reinterpret_cast<const float *>(base + size_t(row) * x->nb[1]), n_embd,
                  n_expert, k, top_.data());
        for (uint32_t e : top_)
            if (!in_union_[e]) {
                in_union_[e] = 1;
                out->push_back(e);
            }
    }
    *next_il = nl;
    ++c_.row_layers;
    c_.row_rows += uint64_t(row);
    c_.row_experts += out->size();
    if (out->size() == size_t(n_expert)) ++c_.row_full;
    c_.guess_s += now_s() - t0;
    return true;
}

void RoutePredictor::score(uint32_t il, const int32_t * ids, int k) {
    if (guess_il_ != int64_t(il)) return;
    guess_il_ = -1;
    for (uint32_t g : guess_) {
        ++c_.scored;
        for (int j = 0; j < k; ++j)
            if (ids[j] == int32_t(g)) {
                ++c_.right;
                break;
            }
    }
}

void RoutePredictor::begin_graph(const GraphInfo & g, RouterHook & /*hook*/) {
    decode_ = g.decode;
    if (enabled_) new_graph();
}

bool RoutePredictor::on_ask(ggml_tensor * t, RouterHook & /*hook*/) {
    if (enabled_) observe(t);
    return false;
}

Status RoutePredictor::on_routing(const Routing & r, ggml_tensor * /*topk*/, RouterHook & hook,
                                  bool * /*defer*/) {
    if (!enabled_) return Status::Ok();
    uint32_t next_il = 0;
    if (r.n_rows > 1) {  // a prompt ubatch: the union of the rows' guesses (prefill read-ahead)
        if (prefill_rows_ && predict_rows(r.layer, r.k, &next_il, &hint_))
            hook.sink().set_prefetch(next_il, hint_);
        return Status::Ok();
    }
    if (r.n_rows < 1 || !decode_guess_) return Status::Ok();  // (0 rows: nothing routed)
    score(r.layer, r.ids.data(), r.k);
    if (decode_ && predict(r.layer, r.k, &next_il, &hint_)) hook.sink().set_prefetch(next_il, hint_);
    return Status::Ok();
}

}  // namespace moestream
