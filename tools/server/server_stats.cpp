// server_stats.cpp — ServerMetrics (server_stats.h): the counters and snapshots the worker
// publishes, and their /stats and /metrics (Prometheus text) forms.
#include "server_stats.h"

#include <cstdio>

#include "moestream/sysinfo.h"
#include "time_json.h"

namespace moestream::server {

void ServerMetrics::count_rejected() {
    std::lock_guard<std::mutex> lk(m_);
    snap_.rejected_busy++;
}

void ServerMetrics::count_cancelled() {
    std::lock_guard<std::mutex> lk(m_);
    snap_.cancelled++;
}

void ServerMetrics::count_error() {
    std::lock_guard<std::mutex> lk(m_);
    snap_.errors++;
}

void ServerMetrics::begin_job(uint64_t id, int n_prompt) {
    std::lock_guard<std::mutex> lk(m_);
    snap_.generating = true;
    snap_.prefilling = true;
    snap_.n_prompt = n_prompt;
    snap_.job_id = id;
    snap_.n_generated = 0;
    snap_.tok_s = snap_.cache_hit_pct = snap_.mib_per_token = 0;
    snap_.decode_time = TimeBreakdown{};
}

void ServerMetrics::publish_live(const RunStats & s) {
    const DecodeFigures f = decode_figures(s);
    const TimeBreakdown t = tools::sum_token_times(s.tokens);
    std::lock_guard<std::mutex> lk(m_);
    snap_.prefilling = false;
    snap_.n_generated = s.n_generated;
    snap_.tok_s = f.tok_s;
    snap_.cache_hit_pct = f.cache_hit_pct;
    snap_.mib_per_token = f.mib_per_token;
    snap_.decode_time = t;
}

void ServerMetrics::publish_after_job(const RunStats & s, json engine_settings, bool lossy,
                                      double dt, bool ok) {
    std::lock_guard<std::mutex> lk(m_);
    if (dt > 0) {  // a generation ran (not the start)
        snap_.prompt_tokens_total += uint64_t(s.n_prompt - s.n_prompt_reused);
        snap_.generated_tokens_total += uint64_t(s.n_generated);
        snap_.prefill_s_total += s.prefill_s;
        snap_.decode_s_total += s.decode_s;
    }
    snap_.engine_settings = std::move(engine_settings);
    snap_.lossy = lossy;
    snap_.resident_expert_mib = mib(double(s.resident_expert_bytes));
    snap_.cache_budget_mib = mib(double(s.cache_budget_bytes));
    snap_.cache_hit_pct_total = s.cache_hit_pct;
    snap_.cache = cache_counters_json(s);
    if (prompt_cache_)
        snap_.prompt_cache = json{{"tokens_restored", s.prompt_cache_tokens},
                                  {"read_mib", mib(double(s.prompt_cache_read_bytes))},
                                  {"restore_s", s.prompt_cache_restore_s},
                                  {"written_mib", mib(double(s.prompt_cache_written_bytes))},
                                  {"refused", s.prompt_cache_refused}};
    if (warm_experts_)
        snap_.warm_experts = json{{"file", s.warm_experts_file},
                                  {"listed", s.warm_experts_listed},
                                  {"preloaded", s.warm_experts_preloaded},
                                  {"before_decode", s.warm_experts_before_decode},
                                  {"not_read", s.warm_experts_not_read},
                                  {"first16_hit_pct", s.first16_hit_pct},
                                  {"refused", s.warm_experts_refused}};
    snap_.read_latency = s.reads_timed == 0 ? json(nullptr)
                                            : json{{"reads", s.reads_timed},
                                                   {"p50_ms", s.read_p50_s * 1e3},
                                                   {"p99_ms", s.read_p99_s * 1e3},
                                                   {"max_ms", s.read_max_s * 1e3}};
    if (ok) {
        snap_.served++;
        snap_.avg_request_s = snap_.served == 1 ? dt : 0.8 * snap_.avg_request_s + 0.2 * dt;
    }
}

void ServerMetrics::end_job(bool failed, bool cancelled) {
    std::lock_guard<std::mutex> lk(m_);
    snap_.generating = false;
    snap_.prefilling = false;
    if (failed) snap_.errors++;
    if (cancelled) snap_.cancelled++;
}

Snapshot ServerMetrics::snapshot() const {
    std::lock_guard<std::mutex> lk(m_);
    return snap_;
}

double ServerMetrics::avg_request_s() const {
    std::lock_guard<std::mutex> lk(m_);
    return snap_.avg_request_s;
}

json stats_figures_json(const Snapshot & s, size_t queue_waiting, int queue_max) {
    return json{{"generating", s.generating},
                {"phase", !s.generating ? "idle" : s.prefilling ? "prefill" : "decode"},
                {"n_prompt", s.n_prompt},
                {"request_id", s.job_id},
                {"n_generated", s.n_generated},
                {"tok_s", s.tok_s},
                {"cache_hit_pct", s.cache_hit_pct},
                {"mib_per_token", s.mib_per_token},
                {"time_per_token", tools::time_breakdown_json(s.decode_time, true)},
                {"cache_hit_pct_total", s.cache_hit_pct_total},
                {"resident_expert_mib", s.resident_expert_mib},
                {"cache_budget_mib", s.cache_budget_mib},
                {"cache", s.cache},
                {"read_latency", s.read_latency},
                {"rss_mib", mib(double(current_rss_bytes()))},
                {"prompt_cache", s.prompt_cache},
                {"warm_experts", s.warm_experts},
                {"peak_rss_mib", mib(double(peak_rss_bytes()))},
                {"queue_waiting", queue_waiting},
                {"queue_max", queue_max},
                {"requests", json{{"served", s.served},
                                  {"cancelled", s.cancelled},
                                  {"errors", s.errors},
                                  {"rejected_busy", s.rejected_busy}}},
                {"lossy", s.lossy},
                {"settings", s.engine_settings}};
}

std::string metrics_text(const Snapshot & s, size_t queue_waiting, double rss_mib) {
    std::string out;
    auto metric = [&](const char * name, const char * type, const char * help, double v) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        out += std::string("# HELP moestream_") + name + " " + help + "\n# TYPE moestream_" +
               name + " " + type + "\nmoestream_" + name + " " + buf + "\n";
    };
    metric("requests_served_total", "counter", "requests answered in full", double(s.served));
    metric("requests_cancelled_total", "counter", "requests whose client left or that the "
           "server stopped", double(s.cancelled));
    metric("requests_errors_total", "counter", "requests that failed", double(s.errors));
    metric("requests_rejected_busy_total", "counter", "requests refused with 503",
           double(s.rejected_busy));
    metric("queue_waiting", "gauge", "requests waiting behind the running one",
           double(queue_waiting));
    metric("generating", "gauge", "1 while a generation runs", s.generating ? 1 : 0);
    metric("prompt_tokens_total", "counter", "prompt tokens prefilled (not reused)",
           double(s.prompt_tokens_total));
    metric("tokens_generated_total", "counter", "tokens generated",
           double(s.generated_tokens_total));
    metric("prefill_seconds_total", "counter", "time spent in prefill", s.prefill_s_total);
    metric("decode_seconds_total", "counter", "time spent decoding", s.decode_s_total);
    metric("decode_tokens_per_second", "gauge", "decode speed of the running or last request",
           s.tok_s);
    metric("cache_hit_ratio", "gauge", "expert cache hits / lookups of the running or last "
           "request's decode", s.cache_hit_pct / 100.0);
    metric("cache_hit_ratio_total", "gauge", "expert cache hits / lookups since start",
           s.cache_hit_pct_total / 100.0);
    metric("flash_mib_per_token", "gauge", "MiB read from the model file per decoded token "
           "(running or last request)", s.mib_per_token);
    metric("resident_expert_mib", "gauge", "expert bytes resident in the cache",
           s.resident_expert_mib);
    metric("rss_mib", "gauge", "resident set size", rss_mib);
    metric("lossy", "gauge", "1 when the current settings are lossy", s.lossy ? 1 : 0);
    return out;
}

}  // namespace moestream::server
