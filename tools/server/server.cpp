// server.cpp — `moestream serve` (see server.h and docs/server.md): starting and stopping
// the Server (server_impl.h) and run_server().
#include "server.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "moestream/log.h"
#include "moestream/settings.h"
#include "server_impl.h"

namespace moestream::server {

int Server::serve() {
    const ServeConfig & cfg = ctx_.cfg();
    setup_routes();
    int port = cfg.port;
    if (port == 0) {
        port = http_.bind_to_any_port(cfg.host);
        if (port < 0) return bind_failed();
    } else if (!http_.bind_to_port(cfg.host, port)) {
        return bind_failed();
    }
    // cpp-httplib listens with a backlog of 5: a burst of connections would be refused or
    // delayed by the kernel. listen() again on the bound socket raises it.
    if (listen_fd_ >= 0) ::listen(listen_fd_, 512);
    if (cfg.host.compare(0, 4, "127.") != 0 && cfg.host != "localhost" && cfg.host != "::1")
        MS_LOG_WARN("listening on %s: reachable from other machines%s", cfg.host.c_str(),
                    cfg.api_key.empty() ? " and no --api-key is set" : "");
    worker_ = std::thread([this] { ctx_.jobs_.run([this](Job & job) { run_job(job); }); });
    // The lossy defaults by their flags (the registry's words, settings.h).
    RunOptions shown = cfg.run;
    shown.drop_cold = cfg.defaults.drop_cold;
    const json set = json::parse(engine_->settings_json(), nullptr, false);
    const std::string knobs =
        lossy_knobs_text(shown, set.is_object() ? set.value("n_expert_used_model", 0u) : 0u);
    const std::string quality =
        engine_->lossy() || !knobs.empty() ? "LOSSY defaults: " + knobs : "lossless";
    std::printf(
        "moestream serve: listening on http://%s:%d/ (model %s, %s, context %d, chat "
        "template %s)\n",
        cfg.host.find(':') != std::string::npos ? ("[" + cfg.host + "]").c_str()
                                                 : cfg.host.c_str(),
        port, ctx_.model_name().c_str(), quality.c_str(),
        engine_->n_ctx(), ctx_.template_name().empty() ? "none (unsupported)" : ctx_.template_name().c_str());
    std::fflush(stdout);
    bool ok = http_.listen_after_bind();
    shutdown();
    return ok ? 0 : 1;
}

int Server::bind_failed() {
    const ServeConfig & cfg = ctx_.cfg();
    MS_LOG_ERROR("cannot listen on %s:%d (in use, or not an address of this machine)",
                 cfg.host.c_str(), cfg.port);
    return 1;
}

int run_server(const ServeConfig & cfg_in) {
    ServeConfig cfg = cfg_in;
    // SIGPIPE: a client that disconnects must not kill the server (writes then fail).
    // SIGINT/SIGTERM: blocked in every thread, taken by one waiter that stops the server.
    ::signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);

    RunOptions ro = cfg.run;
    if (!cfg.drop_cold_explicit) ro.drop_cold = 0;  // applied after open, if the cache allows
    // The app default drop-cold needs the LRU cache; without it (--lossless) the fixed-slot
    // cache may hold the budget, and requests for drop-cold are refused by name.
    ro.drop_cold_later = cfg.defaults.drop_cold > 0;
    std::unique_ptr<Engine> engine;
    Status st = Engine::open(ro, &engine);
    if (!st.ok()) {
        MS_LOG_ERROR("%s", (cfg.option_words ? cfg.option_words(st.message()) : st.message()).c_str());
        return st.exit_code();
    }
    if (!cfg.drop_cold_explicit && cfg.defaults.drop_cold > 0) {
        st = engine->set_drop_cold(cfg.defaults.drop_cold);
        if (!st.ok()) {
            MS_LOG_WARN("app default drop-cold %.2f not applied, serving lossless: %s",
                        cfg.defaults.drop_cold,
                        (cfg.option_words ? cfg.option_words(st.message()) : st.message()).c_str());
            cfg.defaults.drop_cold = 0;
        }
    }
    if (cfg.token_delay_ms > 0)
        MS_LOG_WARN("MOESTREAM_DEBUG_TOKEN_DELAY_MS=%d: every token is delayed (tests only)",
                    cfg.token_delay_ms);
    if (!cfg.prefill_hold.empty())
        MS_LOG_WARN("MOESTREAM_DEBUG_PREFILL_HOLD=%s: a prompt stays in prefill while that file "
                    "exists (tests only)", cfg.prefill_hold.c_str());

    Server server(cfg, std::move(engine));
    if (!server.template_error().empty()) {
        MS_LOG_ERROR("%s", server.template_error().c_str());
        return Status::BadInput("").exit_code();
    }
    std::thread sig([&server, set] {
        int signo = 0;
        sigwait(&set, &signo);
        if (signo == SIGINT || signo == SIGTERM) {
            MS_LOG_INFO("signal %d: stopping", signo);
            server.stop();
        }
    });
    int rc = server.serve();
    // Wake the signal thread if the server stopped by itself (bind failure).
    pthread_kill(sig.native_handle(), SIGTERM);
    sig.join();
    return rc;
}

}  // namespace moestream::server
