// server_stats.h — the figures `moestream serve` reports (/stats, /metrics, /props):
// ServerMetrics holds the worker's snapshot and the request counters; the HTTP side reads a
// copy (snapshot()) and formats it with the pure functions below (stats_figures_json,
// metrics_text), so the formatting never sees the engine or the queue. Also the expert
// cache's counters and a generation's decode figures from the engine's stats.
// Invariants: a Snapshot is a copy: it never points into the engine; counters only grow.
// Thread-safety: ServerMetrics' methods may be called from any thread (one mutex); the
// publish_* ones read the engine's stats and are called by the worker only. The free
// functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "moestream/moestream.h"
#include "server_util.h"

namespace moestream::server {

// The worker's view for /stats, published by ServerMetrics.
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

// The request counters and the worker's published figures (see the file comment).
class ServerMetrics {
public:
    // prompt_cache / warm_experts: the run uses --prompt-cache / --warm-experts (their
    // figures are reported, else null).
    ServerMetrics(bool prompt_cache, bool warm_experts)
        : prompt_cache_(prompt_cache), warm_experts_(warm_experts) {}

    void count_rejected();   // a request refused with 503 (queue full or stopping)
    void count_cancelled();  // a request cancelled before it ran (client gone, stop)
    void count_error();      // a request that failed before it ran

    // The worker starts job `id` (n_prompt: its prompt tokens): generating, in prefill.
    void begin_job(uint64_t id, int n_prompt);
    // The running request's figures from the engine's per-token stats: out of prefill.
    void publish_live(const RunStats & s);
    // After a job (dt > 0: its seconds; ok: it was answered in full) and at start (dt = 0):
    // totals, the engine's settings (JSON) and lossiness, cache figures, the mean request time.
    void publish_after_job(const RunStats & s, json engine_settings, bool lossy, double dt,
                           bool ok);
    // The worker is done with the running job (after it was released from the queue, so
    // that "generating": false is never seen while the queue still counts it as running).
    void end_job(bool failed, bool cancelled);

    Snapshot snapshot() const;
    double avg_request_s() const;  // exponential mean of answered requests' seconds

private:
    const bool prompt_cache_, warm_experts_;
    mutable std::mutex m_;  // guards snap_
    Snapshot snap_;
};

// /stats's figures from a snapshot (everything but "model" and "defaults", which are the
// server's configuration): queue_waiting / queue_max are the queue's.
json stats_figures_json(const Snapshot & s, size_t queue_waiting, int queue_max);

// /metrics: the Prometheus text exposition of a snapshot.
std::string metrics_text(const Snapshot & s, size_t queue_waiting, double rss_mib);

}  // namespace moestream::server
