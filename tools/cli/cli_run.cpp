// `moestream run` — generate text, streaming the routed experts from the model file.
// Text goes to stdout as produced; the summary goes to stderr; --stats-json / --stats-csv
// write the same figures to files (docs/metrics.md defines every field).
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli.h"
#include "moestream/settings.h"
#include "moestream/log.h"
#include "moestream/moestream.h"
#include "moestream/text_file.h"
#include "time_json.h"

namespace moestream::cli {
namespace {

struct RunFlags {
    RunOptions opt;
    RunCmdOptions run;    // run's own flags (registry rows, settings.h)
    GenerateRequest gen;  // the sampling flags and -r; temp and seed come from opt
    std::string color = "auto";  // --color: on | off | auto
    CLI::App * sub = nullptr;
    int verbose = 0;
};

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
    j["prompt_cache_tokens"] = s.prompt_cache_tokens;
    j["prompt_cache_read_bytes"] = s.prompt_cache_read_bytes;
    j["prompt_cache_restore_s"] = s.prompt_cache_restore_s;
    j["prompt_cache_refused"] = s.prompt_cache_refused;
    j["prompt_cache_written_bytes"] = s.prompt_cache_written_bytes;
    j["warm_experts_file"] = s.warm_experts_file;
    j["warm_experts_listed"] = s.warm_experts_listed;
    j["warm_experts_preloaded"] = s.warm_experts_preloaded;
    j["warm_experts_before_decode"] = s.warm_experts_before_decode;
    j["warm_experts_not_read"] = s.warm_experts_not_read;
    j["warm_experts_refused"] = s.warm_experts_refused;
    j["decode_s"] = s.decode_s;
    j["decode_tok_s"] = s.decode_tok_s;
    j["peak_rss_bytes"] = s.peak_rss_bytes;
    j["anon_huge_bytes"] = s.anon_huge_bytes;
    j["majflt_per_token"] = s.majflt_per_token;
    j["flash_bytes_read"] = s.flash_bytes_read;
    j["flash_reads"] = s.flash_reads;
    j["io_s"] = s.io_s;
    j["reads_timed"] = s.reads_timed;
    j["read_p50_s"] = s.read_p50_s;
    j["read_p99_s"] = s.read_p99_s;
    j["read_max_s"] = s.read_max_s;
    j["time_breakdown"] = {{"decode", tools::time_breakdown_json(s.decode_time, false)},
                           {"decode_per_token", tools::time_breakdown_json(s.decode_time, true)},
                           {"prefill", tools::time_breakdown_json(s.prefill_time, false)}};
    j["bytes_per_token"] = s.bytes_per_token;
    j["token_demand_bytes"] = s.token_demand_bytes;
    j["layer_demand_bytes"] = s.layer_demand_bytes;
    j["expert_buffer_bytes"] = s.expert_buffer_bytes;
    j["logits_sha"] = s.logits_sha;
    j["cache_budget_bytes"] = s.cache_budget_bytes;
    j["cache_budget_reason"] = s.cache_budget_reason;
    j["cache_hit_pct"] = s.cache_hit_pct;
    j["first16_hit_pct"] = s.first16_hit_pct;
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
    j["cache_deferred_commits"] = s.cache_deferred_commits;
    j["cache_pool_bytes"] = s.cache_pool_bytes;
    j["cache_pool_warm_bytes"] = s.cache_pool_warm_bytes;
    j["cache_pool_warm_s"] = s.cache_pool_warm_s;
    j["cache_pool_warm_error"] = s.cache_pool_warm_error;
    j["cache_warmed_commits"] = s.cache_warmed_commits;
    j["dense_bytes"] = s.dense_bytes;
    j["prefetch"] = s.prefetch;
    j["prefetch_predictions"] = s.prefetch_predictions;
    j["prefetch_accuracy_pct"] = s.prefetch_accuracy_pct;
    j["prefetch_experts"] = s.prefetch_experts;
    j["prefetch_used"] = s.prefetch_used;
    j["prefetch_unused"] = s.prefetch_unused;
    j["prefetch_bytes"] = s.prefetch_bytes;
    j["prefetch_wait_s"] = s.prefetch_wait_s;
    j["guess_s"] = s.guess_s;
    j["prefill_guess_layers"] = s.prefill_guess_layers;
    j["prefill_guess_rows"] = s.prefill_guess_rows;
    j["prefill_guess_experts"] = s.prefill_guess_experts;
    j["experts_routed"] = s.experts_routed;
    j["experts_dropped"] = s.experts_dropped;
    j["weight_mass_dropped"] = s.weight_mass_dropped;
    j["drop_bytes_avoided"] = s.drop_bytes_avoided;
    j["drop_deferred"] = s.drop_deferred;
    j["drop_fallbacks"] = s.drop_fallbacks;
    j["drop_terminal"] = s.drop_terminal;
    j["experts_substituted"] = s.experts_substituted;
    j["subst_bytes_avoided"] = s.subst_bytes_avoided;
    j["experts_fallback"] = s.experts_fallback;
    j["fallback_bytes_read"] = s.fallback_bytes_read;
    j["fallback_bytes_saved"] = s.fallback_bytes_saved;
    j["fallback_convert_s"] = s.fallback_convert_s;
    j["settings"] = nlohmann::json::parse(e.settings_json());
    return j;
}

// Ctrl-C: the first SIGINT asks generation to stop at the next token (on_piece returns false),
// so the summary of what ran is printed and the outputs written, then exit 130; the handler
// then reverts to the default, so a second Ctrl-C ends the process at once.
volatile std::sig_atomic_t g_interrupted = 0;

void on_sigint(int) {
    g_interrupted = 1;
    std::signal(SIGINT, SIG_DFL);
}

int fail(const Status & st) {
    MS_LOG_ERROR("%s", flag_words(st.message()).c_str());
    return st.exit_code();
}

int do_run(RunFlags & f) {
    apply_verbosity(f.verbose);
    if (int rc = check_engine_flags(f.sub, f.opt)) return rc;
    if (!f.run.prompt_file.empty())
        if (int rc = refuse_given(f.sub, {"--no-escape", "--escape"},
                                  "applies to -p, and the prompt comes from -f (read as is)"))
            return rc;
    if (int rc = check_sampling_flags(f.sub, f.opt)) return rc;
    auto inputs = model_inputs("-m", f.opt.model_path);
    inputs.push_back({"-f", f.run.prompt_file});
    inputs.push_back({"--miss-fallback", f.opt.miss_fallback});
    Status st = check_output_paths({{"--stats-json", f.run.stats_json},
                                    {"--stats-csv", f.run.stats_csv},
                                    {"--dump-logits", f.run.dump_logits},
                                    {"--route-trace", f.opt.route_trace}},
                                   inputs);
    if (!st.ok()) return fail(st);
    if (!f.run.prompt_file.empty()) {
        Status rs = read_text_file(f.run.prompt_file, "prompt", &f.run.prompt);
        if (!rs.ok()) return fail(rs);
    } else if (f.sub->get_option("--prompt")->count() == 0) {
        std::fprintf(stderr, "moestream: no -p or -f given: the prompt is \"%s\"\n",
                     RunCmdOptions{}.prompt.c_str());
    } else if (f.run.escape) {
        st = process_escapes("-p", &f.run.prompt);
        if (!st.ok()) return fail(st);
    }
    st = process_reverse_prompts(f.run.escape, &f.gen.stop);
    if (!st.ok()) return fail(st);
    std::unique_ptr<Engine> engine;
    show_load_progress(&f.opt);
    st = Engine::open(f.opt, &engine);
    if (!st.ok()) return fail(st);

    if (f.run.display_prompt) {
        // With --color on a terminal the prompt is coloured apart from the generated text.
        const bool colour = colour_stdout(f.color);
        if (colour) std::fputs(kColourPrompt, stdout);
        std::fwrite(f.run.prompt.data(), 1, f.run.prompt.size(), stdout);
        if (colour) std::fputs(kColourReset, stdout);
        std::fflush(stdout);
    }
    GenerateRequest req = f.gen;  // the sampling flags and -r
    req.prompt = f.run.prompt;
    req.n_predict = f.run.n_predict;
    req.sampling.temp = f.opt.temp;
    req.sampling.seed = f.opt.seed;
    // On a terminal (and without --log-disable) a live prefill line: tokens done of the
    // prompt, rate, time left. Ctrl-C is looked at after each micro-batch.
    ProgressLine prefill_line("prefill", "tokens");
    int prompt_done = 0, prompt_total = 0;
    req.on_prefill = [&](int done, int total) {
        prompt_done = done;
        prompt_total = total;
        prefill_line.update(done, total);
        return g_interrupted == 0;
    };
    GenerateResult g;
    g_interrupted = 0;
    std::signal(SIGINT, on_sigint);
    st = engine->generate(req,
                          [](const std::string & piece) {
                              std::fwrite(piece.data(), 1, piece.size(), stdout);
                              std::fflush(stdout);
                              return g_interrupted == 0;
                          },
                          &g);
    const bool interrupted = g_interrupted != 0;
    prefill_line.clear();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!st.ok()) return fail(st);
    const RunStats & s = engine->stats();

