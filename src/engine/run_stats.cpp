// run_stats.cpp — see run_stats.h.
#include "run_stats.h"

#include <algorithm>
#include <cstdio>

#include "hash.h"
#include "moestream/sysinfo.h"
#include "policy_drop_cold.h"
#include "miss_fallback.h"
#include "policy_substitute.h"
#include "prefetch.h"
#include "residency.h"
#include "router_hook.h"
#include "step_timing.h"
#include "streamer.h"
#include "weight_binder.h"

namespace moestream {
namespace {

std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return b;
}

double per(double total, uint64_t n) { return n ? total / double(n) : 0; }

// Cuts a step at its measured boundaries (docs/metrics.md, "Time breakdown"): ggml computes
// in llama_decode outside the callbacks; the hook's time (callbacks and the edges of the
// graph) less the reads and store calls it contains; the remainder is other.
TokenStats split_step(const StepTiming * t, double step_s, double sampling_s, double io_s,
                      double stage_s) {
    TokenStats b;
    b.step_s = step_s;
    b.sampling_s = sampling_s;
    b.io_s = io_s;
    b.stage_s = stage_s;
    if (t) {
        b.compute_s = t->llama_s - t->callback_s;
        b.hook_s = t->callback_s + t->edges_s - io_s - stage_s;
    }
    b.other_s = step_s - sampling_s - b.compute_s - io_s - stage_s - b.hook_s;
    return b;
}

}  // namespace

RunStatsAssembly::RunStatsAssembly(const StatsSources & src, RunStats * s) : src_(src), s_(s) {
    RunStats fresh;  // what open() set stays
    fresh.load_s = s->load_s;
    fresh.dense_read_s = s->dense_read_s;
    fresh.expert_buffer_bytes = s->expert_buffer_bytes;
    fresh.cache_budget_bytes = s->cache_budget_bytes;
    fresh.cache_budget_reason = s->cache_budget_reason;
    fresh.warm_experts_file = s->warm_experts_file;
    fresh.warm_experts_listed = s->warm_experts_listed;
    fresh.warm_experts_refused = s->warm_experts_refused;
    *s = std::move(fresh);
    majflt0_ = major_faults();
    if (src_.streamer) latency0_ = src_.streamer->read_latency();
    if (src_.drop_cold) {  // the policy counts since it was enabled: this run reports its share
        const DropCounters & dc = src_.drop_cold->counters();
        routed0_ = dc.routed;
        dropped0_ = dc.dropped;
        weight_total0_ = dc.weight_total;
        weight_dropped0_ = dc.weight_dropped;
        bytes_avoided0_ = dc.bytes_avoided;
        deferred0_ = src_.drop_cold->deferred();
        fallbacks0_ = src_.drop_cold->fallbacks();
    }
    if (src_.fallback) fallback0_ = src_.fallback->counters();
    if (src_.substitute) {
        substituted0_ = src_.substitute->counters().substituted;
        subst_bytes0_ = src_.substitute->counters().bytes_avoided;
    }
}

void RunStatsAssembly::prefill_step() {
    const StepCounters none;
    const StepCounters & c = src_.streamer ? src_.streamer->step() : none;
    if (src_.timing)
        prefill_time_.add(split_step(src_.timing, src_.timing->wall_s, 0, c.io_s, c.stage_s));
    if (!src_.streamer) return;
    prefill_bytes_ += c.bytes_read;
    prefill_reads_ += c.reads;
    prefill_io_ += c.io_s;
    read_max_ = std::max(read_max_, c.max_read_s);
}

void RunStatsAssembly::decode_begins() { majflt0_ = major_faults(); }

