// run_stats.h — the one place RunStats is filled: generate and score alike report the same
// fields, read from the same components (the streamer's step and run counters, the residency
// store, the prefetch predictor, the weight binder, the drop-cold observer and the router hook).
//
// A run (one generate, one score) is: begin() (clears the per-run fields, keeps what open()
// set, snapshots the counters reported per run), then per llama_decode either prefill_step()
// or decode_step(), hash_logits() for every logits row handed out, and finish().
// Counted per run: the reads (prefill + decode), decode time, page faults, the logits hash,
// drop-cold's counts. Counted over the whole life of the engine: the cache's lookups, hits,
// misses, evictions and pages, and prefetch (RunStats documents each field).
// Thread-safety: one thread at a time, like the Engine.
#pragma once

#include <cstdint>

#include "miss_fallback.h"
#include "moestream/moestream.h"
#include "read_latency.h"

namespace moestream {

class Streamer;
class ResidencyStore;
class RoutePredictor;
class WeightBinder;
class DropColdObserver;
class SubstituteObserver;
class RouterHook;
struct StepTiming;

// What the figures are read from; null where the run has no such component (resident runs:
// all null; drop_cold null while the policy is off).
struct StatsSources {
    const Streamer * streamer = nullptr;
    const ResidencyStore * store = nullptr;
    // The next-layer guesser: decode prefetch (on or paused) when its decode_guess(), prefill
    // read-ahead's per-row guesses, or both.
    const RoutePredictor * predictor = nullptr;
    bool prefetch_on = false;  // reading ahead in this run
    const WeightBinder * binder = nullptr;
    const DropColdObserver * drop_cold = nullptr;
    const SubstituteObserver * substitute = nullptr;  // null while the policy is off
    const MissFallback * fallback = nullptr;          // null without --miss-fallback
    const RouterHook * hook = nullptr;
    int first_moe_layer = -1;  // whose learned terminal node is reported (-1: none)
    const StepTiming * timing = nullptr;  // the last llama_decode's boundaries (time breakdown)
};

class RunStatsAssembly {
public:
    // Starts a run: *s keeps what open() set (load, dense read, buffers, budget), every other
    // field starts at zero.
    RunStatsAssembly(const StatsSources & src, RunStats * s);

    // After each prefill llama_decode (also a failed one): its reads count for the run.
    void prefill_step();
    // The prefill is over: RunStats::majflt_per_token counts the page faults from here.
    void decode_begins();
    // The figures of the decode step that just ran, for `token` (not yet recorded): decode_s is
    // the decode's wall time, sampling_s the sampling that chose the token, step_s the whole
    // step from the sampling's start to the decode's end (0: decode_s + sampling_s).
    TokenStats step(int32_t token, double decode_s, double sampling_s = 0,
                    double step_s = 0) const;
    // Records a decode step (RunStats::tokens and the run's totals).
    void decode_step(const TokenStats & t);
    // Folds one logits row into RunStats::logits_sha.
    void hash_logits(const float * logits, int n_vocab);
    // Fills the run's totals and the components' figures into the RunStats given at begin.
    void finish();

private:
    StatsSources src_;
    RunStats * s_;
    uint64_t majflt0_ = 0;
    uint64_t dropped0_ = 0, routed0_ = 0, bytes_avoided0_ = 0, deferred0_ = 0, fallbacks0_ = 0;
    uint64_t substituted0_ = 0, subst_bytes0_ = 0;
    FallbackCounters fallback0_;
    double weight_total0_ = 0, weight_dropped0_ = 0;
    uint64_t logit_hash_ = 0xcbf29ce484222325ull;  // FNV-1a-64 offset basis (hash.h)
    uint64_t prefill_bytes_ = 0, prefill_reads_ = 0;
    double prefill_io_ = 0;
    double read_max_ = 0;             // the longest read waited for (prefill + decode)
    ReadLatencySnapshot latency0_;    // the lanes' read times at begin
    double decode_s_ = 0, dec_io_ = 0;
    TimeBreakdown prefill_time_, decode_time_;
    uint64_t dec_bytes_ = 0, dec_reads_ = 0, demand_sum_ = 0, layer_demand_max_ = 0;
};

}  // namespace moestream
