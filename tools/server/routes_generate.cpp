// routes_generate.cpp — the generation endpoints of `moestream serve` (server_routes.h): POST
// /v1/chat/completions, /v1/completions, llama-server's /completion and /v1/responses (translated
// to chat completions, responses.h), each also without /v1. A request is parsed and its prompt
// checked here, then queued as a Job for the worker; the reply is streamed (SSE, ReplyWriter)
// or sent once the job is done.
// Thread-safety: cpp-httplib's threads; the engine is reached only through ServerContext's
// thread-safe methods (the worker runs the generation).
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chat_request.h"
#include "llama_completion.h"
#include "responses.h"
#include "server_routes.h"

namespace moestream::server {

namespace {

// The prompt text of a request (chat: the template applied), checked against the context and
// the engine's own rules before it is queued.
std::optional<ApiError> prepare_prompt(const ServerContext & ctx, GenParams & p, ChatPlan * plan) {
    const char * param = p.chat ? "messages" : "prompt";
    if (p.chat) {
        if (ctx.template_name().empty())
            return bad_request("messages",
                               "chat completions are not available: the model's chat "
                               "template is not one llama.cpp renders; format the "
                               "prompt yourself and use /v1/completions");
        if (auto e = plan_chat(ctx.chat_format(), ctx.template_name(), &p, plan)) return e;
    } else if (!p.prompt_tokens.empty()) {
        // Token ids are passed as their text: accepted when the text gives the same ids.
        Status st = ctx.detokenize(p.prompt_tokens, &p.prompt);
        std::vector<int32_t> again;
        if (st.ok()) st = ctx.tokenize(p.prompt, &again);
        if (!st.ok()) return bad_request("prompt", "'prompt': " + st.message());
        if (again != p.prompt_tokens)
            return bad_request("prompt",
                               "'prompt': these token ids do not come back from their "
                               "text (the server tokenizes text); send the text");
    }
    GenerateRequest r = engine_request(p);
    int n_prompt = 0;
    Status st = ctx.check_request(r, &n_prompt);
    if (!st.ok()) {
        std::string field = field_of(st.message());
        if (field.empty() && n_prompt >= ctx.n_ctx()) field = param;
        std::string msg = st.message();
        if (n_prompt >= ctx.n_ctx())
            msg = "the prompt is " + std::to_string(n_prompt) +
                  " tokens, longer than the context (" + std::to_string(ctx.n_ctx()) +
                  " tokens): shorten it";
        if (field == "grammar" && !p.format_param.empty()) {  // the server's grammar
            field = p.format_param;
            msg = "'" + field + "': llama.cpp refuses the grammar made from it (" + msg +
                  "); a schema that comes back to itself before writing any JSON text, "
                  "such as a $ref to an enclosing schema first in an anyOf, cannot be "
                  "generated";
        }
        return bad_request(field, msg);
    }
    return std::nullopt;
}

// Chat and completions in every shape: the request parsed and checked on this thread (so a
// refusal is a 400 even for a streaming request), queued, then streamed or waited for.
// responses_body: the chat completions body a /v1/responses request was translated to;
// errors then name its fields.
void generate_route(ServerContext & ctx, const Req & req, Res & res, bool chat,
                    bool llama_shape = false, const std::string * responses_body = nullptr) {
    const ServeConfig & cfg = ctx.cfg();
    auto job = std::make_shared<Job>();
    job->llama_shape = llama_shape;
    job->responses = responses_body != nullptr;
    auto send_error = [&](Res & r, ApiError e) {
        if (job->responses && responses_param(e.param) != e.param) {  // its own field names
            const std::string from = "'" + e.param + "'";
            e.param = responses_param(e.param);
            for (size_t at; (at = e.message.find(from)) != std::string::npos;)
                e.message.replace(at, from.size(), "'" + e.param + "'");
        }
        server::send_error(r, e);
    };
    std::string llama_body;  // /completion: n_probs taken out (llama_completion.h)
    if (llama_shape) {
        llama_body = req.body;
        if (auto e = take_n_probs(&llama_body, &job->n_probs)) return send_error(res, *e);
    }
    if (auto e = parse_request(responses_body ? *responses_body
                               : llama_shape  ? llama_body
                                              : req.body,
                               chat, cfg.defaults, &job->params))
        return send_error(res, *e);
    GenParams & p = job->params;
    if (p.drop_cold > 0 && ctx.drop_cold_block() != DropColdBlock::kNone) {
        ApiError e =
            api_error(400, drop_cold_refusal(ctx.drop_cold_block()), "invalid_request_error");
        e.param = "drop_cold_experts";
        return send_error(res, e);
    }
    if (auto e = prepare_prompt(ctx, p, &job->plan)) return send_error(res, *e);
    job->created = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
    if (!ctx.enqueue(job)) {
        res.set_header("Retry-After", std::to_string(ctx.retry_after_s()));
        return send_error(res, api_error(503,
                                         "the server is busy (" + std::to_string(cfg.queue_max) +
                                             " requests already wait); retry later",
                                         "server_busy"));
    }
    if (p.stream) return ctx.stream_reply(job, res);
    // Not streaming: nothing is written before the end, so watch the connection instead;
    // a client that leaves cancels its job, waiting or running.
    const int fd = find_request_socket(req);
    std::unique_lock<std::mutex> lk(job->m);
    while (!job->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return job->done; })) {
        if (fd >= 0 && !job->cancelled && peer_gone(fd)) {
            lk.unlock();
            ctx.client_left(job);
            lk.lock();
        }
    }
    lk.unlock();                             // done: the job is no longer written to
    if (job->cancelled && ctx.stopping()) {  // SIGTERM: not a failure of the request
        res.set_header("Retry-After", "5");
        return send_error(res,
                          api_error(503, "the server is stopping; retry later", "server_busy"));
    }
    if (!job->status.ok()) return send_error(res, ReplyWriter::job_error(*job));
    send_json(res, 200, ctx.replies().reply_json(*job));
}

