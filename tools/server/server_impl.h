// server_impl.h — the Server behind run_server() (server.h): it wires the parts, each with
// its own header or file:
//   job_queue.h        JobQueue: admission (503 when full), one job at a time, cancellation;
//   server_stats.h     ServerMetrics: the counters and snapshots behind /stats and /metrics;
//   server_http.cpp    the route table (method, path, checks, handler) and the handlers;
//   server_worker.cpp  the worker: runs one job on the Engine, reports it;
//   server_sse.h       ReplyWriter: JSON bodies and the SSE streams (chat, completions,
//                      llama-server's /completion, /v1/responses events);
//   server.cpp         start (bind, listen), stop, run_server().
// Invariants: the Engine is touched only by the worker thread (and the constructor); a job
// is waiting, running or done, never two (JobQueue); the API key is compared in constant
// time; the renderer's name is read once, here.
// Thread-safety: jobs_ and metrics_ lock themselves; a Job guards its own fields (job.h);
// HTTP threads read only metrics snapshots, the configuration and the Engine's methods
// documented as safe beside a generate.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api.h"
#include "chat_request.h"
#include "job.h"
#include "job_queue.h"
#include "responses.h"
#include "server.h"
#include "server_sse.h"
#include "server_stats.h"
#include "server_util.h"

namespace moestream::server {

class Server {
public:
    Server(const ServeConfig & cfg, std::unique_ptr<Engine> engine)
        : cfg_(cfg),
          engine_(std::move(engine)),
          model_name_(cfg.alias.empty() ? basename_of(cfg.run.model_path) : cfg.alias) {
        std::string bos, eos, err;
        bool bos_added = false;
        engine_->special_texts(&bos, &eos, &bos_added);
        const std::string src =
            cfg.chat_template.empty() ? engine_->chat_template() : cfg.chat_template;
        if (load_chat_format(src, bos, eos, bos_added, &fmt_, &err)) {
            tmpl_ = fmt_.name;
            renderer_ = fmt_.jinja ? fmt_.jinja->renderer() : std::string();
            if (!cfg.chat_template_from.empty()) tmpl_ += " from " + cfg.chat_template_from;
        } else {
            tmpl_error_ = "the chat template (" +
                          (cfg.chat_template_from.empty() ? std::string("the model's")
                                                          : cfg.chat_template_from) +
                          ") cannot be rendered (" + err + ")" +
                          "; give a template that renders with --chat-template-file";
        }
        drop_cold_block_ = engine_->drop_cold_block();
        publish_after_job(0, false);
    }

    // Why the chat template cannot be used ("" = it renders): the server does not start.
    const std::string & template_error() const { return tmpl_error_; }

    int serve();

    // From the signal thread: cancel what runs and waits, let the open streams send their
    // final chunk and [DONE] (cpp-httplib stops writing chunks once it stops listening), then
    // stop accepting; serve() returns once the HTTP threads are done.
    void stop();

private:
    int bind_failed();

    void shutdown();

    // ---- HTTP -------------------------------------------------------------------------
    static void send_json(httplib::Response & res, int status, const json & j);
    static void send_error(httplib::Response & res, const ApiError & e);
    static ApiError api_error(int status, const std::string & msg, const std::string & type);

    bool authorized(const httplib::Request & req, httplib::Response & res) const;

    // Browsers send a cross-origin POST without asking first only for form content types (or
    // none): requiring application/json from a browser keeps other web sites from driving this
    // server. A request without an Origin header does not come from a web page (curl -d, SDKs):
    // its body is read as JSON whatever its Content-Type says.
    static bool json_body(const httplib::Request & req, httplib::Response & res);

    // One endpoint (server_http.cpp's table): adding one is a row there and its handler.
    enum RouteCheck : unsigned {
        kOpen = 0,
        kAuth = 1,      // the API key (authorized)
        kJsonBody = 2,  // a JSON body (json_body), checked after the key
    };
    struct Route {
        const char * method;  // "GET" or "POST"
        const char * path;    // cpp-httplib's pattern (a regex where it has groups)
        const char * shown;   // how the 404 names it; nullptr = an alias, not listed
        unsigned checks;      // RouteCheck bits, done before the handler
        void (*handle)(Server &, const httplib::Request &, httplib::Response &);
    };
    static const std::vector<Route> & routes();

    // The routes, for the 404 that names them (from routes(), with the web page if served).
    std::string routes_text() const;

    void setup_routes();

    // Authorization and the content type are checked (the route's checks). responses_body:
    // the chat completions body a /v1/responses request was translated to; errors then name
    // its fields.
    void generate_route(const httplib::Request & req, httplib::Response & res, bool chat,
                        bool llama_shape = false, const std::string * responses_body = nullptr);

