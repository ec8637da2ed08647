// test_memory_limits.cpp — moestream under memory limits (docs/reliability.md, "Memory limits").
//
// cgroup tests: each run of the CLI goes into a fresh child memory cgroup of this process's own
// (cgroup v1 memory controller; the test needs to be able to create one, i.e. root, and skips
// with the reason otherwise). The model is the tiny synth preset with f32 experts: 96 MiB of
// experts, 12 MiB routed per token, so the budgets below evict.
//  - `--cache-mb auto` under limits of several sizes: never OOM-killed, exit 0, the budget comes
//    from the cgroup and the tokens equal the unconstrained cache-off run's;
//  - an explicit budget under a limit of (the cache-off run's peak + budget + margin): no OOM
//    kill. Negative control: the same budget under (peak + budget / 4) is OOM-killed, so the
//    harness does see the kernel's OOM kills and the limit does bind.
// Refused commits, in process: RLIMIT_DATA lowered under what the cache holds makes the
// kernel refuse the cache's mprotect(PROT_READ|WRITE) with ENOMEM; the cache must shrink and
// the generation continue with the same tokens.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "moestream/moestream.h"
#include "test_util.h"

using namespace moestream;
using namespace moestream::test;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
const char * kPrompt = "Memory limits must never kill the run";

std::string read_text(const std::string & p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

uint64_t field(const std::string & text, const std::string & key) {
    std::istringstream in(text);
    std::string k;
    uint64_t v;
    while (in >> k >> v)
        if (k == key) return v;
    return 0;
}

// A child memory cgroup (v1) of this process's own; removed on destruction.
class Cgroup {
public:
    static std::string own_memory_dir(std::string * why) {
        std::ifstream f("/proc/self/cgroup");
        std::string line;
        while (std::getline(f, line)) {
            const size_t a = line.find(':'), b = line.find(':', a + 1);
            if (a == std::string::npos || b == std::string::npos) continue;
            const std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
            if (ctl == "memory" || ctl.find("memory,") == 0 || ctl.find(",memory") != std::string::npos) {
                const std::string d = "/sys/fs/cgroup/memory" + (path == "/" ? std::string() : path);
                if (fs::exists(d + "/memory.limit_in_bytes")) return d;
            }
        }
        *why = "no cgroup v1 memory controller for this process (only v1 is supported here)";
        return "";
    }

    bool create(const std::string & tag, std::string * why) {
        const std::string parent = own_memory_dir(why);
        if (parent.empty()) return false;
        dir_ = parent + "/moestream-test-" + std::to_string(getpid()) + "-" + tag;
        if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
            *why = "cannot create " + dir_ + ": " + std::strerror(errno) + " (needs root)";
            dir_.clear();
            return false;
        }
        write("memory.swappiness", "0");  // no swap to hide in (best effort)
        return true;
    }
    ~Cgroup() {
        if (!dir_.empty()) ::rmdir(dir_.c_str());
    }
    bool write(const std::string & file, const std::string & v) {
        std::ofstream f(dir_ + "/" + file);
        f << v;
        f.flush();
        return bool(f);
    }
    bool limit(uint64_t bytes) { return write("memory.limit_in_bytes", std::to_string(bytes)); }
    uint64_t peak() const { return std::stoull(read_text(dir_ + "/memory.max_usage_in_bytes")); }
    uint64_t oom_kills() const { return field(read_text(dir_ + "/memory.oom_control"), "oom_kill"); }
    const std::string & dir() const { return dir_; }

    // Runs `args` (appended to the CLI) as the only process of this cgroup.
    CmdResult run(const std::string & args, const std::string & env = "") {
        const std::string cmd = "echo $$ > " + sh_quote(dir_ + "/cgroup.procs") + " && " + env +
                                " exec " + sh_quote(cli_bin()) + " " + args;
        return run_cmd("sh -c " + sh_quote(cmd));
    }

private:
    std::string dir_;
};

std::string run_args(const std::string & model, const std::string & cache, const std::string & json) {
    return "run -m " + sh_quote(model) + " -p " + sh_quote(kPrompt) + " -n 24 -t 1 -c 128 " + cache +
           " --stats-json " + sh_quote(json);
}

