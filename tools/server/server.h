// server.h — `moestream serve`: an OpenAI-compatible HTTP server and a web page over one
// Engine (docs/server.md).
//
// Shape: cpp-httplib's thread pool answers HTTP; one worker thread owns the Engine and runs
// one generation at a time (decode is single-stream). Generation requests wait in a bounded
// FIFO queue; a full queue answers 503 with Retry-After. A streaming client that disconnects
// cancels its job (the engine's on_piece returns false); so does a non-streaming client whose
// connection closes (the HTTP thread watches it). HTTP threads call only the Engine's
// methods documented as safe alongside a generate (tokenize, templates, check_request); the
// figures they report come from snapshots the worker publishes under a mutex.
//
// Invariants: the Engine is touched only by the worker thread; the API key is compared in
// constant time and never logged; POST bodies above the limit get 413 before being parsed.
// Thread-safety: run_server() is called once, from the main thread.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "api.h"
#include "moestream/moestream.h"

namespace moestream::server {

struct ServeConfig {
    RunOptions run;                   // the engine (run's flags); run.drop_cold: see below
    bool drop_cold_explicit = false;  // --drop-cold-experts given: failing to apply it is an error
    std::string host = "127.0.0.1";
    int port = 8080;           // 0 = any free port (printed on stdout)
    std::string api_key;       // "" = no key
    RequestDefaults defaults;  // per-request defaults; defaults.drop_cold = the app default
    int queue_max = 8;         // requests waiting behind the running one
    size_t body_limit_bytes = 1 << 20;
    int token_delay_ms = 0;  // MOESTREAM_DEBUG_TOKEN_DELAY_MS (tests only)
    // MOESTREAM_DEBUG_PREFILL_HOLD (tests only): while this file exists, a request's prompt
    // stays in prefill (after its first micro-batch); "" = never held.
    std::string prefill_hold;
    std::string cors_origin;  // --cors ORIGIN: allow that web origin ("" = no CORS headers)
    // --slot-save-path DIR: POST /slots/0?action=save|restore|erase with {"filename": NAME}
    // saves / restores the KV the context holds to DIR/NAME (docs/server.md); "" = refused (501).
    std::string slot_save_path;
    // --chat-template / --chat-template-file: the template text used instead of the model's
    // ("" = the model's), and where it came from (a file's path or a name) for messages.
    std::string chat_template;
    std::string chat_template_from;
    std::string alias;        // --alias: the model's name in the API ("" = the file's name)
    bool webui = true;        // false (--no-webui): no web page; GET / is a 404
    // How the caller words an error of Engine::open (the library names RunOptions fields; the
    // CLI maps them to its flags); unset = the library's words.
    std::function<std::string(const std::string &)> option_words;
};

// Opens the engine, binds, prints "moestream serve: listening on http://HOST:PORT/" on stdout
// and serves until SIGINT or SIGTERM. Returns the process exit code (Status codes: 64 usage,
// 2 bad model, 1 runtime, e.g. the port is taken).
int run_server(const ServeConfig & cfg);

}  // namespace moestream::server
