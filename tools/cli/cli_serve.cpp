// `moestream serve` — the app: an OpenAI-compatible HTTP server with a web page (docs/server.md).
// Binds its flags (the registry's serve rows into ServeOptions, settings.h; the engine's into
// RunOptions), copies them into a ServeConfig and hands over to tools/server. App defaults
// differ from `run`: drop-cold 0.75 (LOSSY) unless --lossless or --drop-cold-experts is given;
// every response says which settings produced it and whether they were lossy.
// Env knobs (read here): MOESTREAM_API_KEY (the key, instead of --api-key, which `ps` shows),
// MOESTREAM_DEBUG_TOKEN_DELAY_MS (tests only: sleep before each token is handed out),
// MOESTREAM_DEBUG_PREFILL_HOLD=FILE (tests only: a prompt stays in prefill while FILE exists).
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "cli.h"
#include "moestream/settings.h"
#include "server.h"

namespace moestream::cli {
namespace {

constexpr double kAppDropCold = 0.75;  // the app's performance default (docs/server.md)

struct ServeFlags {
    server::ServeConfig cfg;  // run options and request defaults; the rest from `serve`
    ServeOptions serve;       // serve's own flags (registry rows, settings.h)
    ChatTemplateOptions tmpl;  // --chat-template, --chat-template-file
    int verbose = 0;
    GenerateRequest gen;  // the sampling flags (request defaults); -r and --ignore-eos refused
};

// The first line of FILE without surrounding blanks; "" and *why on failure.
std::string read_key_file(const std::string & path, std::string * why) {
    std::ifstream f(path);
    if (!f) {
        *why = "--api-key-file " + path + ": cannot be read (" + std::strerror(errno) + ")";
        return "";
    }
    std::string line;
    std::getline(f, line);
    const size_t a = line.find_first_not_of(" \t\r"), b = line.find_last_not_of(" \t\r");
    if (a == std::string::npos) {
        *why = "--api-key-file " + path + ": the first line holds no key";
        return "";
    }
    return line.substr(a, b - a + 1);
}

}  // namespace

void add_serve_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<ServeFlags>();
    RunOptions app_defaults;  // the app's lossy defaults, named by the registry's flags
    app_defaults.drop_cold = kAppDropCold;
    const std::string app_lossy = lossy_knobs_text(app_defaults, 0);
    auto * sub = app.add_subcommand(
        "serve", "OpenAI-compatible server and web page (app defaults, LOSSY: " + app_lossy + ")");
    add_serve_flags(sub, &f->serve);
    sub->get_option("--lossless")
        ->description(find_flag_setting("--lossless")->doc + std::string(" (") + app_lossy + ")");
    add_chat_template_flags(sub, &f->tmpl);
    add_sampling_flags(sub, &f->gen);
    add_engine_flags(sub, &f->cfg.run);
    auto * dc = sub->get_option("--drop-cold-experts");
    dc->default_str(fmt_num(kAppDropCold) + " (the app default; --lossless: off)");
    sub->add_flag("-v,--verbose", f->verbose, "more log (-v: one line per request; -vv: debug)");
    sub->callback([f, action, sub, dc] {
        *action = [f, sub, dc] {
            apply_verbosity(f->verbose);
            if (int rc = check_engine_flags(sub, f->cfg.run)) return rc;
            if (int rc = refuse_given(sub, {"--miss-fallback"},
                                      "is not available in serve (use run, chat or eval)"))
                return rc;
            if (int rc = refuse_given(sub, {"-r", "--ignore-eos"},
                                      "is not a serve flag: a request sets it (`stop`, `ignore_eos`)"))
                return rc;
            const ServeOptions & so = f->serve;
            server::ServeConfig cfg = f->cfg;
            cfg.defaults.sampling = f->gen.sampling;
            cfg.host = so.host;
            cfg.port = so.port;
            cfg.api_key = so.api_key;
            cfg.defaults.max_tokens = so.n_predict;
            cfg.cors_origin = so.cors;
            cfg.queue_max = so.queue;
            cfg.body_limit_bytes = size_t(so.max_body);
            cfg.slot_save_path = so.slot_save_path;
            cfg.alias = so.alias;
            if (Status st = resolve_chat_template(f->tmpl, &cfg.chat_template,
                                                  &cfg.chat_template_from);
                !st.ok()) {
                std::fprintf(stderr, "moestream serve: error: %s\n", st.message().c_str());
                return st.exit_code();
            }
            cfg.webui = !so.no_webui;
            if (!so.api_key_file.empty()) {
                std::string why;
                cfg.api_key = read_key_file(so.api_key_file, &why);
                if (cfg.api_key.empty()) return usage_error("serve", why);
            }
            if (cfg.api_key.empty()) {
                const char * k = std::getenv("MOESTREAM_API_KEY");
                if (k && *k) cfg.api_key = k;
            }
            if (const char * d = std::getenv("MOESTREAM_DEBUG_TOKEN_DELAY_MS"); d && *d)
                cfg.token_delay_ms = std::max(0, std::atoi(d));
            if (const char * h = std::getenv("MOESTREAM_DEBUG_PREFILL_HOLD"); h && *h)
                cfg.prefill_hold = h;
            cfg.drop_cold_explicit = dc->count() > 0;
            // Without -c the server uses the model's context (capped by memory), as
            // llama-server does; `run` keeps its fixed default.
            if (sub->get_option("-c")->count() == 0) cfg.run.n_ctx = 0;
            if (cfg.run.substitute > 0 && so.lossless)
                return usage_error("serve", "--lossless and --substitute-experts contradict");
            cfg.defaults.drop_cold = cfg.drop_cold_explicit ? cfg.run.drop_cold
                                     : so.lossless          ? 0.0
                                                            : kAppDropCold;
            cfg.defaults.temperature = cfg.run.temp;
            cfg.defaults.seed = cfg.run.seed;
            cfg.option_words = flag_words;
            prestart_template_check(cfg.run.model_path, cfg.chat_template);
            return server::run_server(cfg);
        };
    });
}

}  // namespace moestream::cli
