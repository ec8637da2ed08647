// cache_budget.h — choosing the expert cache's budget (docs/cache.md, "Choosing a budget").
//
// The cache rule: below one token's routed working set a cache gets zero hits and pays
// eviction costs — slower than no cache. So an explicit budget of 1..1499 MiB is refused
// unless forced; 0 means cache off (shared slots).
// auto (the default of `run`): budget = memory available to the process (the cgroup limit
// if one applies, else MemAvailable; see sysinfo.h) minus what the run itself needs besides
// cached experts (dense weights, KV cache and compute buffers as measured after the context
// exists, the I/O buffers) and a floor; clamped to [1.5 x one token's working set, total
// expert bytes]; if even the lower clamp does not fit: cache off.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "gguf_index.h"
#include "status.h"
#include "sysinfo.h"

namespace moestream {

constexpr int64_t kCacheRuleMinMiB = 1500;         // budgets below this need --force-cache
constexpr uint64_t kAutoFloorBytes = 512ull << 20;  // head-room auto never gives the cache

struct BudgetDecision {
    uint64_t budget_bytes = 0;  // 0 = cache off
    std::string reason;         // one line for the user
};

// cache_mb: -1 = auto, 0 = off, N = explicit. `needs_bytes`: memory the run needs besides
// cached experts. `mem` is only used for auto.
Status decide_cache_budget(const ModelIndex & index, int64_t cache_mb, bool force,
                           uint64_t needs_bytes, const MemoryAvailability & mem,
                           BudgetDecision * out);

}  // namespace moestream
