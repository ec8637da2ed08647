// server_stats.cpp — Server's figures (server_impl.h): the snapshots the worker publishes
// and /stats, /metrics (Prometheus text), /props.
#include "server.h"
#include "responses.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "chat_jinja.h"
#include "chat_request.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"
#include "llama_completion.h"
#include "logprobs_json.h"
#include "time_json.h"
#include "web_assets.h"
#include "server_impl.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`

void Server::publish_live() {
    const RunStats & s = engine_->stats();
    const DecodeFigures f = decode_figures(s);
    std::lock_guard<std::mutex> sl(stats_m_);
    snap_.prefilling = false;
    snap_.n_generated = s.n_generated;
    snap_.tok_s = f.tok_s;
    snap_.cache_hit_pct = f.cache_hit_pct;
    snap_.mib_per_token = f.mib_per_token;
    snap_.decode_time = tools::sum_token_times(s.tokens);
}

void Server::publish_after_job(double dt, int ok) {
    const RunStats & s = engine_->stats();
    json settings = json::parse(engine_->settings_json(), nullptr, false);
    std::lock_guard<std::mutex> sl(stats_m_);
    if (dt > 0) {  // a generation ran (not the start)
        snap_.prompt_tokens_total += uint64_t(s.n_prompt - s.n_prompt_reused);
        snap_.generated_tokens_total += uint64_t(s.n_generated);
        snap_.prefill_s_total += s.prefill_s;
        snap_.decode_s_total += s.decode_s;
    }
    snap_.engine_settings = settings;
    snap_.lossy = engine_->lossy();
    snap_.resident_expert_mib = mib(double(s.resident_expert_bytes));
    snap_.cache_budget_mib = mib(double(s.cache_budget_bytes));
    snap_.cache_hit_pct_total = s.cache_hit_pct;
    snap_.cache = cache_counters_json(s);
    if (!cfg_.run.prompt_cache.empty())
        snap_.prompt_cache = json{{"tokens_restored", s.prompt_cache_tokens},
                                  {"read_mib", mib(double(s.prompt_cache_read_bytes))},
                                  {"restore_s", s.prompt_cache_restore_s},
                                  {"written_mib", mib(double(s.prompt_cache_written_bytes))},
                                  {"refused", s.prompt_cache_refused}};
    if (!cfg_.run.warm_experts.empty())
        snap_.warm_experts = json{{"file", s.warm_experts_file},
                                  {"listed", s.warm_experts_listed},
                                  {"preloaded", s.warm_experts_preloaded},
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

json Server::props_json() {
    json st = stats_json();
    return json{{"model_path", cfg_.run.model_path},
                {"model", model_name_},
                {"n_ctx", engine_->n_ctx()},
                {"n_vocab", engine_->n_vocab()},
                {"total_slots", 1},
                {"chat_template", tmpl_.empty() ? json(nullptr) : json(tmpl_)},
                {"chat_template_renderer",
                 fmt_.jinja ? json(fmt_.jinja->renderer()) : json(nullptr)},
                {"default_generation_settings", st["defaults"]},
                {"lossy", st["lossy"]},
                {"settings", st["settings"]}};
}

std::string Server::metrics_text() {
    const json st = stats_json();
    std::string out;
    auto metric = [&](const char * name, const char * type, const char * help, double v) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        out += std::string("# HELP moestream_") + name + " " + help + "\n# TYPE moestream_" +
               name + " " + type + "\nmoestream_" + name + " " + buf + "\n";
    };
    Snapshot s;
    {
        std::lock_guard<std::mutex> sl(stats_m_);
        s = snap_;
    }
    metric("requests_served_total", "counter", "requests answered in full", double(s.served));
    metric("requests_cancelled_total", "counter", "requests whose client left or that the "
           "server stopped", double(s.cancelled));
    metric("requests_errors_total", "counter", "requests that failed", double(s.errors));
    metric("requests_rejected_busy_total", "counter", "requests refused with 503",
           double(s.rejected_busy));
    metric("queue_waiting", "gauge", "requests waiting behind the running one",
           st["queue_waiting"].get<double>());
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
    metric("rss_mib", "gauge", "resident set size", st["rss_mib"].get<double>());
    metric("lossy", "gauge", "1 when the current settings are lossy", s.lossy ? 1 : 0);
    return out;
}

json Server::stats_json() {
    size_t waiting;
    {
        std::lock_guard<std::mutex> lk(q_m_);
        waiting = queue_.size();
    }
    std::lock_guard<std::mutex> sl(stats_m_);
    const Snapshot & s = snap_;
    json defaults{{"max_tokens", cfg_.defaults.max_tokens < 0
                                     ? json(nullptr)
                                     : json(cfg_.defaults.max_tokens)},
                  {"max_tokens_limit", engine_->n_ctx() - 1},
                  {"n_ctx", engine_->n_ctx()},
                  {"temperature", float_json(cfg_.defaults.temperature)},
                  {"top_k", cfg_.defaults.sampling.top_k},
                  {"top_p", float_json(cfg_.defaults.sampling.top_p)},
                  {"min_p", float_json(cfg_.defaults.sampling.min_p)},
                  {"repeat_penalty", float_json(cfg_.defaults.sampling.repeat_penalty)},
                  {"repeat_last_n", cfg_.defaults.sampling.repeat_last_n},
                  {"presence_penalty", float_json(cfg_.defaults.sampling.presence_penalty)},
                  {"frequency_penalty", float_json(cfg_.defaults.sampling.frequency_penalty)},
                  {"seed", cfg_.defaults.seed},
                  {"drop_cold_experts", cfg_.defaults.drop_cold},
                  {"cache_prompt", true},
                  {"chat_template", tmpl_.empty() ? json(nullptr) : json(tmpl_)},
                  {"drop_cold_available", drop_cold_block_ == DropColdBlock::kNone}};
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
                {"queue_waiting", waiting},
                {"queue_max", cfg_.queue_max},
                {"requests", json{{"served", s.served},
                                  {"cancelled", s.cancelled},
                                  {"errors", s.errors},
                                  {"rejected_busy", s.rejected_busy}}},
                {"lossy", s.lossy},
                {"model", model_name_},
                {"settings", s.engine_settings},
                {"defaults", defaults}};
}

}  // namespace moestream::server
