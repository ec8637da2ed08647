// test_eval_cli.cpp — `moestream eval` end to end on a tiny synth model:
//  - a lossless configuration against the reference: KL exactly 0, top-1 100 %, equal
//    perplexity (the reference pipeline and the scored run see the same logits);
//  - the negative control: --n-expert-used 1 must show KL > 0 and top-1 < 100 %;
//  - --save-ref / --ref reproduce the computed-reference numbers exactly;
//  - --window N empties the context every N tokens: a window as long as the text changes
//    nothing, a shorter one changes the reference's perplexity, fits a smaller -c, and a
//    reference saved with one window is refused for another;
//  - bad input: a reference for another text, an empty or missing text, a one-token text, a
//    reference with non-finite logits or that is no regular file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

const char * kText =
    "Mixture-of-Experts models route every token to a few experts. moestream reads only those "
    "experts from flash, so the model does not have to fit in memory, and the output stays the "
    "same as with everything resident.";

std::string write_text(const std::string & name, const std::string & body) {
    const std::string p = models_dir() + "/" + name + "-" + std::to_string(getpid()) + ".txt";
    std::ofstream(p, std::ios::binary) << body;
    return p;
}

CmdResult eval(const std::string & args) {
    return run_cmd(sh_quote(cli_bin()) + " eval -t 1 --max-tokens 64 --bootstrap 200 " + args);
}

json eval_json(const std::string & args) {
    CmdResult r = eval(args + " --json");
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json();
}

}  // namespace

TEST(EvalCli, LosslessMatchesTheReferenceAndLossyDoesNot) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string text = write_text("eval", kText);
    const json same =
        eval_json("-m " + sh_quote(model) + " -f " + sh_quote(text) + " --cache-mb 0");
    ASSERT_FALSE(same.is_null());
    EXPECT_FALSE(same["lossy"].get<bool>());
    EXPECT_EQ(same["positions"].get<int>(), 63);
    EXPECT_EQ(same["mean_kl_nats"]["value"].get<double>(), 0.0);
    EXPECT_EQ(same["top1_agreement_pct"]["value"].get<double>(), 100.0);
    EXPECT_EQ(same["perplexity"]["value"].get<double>(),
              same["perplexity_reference"]["value"].get<double>());
    EXPECT_GT(same["perplexity"]["value"].get<double>(), 1.0);

    const json lossy = eval_json("-m " + sh_quote(model) + " -f " + sh_quote(text) +
                                 " --cache-mb 0 --n-expert-used 1");
    ASSERT_FALSE(lossy.is_null());
    EXPECT_TRUE(lossy["lossy"].get<bool>());
    EXPECT_GT(lossy["mean_kl_nats"]["lo"].get<double>(), 0.0);
    EXPECT_LT(lossy["top1_agreement_pct"]["value"].get<double>(), 100.0);
    // The reference is the same in both: lossless, whatever the configured run's knobs.
    EXPECT_EQ(lossy["perplexity_reference"]["value"].get<double>(),
              same["perplexity_reference"]["value"].get<double>());
    std::remove(text.c_str());
}

TEST(EvalCli, SavedReferenceReproducesTheNumbers) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string text = write_text("eval-ref", kText);
    const std::string ref = text + ".ref";
    const std::string base =
        "-m " + sh_quote(model) + " -f " + sh_quote(text) + " --cache-mb 0 --n-expert-used 2";
    const json a = eval_json(base + " --save-ref " + sh_quote(ref));
    const json b = eval_json(base + " --ref " + sh_quote(ref));
    ASSERT_FALSE(a.is_null());
    ASSERT_FALSE(b.is_null());
    for (const char * k :
         {"perplexity", "perplexity_reference", "mean_kl_nats", "top1_agreement_pct"})
        EXPECT_EQ(a[k], b[k]) << k;

    // The same reference against another text is refused, naming the file.
    const std::string other = write_text("eval-other", std::string("Another text: ") + kText);
    CmdResult r = eval("-m " + sh_quote(model) + " -f " + sh_quote(other) + " --cache-mb 0 --ref " +
                       sh_quote(ref));
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find(ref), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("offset"), std::string::npos) << r.err;
    for (const std::string & p : {text, ref, other}) std::remove(p.c_str());
}

// --route-trace records one decode row per scored token, with the cache's real hits: replay
// --validate reproduces them exactly.
TEST(EvalCli, RouteTraceOfTheTextReplays) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string text = write_text("eval-trace", kText);
    const std::string trace = text + ".trace";
    const json j = eval_json("-m " + sh_quote(model) + " -f " + sh_quote(text) +
                             " --cache-mb 64 --force-cache --route-trace " + sh_quote(trace));
    ASSERT_FALSE(j.is_null());
    CmdResult v = run_cmd(sh_quote(cli_bin()) + " replay --validate --json " + sh_quote(trace));
    ASSERT_EQ(v.exit_code, 0) << v.err;
    const json r = json::parse(v.out)["validate"];
    EXPECT_TRUE(r["ok"].get<bool>()) << v.out;
    EXPECT_GT(r["hits"].get<uint64_t>(), 0u) << v.out;
    // One decode row per scored position, every MoE layer, k slots each: tiny has 4 MoE
    // layers x top-4.
    const uint64_t positions = j["positions"].get<uint64_t>();
    ASSERT_GT(positions, 10u);
    EXPECT_EQ(r["slots_checked"].get<uint64_t>(), positions * 4 * 4) << v.out;
    for (const std::string & p : {text, trace}) std::remove(p.c_str());
}