    if (interrupted && prompt_done < prompt_total)
        std::fprintf(stderr, "\nmoestream: interrupted (Ctrl-C) during prefill, after %d of %d prompt tokens\n",
                     prompt_done, prompt_total);
    else if (interrupted)
        std::fprintf(stderr, "\nmoestream: interrupted (Ctrl-C) after %d generated tokens\n",
                     s.n_generated);
    std::fprintf(stderr,
                 "\nmoestream: %s | load %.2f s | first token %.2f s | prefill %d tok %.2f tok/s | "
                 "decode %d tok %.2f tok/s\n",
                 f.opt.stream ? "streaming" : "resident (--no-stream)", s.load_s, s.ttft_s,
                 s.n_prompt, s.prefill_tok_s, s.n_generated, s.decode_tok_s);
    if (!f.opt.prompt_cache.empty())
        std::fprintf(stderr,
                     "moestream: prompt cache: %d of %d prompt tokens restored (%.1f MiB read in "
                     "%.2f s) | %.1f MiB written\n",
                     s.prompt_cache_tokens, s.n_prompt, mib(double(s.prompt_cache_read_bytes)),
                     s.prompt_cache_restore_s, mib(double(s.prompt_cache_written_bytes)));
    if (!f.opt.warm_experts.empty())
        std::fprintf(stderr,
                     "moestream: warm experts: %llu of %llu listed read in the background (%llu "
                     "before decode), %llu not read | first 16 decode tokens hit %.1f%% | usage "
                     "file %s%s%s\n",
                     (unsigned long long)s.warm_experts_preloaded,
                     (unsigned long long)s.warm_experts_listed,
                     (unsigned long long)s.warm_experts_before_decode,
                     (unsigned long long)s.warm_experts_not_read, s.first16_hit_pct,
                     s.warm_experts_file.c_str(), s.warm_experts_refused.empty() ? "" : " (ignored: ",
                     s.warm_experts_refused.empty() ? "" : (s.warm_experts_refused + ")").c_str());
    if (f.opt.stream)
        std::fprintf(stderr,
                     "moestream: flash read %.1f MiB in %llu reads (io %.2f s) | %.2f MiB/token | "
                     "token demand %.2f MiB | widest layer %.2f MiB | read p50 %.2f ms, p99 %.2f ms, "
                     "max %.2f ms\n",
                     mib(double(s.flash_bytes_read)), (unsigned long long)s.flash_reads, s.io_s,
                     mib(s.bytes_per_token), mib(double(s.token_demand_bytes)),
                     mib(double(s.layer_demand_bytes)), s.read_p50_s * 1e3, s.read_p99_s * 1e3,
                     s.read_max_s * 1e3);
    if (f.opt.stream) {
        // The budget's source in a word ("auto", "--cache-mb 4"); -v logs the whole reason.
        const std::string source = s.cache_budget_reason.substr(0, s.cache_budget_reason.find(':'));
        if (s.cache_budget_bytes > 0)
            std::fprintf(stderr,
                         "moestream: cache %lld MiB (%s) | hit %.1f%% of %llu lookups | %llu evictions | "
                         "%llu rereads | resident %.1f MiB (peak %.1f)\n",
                         (long long)(s.cache_budget_bytes >> 20), source.c_str(),
                         s.cache_hit_pct, (unsigned long long)s.cache_lookups,
                         (unsigned long long)s.evictions, (unsigned long long)s.rereads,
                         mib(double(s.resident_expert_bytes)), mib(double(s.peak_resident_expert_bytes)));
        else
            std::fprintf(stderr, "moestream: %s\n", s.cache_budget_reason.c_str());
        if (s.prefetch)
            std::fprintf(stderr,
                         "moestream: prefetch: %.1f%% of %llu next-layer guesses right | %llu experts "
                         "read ahead (%.1f MiB), %llu then routed, %llu dropped unrouted | %.2f s "
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
        const uint64_t huge = set.value("huge_page_bytes", uint64_t(0));
        const std::string huge_text = !set.value("huge_pages", false) ? "off"
                                      : huge == 0 ? "none (transparent huge pages unavailable)"
                                                  : std::to_string(huge >> 20) + " MiB advised, " +
                                                        std::to_string(s.anon_huge_bytes >> 20) +
                                                        " MiB backed";
        std::fprintf(stderr, "moestream: paths: %s reads | page %llu KiB | page moves %s | huge pages %s | prefetch %s%s%s\n",
                     set.value("odirect", false) ? "O_DIRECT" : "buffered",
                     (unsigned long long)(set.value("page_bytes", uint64_t(0)) >> 10),
                     set.value("cache_move_used", false) ? "on" : "off", huge_text.c_str(), pio.c_str(),
                     why.empty() ? "" : " (io_uring unavailable: ", why.empty() ? "" : (why + ")").c_str());
        if (set.value("prefill_readahead_requested", false) || set.value("prefill_readahead", false))
            std::fprintf(stderr, "moestream: prefill read-ahead %s | %.1f MiB read ahead | %.2f s waiting for them\n",
                         set.value("prefill_readahead", false) ? "on" : "off (-v says why)",
                         mib(double(s.prefetch_bytes)), s.prefetch_wait_s);
        if (const uint64_t k = set.value("cache_slots", uint64_t(0)); k > 0)
            std::fprintf(stderr, "moestream: fixed slots: %llu per MoE layer | "
                         "%llu layer routings read from slots | warm start %s, %llu experts copied "
                         "in %.2f s\n",
                         (unsigned long long)k,
                         (unsigned long long)set.value("cache_slot_rewrites", uint64_t(0)),
                         set.value("cache_slot_warm", false) ? "on" : "off",
                         (unsigned long long)set.value("cache_slot_warm_copies", uint64_t(0)),
                         set.value("cache_slot_warm_s", 0.0));
        else if (set.value("cache_store", "") == "lru")  // the fixed slots' default, and why not
            std::fprintf(stderr, "moestream: LRU cache: %s\n",
                         flag_words(set.value("cache_store_reason", "")).c_str());
    }
    if (const std::string tl = tools::time_breakdown_line(s.decode_time); !tl.empty())
        std::fprintf(stderr, "moestream: %s\n", tl.c_str());
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
    if (f.opt.substitute > 0)
        std::fprintf(stderr,
                     "moestream: --substitute-experts %g (LOSSY): %llu routed misses computed with a "
                     "resident expert instead, %.1f MiB of reads avoided\n",
                     f.opt.substitute, (unsigned long long)s.experts_substituted,
                     mib(double(s.subst_bytes_avoided)));
    if (!f.opt.miss_fallback.empty())
        std::fprintf(stderr,
                     "moestream: --miss-fallback %s --fallback-threshold %g (LOSSY): %llu expert "
                     "computations from the low-bit copy, %.1f MiB of reads avoided, %.1f ms "
                     "converting\n",
                     f.opt.miss_fallback.c_str(), f.opt.fallback_threshold,
                     (unsigned long long)s.experts_fallback, mib(double(s.fallback_bytes_saved)),
                     s.fallback_convert_s * 1e3);
    if (f.opt.n_expert_used > 0 && engine->lossy())
        std::fprintf(stderr, "moestream: --n-expert-used %d: fewer experts per token than the model's "
                             "top-k: output differs from the model's\n", f.opt.n_expert_used);

    if (!f.run.stats_json.empty()) {
        st = write_output_file("--stats-json", f.run.stats_json, stats_to_json(s, g, *engine).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
        if (!st.ok()) return fail(st);
    }
    if (!f.run.stats_csv.empty()) {
        std::ostringstream o;
        o << "step,token,decode_s,io_s,flash_bytes_read,flash_reads,token_demand_bytes,"
             "layer_demand_bytes,cache_hits,cache_misses,prefetch_bytes,stage_s,"
             "compute_s,hook_s,sampling_s,other_s,step_s,read_max_s\n";
        for (size_t i = 0; i < s.tokens.size(); ++i) {
            const TokenStats & t = s.tokens[i];
            o << i << ',' << t.token << ',' << t.decode_s << ',' << t.io_s << ','
              << t.flash_bytes_read << ',' << t.flash_reads << ',' << t.token_demand_bytes << ','
              << t.layer_demand_bytes << ',' << t.cache_hits << ',' << t.cache_misses << ','
              << t.prefetch_bytes << ',' << t.stage_s << ',' << t.compute_s << ','
              << t.hook_s << ',' << t.sampling_s << ',' << t.other_s << ',' << t.step_s << ','
              << t.read_max_s << '\n';
        }
        st = write_output_file("--stats-csv", f.run.stats_csv, o.str());
        if (!st.ok()) return fail(st);
    }
    if (!f.run.dump_logits.empty()) {
        st = write_output_file("--dump-logits", f.run.dump_logits,
                        std::string(reinterpret_cast<const char *>(g.final_logits.data()),
                                    g.final_logits.size() * sizeof(float)));
        if (!st.ok()) return fail(st);
    }
    return interrupted ? 130 : 0;
}

}  // namespace

namespace {

// A row's long flag name ("--seed" of "-s,--seed"): how CLI11 finds the option.
std::string long_flag(const char * flags) {
    const std::string f = flags;
    return f.substr(f.rfind(',') + 1);
}

// The row's member of options O of type V (nullptr: none).
template <class V, class O>
V O::*typed_member(const Setting & s) {
    V O::*out = nullptr;
    auto take = [&out](auto m) {
        if constexpr (std::is_same_v<decltype(m), V O::*>) out = m;
    };
    if constexpr (std::is_same_v<O, RunOptions>)
        std::visit(take, s.member);
    else
        std::visit(take, s.command_member);
    return out;
}

// One registry row as a CLI11 flag: its names, help, the values its range admits (validated
// by the registry), the field set from the value; a bool's flag sets the opposite of the
// field's default (setting_flag_value: --prefetch on, --cache-no-move off); a negation pair
// (off_flags) is two bare flags setting "on" and "off"; a draw (--seed -1) is printed.
// O: RunOptions (the row's member) or a command's own options (its command_member).
template <class O>
void bind_setting(CLI::App * sub, const Setting & s, O * opt) {
    const Setting * row = &s;
    bool O::*const bm = typed_member<bool, O>(s);
    const std::string help = *s.field ? setting_help(s.field) : std::string(s.doc);
    if (*s.off_flags) {
        auto set = [opt, row, bm](bool on) {
            if (bm != nullptr)
                opt->*bm = on;
            else
                set_setting_text(*row, on ? "on" : "off", opt);
        };
        auto * on = sub->add_flag(s.flags, [set](int64_t) { set(true); }, help);
        sub->add_flag(s.off_flags, [set](int64_t) { set(false); }, s.off_doc)->excludes(on);
        return;
    }
    if (bm != nullptr) {
        const auto m = bm;
        const bool value = setting_flag_value(s);
        sub->add_flag(s.flags, [opt, m, value](int64_t) { opt->*m = value; }, help);
        return;
    }
    if (auto list = typed_member<std::vector<std::string>, O>(s)) {  // repeatable (-r)
        sub->add_option(s.flags, opt->*list, help)
            ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
            ->default_str("");
        return;
    }
    auto * o = sub->add_option_function<std::string>(
        s.flags,
        [opt, row](const std::string & v) {
            std::string note;
            if constexpr (std::is_same_v<O, RunOptions>)
                set_setting_text(*row, v, opt, &note);
            else
                set_setting_text(*row, v, opt);
            if (!note.empty())
                std::fprintf(stderr, "moestream: %s %s: %s\n", long_flag(row->flags).c_str(),
                             v.c_str(), note.c_str());
        },
        help);
    o->type_name(setting_type_name(s));
    if (!setting_holds<std::string>(s) || *s.choices)  // a number's range, or a command's text of choices
        o->check(CLI::Validator([row](std::string & v) { return check_setting_text(*row, v); },
                                setting_range_text(s)));
    if (s.traits & kExistingDir) o->check(CLI::ExistingDirectory);
    if (s.traits & kRequired) {
        o->required();
        return;  // a required option shows no default
    }
    const std::string dflt = setting_value_text(s, *opt);
    if (!dflt.empty()) o->default_str(dflt);
}

}  // namespace

namespace {
// Each row `sub` takes whose `excludes` names a flag `sub` has bound so far: the two exclude
// each other (CLI11: "--file excludes --prompt"). Called after each group of flags is bound,
// so that a pair across groups (serve's --lossless, the engine's --drop-cold-experts) is
// wired once both are.
void wire_excludes(CLI::App * sub) {
    for (const Setting & s : settings_registry()) {
        if (!*s.excludes || !*s.flags || !s.for_command(sub->get_name())) continue;
        CLI::Option * a = sub->get_option_no_throw(long_flag(s.flags));
        CLI::Option * b = sub->get_option_no_throw(s.excludes);
        if (a != nullptr && b != nullptr) a->excludes(b);
    }
}
}  // namespace

void add_engine_flags(CLI::App * sub, RunOptions * opt) {
    opt->n_threads = default_threads();
    opt->n_ctx = 0;
    // Every row with a flag this command takes (settings.h): flags, help, values, default.
    for (const Setting & s : settings_registry())
        if (*s.flags && *s.field && s.for_command(sub->get_name())) bind_setting(sub, s, opt);
    // A combination rule of the flags: the cache's size needs the cache.
    sub->get_option("--prompt-cache-mb")->needs(sub->get_option("--prompt-cache"));
    wire_excludes(sub);
}

namespace {
// Every row of options O (a command's own) that the command `sub` takes; then the pairs of
// the `excludes` column whose two flags are bound.
template <class O>
void add_command_flags(CLI::App * sub, O * opt) {
    for (const Setting & s : settings_registry()) {
        const bool of_o = std::visit(
            [](auto m) {
                if constexpr (std::is_same_v<decltype(m), std::monostate>)
                    return false;
                else
                    return std::is_same_v<typename MemberOf<decltype(m)>::Class, O>;
            },
            s.command_member);
        if (of_o && *s.flags && s.for_command(sub->get_name())) bind_setting(sub, s, opt);
    }
    wire_excludes(sub);
}
}  // namespace

void add_serve_flags(CLI::App * sub, ServeOptions * opt) { add_command_flags(sub, opt); }

void add_chat_flags(CLI::App * sub, ChatOptions * opt) { add_command_flags(sub, opt); }

void add_run_flags(CLI::App * sub, RunCmdOptions * opt) { add_command_flags(sub, opt); }

void add_chat_template_flags(CLI::App * sub, ChatTemplateOptions * opt) {
    add_command_flags(sub, opt);
}

void add_sampling_flags(CLI::App * sub, GenerateRequest * req) {
    add_command_flags(sub, &req->sampling);
    add_command_flags(sub, req);  // -r
}

void add_eval_flags(CLI::App * sub, EvalOptions * opt) { add_command_flags(sub, opt); }

void add_inspect_flags(CLI::App * sub, InspectOptions * opt) {
    add_command_flags(sub, opt);
}

void add_fallback_flags(CLI::App * sub, FallbackOptions * opt) {
    add_command_flags(sub, opt);
}

void add_synth_flags(CLI::App * sub, SynthCommandOptions * opt) {
    add_command_flags(sub, opt);
}

void add_replay_flags(CLI::App * sub, ReplayOptions * opt) {
    add_command_flags(sub, opt);
}

// The registry rewrites the library's RunOptions names (settings.h, option_words).
std::string flag_words(const std::string & msg) { return option_words(msg); }

int check_engine_flags(CLI::App * sub, const RunOptions & opt) {
    if (!opt.stream) {  // the rows of the streaming loader (settings.h, kStreaming)
        std::vector<std::string> streaming;
        for (const Setting & s : settings_registry())
            if ((s.traits & kStreaming) && *s.flags && s.for_command(sub->get_name()))
                streaming.push_back(long_flag(s.flags));
        return refuse_given(sub, streaming, "applies to streaming; remove --no-stream");
    }
    if (opt.miss_fallback.empty()) {
        // An empty FILE would silently mean "no fallback".
        if (int rc = refuse_given(sub, {"--miss-fallback"}, "needs a file (the value is empty)"))
            return rc;
        return refuse_given(sub, {"--fallback-threshold"}, "applies to --miss-fallback FILE");
    }
    return 0;
}

void add_color_flag(CLI::App * sub, std::string * mode) {
    const Setting * row = find_flag_setting("--color");
    const std::string doc = row ? row->doc : "";
    *mode = "auto";
    sub->add_option_function<std::string>(
           "--color", [mode](const std::string & v) { *mode = v.empty() ? "on" : v; }, doc)
        ->expected(0, 1)
        ->check(CLI::IsMember({"on", "off", "auto"}))
        ->type_name("[on|off|auto]=auto");  // (a default_str would stand in for the bare flag)
}

bool colour_stdout(const std::string & mode) {
    if (mode == "off" || ::isatty(STDOUT_FILENO) == 0) return false;
    if (mode == "on") return true;
    const char * no_color = std::getenv("NO_COLOR");
    const char * term = std::getenv("TERM");
    return !(no_color && *no_color) && !(term && std::string(term) == "dumb");
}

int check_sampling_flags(CLI::App * sub, const RunOptions & opt) {
    const bool greedy = opt.temp < SamplingParams::kGreedyBelow;
    if (greedy)
        if (int rc = refuse_given(sub, {"--top-k", "--top-p", "--min-p"},
                                  "shapes sampling, and --temp 0 (the default) is greedy: add "
                                  "--temp T"))
            return rc;
    if (greedy && sub->get_option("--seed")->count() > 0)
        std::fprintf(stderr, "moestream: warning: --seed has no effect with --temp 0 (greedy)\n");
    return 0;
}

Status process_reverse_prompts(bool escape, std::vector<std::string> * stop) {
    for (std::string & r : *stop) {
        Status st = escape ? process_escapes("-r", &r) : Status::Ok();
        if (st.ok() && r.empty()) st = Status::Usage("-r: an empty reverse prompt");
        if (!st.ok()) return st;
    }
    return Status::Ok();
}

void add_run_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<RunFlags>();
    auto * sub = app.add_subcommand("run", "generate text, streaming the routed experts from flash");
    f->sub = sub;
    add_run_flags(sub, &f->run);
    add_color_flag(sub, &f->color);
    add_engine_flags(sub, &f->opt);
    add_sampling_flags(sub, &f->gen);
    sub->add_flag("-v,--verbose", f->verbose, "more log (-vv: debug, llama.cpp's log too)");
    sub->callback([f, action] { *action = [f] { return do_run(*f); }; });
}

}  // namespace moestream::cli
