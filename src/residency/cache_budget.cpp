#include "moestream/cache_budget.h"

#include <algorithm>
#include <cstdio>

#include "page_layout.h"

namespace moestream {
namespace {
std::string mib(uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f MiB", double(b) / (1 << 20));
    return buf;
}
}  // namespace

uint64_t cache_bytes_for_all_experts(const ModelIndex & index, uint64_t page_bytes) {
    if (page_bytes == 0) page_bytes = 4096;
    uint64_t total = 0;
    for (const MoeLayer & L : index.moe_layers)
        for (const ExpertTensor & t : L.tensors) {
            const uint32_t n_expert = t.ne[2] > 0 ? uint32_t(t.ne[2]) : 0;
            if (n_expert == 0 || t.slice_bytes == 0) continue;
            const PageLayout lay{t.file_offset % page_bytes, t.slice_bytes, page_bytes, n_expert};
            // No overflow: a chunk is at most slice_bytes + 2 pages, and the slices exist in
            // the file, so n_expert x chunk <= tensor_bytes + 2 x n_expert pages.
            total += uint64_t(n_expert) * lay.chunk_pages() * page_bytes;
        }
    return std::max(total, index.expert_bytes_total);
}

Status decide_cache_budget(const ModelIndex & index, int64_t cache_mb, bool force,
                           uint64_t needs_bytes, const MemoryAvailability & mem,
                           uint64_t page_bytes, BudgetDecision * out) {
    const uint64_t ws = index.token_working_set_bytes;
    const uint64_t all = cache_bytes_for_all_experts(index, page_bytes);
    if (cache_mb == 0) {
        *out = {0, "cache off (--cache-mb 0): every routed expert is read for every token"};
        return Status::Ok();
    }
    if (cache_mb > 0) {
        if (cache_mb < kCacheRuleMinMiB && !force)
            return Status::Usage(
                "--cache-mb " + std::to_string(cache_mb) + " is in the 1.." +
                std::to_string(kCacheRuleMinMiB - 1) +
                " MiB band: one token of this model routes " + mib(ws) +
                " of experts (inspect: token working set); a cache below that gets no hits and "
                "pays for evictions, which is slower than no cache. Use 0, or at least " +
                mib(ws + ws / 2) + " (1.5 x the working set), or add --force-cache");
        uint64_t b = uint64_t(cache_mb) << 20;
        std::string why = "--cache-mb " + std::to_string(cache_mb);
        if (b > all) {
            b = all;
            why += ", capped at what holds every expert (" + mib(all) + ")";
        }
        // Never above the memory limit: what is available minus what the run needs besides.
        const uint64_t avail = mem.available_bytes;
        if (avail > 0) {
            const uint64_t fits = avail > needs_bytes ? avail - needs_bytes : 0;
            if (b > fits) {
                const std::string lim = std::string(mem.source) + " " + mib(avail) +
                                        " available - " + mib(needs_bytes) +
                                        " (dense weights, KV, buffers)";
                if (fits == 0 || fits < ws + ws / 2) {
                    *out = {0, why + " does not fit: " + lim + " leaves " + mib(fits) +
                                   ", below 1.5 x the working set (" + mib(ws + ws / 2) +
                                   "): cache off", true};
                    return Status::Ok();
                }
                *out = {fits, why + " clamped to " + mib(fits) + " (" + lim + ")", true};
                return Status::Ok();
            }
        }
        *out = {b, why};
        return Status::Ok();
    }
    // auto
    const uint64_t lo = ws + ws / 2, hi = all;
    const uint64_t reserve = needs_bytes + kAutoFloorBytes;
    const uint64_t avail = mem.available_bytes;
    std::string from = std::string(mem.source) + " " + mib(avail);
    if (avail <= reserve || avail - reserve < lo) {
        *out = {0, "auto: " + from + " available, minus " + mib(needs_bytes) +
                       " for dense weights/KV/buffers and a " + mib(kAutoFloorBytes) +
                       " floor, leaves less than 1.5 x the working set (" + mib(lo) + "): cache off"};
        return Status::Ok();
    }
    uint64_t b = avail - reserve;
    std::string why = "auto: " + from + " available - " + mib(needs_bytes) +
                      " (dense weights, KV, buffers) - " + mib(kAutoFloorBytes) + " floor";
    if (b > hi) {
        b = hi;
        why += ", capped at what holds every expert (" + mib(hi) + ")";
    }
    *out = {b, why};
    return Status::Ok();
}

}  // namespace moestream