nlohmann::json stats(const std::string & path) {
    return nlohmann::json::parse(read_text(path), nullptr, false);
}

#define NEED_CGROUP(cg, tag)                                              \
    Cgroup cg;                                                            \
    {                                                                     \
        std::string why;                                                  \
        if (!cg.create(tag, &why)) GTEST_SKIP() << "no memory cgroup: " << why; \
    }

// The cgroup peak and the tokens of the cache-off run, in a cgroup of its own. Without prefill
// read-ahead, whose second slot set the cache-off run alone would add to the peak that limits
// are set from.
void cache_off_peak(const std::string & model, const std::string & json, const std::string & tag,
                    uint64_t * base, std::string * want) {
    NEED_CGROUP(cg, tag);
    CmdResult r = cg.run(run_args(model, "--cache-mb 0 --no-prefill-readahead", json));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    *base = cg.peak();
    *want = r.out;
}

TEST(MemoryLimits, CacheAutoUnderCgroupLimitsIsNeverOomKilled) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    const std::string json = models_dir() + "/memlim-" + std::to_string(getpid()) + ".json";
    // Reference: unconstrained, cache off.
    CmdResult ref = run_cmd(sh_quote(cli_bin()) + " " + run_args(model, "--cache-mb 0", json));
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    const std::string want = ref.out;
    ASSERT_FALSE(want.empty());
    // 300 MiB: below auto's 512 MiB floor (cache off); 580, 600: a cache smaller than the 96 MiB
    // of experts (evicting); 1024: every expert fits.
    for (uint64_t limit_mib : {300, 580, 600, 1024}) {
        SCOPED_TRACE("limit " + std::to_string(limit_mib) + " MiB");
        NEED_CGROUP(cg, "auto-" + std::to_string(limit_mib));
        ASSERT_TRUE(cg.limit(limit_mib * kMiB));
        CmdResult r = cg.run(run_args(model, "--cache-mb auto", json));
        EXPECT_EQ(cg.oom_kills(), 0u);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, want);
        EXPECT_LE(cg.peak(), limit_mib * kMiB);
        const auto j = stats(json);
        ASSERT_TRUE(j.is_object());
        const std::string reason = j["cache_budget_reason"];
        EXPECT_NE(reason.find("cgroup v1"), std::string::npos) << reason;
        const uint64_t budget = j["cache_budget_bytes"];
        if (limit_mib == 300) {
            EXPECT_EQ(budget, 0u) << reason;
        }
        if (limit_mib == 580 || limit_mib == 600) {
            EXPECT_GT(budget, 0u) << reason;
            EXPECT_LT(budget, 96 * kMiB) << reason;
            EXPECT_GT(uint64_t(j["evictions"]), 0u);
        }
        if (budget > 0) {  // at most one layer's routed set (4 x 768 KiB) above the budget
            EXPECT_LE(uint64_t(j["peak_resident_expert_bytes"]), budget + 4 * kMiB);
        }
        std::printf("limit %llu MiB: budget %llu MiB, cgroup peak %.1f MiB\n",
                    (unsigned long long)limit_mib, (unsigned long long)(budget >> 20),
                    double(cg.peak()) / kMiB);
    }
    fs::remove(json);
}

