// moestream CLI entry point: dispatches to the subcommands (run, inspect, synth, ...).
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "llama.h"
#include "moestream/log.h"

#ifndef MOESTREAM_VERSION
#define MOESTREAM_VERSION "unknown"
#endif
#ifndef MOESTREAM_SERVE_AND_CHAT
#define MOESTREAM_SERVE_AND_CHAT 1
#endif

namespace moestream::cli {
void apply_verbosity(int count) {
    if (log_disabled()) log_set_level(LogLevel::kError);
    else if (count >= 2) log_set_level(LogLevel::kDebug);
    else if (count == 1) log_set_level(LogLevel::kInfo);
}
}  // namespace moestream::cli

int main(int argc, char ** argv) {
    using namespace moestream::cli;
    // A file size limit (ulimit -f) makes the write that passes it fail with EFBIG, which every
    // writer reports (outputs go through a temporary file: none is left half written), instead
    // of SIGXFSZ ending the process with its temporary files behind.
    std::signal(SIGXFSZ, SIG_IGN);
    CLI::App app{"moestream: run Mixture-of-Experts GGUF models whose experts do not fit in RAM,\n"
                 "reading from flash only the experts each token is routed to.",
                 "moestream"};  // usage lines name the program: "moestream synth [OPTIONS]"
    app.require_subcommand(1);
    app.option_defaults()->always_capture_default();
    // A repeated option: the last one wins (as in llama.cpp).
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    auto version = [] {
        std::string be;
        moestream::Status st = moestream::cpu_backend_file(&be);
        return std::string("moestream ") + MOESTREAM_VERSION + " (llama.cpp " + llama_version() +
               ")\nggml CPU backend: " + (st.ok() ? (be.empty() ? "unknown" : be) : st.message());
    };
    app.set_version_flag("--version", version);
    Action action;
    add_run_command(app, &action);
#if MOESTREAM_SERVE_AND_CHAT
    add_chat_command(app, &action);
#endif
    add_inspect_command(app, &action);
    add_synth_command(app, &action);
    add_replay_command(app, &action);
    add_eval_command(app, &action);
#if MOESTREAM_SERVE_AND_CHAT
    add_serve_command(app, &action);
#endif
    add_fallback_command(app, &action);
    // `moestream run --version` as well (llama.cpp's tools take --version after their name).
    for (CLI::App * sub : app.get_subcommands({})) sub->set_version_flag("--version", version);
    std::vector<std::string> args(argv + 1, argv + argc);
#if !MOESTREAM_SERVE_AND_CHAT
    // A CLI configured with -DMOESTREAM_SERVE_AND_CHAT=OFF (the sanitizer and cross builds).
    if (!args.empty() && (args[0] == "serve" || args[0] == "chat")) {
        std::fprintf(stderr,
                     "moestream %s: not in this build (configured with "
                     "-DMOESTREAM_SERVE_AND_CHAT=OFF); use a default build\n",
                     args[0].c_str());
        return 64;
    }
#endif
    if (int rc = preprocess_args(app, &args); rc != 0) return rc;
    const std::string cmd = !args.empty() && !args[0].empty() && args[0][0] != '-' ? args[0] : "";
    try {
        std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
        app.parse(rev);
    } catch (const CLI::CallForHelp & e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp & e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion & e) {
        return app.exit(e);
    } catch (const CLI::ParseError & e) {
        if (cmd.empty() && args.empty())
            return usage_error("", "give a subcommand (run, chat, inspect, synth, replay, eval, serve, make-fallback)");
        return usage_error(cmd, e.what());
    }
    if (!action) return 64;
    return action();
}
