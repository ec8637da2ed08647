// replay.h — offline replay of a route trace through a simulated residency cache
// (`moestream replay`, docs/replay.md).
//
// The simulator is the engine's own cache bookkeeping (its expert ledger) without memory: the
// same per-(layer, expert) states, the same LRU order, the same rule that experts routed in
// the layer being staged are never victims, the same page-granular commit accounting (slices
// that share a boundary page, the page size of the recording machine), the same "evict until
// the miss fits, then commit" loop. Distinct experts are staged in first-seen order over the
// routing's rows, as the streamer does, and --drop-cold-experts is decided by the engine's own
// drop_cold_row() (policy_drop_cold.h) against the simulated residency. Replaying a trace
// with the settings it was recorded under therefore reproduces its hits and misses slot for
// slot (validate). Other settings are estimates: a lossy setting changes the hidden states and
// so every later routing, which a trace cannot know, and the cache cannot respond to dropping
// the way a live run's would (docs/replay.md).
//
// Policies: lru (the engine's), lfu (evict the lowest routing count over the whole replay,
// ties by least recent use), belady (evict the expert whose next routing is farthest in the
// future; the offline optimum for equal-size experts, a bound to aim at).
// Thread-safety: a Replayer is used from one thread; distinct Replayers are independent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moestream/route_trace.h"
#include "moestream/status.h"

namespace moestream {

enum class ReplayPolicy { kLru, kLfu, kBelady };  // policy_name() relies on this order
const char * policy_name(ReplayPolicy p);
bool parse_policy(const std::string & s, ReplayPolicy * out);

struct ReplaySetting {
    ReplayPolicy policy = ReplayPolicy::kLru;
    uint64_t budget_bytes = 0;  // 0 = cache off (every routed expert is read)
    double drop_cold = 0;       // --drop-cold-experts F, 0 = off
    bool drop_in_prefill = false;
    uint32_t k = 0;  // experts per token: the first k slots of each row; 0 = the trace's
    // --miss-fallback estimate (docs/replay.md): in decode rows with observed weights, a slot
    // other than the row's top whose final weight is below fallback_w and that is a miss (or
    // a lossy copy) is read from the companion: fallback_expert_bytes[moe] bytes instead of
    // the expert's. The copy stays resident as lossy; a full-weight routing of it reads the
    // expert again. 0 = off.
    double fallback_w = 0;
    std::vector<uint64_t> fallback_expert_bytes;  // per MoE layer of the trace
    // --substitute-experts M (docs/replay.md): in decode rows with recorded router scores
    // (TraceHeader::scores), the engine's substitute_row() against the simulated residency.
    // Needs the scores; excludes drop_cold, fallback_w and the belady policy. 0 = off.
    double substitute = 0;
    // The fixed-slot cache (residency.h; TraceHeader::slots_per_layer): K slots per MoE layer,
    // the engine's slot ledger (expert_ledger.h, slot mode) instead of a byte budget. A routing
    // of more than K distinct experts goes to the shared slots (a second ledger, in shared
    // mode, with the read-ahead calls the trace made into them): only what read-ahead put
    // there is a hit, the slots are untouched. slot_warm: after such a routing in the prompt's
    // last ubatch, the slots are filled with its last tokens' experts, as the engine's warm
    // start does. lru only; no fallback_w. 0 = the byte-budget cache (budget_bytes).
    uint32_t slots_per_layer = 0;
    bool slot_warm = false;
};

struct ReplayResult {
    ReplaySetting setting;
    // Whole trace (prefill + decode).
    uint64_t routings = 0, lookups = 0, hits = 0, misses = 0;
    uint64_t evictions = 0, rereads = 0, over_budget_stages = 0;
    uint64_t peak_committed_bytes = 0;
    // (misses + experts read ahead) x expert bytes (no alignment over-read)
    uint64_t bytes_read = 0;
    // Decode phase.
    uint64_t decode_tokens = 0, decode_lookups = 0, decode_hits = 0, decode_misses = 0;
    uint64_t decode_bytes_read = 0;
    double decode_hit_pct = 0;   // decode hits / lookups
    double bytes_per_token = 0;  // decode bytes read / decode tokens
    // Lossy accounting over decode rows whose weights were observed, vs the trace's full k:
    // slots cut by k, slots dropped by the policy, and their share of the router weight.
    uint64_t slots_total = 0, slots_cut = 0, slots_dropped = 0;
    uint64_t rows_weight_unknown = 0;  // decode rows without observed weights (not counted)
    double weight_total = 0, weight_cut = 0, weight_dropped = 0;
    double weight_mass_discarded = 0;  // (cut + dropped) / total
    // --miss-fallback estimate: expert reads served from the low-bit copy (decode), and the
    // bytes that saved against reading the full experts.
    uint64_t fallbacks = 0, fallback_bytes_saved = 0;
    // --substitute-experts estimate (decode): slots whose routed miss was computed with a
    // resident expert, the sum of their score margins (score(routed) - score(substitute)),
    // and the final router weight of the replaced slots (rows with observed weights).
    uint64_t substitutions = 0;
    double substitute_score_lost = 0, weight_substituted = 0;
};

struct ValidateReport {
    bool ok = true;
    uint64_t slots_checked = 0, mismatches = 0;
    uint64_t recorded_hits = 0, recorded_misses = 0, recorded_drops = 0;
    uint64_t replay_hits = 0, replay_misses = 0, replay_drops = 0;
    uint64_t recorded_substitutions = 0, replay_substitutions = 0;
    // Read-ahead calls replayed (RouteTrace::read_aheads) and the experts they committed.
    uint64_t read_aheads = 0, recorded_read_ahead = 0, replay_read_ahead = 0;
    std::string first_mismatch;  // where and what, with the record's file offset
};

class Replayer {
public:
    explicit Replayer(const RouteTrace & trace);
    Replayer(const Replayer &) = delete;
    Replayer & operator=(const Replayer &) = delete;

