// cache_budget.h — choosing the expert cache's budget (docs/cache.md, "Choosing a budget").
//
// The cache rule, relative to the model: below one token's routed working set a cache gets
// zero hits and pays eviction costs — slower than no cache. So an explicit budget between 0
// and 1.5 x the working set (cache_rule_min_mib) is refused unless forced; 0 means cache off
// (shared slots). cache_rule_text states the rule with the model's numbers: inspect, run's
// refusal, the drop-cold error and the engine's settings (the server) all print it.
// auto (the default of `run`): budget = memory available to the process (the cgroup limit
// if one applies, else MemAvailable; see sysinfo.h) minus what the run itself needs besides
// cached experts (dense weights, KV cache and compute buffers as measured after the context
// exists, the I/O buffers) and a floor; clamped to [1.5 x one token's working set, total
// expert bytes]; if even the lower clamp does not fit: cache off. "Total expert bytes" is
// what the cache needs to hold every expert at once (cache_bytes_for_all_experts), a little
// more than the experts' file bytes: a budget that says "everything" then holds everything.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "moestream/gguf_index.h"
#include "moestream/status.h"
#include "moestream/sysinfo.h"

namespace moestream {

constexpr uint64_t kAutoFloorBytes = 512ull << 20;  // head-room auto never gives the cache

struct BudgetDecision {
    uint64_t budget_bytes = 0;  // 0 = cache off
    std::string reason;         // one line for the user
    bool clamped = false;       // an explicit budget above the memory limit was lowered
};

// Bytes the LRU cache needs to hold every expert at once, with pages of `page_bytes`: each
// (layer, projection) slice costs its page-pool chunk (PageLayout::chunk_pages pages; the
// recycled-pages accounting of docs/cache.md), which is >= the page-exact cost of the fresh
// pages mode. Above expert_bytes_total by up to one page per slice: +0.5 % on the 30B
// preset's Q4_K slices, +4.9 % / +11.8 % on the trained demo model's 68 KiB Q8_0 / 36 KiB
// Q4_K_M ones.
uint64_t cache_bytes_for_all_experts(const ModelIndex & index, uint64_t page_bytes);

// The smallest explicit budget accepted without --force-cache: 1.5 x the token working set,
// in MiB rounded up (at least 1).
uint64_t cache_rule_min_mib(const ModelIndex & index);
// "--cache-mb 0 (off) or >= M MiB (1.5 x this model's W MiB per-token working set); smaller
// budgets need --force-cache" (the words of the CLI and the server's settings). With
// `option_names` the options are named as RunOptions fields ("RunOptions::cache_mb 0 (off)
// ... RunOptions::force_cache"), as in the library's errors, which the CLI maps to its flags.
std::string cache_rule_text(const ModelIndex & index, bool option_names = false);

// What a run needs besides cached experts, as auto counts it before the KV cache exists:
// dense weights, an estimate of untouched compute buffers for n_batch (logits and activations
// of one batch) and one layer's routed set above the budget.
uint64_t auto_needs_bytes(const ModelIndex & index, uint32_t n_batch);

// cache_mb: -1 = auto, 0 = off, N = explicit. `needs_bytes`: memory the run needs besides
// cached experts. `mem`: for auto; for an explicit budget, one above what is available minus
// `needs_bytes` is clamped to that (clamped = true, said in the reason), or turns the cache off
// when that is below 1.5 x the working set (mem.available_bytes 0: no clamp). `page_bytes`: the system page size (the
// cache's commit granularity), for the upper clamp.
Status decide_cache_budget(const ModelIndex & index, int64_t cache_mb, bool force,
                           uint64_t needs_bytes, const MemoryAvailability & mem,
                           uint64_t page_bytes, BudgetDecision * out);

}  // namespace moestream
