// routes_info.cpp — the read-only endpoints of `moestream serve` (server_routes.h): GET
// /health, /stats, /props, /metrics, /slots, /v1/models and /v1/models/{id}. They read the
// configuration, the metrics' snapshot and the engine's thread-safe methods; none queues a job.
// Thread-safety: cpp-httplib's threads (ServerContext's methods are safe from any thread).
#include <string>
#include <vector>

#include "moestream/sysinfo.h"
#include "server_routes.h"

namespace moestream::server {

namespace {

// A /v1/models entry: the served model.
json model_json(const ServerContext & ctx) {
    return json{{"id", ctx.model_name()},
                {"object", "model"},
                {"created", ctx.started_unix()},
                {"owned_by", "moestream"}};
}

// GET /stats: the metrics' figures, the model and the request defaults.
json stats_json(const ServerContext & ctx) {
    const ServeConfig & cfg = ctx.cfg();
    json j = stats_figures_json(ctx.metrics_snapshot(), ctx.waiting(), cfg.queue_max);
    j["model"] = ctx.model_name();
    const RequestDefaults & d = cfg.defaults;
    const std::string & tmpl = ctx.template_name();
    j["defaults"] = json{{"max_tokens", d.max_tokens < 0 ? json(nullptr) : json(d.max_tokens)},
                         {"max_tokens_limit", ctx.n_ctx() - 1},
                         {"n_ctx", ctx.n_ctx()},
                         {"temperature", float_json(d.temperature)},
                         {"top_k", d.sampling.top_k},
                         {"top_p", float_json(d.sampling.top_p)},
                         {"min_p", float_json(d.sampling.min_p)},
                         {"repeat_penalty", float_json(d.sampling.repeat_penalty)},
                         {"repeat_last_n", d.sampling.repeat_last_n},
                         {"presence_penalty", float_json(d.sampling.presence_penalty)},
                         {"frequency_penalty", float_json(d.sampling.frequency_penalty)},
                         {"seed", d.seed},
                         {"drop_cold_experts", d.drop_cold},
                         {"cache_prompt", true},
                         {"chat_template", tmpl.empty() ? json(nullptr) : json(tmpl)},
                         {"drop_cold_available", ctx.drop_cold_block() == DropColdBlock::kNone}};
    return j;
}

// GET /props: what llama-server's /props reports that applies here.
json props_json(const ServerContext & ctx) {
    json st = stats_json(ctx);
    const std::string & tmpl = ctx.template_name();
    return json{{"model_path", ctx.cfg().run.model_path},
                {"model", ctx.model_name()},
                {"n_ctx", ctx.n_ctx()},
                {"n_vocab", ctx.n_vocab()},
                {"total_slots", 1},
                {"chat_template", tmpl.empty() ? json(nullptr) : json(tmpl)},
                {"chat_template_renderer", ctx.renderer_json()},
                {"default_generation_settings", st["defaults"]},
                {"lossy", st["lossy"]},
                {"settings", st["settings"]}};
}

}  // namespace

std::vector<Route> info_routes() {
    return {
        {"GET", "/health", "/health", kOpen,
         [](ServerContext & ctx, const Req &, Res & res) {
             // A changed model file fails every request.
             const Status fs = ctx.model_file_status();
             if (!fs.ok())
                 return send_json(res, 503,
                                  json{{"status", "error"},
                                       {"model", ctx.model_name()},
                                       {"error", fs.message()}});
             send_json(res, 200, json{{"status", "ok"}, {"model", ctx.model_name()}});
         }},
        {"GET", "/stats", "/stats", kAuth,
         [](ServerContext & ctx, const Req &, Res & res) { send_json(res, 200, stats_json(ctx)); }},
        {"GET", "/props", "/props", kAuth,
         [](ServerContext & ctx, const Req &, Res & res) { send_json(res, 200, props_json(ctx)); }},
        {"GET", "/metrics", "/metrics", kAuth,
         [](ServerContext & ctx, const Req &, Res & res) {
             res.set_content(metrics_text(ctx.metrics_snapshot(), ctx.waiting(),
                                          mib(double(current_rss_bytes()))),
                             "text/plain; version=0.0.4");
         }},
        // llama-server's slot listing: this server has one slot (one generation at a time;
        // others wait in the queue).
        {"GET", "/slots", "/slots", kAuth,
         [](ServerContext & ctx, const Req &, Res & res) {
             send_json(res, 200,
                       json::array({json{{"id", 0},
                                         {"n_ctx", ctx.n_ctx()},
                                         {"is_processing", ctx.busy()},
                                         {"speculative", false}}}));
         }},
        {"GET", "/v1/models", "/v1/models", kAuth,
         [](ServerContext & ctx, const Req &, Res & res) {
             send_json(res, 200,
                       json{{"object", "list"}, {"data", json::array({model_json(ctx)})}});
         }},
        {"GET", R"(/v1/models/(.+))", "/v1/models/{id}", kAuth,
         [](ServerContext & ctx, const Req & req, Res & res) {
             const std::string id = req.matches[1];
             if (id != ctx.model_name()) {
                 ApiError e = api_error(404,
                                        "The model '" + id + "' does not exist (this server has '" +
                                            ctx.model_name() + "')",
                                        "invalid_request_error");
                 e.param = "model";
                 e.code = "model_not_found";
                 return send_error(res, e);
             }
             send_json(res, 200, model_json(ctx));
         }},
    };
}

}  // namespace moestream::server
