// server_impl.h — the Server behind run_server() (server.h): its lifecycle (bind, serve, stop)
// and the worker thread. The parts, each with its own header or file:
//   server_context.h   ServerContext: what request handlers may use (configuration, the
//                      engine's thread-safe methods, queue admission, metrics, replies);
//   server_routes.h    the endpoints: one row each, grouped in routes_*.cpp with their
//                      handlers; server_http.cpp collects them, checks the key and body type;
//   job_queue.h        JobQueue: admission (503 when full), one job at a time, cancellation;
//   server_stats.h     ServerMetrics: the counters and snapshots behind /stats and /metrics;
//   server_worker.cpp  the worker: runs one job on the Engine, reports it
//                      (request_report.h: the moestream object of a response);
//   server_sse.h       ReplyWriter: JSON bodies and the SSE streams (chat, completions,
//                      llama-server's /completion, /v1/responses events);
//   server.cpp         start (bind, listen), stop, run_server().
// Invariants: the Engine is touched only by the worker thread (and the constructors); HTTP
// threads reach it only through ServerContext's const methods; a job is waiting, running or
// done, never two (JobQueue); the API key is compared in constant time; the renderer's name
// is read once (ServerContext).
// Thread-safety: serve() and the worker run on their own threads, stop() on the signal thread;
// the context's queue and metrics lock themselves; a Job guards its own fields (job.h).
#pragma once

#include <httplib.h>

#include <memory>
#include <string>
#include <thread>

#include "job.h"
#include "server.h"
#include "server_context.h"

namespace moestream::server {

class Server {
public:
    Server(const ServeConfig & cfg, std::unique_ptr<Engine> engine)
        : engine_(std::move(engine)), ctx_(cfg, *engine_) {
        publish_after_job(0, false);
    }

    // Why the chat template cannot be used ("" = it renders): the server does not start.
    const std::string & template_error() const { return ctx_.template_error(); }

    int serve();

    // From the signal thread: cancel what runs and waits, let the open streams send their
    // final chunk and [DONE] (cpp-httplib stops writing chunks once it stops listening), then
    // stop accepting; serve() returns once the HTTP threads are done.
    void stop();

private:
    int bind_failed();

    void shutdown();

    // ---- HTTP (server_http.cpp) ---------------------------------------------------------
    // The routes, for the 404 that names them (from routes(), with the web page if served).
    std::string routes_text() const;

    // Server-wide settings of cpp-httplib, the web page and every route of routes().
    void setup_routes();

    // ---- the worker (server_worker.cpp; worker thread only) -------------------------------
    // Ends a job: the worker is idle before the client hears back, so a client that sends its
    // next request at once does not find the server busy.
    void finish(Job & job, Status st);

    void run_job(Job & job);

    // After a job (and at start): the engine's figures to the metrics.
    void publish_after_job(double dt, bool ok);

    // A tool call's id: 9 letters and digits (the form Mistral templates require), unique
    // within this server's run and unlikely to repeat across runs.
    std::string next_call_id();

    std::unique_ptr<Engine> engine_;  // worker thread only (and the constructor)
    ServerContext ctx_;               // what the handlers see (after engine_)
    static constexpr int kHttpThreads = 128;
    int listen_fd_ = -1;       // the listening socket (set_socket_options)
    uint64_t calls_made_ = 0;  // tool calls parsed (next_call_id)
    httplib::Server http_;
    std::thread worker_;
};

}  // namespace moestream::server
