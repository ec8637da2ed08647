// replay_warm.cpp — estimate_warm_start (replay.h): two derived traces replayed by the
// Replayer, the second part of the trace alone (cold) and behind one prefill-like routing per
// MoE layer of the preloaded experts (warm), which counts in no decode figure.
#include <algorithm>
#include <cmath>
#include <limits>

#include "moestream/replay.h"

namespace moestream {
namespace {

// Appends routing r of `from` (its k slots per row) to `to`, as graph `graph`.
void copy_routing(const RouteTrace & from, const TraceRouting & r, uint32_t graph,
                  RouteTrace * to) {
    TraceRouting c = r;
    const uint64_t n = uint64_t(r.n_rows) * from.header.k;
    c.first_slot = to->expert.size();
    c.graph = graph;
    c.score_rows = 0;
    c.first_score_row = 0;
    to->expert.insert(to->expert.end(), from.expert.begin() + long(r.first_slot),
                      from.expert.begin() + long(r.first_slot + n));
    to->weight.insert(to->weight.end(), from.weight.begin() + long(r.first_slot),
                      from.weight.begin() + long(r.first_slot + n));
    if (!from.flags.empty())
        to->flags.insert(to->flags.end(), from.flags.begin() + long(r.first_slot),
                         from.flags.begin() + long(r.first_slot + n));
    else
        to->flags.insert(to->flags.end(), n, 0);
    to->routings.push_back(c);
}

}  // namespace

Status estimate_warm_start(const RouteTrace & t, const ReplaySetting & s, uint32_t split,
                           uint32_t measure, WarmEstimate * out) {
    *out = WarmEstimate{};
    const TraceHeader & h = t.header;
    if (s.budget_bytes == 0) return Status::Usage("a warm start needs a cache (budget > 0)");
    if (s.drop_cold > 0 || s.substitute > 0 || s.fallback_w > 0 || (s.k && s.k != h.k))
        return Status::Usage("the warm-start estimate replays lossless settings only");
    if (measure == 0) return Status::Usage("the warm-start estimate measures at least one token");
    const uint32_t K = h.k;
    const size_t n_moe = h.moe_layers.size();

    // Decode token index of each routing (-1: prefill).
    std::vector<int64_t> tok(t.routings.size(), -1);
    int64_t n_tok = 0;
    uint32_t last = std::numeric_limits<uint32_t>::max();
    for (size_t i = 0; i < t.routings.size(); ++i) {
        const TraceRouting & r = t.routings[i];
        if (!r.decode) continue;
        if (r.graph != last) {
            ++n_tok;
            last = r.graph;
        }
        tok[i] = n_tok - 1;
    }
    if (n_tok <= int64_t(split))
        return Status::Usage("the trace has " + std::to_string(n_tok) +
                             " decode tokens: nothing after a split at " + std::to_string(split));

    // The first part's routing counts, per (MoE layer, expert).
    std::vector<uint64_t> count(n_moe * h.n_expert, 0);
    for (size_t i = 0; i < t.routings.size(); ++i) {
        if (tok[i] >= int64_t(split)) continue;
        const TraceRouting & r = t.routings[i];
        for (uint64_t j = 0; j < uint64_t(r.n_rows) * K; ++j) {
            const int32_t e = t.expert[r.first_slot + j];
            if (e >= 0 && uint32_t(e) < h.n_expert) ++count[r.moe_idx * h.n_expert + uint32_t(e)];
        }
    }
    std::vector<uint32_t> order;
    for (uint32_t i = 0; i < count.size(); ++i)
        if (count[i]) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return count[a] > count[b]; });
    std::vector<std::vector<int32_t>> preload(n_moe);
    const uint64_t room = s.budget_bytes / 10 * 9;  // page rounding and staging headroom
    for (uint32_t i : order) {
        const uint64_t eb = h.moe_layers[i / h.n_expert].expert_bytes;
        if (out->bytes_preloaded + eb > room) continue;
        out->bytes_preloaded += eb;
        out->experts_preloaded++;
        preload[i / h.n_expert].push_back(int32_t(i % h.n_expert));
    }

    // The second part's first `measure` decode tokens, alone and behind the preload.
    RouteTrace cold, warm;
    cold.header = warm.header = h;
    cold.header.scores = warm.header.scores = false;
    uint32_t graph = 0;
    for (size_t m = 0; m < n_moe; ++m) {
        if (preload[m].empty()) continue;
        TraceRouting r;
        r.layer = h.moe_layers[m].layer;
        r.moe_idx = uint32_t(m);
        r.n_rows = uint32_t((preload[m].size() + K - 1) / K);
        r.k = uint16_t(K);
        r.decode = 0;
        r.graph = graph;
        r.first_slot = warm.expert.size();
        std::vector<int32_t> ids = preload[m];
        ids.resize(size_t(r.n_rows) * K, ids.back());  // a repeated expert is staged once
        warm.expert.insert(warm.expert.end(), ids.begin(), ids.end());
        warm.weight.insert(warm.weight.end(), ids.size(), std::nanf(""));
        warm.flags.insert(warm.flags.end(), ids.size(), 0);
        warm.routings.push_back(r);
    }
    ++graph;
    for (size_t i = 0; i < t.routings.size(); ++i) {
        if (tok[i] < int64_t(split) || tok[i] >= int64_t(split) + int64_t(measure)) continue;
        const uint32_t g = graph + uint32_t(tok[i] - int64_t(split));
        copy_routing(t, t.routings[i], g, &cold);
        copy_routing(t, t.routings[i], g, &warm);
    }

    ReplaySetting rs = s;
    rs.k = 0;
    ReplayResult rc, rw;
    Replayer pc(cold), pw(warm);
    Status st = pc.run(rs, &rc);
    if (!st.ok()) return st;
    st = pw.run(rs, &rw);
    if (!st.ok()) return st;
    out->tokens = rc.decode_tokens;
    out->lookups = rc.decode_lookups;
    out->cold_hits = rc.decode_hits;
    out->warm_hits = rw.decode_hits;
    out->cold_hit_pct = rc.decode_hit_pct;
    out->warm_hit_pct = rw.decode_hit_pct;
    return Status::Ok();
}

}  // namespace moestream