    // Replays the whole trace under `s`. With `v`, also compares every slot's residency and
    // drop with the recorded ones (meaningful for the recorded settings).
    Status run(const ReplaySetting & s, ReplayResult * out, ValidateReport * v = nullptr);

    // The settings the trace was recorded under (lru, its budget, its drop settings, its k;
    // its --substitute-experts margin when the trace holds the scores to replay it).
    ReplaySetting recorded_setting() const;

private:
    struct Impl;
    const RouteTrace & t_;
    std::vector<std::vector<uint32_t>> next_use_;  // per k: per slot, next routing index
    const std::vector<uint32_t> & next_use(uint32_t k);
};

// Warm-start estimate (`replay --warm-split N`, docs/replay.md): what a warm expert set learned
// from an earlier run does to the first decode tokens of a later one. The trace is split after
// its Nth decode token: the first part (the prompt and N decode tokens) counts how often each
// expert was routed; the second part is replayed twice from an empty cache under `s` (lossless
// settings only): cold, and with the most routed experts of the first part that fit in 90 % of
// the budget made resident before it starts (loaded in count order, as a warm start would).
// The hit rates are over the first `measure` decode tokens of the second part.
struct WarmEstimate {
    uint64_t experts_preloaded = 0, bytes_preloaded = 0;
    uint64_t tokens = 0;                       // decode tokens measured
    uint64_t lookups = 0;                      // their routed (layer, expert) lookups
    uint64_t cold_hits = 0, warm_hits = 0;
    double cold_hit_pct = 0, warm_hit_pct = 0;
};
// kUsage: lossy settings, a cache off, or fewer than split + 1 decode tokens in the trace.
Status estimate_warm_start(const RouteTrace & t, const ReplaySetting & s, uint32_t split,
                           uint32_t measure, WarmEstimate * out);

}  // namespace moestream