TEST(MemoryLimits, ExplicitBudgetFitsOrIsClampedAndNegativeControlIsOomKilled) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    const std::string json = models_dir() + "/memlim2-" + std::to_string(getpid()) + ".json";
    uint64_t base = 0;
    std::string want;
    cache_off_peak(model, json, "base", &base, &want);
    if (HasFatalFailure() || IsSkipped()) return;
    const uint64_t budget = 64 * kMiB;
    const std::string cache = "--cache-mb 64 --force-cache --no-prefill-readahead";
    {
        NEED_CGROUP(cg, "fits");
        const uint64_t limit = base + budget + 16 * kMiB;
        ASSERT_TRUE(cg.limit(limit));
        CmdResult r = cg.run(run_args(model, cache, json));
        EXPECT_EQ(cg.oom_kills(), 0u);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, want);
        const auto j = stats(json);
        EXPECT_GT(uint64_t(j["evictions"]), 0u);
        std::printf("cache off peak %.1f MiB; budget 64 MiB under %.1f MiB: cgroup peak %.1f MiB\n",
                    double(base) / kMiB, double(limit) / kMiB, double(cg.peak()) / kMiB);
    }
    for (const uint64_t over : {budget / 4, budget / 2}) {
        // The same budget under a limit it cannot fit in: clamped to what fits, or the cache
        // off when that is below 1.5 x the working set (a warning, the reason in the stats),
        // exit 0, the same tokens, no OOM kill. Not base + 3/4 budget: the cache-off peak
        // includes read buffers a cached run does without, and 64 MiB was seen to fit there
        // (engine estimate 66 MiB available, cgroup peak 76.9 of 88 MiB).
        NEED_CGROUP(cg, "clamp");
        ASSERT_TRUE(cg.limit(base + over));
        CmdResult r = cg.run(run_args(model, cache, json));
        EXPECT_EQ(cg.oom_kills(), 0u);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, want);
        EXPECT_NE(r.err.find("warning: expert cache: --cache-mb 64"), std::string::npos) << r.err;
        const auto j = stats(json);
        const std::string why = j["cache_budget_reason"].get<std::string>();
        EXPECT_LT(uint64_t(j["cache_budget_bytes"]), budget);
        EXPECT_TRUE(why.find("clamped to") != std::string::npos ||
                    why.find("does not fit") != std::string::npos)
            << why;
        std::printf("--cache-mb 64 under %.1f MiB: %s; cgroup peak %.1f MiB\n",
                    double(base + over) / kMiB, why.c_str(), double(cg.peak()) / kMiB);
    }
    {
        // Negative control: without the clamp (test knob) the same run is OOM-killed, so the
        // limit binds and the harness sees the kernel's kills.
        NEED_CGROUP(cg, "oom");
        ASSERT_TRUE(cg.limit(base + budget / 4));
        CmdResult r = cg.run(run_args(model, cache, json), "MOESTREAM_DEBUG_NO_BUDGET_CLAMP=1");
        EXPECT_EQ(r.exit_code, 128 + 9) << "expected an OOM kill (SIGKILL): " << r.err;
        EXPECT_GE(cg.oom_kills(), 1u);
    }
    fs::remove(json);
}

// The page pool's warm-up (docs/cache.md, "Pool warm-up") zero-fills up to the budget's worth
// of pages before the first routing needs them. Under a limit of (the cache-off run's peak +
// budget + margin), as in the test above, it runs (it warmed pages, misses took them), never
// more than the budget, with no OOM kill, the same tokens, and the cgroup's peak within the
// limit; the run without it (MOESTREAM_POOL_WARM=0) is the control of the counters. Negative
// control: the same run under (peak + budget / 4) without the budget clamp is OOM-killed, so
// the limit binds the warmed pages too.
TEST(MemoryLimits, PoolWarmUpStaysWithinTheBudget) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    const std::string json = models_dir() + "/memlim4-" + std::to_string(getpid()) + ".json";
    uint64_t base = 0;
    std::string want;
    cache_off_peak(model, json, "wbase", &base, &want);
    if (HasFatalFailure() || IsSkipped()) return;
    const uint64_t budget = 64 * kMiB;
    const std::string cache = "--cache-mb 64 --force-cache --no-prefill-readahead";
    for (const char * warm : {"1", "0"}) {
        SCOPED_TRACE(std::string("MOESTREAM_POOL_WARM=") + warm);
        NEED_CGROUP(cg, std::string("warm") + warm);
        const uint64_t limit = base + budget + 16 * kMiB;
        ASSERT_TRUE(cg.limit(limit));
        CmdResult r = cg.run(run_args(model, cache, json), std::string("MOESTREAM_POOL_WARM=") + warm);
        EXPECT_EQ(cg.oom_kills(), 0u);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, want);
        EXPECT_LE(cg.peak(), limit);
        const auto j = stats(json);
        ASSERT_TRUE(j.is_object());
        const uint64_t warmed = j["cache_pool_warm_bytes"], commits = j["cache_warmed_commits"];
        if (std::string(warm) == "1") {
            EXPECT_GT(warmed, 0u);
            EXPECT_GT(commits, 0u);
        } else {
            EXPECT_EQ(warmed, 0u);
            EXPECT_EQ(commits, 0u);
        }
        EXPECT_LE(warmed, budget);
        EXPECT_LE(uint64_t(j["cache_pool_bytes"]), budget);
        EXPECT_LE(uint64_t(j["peak_resident_expert_bytes"]), budget);
        EXPECT_GT(uint64_t(j["evictions"]), 0u);
        std::printf("MOESTREAM_POOL_WARM=%s: warmed %.1f MiB, %llu warmed commits; cache off peak "
                    "%.1f MiB, limit %.1f MiB, cgroup peak %.1f MiB\n",
                    warm, double(warmed) / kMiB, (unsigned long long)commits, double(base) / kMiB,
                    double(limit) / kMiB, double(cg.peak()) / kMiB);
    }
    {
        NEED_CGROUP(cg, "woom");
        ASSERT_TRUE(cg.limit(base + budget / 4));
        CmdResult r = cg.run(run_args(model, cache, json),
                             "MOESTREAM_POOL_WARM=1 MOESTREAM_DEBUG_NO_BUDGET_CLAMP=1");
        EXPECT_EQ(r.exit_code, 128 + 9) << "expected an OOM kill (SIGKILL): " << r.err;
        EXPECT_GE(cg.oom_kills(), 1u);
    }
    fs::remove(json);
}

