// server_context.h — what the request handlers of `moestream serve` (server.h) may use:
// ServerContext is the narrow view the route files (routes_*.cpp, server_routes.h) get of the
// Server (server_impl.h): the configuration and the model's names and chat format, the
// Engine's methods that are safe beside a generate (vocabulary, request checks, the model
// file's status), the job queue's admission and cancellation, the metrics' snapshot and the
// reply writer. It never hands out the Engine: what must run on the engine (a generation, a
// slot action) is queued as a Job and run by the worker.
// Invariants: everything but the queue, the metrics and open_streams is const after
// construction; the Engine is reached only through the const methods below (each documented
// by the library as safe from any thread while a generate runs).
// Thread-safety: every public method may be called from any thread: the queue and the
// metrics lock themselves, open_streams is atomic, the rest is read-only.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api.h"
#include "chat_format.h"
#include "job.h"
#include "job_queue.h"
#include "server.h"
#include "server_sse.h"
#include "server_stats.h"
#include "server_util.h"

namespace moestream::server {

class Server;

// What the engine is asked to do for p (the HTTP side checks it, the worker runs it).
GenerateRequest engine_request(const GenParams & p);

class ServerContext {
public:
    // Reads the model's chat template (or cfg.chat_template) and the engine's drop-cold block.
    ServerContext(const ServeConfig & cfg, const Engine & engine);

    // ---- configuration (read-only) -------------------------------------------------------
    const ServeConfig & cfg() const { return cfg_; }
    const std::string & model_name() const { return model_name_; }      // --alias or the file's
    const std::string & template_name() const { return tmpl_; }         // "" = chat refused
    const std::string & template_error() const { return tmpl_error_; }  // "" = it renders
    const chat::ChatFormat & chat_format() const { return fmt_; }
    // The template's renderer ("minja" or "python3-jinja2"; null when chat is refused).
    json renderer_json() const { return renderer_.empty() ? json(nullptr) : json(renderer_); }
    DropColdBlock drop_cold_block() const { return drop_cold_block_; }  // the engine's, at start
    int64_t started_unix() const { return started_unix_; }              // when the server started

    // ---- the Engine's methods safe beside a generate ---------------------------------------
    int n_ctx() const { return engine_.n_ctx(); }
    int n_vocab() const { return engine_.n_vocab(); }
    Status tokenize(const std::string & text, std::vector<int32_t> * out) const {
        return engine_.tokenize(text, out);
    }
    Status detokenize(const std::vector<int32_t> & tokens, std::string * out) const {
        return engine_.detokenize(tokens, out);
    }
    Status check_request(const GenerateRequest & r, int * n_prompt) const {
        return engine_.check_request(r, n_prompt);
    }
    Status model_file_status() const { return engine_.model_file_status(); }

    // ---- the queue ----------------------------------------------------------------------
    // Admits a job (false: refused, counted as rejected_busy: answer 503 with retry_after_s).
    bool enqueue(const std::shared_ptr<Job> & job);
    int retry_after_s() const;  // seconds a refused client should wait (1..60)
    size_t waiting() const { return jobs_.waiting(); }
    bool busy() const { return jobs_.busy(); }          // a job runs
    bool stopping() const { return jobs_.stopping(); }  // SIGTERM: nothing more is admitted
    // The client went away: cancel its job; a waiting one leaves the queue at once (and is
    // finished here, so its handler returns), a running one stops at its next token.
    void client_left(const std::shared_ptr<Job> & job);

    // ---- figures and replies ------------------------------------------------------------
    Snapshot metrics_snapshot() const { return metrics_.snapshot(); }
    const ReplyWriter & replies() const { return replies_; }
    // Sets `res` up as the SSE stream of `job` (replies()), counted in open_streams until it
    // ends; a client that leaves cancels the job.
    void stream_reply(const std::shared_ptr<Job> & job, httplib::Response & res);

private:
    friend class Server;  // lifecycle: the worker loop, publishing, stop

    ServeConfig cfg_;
    const Engine & engine_;  // only the const methods above (safe beside a generate)
    std::string model_name_;
    std::string tmpl_;        // the chat template's name; "" = chat refused
    std::string tmpl_error_;  // why the template cannot be parsed ("" = it renders)
    std::string renderer_;    // what renders the template (fmt_.jinja->renderer()); "" = none
    chat::ChatFormat fmt_;    // the model template's family when moestream renders it
    DropColdBlock drop_cold_block_ = DropColdBlock::kResident;
    int64_t started_unix_ = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    std::atomic<int> open_streams_{0};    // SSE responses not yet finished
    ReplyWriter replies_{model_name_};    // the replies' shapes (after model_name_)
    JobQueue<Job> jobs_{cfg_.queue_max};  // the waiting jobs and the running one
    ServerMetrics metrics_{!cfg_.run.prompt_cache.empty(), !cfg_.run.warm_experts.empty()};
};

}  // namespace moestream::server