TokenStats RunStatsAssembly::step(int32_t token, double decode_s, double sampling_s,
                                  double step_s) const {
    const StepCounters none;
    const StepCounters & c0 = src_.streamer ? src_.streamer->step() : none;
    TokenStats t = split_step(src_.timing, step_s > 0 ? step_s : decode_s + sampling_s,
                              sampling_s, c0.io_s, c0.stage_s);
    t.token = token;
    t.decode_s = decode_s;
    if (src_.streamer) {
        const StepCounters & c = src_.streamer->step();
        t.io_s = c.io_s;
        t.flash_bytes_read = c.bytes_read;
        t.flash_reads = c.reads;
        t.token_demand_bytes = c.demand_bytes;
        t.layer_demand_bytes = c.layer_demand_bytes;
        t.prefetch_bytes = c.prefetch_bytes;
        t.read_max_s = c.max_read_s;
        t.stage_s = c.stage_s;
        t.cache_hits = c.hits;
        t.cache_misses = c.misses;
    }
    return t;
}

void RunStatsAssembly::decode_step(const TokenStats & t) {
    decode_s_ += t.decode_s;
    dec_bytes_ += t.flash_bytes_read;
    dec_reads_ += t.flash_reads;
    dec_io_ += t.io_s;
    read_max_ = std::max(read_max_, t.read_max_s);
    demand_sum_ += t.token_demand_bytes;
    layer_demand_max_ = std::max(layer_demand_max_, t.layer_demand_bytes);
    decode_time_.add(t);
    s_->tokens.push_back(t);
}

void RunStatsAssembly::hash_logits(const float * logits, int n_vocab) {
    logit_hash_ = fnv1a64(logit_hash_, logits, sizeof(float) * size_t(n_vocab));
}

