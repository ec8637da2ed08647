// request_report.cpp — the moestream object of a response (request_report.h).
#include "request_report.h"

#include <cmath>
#include <string>
#include <utility>

#include "server_stats.h"

namespace moestream::server {

namespace {

// How a chat request's prompt was made and its reply read.
json chat_format_json(const ServerContext & ctx, const GenParams & p) {
    const ChatExtras & x = p.extras;
    return json{
        {"renderer", ctx.renderer_json()},
        {"tools", x.tools.size()},
        {"tool_choice", x.tools.empty()               ? json(nullptr)
                        : x.tool_choice == "function" ? json(x.tool_name)
                                                      : json(x.tool_choice)},
        {"thinking",
         ctx.chat_format().thinking ? json(x.enable_thinking.value_or(true)) : json(nullptr)},
        {"reasoning_effort", ctx.chat_format().effort
                                 ? json(x.reasoning_effort.empty() ? "medium" : x.reasoning_effort)
                                 : json(nullptr)}};
}

// The request's settings as the engine ran them (settings.request).
json request_settings(const ServerContext & ctx, const GenParams & p) {
    const SamplingParams & sp = p.sampling;
    json bias = json::object();
    for (const auto & [id, b] : sp.logit_bias)
        bias[std::to_string(id)] = std::isfinite(b) ? float_json(b) : json(false);
    return json{{"max_tokens", p.max_tokens < 0 ? json(nullptr) : json(p.max_tokens)},
                {"temperature", float_json(sp.temp)},
                {"top_p", float_json(sp.top_p)},
                {"top_k", sp.top_k},
                {"min_p", float_json(sp.min_p)},
                {"repeat_penalty", float_json(sp.repeat_penalty)},
                {"repeat_last_n", sp.repeat_last_n},
                {"presence_penalty", float_json(sp.presence_penalty)},
                {"frequency_penalty", float_json(sp.frequency_penalty)},
                {"logit_bias", bias},
                {"grammar", sp.grammar.empty() || p.response_format != "text" ? json(nullptr)
                                                                              : json(sp.grammar)},
                {"response_format", p.response_format},
                {"logprobs", p.logprobs < 0 ? json(nullptr) : json(p.logprobs)},
                {"ignore_eos", sp.ignore_eos},
                {"stop", p.stop},
                {"seed", sp.seed},
                {"drop_cold_experts", p.drop_cold},
                {"cache_prompt", p.cache_prompt},
                {"stream", p.stream},
                {"chat_template", p.chat ? json(ctx.template_name()) : json(nullptr)},
                {"chat_format", p.chat ? chat_format_json(ctx, p) : json(nullptr)}};
}

}  // namespace

json request_report(const ServerContext & ctx, const Job & job, const GenerateResult & g,
                    const RunStats & s, json engine_settings, bool cancelled) {
    const DecodeFigures f = decode_figures(s);
    json st{{"n_prompt", s.n_prompt},
            {"n_prompt_reused", s.n_prompt_reused},
            {"prompt_cache_tokens", s.prompt_cache_tokens},
            {"prompt_cache_read_bytes", s.prompt_cache_read_bytes},
            {"prompt_cache_restore_s", s.prompt_cache_restore_s},
            {"n_generated", s.n_generated},
            {"prefill_s", s.prefill_s},
            {"prefill_tok_s", s.prefill_tok_s},
            {"decode_tok_s", f.tok_s},
            {"cache_hit_pct", f.cache_hit_pct},
            {"first16_hit_pct", s.first16_hit_pct},
            {"flash_mib_per_token", f.mib_per_token},
            {"resident_expert_mib", mib(double(s.resident_expert_bytes))},
            {"experts_dropped", s.experts_dropped},
            {"experts_substituted", s.experts_substituted},
            {"finish", finish_reason_name(g.finish)}};
    json r{{"lossy", g.lossy},
           {"settings", json{{"engine", std::move(engine_settings)},
                             {"request", request_settings(ctx, job.params)}}},
           {"stats", st},
           {"cancelled", cancelled}};
    if (job.params.return_tokens) r["tokens"] = g.tokens;
    if (g.finish == FinishReason::kStop) r["stop_string"] = g.stop_string;
    return r;
}

}  // namespace moestream::server
