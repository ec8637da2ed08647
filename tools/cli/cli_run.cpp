// `moestream run` — generate text, streaming the routed experts from the model file.
// Text goes to stdout as produced; the summary goes to stderr; --stats-json / --stats-csv
// write the same figures to files (docs/metrics.md defines every field).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "moestream/log.h"
#include "moestream/moestream.h"
#include "moestream/text_file.h"

namespace moestream::cli {
namespace {

struct RunFlags {
    RunOptions opt;
    std::string prompt = "Once upon a time";
    std::string prompt_file;
    int n_predict = 64;
    std::string stats_json;
    std::string stats_csv;
    std::string dump_logits;
    int verbose = 0;
};

double mib(double b) { return b / (1024.0 * 1024.0); }

nlohmann::json stats_to_json(const RunStats & s, const GenerateResult & g, const Engine & e) {
    nlohmann::json j;
    j["tokens"] = g.tokens;
    j["text"] = g.text;
    j["n_prompt"] = s.n_prompt;
    j["n_generated"] = s.n_generated;
    j["load_s"] = s.load_s;
    j["dense_read_s"] = s.dense_read_s;
    j["ttft_s"] = s.ttft_s;
    j["prefill_s"] = s.prefill_s;
    j["prefill_tok_s"] = s.prefill_tok_s;
    j["decode_s"] = s.decode_s;
    j["decode_tok_s"] = s.decode_tok_s;
    j["peak_rss_bytes"] = s.peak_rss_bytes;
    j["majflt_per_token"] = s.majflt_per_token;
    j["flash_bytes_read"] = s.flash_bytes_read;
    j["flash_reads"] = s.flash_reads;
    j["io_s"] = s.io_s;
    j["bytes_per_token"] = s.bytes_per_token;
    j["token_demand_bytes"] = s.token_demand_bytes;
    j["layer_demand_bytes"] = s.layer_demand_bytes;
    j["expert_buffer_bytes"] = s.expert_buffer_bytes;
    j["logits_sha"] = s.logits_sha;
    j["cache_budget_bytes"] = s.cache_budget_bytes;
    j["cache_budget_reason"] = s.cache_budget_reason;
    j["cache_hit_pct"] = s.cache_hit_pct;
    j["cache_lookups"] = s.cache_lookups;
    j["cache_hits"] = s.cache_hits;
    j["cache_misses"] = s.cache_misses;
    j["evictions"] = s.evictions;
    j["rereads"] = s.rereads;
    j["cache_commit_failures"] = s.cache_commit_failures;
    j["cache_budget_now_bytes"] = s.cache_budget_now_bytes;
    j["resident_expert_bytes"] = s.resident_expert_bytes;
    j["peak_resident_expert_bytes"] = s.peak_resident_expert_bytes;
    j["cache_recycle_pages"] = s.cache_recycle_pages;
    j["cache_recycled_commits"] = s.cache_recycled_commits;
    j["cache_moved_commits"] = s.cache_moved_commits;
    j["cache_pool_bytes"] = s.cache_pool_bytes;
    j["dense_bytes"] = s.dense_bytes;
    j["prefetch"] = s.prefetch;
    j["prefetch_predictions"] = s.prefetch_predictions;
    j["prefetch_accuracy_pct"] = s.prefetch_accuracy_pct;
    j["prefetch_experts"] = s.prefetch_experts;
    j["prefetch_used"] = s.prefetch_used;
    j["prefetch_unused"] = s.prefetch_unused;
    j["prefetch_bytes"] = s.prefetch_bytes;
    j["prefetch_wait_s"] = s.prefetch_wait_s;
    j["experts_routed"] = s.experts_routed;
    j["experts_dropped"] = s.experts_dropped;
    j["weight_mass_dropped"] = s.weight_mass_dropped;
    j["drop_bytes_avoided"] = s.drop_bytes_avoided;
    j["drop_deferred"] = s.drop_deferred;
    j["drop_fallbacks"] = s.drop_fallbacks;
    j["drop_terminal"] = s.drop_terminal;
    j["settings"] = nlohmann::json::parse(e.settings_json());
    return j;
}

Status write_file(const std::string & path, const std::string & data) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) return Status::BadInput(path + ": cannot open for writing");
    f.write(data.data(), std::streamsize(data.size()));
    f.close();
    if (!f) return Status::BadInput(path + ": write failed");
    return Status::Ok();
}

