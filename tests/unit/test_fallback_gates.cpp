// test_fallback_gates.cpp — `make-fallback` and --miss-fallback end to end via the CLI
// (docs/quality.md, "Low-bit fallback"):
//  - a threshold no weight is below leaves the output byte-identical to lossless (the
//    machinery present, never firing) and unlabelled;
//  - with a small constantly evicting cache under --cache-debug (poison + residency checks,
//    and the check that every expert a matmul reads is resident), and with the cache off,
//    low-weight misses are computed from the companion: fewer bytes read, a different output
//    (negative control of the identity), labelled LOSSY;
//  - a planted bug (MOESTREAM_DEBUG_FALLBACK_SKIP_CONVERT: a converted slot left unwritten)
//    is caught by --cache-debug with one error (negative control of the safety check);
//  - a companion of another model, a truncated one and a non-companion file are refused
//    with exit 2 naming the file; serve refuses the flag, run refuses a lone threshold.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moestream/route_trace.h"
#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

const char * kPrompt = "The expert streaming engine reads only what the router selects.";
const char * kSmall = "--cache-mb 4 --force-cache --cache-debug ";

struct CliRun {
    int rc = -1;
    std::string err;
    json stats;
};

CliRun run(const std::string & model, const std::string & flags, const std::string & env = "") {
    StatsRun r = run_with_stats(model, kPrompt, 24, flags, env);
    return {r.rc, r.err, r.rc == 0 ? json::parse(r.stats) : json()};
}

// The companion of `model`, made afresh (make-fallback writes through a temporary file and
// a rename, so test processes running at once do not see each other's partial files).
std::string companion(const std::string & model, const std::string & tag) {
    const std::string out = models_dir() + "/fallback-" + tag + "-q4_0.gguf";
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " make-fallback -m " + sh_quote(model) + " -o " +
                          sh_quote(out) + " --type Q4_0 -t 1");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("source fingerprint"), std::string::npos) << r.out;
    return out;
}

std::string model() { return synth_model("tiny", "qwen3moe", "q8_0"); }

}  // namespace

TEST(FallbackGate, UnreachedThresholdIsLossless) {
    const std::string m = model();
    const std::string c = companion(m, "a");
    CliRun off = run(m, kSmall);
    CliRun on = run(m, std::string(kSmall) + "--miss-fallback " + c + " --fallback-threshold 1e-12");
    ASSERT_EQ(off.rc, 0) << off.err;
    ASSERT_EQ(on.rc, 0) << on.err;
    EXPECT_EQ(on.stats["logits_sha"], off.stats["logits_sha"]);
    EXPECT_EQ(on.stats["experts_fallback"].get<uint64_t>(), 0u);
    EXPECT_EQ(on.stats["bytes_per_token"], off.stats["bytes_per_token"]);
}

TEST(FallbackGate, ComputesLowWeightMissesFromTheCompanionUnderCacheDebug) {
    const std::string m = model();
    const std::string c = companion(m, "a");
    for (const char * cache : {kSmall, "--cache-mb 0 "}) {
        SCOPED_TRACE(cache);
        CliRun off = run(m, cache);
        CliRun on = run(m, std::string(cache) + "--miss-fallback " + c + " --fallback-threshold 1");
        ASSERT_EQ(off.rc, 0) << off.err;
        ASSERT_EQ(on.rc, 0) << on.err;  // every matmul read only loaded, written experts
        EXPECT_GT(on.stats["experts_fallback"].get<uint64_t>(), 0u);
        EXPECT_GT(on.stats["fallback_bytes_read"].get<uint64_t>(), 0u);
        EXPECT_GT(on.stats["fallback_bytes_saved"].get<uint64_t>(), 0u);
        EXPECT_LT(on.stats["bytes_per_token"].get<double>(),
                  off.stats["bytes_per_token"].get<double>());
        EXPECT_NE(on.stats["logits_sha"], off.stats["logits_sha"]);  // negative control
        EXPECT_TRUE(on.stats["settings"]["lossy"].get<bool>());
        EXPECT_NE(on.err.find("--miss-fallback " + c + " --fallback-threshold 1 (LOSSY)"),
                  std::string::npos)
            << on.err;
        EXPECT_NE(on.err.find("LOSSY output"), std::string::npos) << on.err;
    }
}

TEST(FallbackGate, CacheDebugCatchesAPlantedUnwrittenSlot) {
    const std::string m = model();
    const std::string c = companion(m, "a");
    const std::string flags = std::string(kSmall) + "--miss-fallback " + c + " --fallback-threshold 1";
    CliRun bad = run(m, flags, "MOESTREAM_DEBUG_FALLBACK_SKIP_CONVERT=1 ");
    EXPECT_NE(bad.rc, 0);
    EXPECT_LT(bad.rc, 128) << "a crash, not an error: " << bad.err;
    EXPECT_NE(bad.err.find("poison"), std::string::npos) << bad.err;
    CliRun good = run(m, flags, "MOESTREAM_DEBUG_FALLBACK_SKIP_CONVERT=0 ");  // control
    EXPECT_EQ(good.rc, 0) << good.err;
}