// A context and batch whose KV cache and attention mask cannot fit under the limit: a usage
// error before loading (exit 64, naming -c and --batch), never an OOM kill. Control: the
// default context under the same limit runs.
// With the cache off the run holds the dense weights and one layer's expert slots (24 MiB on
// this model) besides the context: a limit that leaves less once the context is made is
// refused before anything is read (exit 64, naming both), not OOM-killed mid-run. Control:
// the same run under the cache-off peak plus a margin decodes the same tokens.
TEST(MemoryLimits, CacheOffThatCannotHoldItsSlotsIsRefusedNotKilled) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    const std::string json = models_dir() + "/memlim-off-" + std::to_string(getpid()) + ".json";
    uint64_t base = 0;
    std::string want;
    cache_off_peak(model, json, "offbase", &base, &want);
    if (HasFatalFailure() || IsSkipped()) return;
    const std::string off = "--cache-mb 0 --no-prefill-readahead";
    {
        NEED_CGROUP(cg, "offshort");
        ASSERT_TRUE(cg.limit(base - 12 * kMiB));  // half the slots short of the peak
        CmdResult r = cg.run(run_args(model, off, json));
        EXPECT_EQ(cg.oom_kills(), 0u);
        EXPECT_EQ(r.exit_code, 64) << r.err;
        EXPECT_NE(r.err.find("cannot hold the run with the cache off"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("expert slots"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("available (cgroup"), std::string::npos) << r.err;
        EXPECT_EQ(r.err.find("RunOptions::"), std::string::npos) << r.err;
    }
    NEED_CGROUP(cg, "offok");
    ASSERT_TRUE(cg.limit(base + 8 * kMiB));
    CmdResult r = cg.run(run_args(model, off, json));
    EXPECT_EQ(cg.oom_kills(), 0u);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want);
    fs::remove(json);
}

TEST(MemoryLimits, ContextThatCannotFitIsRefusedBeforeLoading) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string json = models_dir() + "/memlim3-" + std::to_string(getpid()) + ".json";
    for (const char * args : {"-c 1048576 --batch 65536", "-c 4194304 --batch 512"}) {
        NEED_CGROUP(cg, "ctx");
        ASSERT_TRUE(cg.limit(700 * kMiB));
        CmdResult r = cg.run("run -m " + sh_quote(model) + " -p hi -n 2 --cache-mb 0 " + args);
        EXPECT_EQ(cg.oom_kills(), 0u);
        EXPECT_EQ(r.exit_code, 64) << r.err;
        EXPECT_NE(r.err.find("cannot fit: the KV cache"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("available (cgroup"), std::string::npos) << r.err;
    }
    NEED_CGROUP(cg, "ctxok");
    ASSERT_TRUE(cg.limit(700 * kMiB));
    CmdResult r = cg.run(run_args(model, "--cache-mb 0", json));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(cg.oom_kills(), 0u);
    fs::remove(json);
}

