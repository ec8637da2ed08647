// test_substitute_gates.cpp — --substitute-experts end to end via the CLI (docs/lossy-knobs.md):
//  - M = 0 is byte-identical to lossless (and not labelled lossy);
//  - M > 0 against a small cache with --cache-debug (poison + residency checks, and the check
//    that every expert a matmul reads is resident) substitutes, avoids reads, changes the
//    output (negative control of the identity) and is labelled LOSSY;
//  - a planted bug (MOESTREAM_DEBUG_SUBSTITUTE_UNROUTED: a substitute the streamer is not told
//    about) is caught by --cache-debug with one error (negative control of the safety check);
//  - the route trace marks every substitution, replay --validate reproduces the run, and
//    replay --substitute-experts on it (no router scores) is refused naming the flag that
//    records them (tests/unit/test_subst_replay.cpp covers traces with scores);
//  - substitution without the cache is refused with the reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "moestream/route_trace.h"
#include "test_stats_run.h"

using nlohmann::json;
using namespace moestream;
using namespace moestream::test;

namespace {

using CliRun = ParsedRun;

CliRun run(const std::string & model, const std::string & flags, const std::string & env = "") {
    return run_parsed(model, kRouterPrompt, 32, flags, env);
}

const char * kSmall = "--cache-mb 4 --force-cache --cache-debug ";

}  // namespace

TEST(SubstituteGate, MarginZeroIsLossless) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CliRun off = run(model, kSmall);
    CliRun zero = run(model, std::string(kSmall) + "--substitute-experts 0");
    ASSERT_EQ(off.rc, 0) << off.err;
    ASSERT_EQ(zero.rc, 0) << zero.err;
    EXPECT_EQ(zero.stats["logits_sha"], off.stats["logits_sha"]);
    EXPECT_EQ(zero.stats["experts_substituted"].get<uint64_t>(), 0u);
    EXPECT_FALSE(zero.stats["settings"]["lossy"].get<bool>());
    EXPECT_EQ(zero.err.find("LOSSY"), std::string::npos) << zero.err;
}

TEST(SubstituteGate, SubstitutesOnlyLoadedExpertsUnderCacheDebugAndChangesTheOutput) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CliRun off = run(model, kSmall);
    ASSERT_EQ(off.rc, 0) << off.err;
    for (const char * m : {"1", "0.05"}) {
        SCOPED_TRACE(m);
        CliRun on = run(model, std::string(kSmall) + "--substitute-experts " + m);
        ASSERT_EQ(on.rc, 0) << on.err;  // every matmul read only resident experts
        EXPECT_GT(on.stats["experts_substituted"].get<uint64_t>(), 0u);
        EXPECT_GT(on.stats["subst_bytes_avoided"].get<uint64_t>(), 0u);
        EXPECT_LT(on.stats["bytes_per_token"].get<double>(),
                  off.stats["bytes_per_token"].get<double>());
        EXPECT_NE(on.stats["logits_sha"], off.stats["logits_sha"]);  // negative control
        EXPECT_TRUE(on.stats["settings"]["lossy"].get<bool>());
        EXPECT_EQ(on.stats["settings"]["substitute_experts"].get<double>(), std::stod(m));
        EXPECT_NE(on.err.find("--substitute-experts " + std::string(m) + " (LOSSY)"),
                  std::string::npos)
            << on.err;
    }
}

// Substitution on the fixed slots (the default store; no switch to the LRU cache; 12 MiB
// holds 6 of the 32 experts per layer): the lossless run and the run at margin `m`, both
// checked to be on the fixed slots.
namespace {
std::pair<CliRun, CliRun> fixed_slot_runs(const std::string & m) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CliRun off = run(model, "--cache-mb 12 --force-cache");
    CliRun on = run(model, "--cache-mb 12 --force-cache --substitute-experts " + m);
    EXPECT_EQ(off.rc, 0) << off.err;
    EXPECT_EQ(on.rc, 0) << on.err;
    if (off.rc == 0 && on.rc == 0) {
        EXPECT_EQ(off.stats["settings"]["cache_store"], "fixed slots");
        EXPECT_EQ(on.stats["settings"]["cache_store"], "fixed slots");
    }
    return {off, on};
}
}  // namespace

// Margin 0 is byte-identical to lossless, tokens and logits.
TEST(SubstituteGate, FixedSlotsMarginZeroIsByteIdentical) {
    const auto [off, zero] = fixed_slot_runs("0");
    ASSERT_TRUE(off.rc == 0 && zero.rc == 0);
    EXPECT_EQ(zero.stats["tokens"], off.stats["tokens"]);
    EXPECT_EQ(zero.stats["logits_sha"], off.stats["logits_sha"]);
    EXPECT_EQ(zero.stats["experts_substituted"].get<uint64_t>(), 0u);
}

// The negative control: a margin substitutes resident experts, reads less and changes the
// output.
TEST(SubstituteGate, FixedSlotsMarginSubstitutesAndChangesTheOutput) {
    const auto [off, on] = fixed_slot_runs("1");
    ASSERT_TRUE(off.rc == 0 && on.rc == 0);
    EXPECT_GT(on.stats["experts_substituted"].get<uint64_t>(), 0u);
    EXPECT_LT(on.stats["bytes_per_token"].get<double>(), off.stats["bytes_per_token"].get<double>());
    EXPECT_NE(on.stats["logits_sha"], off.stats["logits_sha"]);
}

