// run_config.cpp — see run_config.h.
#include "run_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "moestream/atomic_file.h"
#include "moestream/cache_budget.h"
#include "moestream/settings.h"
#include "moestream/sysinfo.h"

namespace moestream {
namespace {

// An integer metadata value (the first element of a per-layer array), or `dflt`.
uint64_t kv_uint(const ModelIndex & m, const std::string & key, uint64_t dflt) {
    auto it = m.kv.find(key);
    if (it == m.kv.end()) return dflt;
    const KvValue & v = it->second;
    if (!v.arr_i.empty()) return v.arr_i[0] > 0 ? uint64_t(v.arr_i[0]) : dflt;
    return v.i > 0 ? uint64_t(v.i) : dflt;
}

std::string mib_str(unsigned __int128 b) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.0f MiB", double(b) / (1 << 20));
    return buf;
}

Status usage(const std::string & msg) { return Status::Usage(msg); }

// The rules for RunOptions::prefetch: each combination below would leave it silently off.
Status check_prefetch(const RunOptions & opt) {
    if (!opt.stream)
        return usage("RunOptions::prefetch needs streaming, not RunOptions::stream = false");
    if (opt.io_threads < 2)
        return usage("RunOptions::prefetch needs a worker lane to read ahead with: "
                     "RunOptions::io_threads 2 or more");
    if (opt.drop_cold > 0)
        return usage("RunOptions::prefetch and RunOptions::drop_cold exclude each other (the "
                     "policy drops cache misses; a read-ahead expert is none)");
    return Status::Ok();
}

}  // namespace

// The rules for RunOptions::prefill_readahead: each combination below would leave it off.
Status check_prefill_readahead(const RunOptions & opt) {
    const char * f = "RunOptions::prefill_readahead";
    if (!opt.stream)
        return usage(std::string(f) + " needs streaming, not RunOptions::stream = false");
    if (opt.io_threads < 2)
        return usage(std::string(f) + " needs a worker lane to read ahead with: "
                     "RunOptions::io_threads 2 or more");
    if (opt.drop_cold > 0 || opt.substitute > 0)
        return usage(std::string(f) + " and " +
                     (opt.drop_cold > 0 ? "RunOptions::drop_cold" : "RunOptions::substitute") +
                     " exclude each other (the policy acts on cache misses; a read-ahead "
                     "expert is none)");
    return Status::Ok();
}

