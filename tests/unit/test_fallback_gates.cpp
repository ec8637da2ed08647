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

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <vector>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moestream/route_trace.h"
#include "test_stats_run.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

const char * kSmall = "--cache-mb 4 --force-cache --cache-debug ";

using CliRun = ParsedRun;

CliRun run(const std::string & model, const std::string & flags, const std::string & env = "") {
    return run_parsed(model, kRouterPrompt, 24, flags, env);
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

// A companion whose expert data is NaN (0xff bytes: NaN scales) but whose source fingerprint
// is right was accepted and quietly spoiled the output; every slice is checked as it is
// converted, so the step that would use it stops (exit 1, like NaN weights in a model, naming
// the companion and the tensor) before its token. The intact companion is the control.
// Runs the model with every expert from a copy of its companion whose expert data is all
// `byte` (gguf_mutate fill), written to `bad` in `dir`, after the control: the companion as
// make-fallback wrote it runs (exit 0).
namespace {
CliRun run_with_filled_companion(const TempDir & dir, const std::string & byte, std::string * bad) {
    const std::string m = model();
    const std::string c = companion(m, "a");
    *bad = dir.path("filled-q4_0.gguf");
    CmdResult mk = run_cmd(gguf_mutate_cmd() + " " + sh_quote(c) + " " + sh_quote(*bad) +
                           " fill role:experts=" + byte);
    EXPECT_EQ(mk.exit_code, 0) << mk.err;
    const std::string flags = std::string(kSmall) + "--fallback-threshold 1 --miss-fallback ";
    CliRun good = run(m, flags + c);
    EXPECT_EQ(good.rc, 0) << good.err;
    return run(m, flags + *bad);
}
}  // namespace

TEST(FallbackGate, CompanionWithNonFiniteWeightsIsRefused) {
    TempDir dir("fallback-nan");
    std::string bad;
    CliRun r = run_with_filled_companion(dir, "0xff", &bad);  // NaN scales
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_NE(r.err.find("--miss-fallback " + bad + ": tensor '"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a weight is not finite"), std::string::npos) << r.err;
}

// The companion's identity covers its own data: finite but altered bytes (zeros: Q4_0 blocks of
// scale 0) under the right source fingerprint fail the slice hash make-fallback recorded.
TEST(FallbackGate, CompanionWithAlteredDataIsRefused) {
    TempDir dir("fallback-altered");
    std::string bad;
    CliRun r = run_with_filled_companion(dir, "0x00", &bad);
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_NE(r.err.find("--miss-fallback " + bad + ": tensor '"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the data differs from what make-fallback wrote"), std::string::npos) << r.err;
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

// ---- bad input to make-fallback and --miss-fallback (docs/reliability.md, "Low-bit fallback
// inputs") ----------------------------------------------------------------------------------

namespace {

std::string file_bytes(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Files in `dir` whose names contain ".quantize-" or ".tmp." (make-fallback's temporaries).
std::vector<std::string> temporaries(const std::string & dir) {
    std::vector<std::string> v;
    for (const auto & e : std::filesystem::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.find(".quantize-") != std::string::npos || n.find(".tmp.") != std::string::npos)
            v.push_back(n);
    }
    return v;
}

}  // namespace

// Every refusal is one line with its exit code, before llama-quantize runs, and leaves the
// model and the directory as they were. Controls: a split set given by its second shard makes
// the same companion as from its first; the model is unchanged after the refusals.
TEST(MakeFallbackInput, RefusedBeforeAnyWorkAndTheModelUntouched) {
    TempDir dir("mkfb");
    const std::string m = dir.path("model.gguf");
    std::filesystem::copy_file(model(), m);
    const std::string before = file_bytes(m);
    std::filesystem::create_symlink("model.gguf", dir.path("link.gguf"));
    std::filesystem::create_hard_link(m, dir.path("hard.gguf"));
    std::filesystem::create_directory(dir.path("sub"));
    ASSERT_EQ(mkfifo(dir.path("fifo.gguf").c_str(), 0600), 0);
    { std::ofstream(dir.path("text.gguf")) << "not a model"; }
    const std::string mf = "timeout 60 " + sh_quote(cli_bin()) + " make-fallback ";
    struct Case {
        std::string args;
        int code;
        std::string msg;
    } cases[] = {
        {"-m " + m + " -o " + m, 64, "the output " + m + " is the model file " + m},
        {"-m " + m + " -o " + dir.path("link.gguf"), 64, "is the model file"},
        {"-m " + m + " -o " + dir.path("hard.gguf"), 64, "is the model file"},
        {"-m " + m + " -o " + dir.path("sub"), 3, "exists and is a directory"},
        {"-m " + m + " -o " + dir.path("none/c.gguf"), 3, "-o " + dir.path("none/c.gguf") +
                                                           ": the directory " + dir.path("none") +
                                                           " does not exist"},
        {"-m " + m + " -o " + dir.path("c.gguf") + " --type BOGUS", 64,
         "--type: type 'BOGUS' is not a ggml type llama-quantize writes; one of f32"},
        {"-m " + m + " -o " + dir.path("c.gguf") + " --type Q3_K_S", 64, "is not a ggml type"},
        {"-m " + m + " -o " + dir.path("c.gguf") + " --type iq2_xxs", 64,
         "needs an importance matrix"},
        {"-m " + dir.path("text.gguf") + " -o " + dir.path("c.gguf"), 2, "not a GGUF file"},
        {"-m " + dir.path("fifo.gguf") + " -o " + dir.path("c.gguf"), 2,
         "not a regular file (a FIFO)"},
        {"-m " + dir.path("sub") + " -o " + dir.path("c.gguf"), 2,
         "not a regular file (a directory)"},
        {"-m " + m + " -o " + dir.path("c.gguf") + " --quantize-tool /nonexistent/llama-quantize",
         1, "cannot run /nonexistent/llama-quantize"},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(c.args);
        CmdResult r = run_cmd(mf + c.args);
        EXPECT_EQ(r.exit_code, c.code) << r.err;
        EXPECT_NE(r.err.find(c.msg), std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");
        EXPECT_FALSE(std::filesystem::exists(dir.path("c.gguf")));
    }
    EXPECT_TRUE(file_bytes(m) == before) << "the model file was changed";
    EXPECT_TRUE(std::filesystem::is_symlink(dir.path("link.gguf")));
    EXPECT_EQ(temporaries(dir.dir()), std::vector<std::string>{});

    // A split set: any shard names the set (llama-quantize itself loads only the first).
    CmdResult r = run_cmd(sh_quote(llama_tool()) + " llama-gguf-split --split --split-max-tensors 20 " +
                          sh_quote(m) + " " + sh_quote(dir.path("sp")));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string s1 = dir.path("sp-00001-of-00003.gguf"), s2 = dir.path("sp-00002-of-00003.gguf");
    r = run_cmd(mf + "-m " + sh_quote(s2) + " -o " + dir.path("c2.gguf") + " -t 1");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run_cmd(mf + "-m " + sh_quote(s1) + " -o " + dir.path("c1.gguf") + " -t 1");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(file_bytes(dir.path("c1.gguf")) == file_bytes(dir.path("c2.gguf")));
    r = run_cmd(mf + "-m " + sh_quote(s1) + " -o " + dir.path("sp-00003-of-00003.gguf"));
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("is the model file " + dir.path("sp-00003-of-00003.gguf")),
              std::string::npos)
        << r.err;
    // The companion of the set works with the set.
    StatsRun sr = run_with_stats(s2, kRouterPrompt, 8, "--miss-fallback " + dir.path("c2.gguf"));
    EXPECT_EQ(sr.rc, 0) << sr.err;
}

// make-fallback ended by a signal while llama-quantize runs: the tool dies with it and no
// temporary file is left. The tool is a script that records its pid and sleeps; control: the
// temporaries exist while it runs (so the final check can see them).
TEST(MakeFallbackInput, SignalEndsTheToolAndRemovesTheTemporaries) {
    TempDir dir("mkfb-sig");
    const std::string tool = dir.path("slow-quantize.sh"), pidf = dir.path("tool.pid");
    {
        std::ofstream t(tool);
        t << "#!/bin/sh\necho $$ > " << pidf << "\nexec sleep 600\n";  // outlives the 60 s bound below
    }
    ASSERT_EQ(chmod(tool.c_str(), 0755), 0);
    for (int sig : {SIGTERM, SIGINT}) {
        SCOPED_TRACE(sig);
        std::remove(pidf.c_str());
        const pid_t pid = fork();
        if (pid == 0) {
            execl(cli_bin().c_str(), "moestream", "make-fallback", "-m", model().c_str(), "-o",
                  dir.path("c.gguf").c_str(), "--quantize-tool", tool.c_str(), (char *)nullptr);
            _exit(127);
        }
        ASSERT_GT(pid, 0);
        std::string tool_pid;
        for (int i = 0; i < 600 && tool_pid.empty(); ++i) {
            usleep(50000);
            tool_pid = file_bytes(pidf);
        }
        ASSERT_FALSE(tool_pid.empty()) << "the tool did not start";
        EXPECT_FALSE(temporaries(dir.dir()).empty()) << "control: the log is there while it runs";
        kill(pid, sig);
        int st = 0;
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
        EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << st;
        const pid_t tp = pid_t(std::stol(tool_pid));
        bool gone = false;
        for (int i = 0; i < 1200 && !gone; ++i) {  // 60 s: only a hang (no latency claim)
            gone = kill(tp, 0) != 0;
            if (!gone) usleep(50000);
        }
        EXPECT_TRUE(gone) << "llama-quantize (pid " << tp << ") outlived make-fallback";
        if (!gone) kill(tp, SIGKILL);
        EXPECT_EQ(temporaries(dir.dir()), std::vector<std::string>{});
        EXPECT_FALSE(std::filesystem::exists(dir.path("c.gguf")));
    }
}

// A companion that is no file (a FIFO: it must not hang, a directory) or an empty name is
// refused with one line, in run, eval and chat; a model that is a FIFO too. Control: the
// real companion runs.
TEST(FallbackGate, CompanionThatIsNoFileIsRefusedInRunEvalAndChat) {
    TempDir dir("fb-special");
    const std::string m = model();
    const std::string c = companion(m, "a");
    const std::string fifo = dir.path("c.fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    const std::string text = dir.path("text.txt");
    { std::ofstream(text) << "The expert streaming engine reads only what the router selects."; }
    const std::string bin = "timeout 60 " + sh_quote(cli_bin());
    const std::string cmds[] = {
        bin + " run -m " + sh_quote(m) + " -p hi -n 2",
        bin + " eval -m " + sh_quote(m) + " -f " + sh_quote(text) + " --max-tokens 8",
        "echo hi | " + bin + " chat -m " + sh_quote(m) + " -n 2",
    };
    for (const std::string & cmd : cmds) {
        struct {
            std::string flag;
            int code;
            std::string msg;
        } cases[] = {
            {"--miss-fallback " + fifo, 2, "--miss-fallback " + fifo + ": " + fifo +
                                               ": not a regular file (a FIFO)"},
            {"--miss-fallback " + dir.dir(), 2, "not a regular file (a directory)"},
            {"--miss-fallback ''", 64, "--miss-fallback needs a file (the value is empty)"},
            {"--miss-fallback ''  --fallback-threshold 0.5", 64, "--miss-fallback needs a file"},
        };
        for (const auto & k : cases) {
            SCOPED_TRACE(cmd + " " + k.flag);
            CmdResult r = run_cmd(cmd + " " + k.flag);
            EXPECT_EQ(r.exit_code, k.code) << r.err;
            EXPECT_NE(r.err.find(k.msg), std::string::npos) << r.err;
        }
        CmdResult ok = run_cmd(cmd + " --miss-fallback " + sh_quote(c));
        EXPECT_EQ(ok.exit_code, 0) << cmd << "\n" << ok.err;
    }
    CmdResult r = run_cmd(bin + " run -m " + sh_quote(fifo) + " -p hi -n 2");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("not a regular file (a FIFO): a model is read from a file"),
              std::string::npos)
        << r.err;
}
