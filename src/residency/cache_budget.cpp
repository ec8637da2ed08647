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

uint64_t cache_rule_min_mib(const ModelIndex & index) {
    const uint64_t ws = index.token_working_set_bytes;
    const uint64_t min_bytes = ws + (ws + 1) / 2;  // 1.5 x ws, rounded to the nearest byte
    return std::max<uint64_t>(1, (min_bytes + (1ull << 20) - 1) >> 20);
}

std::string cache_rule_text(const ModelIndex & index, bool option_names) {
    char ws[32];
    std::snprintf(ws, sizeof ws, "%.1f", double(index.token_working_set_bytes) / (1 << 20));
    const char * budget = option_names ? "RunOptions::cache_mb" : "--cache-mb";
    const char * force = option_names ? "RunOptions::force_cache" : "--force-cache";
    return std::string(budget) + " 0 (off) or >= " + std::to_string(cache_rule_min_mib(index)) +
           " MiB (1.5 x this model's " + ws + " MiB per-token working set); smaller budgets need " +
           force;
}

uint64_t auto_needs_bytes(const ModelIndex & index, uint32_t n_batch) {
    uint64_t max_layer_set = 0;
    for (const auto & L : index.moe_layers)
        max_layer_set = std::max<uint64_t>(max_layer_set, uint64_t(index.n_expert_used) * L.expert_bytes);
    const uint64_t compute_est =
        uint64_t(n_batch) * (uint64_t(index.n_vocab) + 64ull * index.n_embd) * 4;
    return index.dense_bytes_total + compute_est + max_layer_set;
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
        if (uint64_t(cache_mb) < cache_rule_min_mib(index) && !force)
            return Status::Usage(
                "RunOptions::cache_mb " + std::to_string(cache_mb) +
                " is below the cache rule: a cache smaller than one token's routed experts gets "
                "no hits and pays for evictions, which is slower than no cache. Use " +
                cache_rule_text(index, true));
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