TEST(EvalCli, WindowEmptiesTheContextEveryNTokens) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string text = write_text("eval-window", kText);
    const std::string ref = text + ".ref", trace = text + ".trace";
    const std::string base = "-m " + sh_quote(model) + " -f " + sh_quote(text);
    const json whole = eval_json(base + " --cache-mb 0");
    const json same = eval_json(base + " --cache-mb 0 --window 64");  // 64 tokens: one window
    const json win = eval_json(base + " --cache-mb 0 --window 16 -c 16 --save-ref " +
                               sh_quote(ref) + " --route-trace " + sh_quote(trace));
    ASSERT_FALSE(whole.is_null() || same.is_null() || win.is_null());
    EXPECT_EQ(same["perplexity_reference"], whole["perplexity_reference"]);
    EXPECT_EQ(win["window"].get<int>(), 16);
    EXPECT_EQ(win["positions"].get<int>(), 63);
    // Negative control: the windows really cut the context (other predictions), and the run
    // still matches its reference exactly (both are scored in the same windows).
    EXPECT_NE(win["perplexity_reference"]["value"].get<double>(),
              whole["perplexity_reference"]["value"].get<double>());
    EXPECT_EQ(win["mean_kl_nats"]["value"].get<double>(), 0.0);
    EXPECT_EQ(win["top1_agreement_pct"]["value"].get<double>(), 100.0);
    // Without windows the text does not fit in -c 16.
    CmdResult big = eval(base + " --cache-mb 0 -c 16");
    EXPECT_EQ(big.exit_code, 64) << big.err;
    EXPECT_NE(big.err.find("exceed the context"), std::string::npos) << big.err;
    // A reference saved with --window 16 is refused without it.
    CmdResult other = eval(base + " --cache-mb 0 --ref " + sh_quote(ref));
    EXPECT_EQ(other.exit_code, 3) << other.err;
    EXPECT_NE(other.err.find("recorded with --window 16"), std::string::npos) << other.err;
    // The trace of a windowed run still replays exactly.
    CmdResult v = run_cmd(sh_quote(cli_bin()) + " replay --validate " + sh_quote(trace));
    EXPECT_EQ(v.exit_code, 0) << v.err;
    for (const std::string & p : {text, ref, trace}) std::remove(p.c_str());
}

TEST(EvalCli, BadTextIsOneClearError) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string empty = write_text("eval-empty", "");
    const std::string one = write_text("eval-one", "x");
    struct Case {
        std::string file;
        const char * expect;
    };
    const Case cases[] = {
        {empty, "the text file is empty"},
        {models_dir() + "/no-such-text.txt", "cannot read the text file"},
        {one, "scoring needs at least two"},
    };
    for (const Case & c : cases) {
        CmdResult r = eval("-m " + sh_quote(model) + " -f " + sh_quote(c.file) + " --cache-mb 0");
        EXPECT_EQ(r.exit_code, 3) << c.file << "\n" << r.err;
        EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(c.file), std::string::npos) << r.err;
    }
    std::remove(empty.c_str());
    std::remove(one.c_str());
}

// A reference whose logits are not finite (0xff bytes: NaN; +inf) is refused by offset, exit
// 3 (it gave "mean KL inf", exit 0); a FIFO as --ref is refused at once instead of waiting for
// a writer (under `timeout`: a regression fails instead of hanging). The intact reference
// is the control.
TEST(EvalCli, ReferenceThatIsNotFiniteOrNotAFileIsRefused) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    TempDir dir("eval-ref");
    const std::string text = dir.path("t.txt"), ref = dir.path("r.ref");
    ASSERT_TRUE(write_bytes(text, kText));
    const std::string base = "-m " + sh_quote(model) + " -f " + sh_quote(text) + " --cache-mb 0";
    ASSERT_EQ(eval(base + " --save-ref " + sh_quote(ref)).exit_code, 0);
    const std::string good = slurp(ref);
    ASSERT_GT(good.size(), 64u);
    EXPECT_EQ(eval(base + " --ref " + sh_quote(ref)).exit_code, 0);  // control
    const size_t logit3 = 40 + 4 + 4 * 3;  // header, the first record's token id, token 3
    for (const std::string & bytes : {std::string(4, '\xff'), std::string("\x00\x00\x80\x7f", 4)}) {
        std::string bad = good;
        bad.replace(logit3, 4, bytes);
        ASSERT_TRUE(write_bytes(ref, bad));
        CmdResult r = eval(base + " --ref " + sh_quote(ref));
        EXPECT_EQ(r.exit_code, 3) << r.err;
        EXPECT_NE(r.err.find(ref + ": offset 56: the logit of token 3 at position 0 is not finite"),
                  std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");
    }
    const std::string fifo = dir.path("fifo.ref");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    CmdResult f = run_cmd("timeout 60 " + sh_quote(cli_bin()) + " eval -t 1 --max-tokens 64 " +
                          base + " --ref " + sh_quote(fifo));
    EXPECT_EQ(f.exit_code, 3) << f.err;
    EXPECT_NE(f.err.find("is a FIFO, not a regular file"), std::string::npos) << f.err;
}