TEST(FallbackGate, RefusesACompanionOfAnotherModelATruncatedOneAndAModel) {
    const std::string m = model();
    const std::string other = synth_model("tiny", "qwen3moe", "q8_0", 7);
    const std::string c_other = companion(other, "other");
    CliRun r = run(m, "--miss-fallback " + c_other);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_NE(r.err.find("--miss-fallback " + c_other + ": made from another model"),
              std::string::npos)
        << r.err;
    const std::string c = companion(m, "a");
    const std::string cut = models_dir() + "/fallback-cut-" + std::to_string(getpid()) + ".gguf";
    std::filesystem::copy_file(c, cut, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(cut, std::filesystem::file_size(c) - 4096);
    r = run(m, "--miss-fallback " + cut);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_NE(r.err.find("--miss-fallback " + cut), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("\n"), r.err.rfind("\n")) << "one line: " << r.err;
    r = run(m, "--miss-fallback " + m);  // the model itself is no companion
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_NE(r.err.find("not a companion file"), std::string::npos) << r.err;
    std::remove(cut.c_str());
}

TEST(FallbackGate, FlagsRefusedWhereTheyDoNotApply) {
    const std::string m = model();
    CliRun r = run(m, "--fallback-threshold 0.2");
    EXPECT_EQ(r.rc, 64);
    EXPECT_NE(r.err.find("--fallback-threshold"), std::string::npos) << r.err;
    const std::string c = companion(m, "a");
    r = run(m, "--cache-mb 4 --force-cache --drop-cold-experts 0.5 --miss-fallback " + c);
    EXPECT_EQ(r.rc, 64);
    EXPECT_NE(r.err.find("--miss-fallback cannot be combined"), std::string::npos) << r.err;
    CmdResult s = run_cmd(sh_quote(cli_bin()) + " serve -m " + sh_quote(m) + " --miss-fallback " +
                          sh_quote(c));
    EXPECT_EQ(s.exit_code, 64);
    EXPECT_NE(s.err.find("--miss-fallback is not available in serve"), std::string::npos) << s.err;
}

TEST(FallbackGate, TraceMarksFallbacksAndReplayEstimatesThem) {
    const std::string m = model();
    const std::string c = companion(m, "a");
    const std::string trace = models_dir() + "/fallback-" + std::to_string(getpid()) + ".trace";
    CliRun on = run(m, "--cache-mb 4 --force-cache --miss-fallback " + c +
                           " --fallback-threshold 0.2 --route-trace " + sh_quote(trace));
    ASSERT_EQ(on.rc, 0) << on.err;
    moestream::RouteTrace t;
    ASSERT_TRUE(moestream::read_route_trace(trace, &t).ok());
    EXPECT_EQ(t.header.version, moestream::kRouteTraceVersion);
    uint64_t marked = 0;
    for (uint8_t f : t.flags) marked += (f & moestream::kSlotFallback) ? 1 : 0;
    EXPECT_GT(marked, 0u);
    EXPECT_EQ(marked, on.stats["experts_fallback"].get<uint64_t>());
    const std::string rp = sh_quote(cli_bin()) + " replay " + sh_quote(trace);
    CmdResult v = run_cmd(rp + " --validate");
    EXPECT_EQ(v.exit_code, 64);
    EXPECT_NE(v.err.find("--validate cannot reproduce a --miss-fallback recording"),
              std::string::npos)
        << v.err;
    CmdResult est = run_cmd(rp + " --budgets 0,4 --miss-fallback " + sh_quote(c) +
                            " --fallback-threshold 0.2 --json");
    ASSERT_EQ(est.exit_code, 0) << est.err;
    const json doc = json::parse(est.out);
    ASSERT_EQ(doc["results"].size(), 2u);
    for (const json & r : doc["results"]) {
        EXPECT_GT(r["fallbacks"].get<uint64_t>(), 0u) << r.dump();
        EXPECT_GT(r["fallback_bytes_saved"].get<uint64_t>(), 0u) << r.dump();
        EXPECT_GT(r["reads_avoided"].get<double>(), 0.0) << r.dump();
        EXPECT_TRUE(r["lossy"].get<bool>());
    }
    // Control: the same sweep without the flags avoids nothing.
    CmdResult base = run_cmd(rp + " --budgets 0,4 --json");
    ASSERT_EQ(base.exit_code, 0) << base.err;
    for (const json & r : json::parse(base.out)["results"])
        EXPECT_EQ(r["reads_avoided"].get<double>(), 0.0);
    CmdResult lone = run_cmd(rp + " --fallback-threshold 0.2");
    EXPECT_EQ(lone.exit_code, 64);
    EXPECT_NE(lone.err.find("go together"), std::string::npos) << lone.err;
    std::remove(trace.c_str());
}
