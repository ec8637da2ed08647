// `moestream eval` — how much quality a configured run gives up against a lossless
// reference run of the same model over the same text (docs/eval.md): perplexity, mean
// KL(ref || run) of the next-token distributions and top-1 agreement, each with a bootstrap
// 95% interval. Both runs decode the text one token at a time (the way streaming runs).
//
// The reference is the same model with the lossy knobs off (--n-expert-used, --drop-cold-*
// cleared; every lossless configuration gives the same logits, the gates prove it), computed
// first and kept in a temporary reference file, or read from --ref FILE (written earlier
// with --save-ref FILE), so large vocabularies never sit in RAM twice.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "moestream/settings.h"
#include "moestream/eval.h"
#include "moestream/gguf_index.h"
#include "moestream/moestream.h"
#include "moestream/text_file.h"

namespace moestream::cli {
namespace {

struct EvalFlags {
    RunOptions opt;
    EvalOptions eval;  // eval's own flags (registry rows, settings.h)
    int verbose = 0;
    CLI::App * sub = nullptr;
};

int eval_fail(const Status & st) {
    std::fprintf(stderr, "moestream: error: %s\n", flag_words(st.message()).c_str());
    return st.exit_code();
}

Status read_text(const std::string & path, std::string * out) {
    Status rs = read_text_file(path, "text", out);
    if (!rs.ok()) return rs;
    if (out->find('\0') != std::string::npos)
        return Status::BadInput(path + ": the text file contains NUL bytes (binary?)");
    return Status::Ok();
}

nlohmann::json interval_json(const Interval & iv) {
    return {{"value", iv.value}, {"lo", iv.lo}, {"hi", iv.hi}};
}

int do_eval(EvalFlags & f) {
    apply_verbosity(f.verbose);
    if (int rc = refuse_given(f.sub,
                              {"--temp", "--seed", "--batch-size", "--ubatch-size", "--threads-batch",
                               "--prompt-cache", "--prompt-cache-mb"},
                              "has no effect on eval: it scores the text's own tokens one decode "
                              "at a time (no sampling, no prompt batches)"))
        return rc;
    if (int rc = check_engine_flags(f.sub, f.opt)) return rc;
    // Outputs before any work: the reference file (kept or temporary) and the trace.
    const std::string tmp_ref_path = f.eval.text_file + ".moestream-ref." + std::to_string(getpid());
    auto inputs = model_inputs("-m", f.opt.model_path);
    inputs.push_back({"-f", f.eval.text_file});
    inputs.push_back({"--ref", f.eval.ref});
    inputs.push_back({"--miss-fallback", f.opt.miss_fallback});
    Status st = check_output_paths({{"--save-ref", f.eval.save_ref},
                                    {"--route-trace", f.opt.route_trace},
                                    {"the temporary reference next to -f",
                                     f.eval.ref.empty() && f.eval.save_ref.empty() ? tmp_ref_path : ""}},
                                   inputs);
    if (!st.ok()) return eval_fail(st);
    std::string text;
    st = read_text(f.eval.text_file, &text);
    if (!st.ok()) return eval_fail(st);
    uint64_t model_bytes = 0;
    {
        ModelIndex idx;  // validates the file before llama.cpp sees it, and gives its size
        st = load_model_index(f.opt.model_path, &idx);
        if (!st.ok()) return eval_fail(st);
        model_bytes = idx.set_bytes;  // every shard of a split set
    }

    // The same model and residency, the registry's lossy knobs off (settings.h).
    RunOptions ref_opt = without_lossy_knobs(f.opt);
    ref_opt.route_trace.clear();
    ref_opt.route_trace_scores = false;

    // One engine at a time (a model that barely fits must not be loaded twice).
    std::vector<int32_t> toks;
    int nv = 0;
    auto tokenize_with = [&](Engine & e) -> Status {
        Status s = e.tokenize(text, &toks);
        if (!s.ok()) return s;
        if (toks.size() > size_t(f.eval.max_tokens)) toks.resize(size_t(f.eval.max_tokens));
        if (toks.size() < 2)
            return Status::BadInput(f.eval.text_file + ": the text is " + std::to_string(toks.size()) +
                                    " token(s); scoring needs at least two");
        nv = e.n_vocab();
        return Status::Ok();
    };

    // 1) The reference logits: from --ref, or a lossless run written to a reference file.
    std::string ref_path = f.eval.ref;
    std::string tmp_ref;
    nlohmann::json ref_info;
    if (ref_path.empty()) {
        ref_path = f.eval.save_ref.empty() ? tmp_ref_path : f.eval.save_ref;
        if (f.eval.save_ref.empty()) tmp_ref = ref_path;
        std::unique_ptr<Engine> ref;
        st = Engine::open(ref_opt, &ref);
        if (!st.ok()) return eval_fail(st);
        if (ref->lossy()) return eval_fail(Status::Runtime("internal: the reference run is lossy"));
        st = tokenize_with(*ref);
        if (!st.ok()) return eval_fail(st);
        RefLogitsFile w;
        st = w.create(ref_path, nv, uint32_t(toks.size() - 1), uint32_t(f.eval.window),
                      hash_tokens(toks), model_bytes);
        if (!st.ok()) return eval_fail(st);
        // On a terminal (not with --log-disable): positions scored of the text, as it goes.
        ProgressLine line("eval: reference", "positions");
        st = ref->score(toks, uint32_t(f.eval.window), [&](size_t i, const float * lg) {
            line.update(int64_t(i) + 1, int64_t(toks.size()) - 1);
            return w.append(toks[i + 1], lg);
        });
        line.clear();
        if (!st.ok()) return eval_fail(st);
        st = w.finish();
        if (!st.ok()) return eval_fail(st);
        ref_info = {
            {"source", f.eval.save_ref.empty() ? "computed" : "computed, saved to " + f.eval.save_ref},
            {"settings", nlohmann::json::parse(ref->settings_json())},
            {"decode_tok_s", ref->stats().decode_tok_s},
            {"bytes_per_token", ref->stats().bytes_per_token}};
    } else {
        ref_info = {{"source", "read from " + f.eval.ref}};
    }

    std::unique_ptr<Engine> run;
    show_load_progress(&f.opt);
    st = Engine::open(f.opt, &run);
    if (!st.ok()) return eval_fail(st);
    if (toks.empty()) {
        st = tokenize_with(*run);
        if (!st.ok()) return eval_fail(st);
    }
    const uint32_t n_pos = uint32_t(toks.size() - 1);
    const uint64_t th = hash_tokens(toks);

    // 2) The configured run, position by position against the reference.
    RefLogitsFile r;
    st = r.open(ref_path, nv, n_pos, uint32_t(f.eval.window), th, model_bytes);
    if (!st.ok()) return eval_fail(st);
    std::vector<PositionMetrics> pos;
    pos.reserve(n_pos);
    std::vector<float> ref_logits;
    ProgressLine line("eval", "positions");
    st = run->score(toks, uint32_t(f.eval.window), [&](size_t i, const float * lg) {
        line.update(int64_t(i) + 1, int64_t(n_pos));
        Status s = r.read(toks[i + 1], &ref_logits);
        if (!s.ok()) return s;
        pos.push_back(compare_logits(ref_logits.data(), lg, nv, toks[i + 1]));
        return Status::Ok();
    });
    line.clear();
    if (!tmp_ref.empty()) std::remove(tmp_ref.c_str());
    if (!st.ok()) return eval_fail(st);
    EvalSummary sum;
    st = summarize_eval(pos, f.eval.bootstrap, &sum);
    if (!st.ok()) return eval_fail(st);

    const RunStats & rs = run->stats();
    nlohmann::json j;
    j["text"] = f.eval.text_file;
    j["tokens"] = toks.size();
    j["positions"] = sum.positions;
    j["window"] = f.eval.window;
    j["lossy"] = run->lossy();
    j["settings"] = nlohmann::json::parse(run->settings_json());
    j["reference"] = ref_info;
    j["perplexity"] = interval_json(sum.ppl_run);
    j["perplexity_reference"] = interval_json(sum.ppl_ref);
    j["mean_kl_nats"] = interval_json(sum.mean_kl);
    j["top1_agreement_pct"] = interval_json(sum.top1_pct);
    j["bootstrap_resamples"] = f.eval.bootstrap;
    j["decode_tok_s"] = rs.decode_tok_s;
    j["bytes_per_token"] = rs.bytes_per_token;
    if (ref_info.contains("bytes_per_token")) {
        const double ref_b = ref_info["bytes_per_token"].get<double>();
        j["bytes_per_token_avoided"] = ref_b - rs.bytes_per_token;
        j["reads_avoided_pct"] = ref_b > 0 ? 100.0 * (ref_b - rs.bytes_per_token) / ref_b : 0.0;
    }
    j["cache_hit_pct"] = rs.cache_hit_pct;
    if (f.eval.json) {
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        auto iv = [](const Interval & x, int nd) {
            char b[128];
            std::snprintf(b, sizeof b, "%.*f [%.*f, %.*f]", nd, x.value, nd, x.lo, nd, x.hi);
            return std::string(b);
        };
        const std::string win =
            f.eval.window ? ", windows of " + std::to_string(f.eval.window) + " tokens" : std::string();
        // The lossy knobs by name (docs/lossy-knobs.md), from the registry (settings.h).
        const nlohmann::json & set = j["settings"];
        const std::string knobs =
            " " + lossy_knobs_text(f.opt, set.value("n_expert_used_model", 0u));
        std::printf("moestream eval: %s, %zu tokens (%llu positions%s), %s\n", f.eval.text_file.c_str(),
                    toks.size(), (unsigned long long)sum.positions, win.c_str(),
                    run->lossy() ? ("LOSSY:" + knobs).c_str() : "lossless settings");
        std::printf("  perplexity        %s   (reference %s)\n", iv(sum.ppl_run, 4).c_str(),
                    iv(sum.ppl_ref, 4).c_str());
        std::printf("  mean KL(ref||run) %s nats\n", iv(sum.mean_kl, 6).c_str());
        std::printf("  top-1 agreement   %s %%\n", iv(sum.top1_pct, 2).c_str());
        std::printf("  decode %.2f tok/s, cache hit %.1f %%\n", rs.decode_tok_s, rs.cache_hit_pct);
        const double run_mib = rs.bytes_per_token / (1024.0 * 1024.0);
        if (ref_info.contains("bytes_per_token")) {
            const double ref_mib = ref_info["bytes_per_token"].get<double>() / (1024.0 * 1024.0);
            std::printf("  reads             %.2f MiB/token (reference %.2f): %.2f MiB/token "
                        "avoided (%.1f %%)\n",
                        run_mib, ref_mib, ref_mib - run_mib,
                        ref_mib > 0 ? 100.0 * (ref_mib - run_mib) / ref_mib : 0.0);
        } else {
            std::printf("  reads             %.2f MiB/token (the reference's is not in --ref's file: "
                        "compute it, or see the --save-ref run)\n",
                        run_mib);
        }
        std::printf("  95%% intervals: bootstrap over positions (%d resamples)\n", f.eval.bootstrap);
    }
    return 0;
}

}  // namespace

void add_eval_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<EvalFlags>();
    auto * sub = app.add_subcommand(
        "eval", "quality of a (lossy) configuration vs the lossless reference over a text");
    f->sub = sub;
    add_eval_flags(sub, &f->eval);
    // run's engine flags (lossy knobs included) and --route-trace (of the configured run)
    add_engine_flags(sub, &f->opt);
    sub->get_option("--ref")->excludes(sub->get_option("--save-ref"));
    sub->add_flag("-v,--verbose", f->verbose, "more log");
    sub->callback([f, action] { *action = [f] { return do_eval(*f); }; });
}

}  // namespace moestream::cli