// RLIMIT_DATA counts private writable mappings: lowering it below what the cache has committed
// makes the kernel refuse the cache's next mprotect(PROT_READ|PROT_WRITE) with ENOMEM.
// Resident without mapping, the context left to the model: weights larger than the limit are
// refused before loading (exit 64, naming the weights and the flags that would fit), not
// OOM-killed. Control: the same command under a limit that holds them runs.
TEST(MemoryLimits, ResidentWeightsThatCannotFitAreRefusedBeforeLoading) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");  // ~100 MiB of weights
    const std::string args = "run -m " + sh_quote(model) + " -p hi -n 2 --no-stream --no-mmap";
    {
        NEED_CGROUP(cg, "resw");
        ASSERT_TRUE(cg.limit(64 * kMiB));
        CmdResult r = cg.run(args);
        EXPECT_EQ(cg.oom_kills(), 0u);
        EXPECT_EQ(r.exit_code, 64) << r.err;
        EXPECT_NE(r.err.find("the weights ("), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("drop --no-mmap"), std::string::npos) << r.err;
        EXPECT_EQ(r.err.find("RunOptions::"), std::string::npos) << r.err;
    }
    NEED_CGROUP(cg, "reswok");
    ASSERT_TRUE(cg.limit(700 * kMiB));
    CmdResult r = cg.run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(cg.oom_kills(), 0u);
}

TEST(MemoryLimits, RefusedCommitShrinksTheCacheAndKeepsTheTokens) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    RunOptions o;
    o.model_path = model;
    o.n_threads = 1;
    o.n_ctx = 256;
    o.cache_mb = 64;
    o.force_cache = true;
    o.cache_debug = true;  // page protection: commits are mprotect calls; poison + residency checks
    // RLIMIT_DATA counts private writable mappings only, not the page pool's shared memory:
    // fresh anonymous pages (the pool's refusals are tested in test_residency_cache).
    o.cache_recycle = false;
    std::unique_ptr<Engine> ref, e;
    ASSERT_TRUE(Engine::open(o, &e).ok());
    RunOptions ro = o;
    ro.cache_mb = 0;
    ro.cache_debug = false;
    ASSERT_TRUE(Engine::open(ro, &ref).ok());
    const char * prompts[] = {"Once upon a time", "The flash device answered slowly"};
    GenerateResult want[2], got[2];
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(ref->generate(prompts[i], 24, nullptr, &want[i]).ok());

    ASSERT_TRUE(e->generate(prompts[0], 24, nullptr, &got[0]).ok());
    EXPECT_EQ(got[0].tokens, want[0].tokens);
    const uint64_t held = e->stats().resident_expert_bytes;
    ASSERT_GT(held, 40 * kMiB) << "the first prompt should fill most of the 64 MiB";

    const std::string status = read_text("/proc/self/status");
    const uint64_t vm_data = field(status.substr(status.find("VmData:")), "VmData:") * 1024;
    ASSERT_GT(vm_data, 0u);
    struct rlimit old;
    ASSERT_EQ(getrlimit(RLIMIT_DATA, &old), 0);
    struct rlimit lim = old;
    lim.rlim_cur = vm_data - 24 * kMiB;  // the cache has to give back at least 24 MiB
    ASSERT_EQ(setrlimit(RLIMIT_DATA, &lim), 0);
    Status st = e->generate(prompts[1], 24, nullptr, &got[1]);
    ASSERT_EQ(setrlimit(RLIMIT_DATA, &old), 0);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(got[1].tokens, want[1].tokens);
    const RunStats & s = e->stats();
    EXPECT_GT(s.cache_commit_failures, 0u);
    EXPECT_LT(s.cache_budget_now_bytes, 64 * kMiB - 16 * kMiB);
    EXPECT_LE(s.resident_expert_bytes, s.cache_budget_now_bytes + 12 * kMiB);
    std::printf("held %.1f MiB; after RLIMIT_DATA = VmData - 24 MiB: %llu refused commits, budget %.1f MiB\n",
                double(held) / kMiB, (unsigned long long)s.cache_commit_failures,
                double(s.cache_budget_now_bytes) / kMiB);
}

}  // namespace
