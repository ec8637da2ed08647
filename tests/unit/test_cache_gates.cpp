// test_cache_gates.cpp — the LRU cache's budget is real, end to end through the engine.
// A tiny f32 model whose experts (96 MiB) far exceed an 8 MiB budget is streamed for 48 tokens.
// The kernel's own high-water mark of the process's RSS (VmHWM, i.e. sampled continuously)
// must stay within what cache off needs (one layer's shared slots, 24 MiB) — and a budget that
// holds every expert must show the difference (the negative control: the measurement can see
// cached experts). Expert memory committed by the cache never exceeds budget + one layer's
// routed set.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

// One CLI run with `env` before the command: its --stats-json, with its stdout as "stdout".
json run_env(const std::string & env, const std::string & model, const std::string & flags,
             int n_tokens = 48) {
    static int n = 0;
    std::string path = models_dir() + "/cachegate-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".json";
    CmdResult r = run_cmd(env + " " + sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p A -n " +
                          std::to_string(n_tokens) + " -t 1 " + flags + " --stats-json " + path);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return json();
    std::ifstream f(path);
    json j = json::parse(f);
    std::remove(path.c_str());
    j["stdout"] = r.out;
    return j;
}

json run(const std::string & model, const std::string & flags) { return run_env("", model, flags); }

constexpr double kMiB = 1024.0 * 1024.0;

TEST(CacheBudget, RssStaysWithinBudgetWhileStreamingAModelLargerThanIt) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    CmdResult ins = run_cmd(sh_quote(cli_bin()) + " inspect --json -m " + sh_quote(model));
    ASSERT_EQ(ins.exit_code, 0);
    json m = json::parse(ins.out);
    const double layer_set = double(m["n_expert_used"].get<uint64_t>() * m["expert_bytes"].get<uint64_t>());
    const double experts_total = double(m["expert_bytes_total"].get<uint64_t>());
    ASSERT_GT(experts_total, 64 * kMiB);

    json off = run(model, "--cache-mb 0");
    json small = run(model, "--cache-mb 8 --force-cache");
    json all = run(model, "--cache-mb 1000000");
    ASSERT_FALSE(off.is_null());
    ASSERT_FALSE(small.is_null());
    ASSERT_FALSE(all.is_null());
    // Lossless in every mode.
    EXPECT_EQ(small["logits_sha"], off["logits_sha"]);
    EXPECT_EQ(all["logits_sha"], off["logits_sha"]);

    // The cache's own accounting: committed expert memory <= budget + the widest routed layer
    // set (the prefill of n_prompt tokens routes up to n_prompt x k experts in a layer).
    const double budget = double(small["cache_budget_bytes"].get<int64_t>());
    EXPECT_EQ(budget, 8 * kMiB);
    const double widest = std::min<double>(double(m["n_expert"].get<uint64_t>()),
                                           double(small["n_prompt"].get<int>()) * double(m["n_expert_used"].get<uint64_t>())) *
                          (layer_set / double(m["n_expert_used"].get<uint64_t>()));
    EXPECT_LE(double(small["peak_resident_expert_bytes"].get<uint64_t>()), budget + std::max(widest, layer_set) + 4096);
    EXPECT_GT(small["evictions"].get<uint64_t>(), 0u);

    // The process: peak RSS with an 8 MiB cache is no larger than with the cache off (whose
    // shared slots hold 24 MiB) plus slack, while the budget that holds everything costs at
    // least 40 MiB more — the measurement sees cached experts.
    const double rss_off = double(off["peak_rss_bytes"].get<uint64_t>());
    const double rss_small = double(small["peak_rss_bytes"].get<uint64_t>());
    const double rss_all = double(all["peak_rss_bytes"].get<uint64_t>());
    EXPECT_LE(rss_small, rss_off + 4 * kMiB) << "small " << rss_small / kMiB << " MiB, off " << rss_off / kMiB;
    EXPECT_GE(rss_all - rss_small, 40 * kMiB) << "all " << rss_all / kMiB << " MiB, small " << rss_small / kMiB;
    EXPECT_GT(all["cache_hit_pct"].get<double>(), small["cache_hit_pct"].get<double>());
}