int fail(const Status & st) {
    MS_LOG_ERROR("%s", st.message().c_str());
    return st.exit_code();
}

int do_run(RunFlags & f) {
    apply_verbosity(f.verbose);
    if (!f.prompt_file.empty()) {
        Status rs = read_text_file(f.prompt_file, "prompt", &f.prompt);
        if (!rs.ok()) return fail(rs);
    }
    std::unique_ptr<Engine> engine;
    Status st = Engine::open(f.opt, &engine);
    if (!st.ok()) return fail(st);

    GenerateResult g;
    st = engine->generate(f.prompt, f.n_predict,
                          [](const std::string & piece) {
                              std::fwrite(piece.data(), 1, piece.size(), stdout);
                              std::fflush(stdout);
                              return true;
                          },
                          &g);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!st.ok()) return fail(st);
    const RunStats & s = engine->stats();

    std::fprintf(stderr,
                 "\nmoestream: %s | load %.2f s | first token %.2f s | prefill %d tok %.2f tok/s | "
                 "decode %d tok %.2f tok/s\n",
                 f.opt.stream ? "streaming" : "resident (--no-stream)", s.load_s, s.ttft_s,
                 s.n_prompt, s.prefill_tok_s, s.n_generated, s.decode_tok_s);
    if (f.opt.stream)
        std::fprintf(stderr,
                     "moestream: flash read %.1f MiB in %llu reads (io %.2f s) | %.2f MiB/token | "
                     "token demand %.2f MiB | widest layer %.2f MiB\n",
                     mib(double(s.flash_bytes_read)), (unsigned long long)s.flash_reads, s.io_s,
                     mib(s.bytes_per_token), mib(double(s.token_demand_bytes)),
                     mib(double(s.layer_demand_bytes)));
    if (f.opt.stream) {
        if (s.cache_budget_bytes > 0)
            std::fprintf(stderr,
                         "moestream: cache %lld MiB (%s) | hit %.1f%% of %llu lookups | %llu evictions | "
                         "%llu rereads | resident %.1f MiB (peak %.1f)\n",
                         (long long)(s.cache_budget_bytes >> 20), s.cache_budget_reason.c_str(),
                         s.cache_hit_pct, (unsigned long long)s.cache_lookups,
                         (unsigned long long)s.evictions, (unsigned long long)s.rereads,
                         mib(double(s.resident_expert_bytes)), mib(double(s.peak_resident_expert_bytes)));
        else
            std::fprintf(stderr, "moestream: %s\n", s.cache_budget_reason.c_str());
        if (s.prefetch)
            std::fprintf(stderr,
                         "moestream: prefetch: %.1f%% of %llu next-layer guesses right | %llu experts "
                         "read ahead (%.1f MiB), %llu then routed, %llu evicted unrouted | %.2f s "
                         "waiting for them\n",
                         s.prefetch_accuracy_pct, (unsigned long long)s.prefetch_predictions,
                         (unsigned long long)s.prefetch_experts, mib(double(s.prefetch_bytes)),
                         (unsigned long long)s.prefetch_used, (unsigned long long)s.prefetch_unused,
                         s.prefetch_wait_s);
        if (s.cache_commit_failures > 0)
            std::fprintf(stderr,
                         "moestream: the system refused %llu cache commits: budget shrunk to %.1f MiB\n",
                         (unsigned long long)s.cache_commit_failures,
                         mib(double(s.cache_budget_now_bytes)));
    }
    if (f.opt.stream) {
        // The paths taken where a kernel or an emulator may lack a feature (docs/arm64.md).
        const nlohmann::json set = nlohmann::json::parse(engine->settings_json());
        const std::string pio = set.value("prefetch_io", "off");
        const std::string why = set.value("prefetch_io_fallback", "");
        std::fprintf(stderr, "moestream: paths: %s reads | page %llu KiB | page moves %s | prefetch %s%s%s\n",
                     set.value("odirect", false) ? "O_DIRECT" : "buffered",
                     (unsigned long long)(set.value("page_bytes", uint64_t(0)) >> 10),
                     set.value("cache_move_used", false) ? "on" : "off", pio.c_str(),
                     why.empty() ? "" : " (io_uring unavailable: ", why.empty() ? "" : (why + ")").c_str());
    }
    std::fprintf(stderr, "moestream: peak RSS %.1f MiB | major faults/token %.2f | %s\n",
                 mib(double(s.peak_rss_bytes)), s.majflt_per_token,
                 engine->lossy() ? "LOSSY output (opt-in knobs changed it; see settings)"
                                 : "lossless");
    if (f.opt.drop_cold > 0)
        std::fprintf(stderr,
                     "moestream: --drop-cold-experts %.2f (LOSSY): dropped %llu of %llu routed experts, "
                     "%.2f%% of router weight mass, %.1f MiB of reads avoided (weights chain ends at %s)\n",
                     f.opt.drop_cold, (unsigned long long)s.experts_dropped,
                     (unsigned long long)s.experts_routed, 100.0 * s.weight_mass_dropped,
                     mib(double(s.drop_bytes_avoided)), s.drop_terminal.empty() ? "?" : s.drop_terminal.c_str());
    if (f.opt.n_expert_used > 0 && engine->lossy())
        std::fprintf(stderr, "moestream: --n-expert-used %d: fewer experts per token than the model's "
                             "top-k: output differs from the model's\n", f.opt.n_expert_used);

    if (!f.stats_json.empty()) {
        st = write_file(f.stats_json, stats_to_json(s, g, *engine).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
        if (!st.ok()) return fail(st);
    }
    if (!f.stats_csv.empty()) {
        std::ostringstream o;
        o << "step,token,decode_s,io_s,flash_bytes_read,flash_reads,token_demand_bytes,"
             "layer_demand_bytes,cache_hits,cache_misses,prefetch_bytes,stage_s\n";
        for (size_t i = 0; i < s.tokens.size(); ++i) {
            const TokenStats & t = s.tokens[i];
            o << i << ',' << t.token << ',' << t.decode_s << ',' << t.io_s << ','
              << t.flash_bytes_read << ',' << t.flash_reads << ',' << t.token_demand_bytes << ','
              << t.layer_demand_bytes << ',' << t.cache_hits << ',' << t.cache_misses << ','
              << t.prefetch_bytes << ',' << t.stage_s << '\n';
        }
        st = write_file(f.stats_csv, o.str());
        if (!st.ok()) return fail(st);
    }
    if (!f.dump_logits.empty()) {
        st = write_file(f.dump_logits,
                        std::string(reinterpret_cast<const char *>(g.final_logits.data()),
                                    g.final_logits.size() * sizeof(float)));
        if (!st.ok()) return fail(st);
    }
    return 0;
}

}  // namespace