void RunStatsAssembly::finish() {
    RunStats & s = *s_;
    const uint64_t steps = s.tokens.size();
    s.decode_s = decode_s_;
    s.decode_tok_s = decode_s_ > 0 ? double(steps) / decode_s_ : 0;
    s.majflt_per_token = per(double(major_faults() - majflt0_), steps);
    s.flash_bytes_read = prefill_bytes_ + dec_bytes_;
    s.flash_reads = prefill_reads_ + dec_reads_;
    s.io_s = prefill_io_ + dec_io_;
    if (src_.streamer) {
        const ReadLatencySnapshot lat = src_.streamer->read_latency().since(latency0_);
        s.reads_timed = lat.count();
        // Bucket edges, but never above the exact longest read.
        s.read_p50_s = std::min(lat.quantile(0.50), read_max_);
        s.read_p99_s = std::min(lat.quantile(0.99), read_max_);
        s.read_max_s = read_max_;
    }
    s.prefill_time = prefill_time_;
    s.decode_time = decode_time_;
    s.bytes_per_token = per(double(dec_bytes_), steps);
    s.token_demand_bytes = steps ? demand_sum_ / steps : 0;
    s.layer_demand_bytes = layer_demand_max_;
    s.peak_rss_bytes = peak_rss_bytes();
    s.anon_huge_bytes = anon_huge_bytes();
    s.logits_sha = hex64(logit_hash_);
    {   // the first decode tokens: how warm the cache was when decode began
        uint64_t hits = 0, lookups = 0;
        for (size_t i = 0; i < std::min<size_t>(s.tokens.size(), 16); ++i) {
            hits += s.tokens[i].cache_hits;
            lookups += s.tokens[i].cache_hits + s.tokens[i].cache_misses;
        }
        s.first16_hit_pct = lookups ? 100.0 * double(hits) / double(lookups) : 0;
    }
    s.prefetch = src_.prefetch_on;
    if (src_.streamer && src_.store) {  // the cache, over the whole run so far
        const StepCounters & tot = src_.streamer->total();
        s.cache_lookups = tot.lookups;
        s.cache_hits = tot.hits;
        s.cache_misses = tot.misses;
        s.cache_hit_pct = tot.lookups ? 100.0 * double(tot.hits) / double(tot.lookups) : 0;
        const LedgerStats cs = src_.store->ledger_stats();
        s.evictions = cs.evictions;
        s.rereads = cs.rereads;
        s.cache_commit_failures = cs.commit_failures;
        s.cache_budget_now_bytes = cs.budget_bytes;
        s.resident_expert_bytes = src_.store->resident_bytes();
        s.peak_resident_expert_bytes = std::max(cs.peak_resident_bytes, s.resident_expert_bytes);
        if (const PagedMemory * mem = src_.store->paged_memory()) {  // the LRU cache's pages
            const PageStats ps = mem->page_stats();
            s.cache_recycle_pages = ps.recycle_pages;
            s.cache_recycled_commits = ps.recycled_commits;
            s.cache_moved_commits = ps.moved_commits;
            s.cache_deferred_commits = ps.deferred_commits;
            s.cache_pool_bytes = ps.pool_bytes;
            const PoolWarmStats pw = mem->pool_warm_stats();
            s.cache_pool_warm_bytes = pw.bytes;
            s.cache_pool_warm_s = pw.seconds;
            s.cache_pool_warm_error = pw.error;
            s.cache_warmed_commits = pw.warmed_commits;
        }
        if (src_.predictor && src_.predictor->decode_guess()) {  // prefetch, the whole run so far
            const PredictCounters & pc = src_.predictor->counters();
            s.prefetch_predictions = pc.predictions;
            s.prefetch_accuracy_pct =
                pc.scored ? 100.0 * double(pc.right) / double(pc.scored) : 0;
            const ReadAheadStats & ra = cs;
            s.prefetch_experts = ra.prefetched;
            s.prefetch_used = ra.prefetch_used;
            s.prefetch_unused = ra.prefetch_unused;
        }
        // Read ahead by prefetch or prefill read-ahead (either may run alone).
        s.prefetch_bytes = tot.prefetch_bytes;
        s.prefetch_wait_s = tot.prefetch_wait_s;
        s.warm_experts_preloaded = src_.streamer->warm_experts();
        s.warm_experts_before_decode = src_.streamer->warm_preloaded();
        s.warm_experts_not_read = src_.streamer->warm_not_read();
    }
    if (src_.predictor) {  // the guess's own cost and prefill read-ahead's per-row guesses
        const PredictCounters & pc = src_.predictor->counters();
        s.guess_s = pc.guess_s;
        s.prefill_guess_layers = pc.row_layers;
        s.prefill_guess_rows = pc.row_rows;
        s.prefill_guess_experts = pc.row_experts;
    }
    if (src_.binder) s.dense_bytes = src_.binder->dense_bytes();
    if (src_.drop_cold) {  // this run's share
        const DropCounters & dc = src_.drop_cold->counters();
        s.experts_routed = dc.routed - routed0_;
        s.experts_dropped = dc.dropped - dropped0_;
        const double wt = dc.weight_total - weight_total0_;
        s.weight_mass_dropped = wt > 0 ? (dc.weight_dropped - weight_dropped0_) / wt : 0;
        s.drop_bytes_avoided = dc.bytes_avoided - bytes_avoided0_;
        s.drop_deferred = src_.drop_cold->deferred() - deferred0_;
        s.drop_fallbacks = src_.drop_cold->fallbacks() - fallbacks0_;
        if (src_.hook && src_.first_moe_layer >= 0)
            s.drop_terminal = src_.hook->nodes().terminal_kind(uint32_t(src_.first_moe_layer));
    }
    if (src_.fallback) {  // this run's share
        const FallbackCounters & fc = src_.fallback->counters();
        s.experts_fallback = fc.fallbacks - fallback0_.fallbacks;
        s.fallback_bytes_read = fc.bytes_read - fallback0_.bytes_read;
        s.fallback_bytes_saved = fc.bytes_saved - fallback0_.bytes_saved;
        s.fallback_convert_s = fc.convert_s - fallback0_.convert_s;
    }
    if (src_.substitute) {  // this run's share
        s.experts_substituted = src_.substitute->counters().substituted - substituted0_;
        s.subst_bytes_avoided = src_.substitute->counters().bytes_avoided - subst_bytes0_;
    }
}

}  // namespace moestream