// The rule is relative to the model: 0, or at least 1.5 x its per-token working set; inspect,
// run's refusal, the drop-cold error and the settings (the server's) state it in the same words.
TEST(CacheBudget, RuleRejectsOnlyBelowOneAndAHalfWorkingSetsInOneWording) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CmdResult ins = run_cmd(sh_quote(cli_bin()) + " inspect --json -m " + sh_quote(model));
    ASSERT_EQ(ins.exit_code, 0);
    const json m = json::parse(ins.out);
    const uint64_t ws = m["token_working_set_bytes"].get<uint64_t>();
    const uint64_t min_mib = ((ws + (ws + 1) / 2) + (1u << 20) - 1) >> 20;
    EXPECT_EQ(m["cache_min_mib"].get<uint64_t>(), min_mib);
    const std::string rule = m["cache_rule"].get<std::string>();
    EXPECT_NE(rule.find(">= " + std::to_string(min_mib) + " MiB"), std::string::npos) << rule;
    CmdResult human = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(model));
    EXPECT_NE(human.out.find("cache rule    " + rule), std::string::npos) << human.out;
    // What auto would choose now, and the decode bound from MiB/token, are printed too.
    EXPECT_LE(m["cache_auto_mib_now"].get<uint64_t>(), m["cache_all_experts_mib"].get<uint64_t>());
    EXPECT_NE(human.out.find("cache auto    "), std::string::npos) << human.out;
    EXPECT_NE(human.out.find("decode bound  cache off: "), std::string::npos) << human.out;

    const std::string cmd = sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p A -n 2 ";
    CmdResult r = run_cmd(cmd + "--cache-mb " + std::to_string(min_mib - 1));
    EXPECT_EQ(r.exit_code, 64);
    EXPECT_NE(r.err.find(rule), std::string::npos) << r.err;
    // Control: the rule's own minimum, and a budget far above the old fixed band's 1500, run.
    r = run_cmd(cmd + "--cache-mb " + std::to_string(min_mib));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run_cmd(cmd + "--cache-mb " + std::to_string(min_mib - 1) + " --force-cache");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run_cmd(cmd + "--cache-mb 0 --drop-cold-experts 0.5");
    EXPECT_EQ(r.exit_code, 64);
    EXPECT_NE(r.err.find("Give --cache-mb " + std::to_string(min_mib) + " or more (the cache rule: " + rule), std::string::npos) << r.err;
    json j = run(model, "--cache-mb " + std::to_string(min_mib));
    ASSERT_FALSE(j.is_null());
    EXPECT_EQ(j["settings"]["cache_rule"], rule);
    EXPECT_EQ(j["settings"]["cache_rule_min_mib"], min_mib);
    r = run_cmd(cmd + "--cache-mb lots");
    EXPECT_EQ(r.exit_code, 64);
}

TEST(CacheBudget, AutoPrintsItsChoice) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    json j = run(model, "");
    ASSERT_FALSE(j.is_null());
    EXPECT_EQ(j["settings"]["cache_mb_requested"], "auto");
    EXPECT_NE(j["cache_budget_reason"].get<std::string>().find("auto"), std::string::npos);
}

}  // namespace

// The page pool's warm-up (docs/cache.md, "Pool warm-up") is lossless: an evicting cache (8 MiB
// of 96 MiB of experts) gives the same tokens and the same logits hash with it on and off,
// plain and with --cache-debug (poison + residency checks on every routing), and with it on
// the misses did take warmed chunks (MOESTREAM_DEBUG_POOL_WARM_WAIT: the warm-up is done
// before the first commit, so a loaded machine cannot starve it). Negative control: a corrupted expert
// (MOESTREAM_DEBUG_CORRUPT_EXPERT) changes the logits hash, so the comparison can fail.
TEST(CacheBudget, PoolWarmUpIsByteIdentical) {
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    for (const char * debug : {"", "--cache-debug"}) {
        SCOPED_TRACE(std::string("flags: ") + debug);
        const std::string flags = std::string("--cache-mb 8 --force-cache ") + debug;
        const json off = run_env("MOESTREAM_POOL_WARM=0", model, flags);
        const json on =
            run_env("MOESTREAM_POOL_WARM=1 MOESTREAM_DEBUG_POOL_WARM_WAIT=1", model, flags);
        ASSERT_TRUE(off.is_object() && on.is_object());
        EXPECT_EQ(on["logits_sha"], off["logits_sha"]);
        EXPECT_EQ(on["stdout"], off["stdout"]);
        EXPECT_EQ(uint64_t(off["cache_warmed_commits"]), 0u);
        EXPECT_GT(uint64_t(on["cache_warmed_commits"]), 0u);
        EXPECT_GT(uint64_t(on["cache_pool_warm_bytes"]), 0u);
        EXPECT_LE(uint64_t(on["cache_pool_warm_bytes"]), uint64_t(on["cache_budget_bytes"]));
        EXPECT_GT(uint64_t(on["evictions"]), 0u);
        EXPECT_EQ(on["settings"]["cache_pool_warm"], true);
        EXPECT_EQ(off["settings"]["cache_pool_warm"], false);
    }
    const json bad = run_env("MOESTREAM_POOL_WARM=1 MOESTREAM_DEBUG_CORRUPT_EXPERT=0:*", model,
                             "--cache-mb 8 --force-cache");
    const json good = run_env("MOESTREAM_POOL_WARM=1", model, "--cache-mb 8 --force-cache");
    ASSERT_TRUE(bad.is_object() && good.is_object());
    EXPECT_NE(bad["logits_sha"], good["logits_sha"]);
}