Status check_run_options(const RunOptions & opt) {
    if (Status cs = check_setting_choices(opt); !cs.ok()) return cs;
    if (opt.n_threads < 1 || opt.n_threads > 512)
        return usage("RunOptions::n_threads must be in 1..512");
    if (opt.n_ctx != 0 && opt.n_ctx < 16)
        return usage("RunOptions::n_ctx must be >= 16 (or 0: the model's context)");
    if (opt.n_batch < 0)
        return usage("RunOptions::n_batch must be >= 0 (0: chosen at open for the memory)");
    if (opt.n_ubatch < 0)
        return usage("RunOptions::n_ubatch must be >= 0 (0: as RunOptions::n_batch)");
    if (opt.flash_attn < -1 || opt.flash_attn > 1)
        return usage("RunOptions::flash_attn must be -1 (auto), 0 (off) or 1 (on)");
    if (opt.n_threads_batch < 0 || opt.n_threads_batch > 512)
        return usage("RunOptions::n_threads_batch must be in 0..512 (0: as RunOptions::n_threads)");
    if (opt.io_threads < 1 || opt.io_threads > 64)
        return usage("RunOptions::io_threads must be in 1..64");
    if (!(opt.temp >= 0.0f) || !std::isfinite(opt.temp))
        return usage("RunOptions::temp must be finite and >= 0");
    if (opt.drop_cold != 0 && !(opt.drop_cold > 0 && opt.drop_cold <= 1))
        return usage("RunOptions::drop_cold must be in (0, 1] (or 0: off)");
    if (opt.drop_cold > 0 && !opt.stream)
        return usage("RunOptions::drop_cold needs streaming (it drops cache misses), not "
                     "RunOptions::stream = false");
    if (!(opt.substitute >= 0 && opt.substitute <= 1))
        return usage("RunOptions::substitute must be in [0, 1] (a router-score margin; 0: off)");
    if (opt.substitute > 0 && !opt.stream)
        return usage("RunOptions::substitute needs streaming (it replaces cache misses), not "
                     "RunOptions::stream = false");
    if (!opt.miss_fallback.empty() && !opt.stream)
        return usage("RunOptions::miss_fallback needs streaming (it replaces cache misses), not "
                     "RunOptions::stream = false");
    if (!(opt.fallback_threshold > 0 && opt.fallback_threshold <= 1))
        return usage("RunOptions::fallback_threshold must be in (0, 1] (a final router weight)");
    if (!opt.miss_fallback.empty() && (opt.drop_cold > 0 || opt.substitute > 0))
        return usage("RunOptions::miss_fallback cannot be combined with RunOptions::drop_cold or "
                     "RunOptions::substitute (each decides what a miss becomes)");
    if (!opt.resident_mmap && opt.stream)
        return usage("RunOptions::resident_mmap = false applies to RunOptions::stream = false "
                     "(streaming maps the file itself)");
    if (!opt.route_trace.empty() && !opt.stream)
        return usage("RunOptions::route_trace needs streaming (the streamer observes the "
                     "routing), not RunOptions::stream = false");
    if (opt.route_trace_scores && opt.route_trace.empty())
        return usage("RunOptions::route_trace_scores needs RunOptions::route_trace (the scores "
                     "are recorded in the route trace)");
    if (!opt.warm_experts.empty() && !opt.route_trace.empty())
        return usage("RunOptions::warm_experts cannot be combined with RunOptions::route_trace "
                     "(the trace does not record the warm set's reads, whose number depends on "
                     "timing, so a replay could not reproduce the run)");
    if ((opt.drop_in_prefill || opt.drop_renorm) && opt.drop_cold <= 0)
        return usage("RunOptions::drop_in_prefill and RunOptions::drop_renorm need "
                     "RunOptions::drop_cold > 0");
    if (!opt.route_trace.empty()) {  // a device or FIFO is refused, never replaced
        Status ts = check_output_path(opt.route_trace, "RunOptions::route_trace");
        if (!ts.ok()) return ts;
    }
    if (!opt.stream && (opt.cache_mb >= 0 || opt.force_cache || opt.cache_debug))
        return usage(std::string(opt.cache_mb >= 0   ? "RunOptions::cache_mb"
                                 : opt.force_cache ? "RunOptions::force_cache"
                                                   : "RunOptions::cache_debug") +
                     " applies to the expert cache of streaming, not RunOptions::stream = false");
    if (opt.prefill_readahead < -1 || opt.prefill_readahead > 1)
        return usage("RunOptions::prefill_readahead " + std::to_string(opt.prefill_readahead) +
                     " is not -1 (where it applies), 0 (off) or 1 (on)");
    if (opt.prefill_readahead == 1) {
        Status ps = check_prefill_readahead(opt);
        if (!ps.ok()) return ps;
    }
    return opt.prefetch ? check_prefetch(opt) : Status::Ok();
}

Status check_n_expert_used(const RunOptions & opt, const ModelIndex & m) {
    if (opt.n_expert_used < 0 || uint32_t(opt.n_expert_used) > m.n_expert_used)
        return usage("RunOptions::n_expert_used must be in 1.." + std::to_string(m.n_expert_used) +
                     " (the model's top-k)");
    return Status::Ok();
}

// The estimate counts f16 K and V for every layer and the f16 mask of n_ctx x n_ubatch; MLA
// models cache the compressed latent; a mapped file is not counted.
Status check_context_fits(const RunOptions & opt, const ModelIndex & m) {
    const MemoryAvailability mem = memory_availability();
    if (mem.available_bytes == 0) return Status::Ok();
    const std::string p = m.arch + ".";
    const uint64_t n_head = kv_uint(m, p + "attention.head_count", 0);
    unsigned __int128 per_token = 0;  // KV bytes per context position, all layers
    // Sliding-window layers keep a smaller cache: no KV term for such models (a lower bound).
    const bool swa = m.kv.count(p + "attention.sliding_window") != 0;
    if (n_head > 0 && !swa) {
        const uint64_t n_head_kv = kv_uint(m, p + "attention.head_count_kv", n_head);
        const uint64_t head_k = kv_uint(m, p + "attention.key_length", m.n_embd / n_head);
        const uint64_t head_v = kv_uint(m, p + "attention.value_length", head_k);
        const uint64_t lora = kv_uint(m, p + "attention.kv_lora_rank", 0);
        const uint64_t nextn = kv_uint(m, p + "nextn_predict_layers", 0);
        const uint64_t layers = m.n_layer > nextn ? m.n_layer - nextn : 1;
        const uint64_t row = lora ? lora + kv_uint(m, p + "rope.dimension_count", 0)
                                  : n_head_kv * (head_k + head_v);
        per_token = (unsigned __int128)layers * row * 2;
    }
    const uint64_t n_ctx = uint64_t(opt.n_ctx);
    const uint64_t n_ubatch = std::min<uint64_t>(uint64_t(opt.n_batch), n_ctx);
    const unsigned __int128 kv = per_token * n_ctx;
    const unsigned __int128 mask = (unsigned __int128)n_ctx * n_ubatch * 2;
    // Weights held in anonymous memory: the dense ones when streaming, every tensor when
    // resident without mapping; a mapped file (resident) is page cache the kernel can reclaim.
    const unsigned __int128 weights =
        opt.stream ? m.dense_bytes_total
                   : (opt.resident_mmap ? 0 : m.dense_bytes_total + m.expert_bytes_total);
    const unsigned __int128 total = kv + mask + weights;
    if (total <= mem.available_bytes) return Status::Ok();
    if (opt.n_ctx == 0)  // the context is not known yet: the weights alone do not fit
        return usage((opt.stream ? "the dense weights (" : "the weights (") + mib_str(weights) +
                     ") need more than the " + mib_str(mem.available_bytes) + " available (" +
                     mem.source + ")" +
                     (opt.stream ? std::string()
                                 : "; drop RunOptions::resident_mmap = false (map the file) or "
                                   "RunOptions::stream = false (stream the experts)"));
    return usage("RunOptions::n_ctx " + std::to_string(opt.n_ctx) + " with RunOptions::n_batch " +
                 std::to_string(opt.n_batch) + " cannot fit: the KV cache (" + mib_str(kv) +
                 ") and one batch's attention mask (" + mib_str(mask) + ") with " +
                 mib_str(weights) + " of weights need at least " + mib_str(total) + ", but " +
                 mib_str(mem.available_bytes) + " is available (" + mem.source +
                 "); lower RunOptions::n_ctx or RunOptions::n_batch");
}

