// `moestream serve` — the app: an OpenAI-compatible HTTP server with a web page (docs/server.md).
// Parses flags into a ServeConfig and hands over to tools/server. App defaults differ from
// `run`: drop-cold 0.75 (LOSSY) unless --lossless or --drop-cold-experts is given; every
// response says which settings produced it and whether they were lossy.
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
    server::ServeConfig cfg;
    ChatTemplateFlags tmpl;  // --chat-template, --chat-template-file
    bool lossless = false;
    int verbose = 0;
    std::string api_key_file;
    bool no_webui = false;
    std::vector<std::string> stop;  // -r: refused (a request's `stop`)
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
    sub->add_option("--host", f->cfg.host,
                    "address to listen on (default 127.0.0.1: this machine only)");
    sub->add_option("--port", f->cfg.port, "TCP port; 0 = any free port (printed)")
        ->check(int_range(0, 65535));
    sub->add_option(
        "--api-key", f->cfg.api_key,
        "require 'Authorization: Bearer KEY' on /v1/* and /stats (or set MOESTREAM_API_KEY)");
    sub->add_option("-n,--n-predict", f->cfg.defaults.max_tokens,
                    "default max_tokens of a request; -1 (default) = until the end of "
                    "generation or the context is full")
        ->check(int_range(-1, 1 << 22));
    sub->add_option("--cors", f->cfg.cors_origin,
                    "allow this web origin (e.g. http://localhost:3000) to call the API from a "
                    "browser (CORS)");
    sub->add_option("--queue", f->cfg.queue_max, "requests that may wait behind the running one")
        ->check(int_range(0, 1024));
    sub->add_option("--max-body", f->cfg.body_limit_bytes,
                    "largest request body in bytes (413 above)")
        ->check(int_range(1024, 1ll << 30));
    sub->add_option("--slot-save-path", f->cfg.slot_save_path,
                    "directory of POST /slots/0?action=save|restore files (llama-server's slot "
                    "save/restore: the KV the context holds; docs/server.md)")
        ->type_name("DIR")
        ->check(CLI::ExistingDirectory);
    add_chat_template_flags(sub, &f->tmpl);
    sub->add_option("--api-key-file", f->api_key_file,
                    "read the API key from the first line of this file (not shown by `ps`)");
    sub->add_option("--alias", f->cfg.alias,
                    "the model's name in the API (/v1/models, `model` of replies; default: the "
                    "file's name)");
    sub->add_flag("--no-webui", f->no_webui, "serve the API only: no web page (GET / is a 404)");
    add_sampling_flags(sub, &f->cfg.defaults.sampling, &f->stop);
    sub->add_flag("--lossless", f->lossless,
                  find_flag_setting("--lossless")->doc + std::string(" (") + app_lossy + ")");
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
            if (!f->api_key_file.empty() && sub->get_option("--api-key")->count() > 0)
                return usage_error("serve", "--api-key and --api-key-file contradict");
            server::ServeConfig cfg = f->cfg;
            if (Status st = resolve_chat_template(f->tmpl, &cfg.chat_template,
                                                  &cfg.chat_template_from);
                !st.ok()) {
                std::fprintf(stderr, "moestream serve: error: %s\n", st.message().c_str());
                return st.exit_code();
            }
            cfg.webui = !f->no_webui;
            if (!f->api_key_file.empty()) {
                std::string why;
                cfg.api_key = read_key_file(f->api_key_file, &why);
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
            if (cfg.drop_cold_explicit && f->lossless) {
                return usage_error("serve", "--lossless and --drop-cold-experts contradict");
            }
            if (cfg.run.substitute > 0 && f->lossless)
                return usage_error("serve", "--lossless and --substitute-experts contradict");
            cfg.defaults.drop_cold = cfg.drop_cold_explicit ? cfg.run.drop_cold
                                     : f->lossless          ? 0.0
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