void add_engine_flags(CLI::App * sub, RunOptions * opt) {
    sub->add_option("-t,--threads", opt->n_threads, "compute threads")->check(CLI::Range(1, 512));
    sub->add_option("-c,--ctx-size", opt->n_ctx, "context length")->check(CLI::Range(16, 1 << 22));
    sub->add_option("-b,--batch", opt->n_batch, "prompt tokens per decode")
        ->check(CLI::Range(1, 1 << 16));
    sub->add_option("--temp", opt->temp, "sampling temperature; 0 = greedy")
        ->check(CLI::Range(0.0, 100.0));
    sub->add_option("--seed", opt->seed, "sampling seed");
    sub->add_flag("--no-stream", [opt](int64_t) { opt->stream = false; },
                  "llama.cpp's own loading, everything resident (the reference)");
    sub->add_flag(
        "--no-mmap", [opt](int64_t) { opt->resident_mmap = false; },
        "with --no-stream: read every tensor into memory at load instead of mapping "
        "the file (no first-touch cost in the first decodes)");
    sub->add_option("--io-threads", opt->io_threads,
                    "parallel read lanes (calling thread included; default 4)")
        ->check(CLI::Range(1, 64));
    sub->add_flag("--no-odirect", [opt](int64_t) { opt->odirect = false; },
                  "buffered reads instead of O_DIRECT");
    sub->add_flag("--no-io-overlap", [opt](int64_t) { opt->io_overlap = false; },
                  "wait for every read of a layer before its first expert matmul (default: "
                  "the down-projection reads overlap the gate/up matmuls)");
    sub->add_flag("--io-copy", [opt](int64_t) { opt->io_in_place = false; },
                  "read through a bounce buffer and copy (default: O_DIRECT straight into "
                  "the expert's place); for A/B benchmarks");
    sub->add_option_function<std::string>(
           "--cache-mb",
           [opt](const std::string & v) {
               if (v == "auto") {
                   opt->cache_mb = -1;
                   return;
               }
               size_t pos = 0;
               long long n = -1;
               try {
                   n = std::stoll(v, &pos);
               } catch (...) {
               }
               if (pos != v.size() || n < 0 || n > (1ll << 40))
                   throw CLI::ValidationError("--cache-mb", "expected 'auto' or a number of MiB >= 0, got '" + v + "'");
               opt->cache_mb = n;
           },
           "expert cache budget in MiB: auto (default), 0 = off, N")
        ->type_name("auto|N");
    sub->add_flag("--force-cache", opt->force_cache, "allow a --cache-mb in the 1..1499 MiB band");
    sub->add_flag("--cache-no-recycle", [opt](int64_t) { opt->cache_recycle = false; },
                  "commit fresh zero-filled pages for every cache miss and free them on "
                  "eviction (default: reuse the evicted expert's pages); for A/B benchmarks");
    sub->add_flag(
        "--cache-no-move", [opt](int64_t) { opt->cache_move = false; },
        "unmap an evicted expert's recycled pages and map them afresh for the next "
        "miss (default: move the mapping with mremap); for A/B benchmarks");
    sub->add_flag("--prefetch", opt->prefetch,
                  "read the experts predicted for the next layer while this layer computes "
                  "(lossless; needs the cache and 2+ io threads; reads more bytes; docs/prefetch.md)");
    sub->add_flag("--cache-debug", opt->cache_debug,
                  "poison released/fresh cache pages and check every routed slice is resident");
    sub->add_option("--n-expert-used", opt->n_expert_used,
                    "LOSSY: experts per token, 1..the model's top-k (default: the model's)")
        ->check(CLI::Range(1, 1 << 16));
    sub->add_option("--drop-cold-experts", opt->drop_cold,
                    "LOSSY: skip a routed expert that is a cache miss with final weight < F/k (0<F<=1)")
        ->check(CLI::Range(1e-12, 1.0));
    sub->add_flag("--drop-in-prefill", opt->drop_in_prefill, "also drop during prefill (LOSSY)");
    sub->add_flag("--drop-renorm", opt->drop_renorm,
                  "renormalize the remaining weights after a drop (LOSSY)");
}

void add_run_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<RunFlags>();
    auto * sub = app.add_subcommand("run", "generate text, streaming the routed experts from flash");
    sub->add_option("-m,--model", f->opt.model_path, "GGUF model file")->required();
    auto * p = sub->add_option("-p,--prompt", f->prompt, "prompt text");
    sub->add_option("-f,--file", f->prompt_file, "read the prompt from a file")->excludes(p);
    sub->add_option("-n,--n-predict", f->n_predict, "tokens to generate")
        ->check(CLI::Range(0, 1 << 24));
    add_engine_flags(sub, &f->opt);
    sub->add_option("--route-trace", f->opt.route_trace,
                    "record every routing to FILE (docs/route-trace.md; `moestream replay` reads it)");
    sub->add_option("--stats-json", f->stats_json, "write the run's figures as one JSON object");
    sub->add_option("--stats-csv", f->stats_csv, "write one row per decoded token");
    sub->add_option("--dump-logits", f->dump_logits, "write the last step's logits (raw float32)");
    sub->add_flag("-v,--verbose", f->verbose, "more log (-vv: debug, llama.cpp's log too)");
    sub->callback([f, action] { *action = [f] { return do_run(*f); }; });
}

}  // namespace moestream::cli