int choose_n_batch(const RunOptions & opt, const ModelIndex & m, const MemoryAvailability & mem,
                   std::string * reason) {
    constexpr int kBase = 512, kMax = 4096;
    const auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
    if (!opt.stream) {
        *reason = "512 (resident: the weights are read once, at load)";
        return kBase;
    }
    const uint64_t avail = mem.available_bytes;
    if (avail == 0) {
        *reason = "512 (the memory available is unknown)";
        return kBase;
    }
    const uint64_t base_needs = auto_needs_bytes(m, kBase);
    const uint64_t experts = m.expert_bytes_total;
    const bool fits = opt.cache_mb > 0 ? experts <= (uint64_t(opt.cache_mb) << 20)
                      : opt.cache_mb < 0 ? experts + base_needs <= avail
                                         : false;
    if (fits) {
        *reason = "512 (the cache can hold every expert, " + mib(experts) +
                  ": a prompt reads each layer's experts once at any batch)";
        return kBase;
    }
    const int cap = opt.n_ctx > 0 ? std::min(kMax, opt.n_ctx) : kMax;
    int u = kBase;
    while (u * 2 <= cap && auto_needs_bytes(m, uint32_t(u * 2)) - base_needs <= avail / 8) u *= 2;
    *reason = std::to_string(u) + " (" +
              (opt.cache_mb == 0 ? std::string("the cache is off")
                                 : "the experts, " + mib(experts) + ", do not fit in the cache") +
              ", so a prompt reads each layer's experts once per batch: " +
              "the largest batch up to " + std::to_string(cap) +
              " whose compute estimate exceeds 512's by at most 1/8 of the " + mib(avail) +
              " available, " + mem.source + ")";
    return u;
}

int model_context(const ModelIndex & m, const MemoryAvailability & mem, std::string * reason) {
    const std::string p = m.arch + ".";
    const int train = int(std::max<uint64_t>(16, std::min<uint64_t>(kv_uint(m, p + "context_length", 0), INT32_MAX)));
    const uint64_t n_head = std::max<uint64_t>(1, kv_uint(m, p + "attention.head_count", 1));
    const uint64_t head_k = kv_uint(m, p + "attention.key_length", m.n_embd / n_head);
    const uint64_t head_v = kv_uint(m, p + "attention.value_length", head_k);
    const uint64_t n_head_kv = kv_uint(m, p + "attention.head_count_kv", n_head);
    const uint64_t kv_per_token = std::max<uint64_t>(1, m.n_layer) * std::max<uint64_t>(1, n_head_kv) *
                                  (head_k + head_v) * 2;
    const uint64_t cap_tokens = mem.available_bytes / 4 / std::max<uint64_t>(1, kv_per_token);
    int n = train;
    if (mem.available_bytes > 0 && cap_tokens < uint64_t(train))
        n = int(std::max<uint64_t>(512, cap_tokens) / 256 * 256);
    n = std::min(n, train);
    *reason = "the model's context " + std::to_string(train) +
              (n < train ? ", capped to " + std::to_string(n) + " so the KV cache (" +
                               std::to_string(kv_per_token >> 10) + " KiB per token) takes <= 1/4 of " +
                               std::to_string(mem.available_bytes >> 20) + " MiB available (" +
                               mem.source + ")"
                         : std::string());
    return n;
}

}  // namespace moestream