// POST /v1/responses: the request translated to chat completions (responses.h).
void responses_route(ServerContext & ctx, const Req & req, Res & res) {
    std::string chat_body;
    if (auto e = responses_to_chat(req.body, &chat_body)) return send_error(res, *e);
    generate_route(ctx, req, res, true, false, &chat_body);
}

}  // namespace

std::vector<Route> generate_routes() {
    using Ctx = ServerContext;
    return {
        {"POST", "/v1/chat/completions", "/v1/chat/completions", kAuth | kJsonBody,
         [](Ctx & ctx, const Req & req, Res & res) { generate_route(ctx, req, res, true); }},
        {"POST", "/chat/completions", nullptr, kAuth | kJsonBody,
         [](Ctx & ctx, const Req & req, Res & res) { generate_route(ctx, req, res, true); }},
        {"POST", "/v1/completions", "/v1/completions", kAuth | kJsonBody,
         [](Ctx & ctx, const Req & req, Res & res) { generate_route(ctx, req, res, false); }},
        {"POST", "/completions", nullptr, kAuth | kJsonBody,
         [](Ctx & ctx, const Req & req, Res & res) { generate_route(ctx, req, res, false); }},
        // OpenAI's Responses API, translated to chat completions (responses.h).
        {"POST", "/v1/responses", "/v1/responses", kAuth | kJsonBody, responses_route},
        {"POST", "/responses", nullptr, kAuth | kJsonBody, responses_route},
        // llama-server's native completion: the completions request, its reply shape.
        {"POST", "/completion", "/completion", kAuth | kJsonBody,
         [](Ctx & ctx, const Req & req, Res & res) { generate_route(ctx, req, res, false, true); }},
    };
}

}  // namespace moestream::server