    // POST /v1/responses: the request translated to chat completions (responses.h).
    void responses_route(const httplib::Request & req, httplib::Response & res);

    // A /v1/models entry: the served model.
    json model_json() const;

    // POST /slots/{id}?action=save|restore|erase, llama-server's slot files: the KV the
    // context holds, to and from --slot-save-path DIR/filename (one slot: id 0).
    void slots_route(const httplib::Request & req, httplib::Response & res);

    // The client went away: cancel its job; a waiting one leaves the queue at once (and is
    // finished here, so its handler returns), a running one stops at its next token.
    void client_left(const std::shared_ptr<Job> & job);

    // The prompt text of a request (chat: the template applied), checked against the
    // context and the engine's own rules before it is queued, so that a refusal is a 400
    // even for a streaming request. Runs on the HTTP thread: the engine methods used read
    // only the loaded vocabulary and template.
    std::optional<ApiError> prepare_prompt(GenParams & p, ChatPlan * plan) const;
    static ApiError api_error_param(int status, const std::string & msg, const std::string & param);

    // What the engine is asked to do for p.
    static GenerateRequest engine_request(const GenParams & p);

    // The SSE stream of `job` (replies_), counted in open_streams_; a client that leaves
    // cancels the job.
    void stream_reply(const std::shared_ptr<Job> & job, httplib::Response & res);

    // ---- queue and worker ---------------------------------------------------------------
    // Admits a job into jobs_ (false: refused, counted as rejected_busy: answer 503).
    bool enqueue(const std::shared_ptr<Job> & job);

    int retry_after_s() const;

    // Ends a job: the worker is idle before the client hears back, so a client that sends its
    // next request at once does not find the server busy.
    void finish(Job & job, Status st);

    void run_job(Job & job);

    // After a job (and at start): the engine's figures to metrics_ (worker thread).
    void publish_after_job(double dt, bool ok);

    json request_settings(const GenParams & p) const;

    // A tool call's id: 9 letters and digits (the form Mistral templates require), unique
    // within this server's run and unlikely to repeat across runs. Worker thread only.
    std::string next_call_id();

    // How a chat request's prompt was made and its reply read.
    json chat_format_json(const GenParams & p) const;

    // The moestream object of a response: what produced it and how it went.
    json request_report(const Job & job, const GenerateResult & g, bool cancelled);

    // POST /tokenize {"content": text} -> {"tokens": [...]} (with the model's start token when
    // it uses one, as a prompt is tokenized for `with_pieces`: each token's text too).
    void tokenize_route(const httplib::Request & req, httplib::Response & res) const;

    // POST /detokenize {"tokens": [...]} -> {"content": text}
    void detokenize_route(const httplib::Request & req, httplib::Response & res) const;

    // POST /apply-template {"messages": [...]} -> {"prompt": text, "chat_template": name}
    void apply_template_route(const httplib::Request & req, httplib::Response & res) const;

    // GET /props: what llama-server's /props reports that applies here.
    json props_json() const;

    // GET /stats: the metrics' figures, the model and the request defaults.
    json stats_json() const;

    // The template's renderer ("minja" or "python3-jinja2"; null when chat is refused).
    json renderer_json() const { return renderer_.empty() ? json(nullptr) : json(renderer_); }

    ServeConfig cfg_;
    std::unique_ptr<Engine> engine_;  // worker thread only (and the constructor)
    std::string model_name_;
    std::string tmpl_;  // the chat template's name; "" = chat refused
    std::string tmpl_error_;  // why the template cannot be parsed ("" = it renders)
    std::string renderer_;    // what renders the template (fmt_.jinja->renderer()); "" = none
    chat::ChatFormat fmt_;    // the model template's family when moestream renders it
    static constexpr int kHttpThreads = 128;
    int listen_fd_ = -1;  // the listening socket (set_socket_options)
    std::atomic<int> open_streams_{0};  // SSE responses not yet finished
    DropColdBlock drop_cold_block_ = DropColdBlock::kResident;  // the engine's, at start
    uint64_t calls_made_ = 0;  // tool calls parsed (next_call_id)
    int64_t started_unix_ = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    httplib::Server http_;
    std::thread worker_;

    ReplyWriter replies_{model_name_};  // the replies' shapes (after model_name_)
    JobQueue<Job> jobs_{cfg_.queue_max};  // the waiting jobs and the running one
    ServerMetrics metrics_{!cfg_.run.prompt_cache.empty(), !cfg_.run.warm_experts.empty()};
};

}  // namespace moestream::server