TEST(SubstituteGate, CacheDebugCatchesAPlantedUnloadedSubstitute) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CliRun bad = run(model, std::string(kSmall) + "--substitute-experts 1",
                  "MOESTREAM_DEBUG_SUBSTITUTE_UNROUTED=1 ");
    EXPECT_NE(bad.rc, 0);
    EXPECT_LT(bad.rc, 128) << "a crash, not an error: " << bad.err;  // no signal
    EXPECT_NE(bad.err.find("cache-debug: ffn_moe_"), std::string::npos) << bad.err;
    EXPECT_NE(bad.err.find("which is not resident"), std::string::npos) << bad.err;
    // Control: the same run without the planted bug passes the same check.
    CliRun good = run(model, std::string(kSmall) + "--substitute-experts 1",
                   "MOESTREAM_DEBUG_SUBSTITUTE_UNROUTED=0 ");
    EXPECT_EQ(good.rc, 0) << good.err;
}

TEST(SubstituteGate, TraceMarksSubstitutionsAndReplayReproducesThem) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string trace = models_dir() + "/subst-" + std::to_string(getpid()) + ".trace";
    CliRun on = run(model, "--cache-mb 4 --force-cache --substitute-experts 1 --route-trace " +
                            sh_quote(trace));
    ASSERT_EQ(on.rc, 0) << on.err;
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(trace, &t).ok());
    EXPECT_EQ(t.header.version, kRouteTraceVersion);
    uint64_t marked = 0;
    for (uint8_t f : t.flags)
        if (f & kSlotSubstituted) {
            ++marked;
            EXPECT_TRUE(f & kSlotResident);
        }
    EXPECT_EQ(marked, on.stats["experts_substituted"].get<uint64_t>());
    EXPECT_GT(marked, 0u);
    CmdResult v = run_cmd(sh_quote(cli_bin()) + " replay " + sh_quote(trace) + " --validate");
    EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
    CmdResult s =
        run_cmd(sh_quote(cli_bin()) + " replay " + sh_quote(trace) + " --substitute-experts 0.1");
    EXPECT_EQ(s.exit_code, 64);
    EXPECT_NE(s.err.find("--substitute-experts needs the router's scores"), std::string::npos)
        << s.err;
    EXPECT_NE(s.err.find("--route-trace-scores"), std::string::npos) << s.err;
    std::remove(trace.c_str());
}

TEST(SubstituteGate, RefusedWithoutTheCacheOrOutOfRange) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CliRun r = run(model, "--cache-mb 0 --substitute-experts 0.1");
    EXPECT_EQ(r.rc, 64);
    EXPECT_NE(r.err.find("--substitute-experts needs an expert cache"), std::string::npos) << r.err;
    r = run(model, "--substitute-experts 1.5");
    EXPECT_EQ(r.rc, 64);
    EXPECT_NE(r.err.find("--substitute-experts"), std::string::npos) << r.err;
    r = run(model, "--no-stream --substitute-experts 0.1");
    EXPECT_EQ(r.rc, 64);
    EXPECT_NE(r.err.find("needs streaming"), std::string::npos) << r.err;
}

// Every output names the knob: chat's footer and eval's text (run's summary: above).
TEST(SubstituteGate, ChatAndEvalLabelIt) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string base = " -m " + sh_quote(model) + " -t 1 --cache-mb 4 --force-cache";
    const std::string chat = "echo hello | " + sh_quote(cli_bin()) + " chat -n 8" + base;
    CmdResult on = run_cmd(chat + " --substitute-experts 0.1");
    EXPECT_EQ(on.exit_code, 0) << on.err;
    EXPECT_NE((on.out + on.err).find("LOSSY (--substitute-experts 0.1)"), std::string::npos)
        << on.out << on.err;
    CmdResult off = run_cmd(chat);  // control: the same chat without the knob
    EXPECT_EQ(off.exit_code, 0) << off.err;
    EXPECT_EQ((off.out + off.err).find("LOSSY"), std::string::npos) << off.out << off.err;
    const std::string text = models_dir() + "/subst-eval-" + std::to_string(getpid()) + ".txt";
    { std::ofstream(text) << "The expert streaming engine reads only what the router selects. "
                             "It keeps hot experts in a cache and reads the rest from flash.\n"; }
    const std::string eval =
        sh_quote(cli_bin()) + " eval -f " + sh_quote(text) + " -c 64 --max-tokens 32" + base;
    CmdResult ev = run_cmd(eval + " --substitute-experts 0.1");
    EXPECT_EQ(ev.exit_code, 0) << ev.err;
    EXPECT_NE(ev.out.find("LOSSY: --substitute-experts 0.1"), std::string::npos) << ev.out;
    CmdResult ev0 = run_cmd(eval);
    EXPECT_NE(ev0.out.find("lossless settings"), std::string::npos) << ev0.out;
    std::remove(text.c_str());
}
