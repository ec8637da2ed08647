// server_impl.h — the Server behind run_server() (server.h): one class whose members are
// defined by concern, each in its own file:
//   server.cpp         start (bind, listen), stop, run_server();
//   server_http.cpp    the HTTP routes: authorization, bodies, errors, one handler per endpoint;
//   server_worker.cpp  the job queue (bounded FIFO, 503 when full) and the worker thread that
//                      owns the Engine and runs one job at a time;
//   server_sse.cpp     the replies: JSON bodies and the SSE streams (chat, completions,
//                      llama-server's /completion, /v1/responses events);
//   server_stats.cpp   the snapshots the worker publishes and /stats, /metrics, /props.
// Invariants: the Engine is touched only by the worker thread (and the constructor); a job
// is in the queue or running or done, never two; the API key is compared in constant time.
// Thread-safety: q_m_ guards the queue, running_, stopping_ and next_id_; stats_m_ guards
// snap_; a Job guards its own fields (job.h); HTTP threads read only the snapshot, the
// configuration and the Engine's methods documented as safe beside a generate.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "api.h"
#include "chat_request.h"
#include "job.h"
#include "responses.h"
#include "server.h"
#include "server_stats.h"
#include "server_util.h"

namespace moestream::server {

class Server {
public:
    Server(const ServeConfig & cfg, std::unique_ptr<Engine> engine)
        : cfg_(cfg), engine_(std::move(engine)) {
        model_name_ = cfg.alias.empty() ? basename_of(cfg.run.model_path) : cfg.alias;
        std::string bos, eos, err;
        bool bos_added = false;
        engine_->special_texts(&bos, &eos, &bos_added);
        const std::string src =
            cfg.chat_template.empty() ? engine_->chat_template() : cfg.chat_template;
        if (load_chat_format(src, bos, eos, bos_added, &fmt_, &err)) {
            tmpl_ = fmt_.name;
            if (!cfg.chat_template_from.empty()) tmpl_ += " from " + cfg.chat_template_from;
        } else {
            tmpl_error_ = "the chat template (" +
                          (cfg.chat_template_from.empty() ? std::string("the model's")
                                                          : cfg.chat_template_from) +
                          ") cannot be rendered (" + err + ")" +
                          "; give a template that renders with --chat-template-file";
        }
        drop_cold_block_ = engine_->drop_cold_block();
        publish_after_job(0, 0);
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
    // Stops taking jobs and cancels the queued ones and the running one (stop, shutdown).
    void cancel_all();

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

    // The routes, for the 404 that names them.
    static const char * routes_text();

    void setup_routes();

    // responses_body: the chat completions body a /v1/responses request was translated to
    // (authorization and content type already checked); errors then name its fields.
    void generate_route(const httplib::Request & req, httplib::Response & res, bool chat,
                        bool llama_shape = false, const std::string * responses_body = nullptr);

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

    json chunk_json(const Job & job, const json & delta_or_text, const json & finish) const;
    std::string job_name(const Job & job) const;
    static std::string sse(const json & j) { return "data: " + dump(j) + "\n\n"; }

    // One call of the chunked content provider: writes what is ready, or a keep-alive comment
    // after 0.5 s (so a vanished client is noticed while it waits in the queue).
    bool stream_step(Job & job, httplib::DataSink & sink, bool * sent_role);
    static bool write_str(httplib::DataSink & sink, const std::string & s);

    static json usage_json(const Job & job);

    json final_json(const Job & job) const;

    // The Response of a /v1/responses job (done: its final status; else in progress).
    ResponseState response_state(const Job & job, bool done) const;

    // One call of the chunked content provider of a /v1/responses stream: the Responses
    // API's events (response.created, output items opened, text deltas, items done,
    // response.completed), as stream_step writes chat chunks.
    bool responses_stream_step(Job & job, httplib::DataSink & sink, ResponsesStream * st);

    // llama-server's /completion reply (with_text: the whole content; streamed, the last event
    // carries none).
    json llama_final_json(const Job & job, bool with_text = true) const;

    // The one place a reply's shape is chosen, by the endpoint the job came from (chat and
    // completions: OpenAI's; /completion: llama-server's; /v1/responses: a Response): the
    // body of a finished job, and the SSE stream of a streaming one (sets `res` up; the
    // stream cancels the job if the client leaves).
    json reply_json(const Job & job) const;
    void stream_reply(const std::shared_ptr<Job> & job, httplib::Response & res);
    // A failed job's error: 400 invalid_request_error for bad input, else 500 server_error.
    static ApiError job_error(const Job & job);

    // ---- queue ------------------------------------------------------------------------
    bool enqueue(const std::shared_ptr<Job> & job);

    int retry_after_s();

    void worker_loop();

    // The worker is idle once `job` no longer runs (q_m_ taken here): a request enqueued from
    // then on is taken at once.
    void release_running(const Job & job);

    // Ends a job: the worker is idle before the client hears back, so a client that sends its
    // next request at once does not find the server busy.
    void finish(Job & job, Status st);

    void run_job(Job & job);

    // Figures of the running request from the engine's per-token stats (worker thread).
    void publish_live();

    // After a job (and at start): settings, cache figures, the mean request time.
    void publish_after_job(double dt, int ok);

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
    json props_json();

    // GET /metrics: Prometheus text exposition.
    std::string metrics_text();

    json stats_json();

    ServeConfig cfg_;
    std::unique_ptr<Engine> engine_;  // worker thread only (and the constructor)
    std::string model_name_;
    std::string tmpl_;  // the chat template's name; "" = chat refused
    std::string tmpl_error_;  // why the template cannot be parsed ("" = it renders)
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

    std::mutex q_m_;  // guards queue_, running_, stopping_, next_id_
    std::condition_variable q_cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    std::shared_ptr<Job> running_;
    bool stopping_ = false;
    uint64_t next_id_ = 0;

    std::mutex stats_m_;  // guards snap_
    Snapshot snap_;
};

}  // namespace moestream::server
