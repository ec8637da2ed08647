// server_stats.h — the figures `moestream serve` reports (/stats, /metrics, /props): the
// worker's snapshot (Snapshot, published under Server::stats_m_), the expert cache's
// counters and a generation's decode figures from the engine's stats.
// Invariants: a Snapshot is a copy: it never points into the engine.
// Thread-safety: plain values and pure functions; Server guards its Snapshot.
#pragma once

#include <cstdint>

#include "moestream/moestream.h"
#include "server_util.h"

namespace moestream::server {

// The worker's view for /stats, published under Server::stats_m_.
struct Snapshot {
    bool generating = false;
    bool prefilling = false;  // generating, and no token out yet: the prompt is being processed
    int n_prompt = 0;         // the running (or last) request's prompt tokens
    uint64_t job_id = 0;
    int n_generated = 0;
    double tok_s = 0, cache_hit_pct = 0, mib_per_token = 0;
    TimeBreakdown decode_time;  // the running (or last) request's decode steps
    uint64_t served = 0, cancelled = 0, errors = 0, rejected_busy = 0;
    double resident_expert_mib = 0, cache_budget_mib = 0, cache_hit_pct_total = 0;
    double avg_request_s = 0;
    uint64_t prompt_tokens_total = 0, generated_tokens_total = 0;
    double prefill_s_total = 0, decode_s_total = 0;
    bool lossy = false;
    json engine_settings;
    json cache;  // the expert cache's counters since start, as of the last finished request
    json read_latency;  // the last finished request's expert read times (null: not streaming)
    json prompt_cache;  // the last finished request's --prompt-cache restore (null: off)
    json warm_experts;  // --warm-experts: the file, experts listed and read, first-16 hit rate
};

// /stats "cache": the expert cache's counters over the engine's life (docs/server.md); null
// without a cache.
inline json cache_counters_json(const RunStats & s) {
    if (s.cache_budget_bytes == 0) return nullptr;
    return json{{"lookups", s.cache_lookups},
                {"hits", s.cache_hits},
                {"misses", s.cache_misses},
                {"evictions", s.evictions},
                {"rereads", s.rereads},
                {"commit_failures", s.cache_commit_failures},
                {"recycled_commits", s.cache_recycled_commits},
                {"moved_commits", s.cache_moved_commits},
                {"deferred_commits", s.cache_deferred_commits},
                {"warmed_commits", s.cache_warmed_commits},
                {"pool_mib", mib(double(s.cache_pool_bytes))},
                {"pool_warm_mib", mib(double(s.cache_pool_warm_bytes))},
                {"pool_warm_error", s.cache_pool_warm_error}};
}

// The decode figures of the current (or last) generation, from the engine's per-token stats.
struct DecodeFigures {
    double tok_s = 0, cache_hit_pct = 0, mib_per_token = 0;
};
inline DecodeFigures decode_figures(const RunStats & s) {
    double dec_s = 0, bytes = 0;
    uint64_t hits = 0, misses = 0;
    for (const TokenStats & t : s.tokens) {
        dec_s += t.decode_s;
        bytes += double(t.flash_bytes_read);
        hits += t.cache_hits;
        misses += t.cache_misses;
    }
    const size_t n = s.tokens.size();
    DecodeFigures f;
    f.tok_s = dec_s > 0 ? double(n) / dec_s : 0;
    f.cache_hit_pct = hits + misses ? 100.0 * double(hits) / double(hits + misses) : 0;
    f.mib_per_token = n ? mib(bytes / double(n)) : 0;
    return f;
}

}  // namespace moestream::server
