// route_stats.cpp — see route_stats.h.
#include "moestream/route_stats.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace moestream {
namespace {

// |a ∩ b| for two rows of k expert ids (k is small: a quadratic scan is fine).
uint32_t overlap(const int32_t * a, const int32_t * b, uint32_t k) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < k; ++i)
        for (uint32_t j = 0; j < k; ++j)
            if (a[i] == b[j]) {
                ++n;
                break;
            }
    return n;
}

double mean_reuse(const std::vector<const int32_t *> & rows, uint32_t k) {
    if (rows.size() < 2 || k == 0) return 0;
    double s = 0;
    for (size_t t = 1; t < rows.size(); ++t) s += double(overlap(rows[t], rows[t - 1], k)) / k;
    return s / double(rows.size() - 1);
}

}  // namespace

Status routing_stats(const RouteTrace & trace, uint64_t seed, RoutingStats * out) {
    const TraceHeader & h = trace.header;
    *out = RoutingStats{};
    out->n_expert = h.n_expert;
    out->k = h.k;
    out->reuse_uniform = h.n_expert ? double(h.k) / double(h.n_expert) : 0;
    // Decode rows per MoE layer, in trace order.
    std::vector<std::vector<const int32_t *>> rows(h.moe_layers.size());
    for (const TraceRouting & r : trace.routings) {
        if (!r.decode || r.moe_idx >= rows.size() || r.k != h.k) continue;
        for (uint32_t row = 0; row < r.n_rows; ++row)
            rows[r.moe_idx].push_back(trace.expert.data() + r.first_slot + uint64_t(row) * r.k);
    }
    std::mt19937_64 rng(seed);
    uint64_t total_rows = 0;
    for (size_t m = 0; m < rows.size(); ++m) {
        if (rows[m].size() < 2) continue;
        LayerRoutingStats L;
        L.layer = h.moe_layers[m].layer;
        L.rows = rows[m].size();
        std::vector<uint64_t> use(h.n_expert, 0);
        for (const int32_t * row : rows[m])
            for (uint32_t j = 0; j < h.k; ++j)
                if (row[j] >= 0 && uint32_t(row[j]) < h.n_expert) ++use[size_t(row[j])];
        const double slots = double(L.rows) * h.k;
        double H = 0;
        uint64_t top = 0;
        for (uint64_t u : use) {
            if (u == 0) {
                ++L.unused_experts;
                continue;
            }
            const double p = double(u) / slots;
            H -= p * std::log(p);
            top = std::max(top, u);
        }
        L.entropy_norm = h.n_expert > 1 ? H / std::log(double(h.n_expert)) : 0;
        L.top_expert_share = double(top) / slots;
        L.reuse = mean_reuse(rows[m], h.k);
        std::vector<const int32_t *> shuffled = rows[m];
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        L.reuse_shuffled = mean_reuse(shuffled, h.k);
        out->layers.push_back(L);
        total_rows += L.rows;
    }
    if (out->layers.empty())
        return Status::BadInput(
            "the trace has fewer than two decoded tokens: no routing statistics");
    for (const LayerRoutingStats & L : out->layers) {
        const double w = double(L.rows) / double(total_rows);
        out->entropy_norm += w * L.entropy_norm;
        out->top_expert_share += w * L.top_expert_share;
        out->reuse += w * L.reuse;
        out->reuse_shuffled += w * L.reuse_shuffled;
    }
    return Status::Ok();
}

}  // namespace moestream
