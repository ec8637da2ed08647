// test_lossy_gates.cpp — the opt-in lossy knobs (docs/lossy-knobs.md), end to end via the CLI.
//  - deferral is transparent: a drop threshold below any producible weight gives byte-identical
//    output to dropping off, records zero drops, and learns the expected terminal node of the
//    weight chain for each synth architecture (softmax+norm, softmax only, sigmoid+norm);
//  - full strength (F = 1) against a cache that evicts on every token, with poison and residency
//    checks on, never reaches an unloaded slot, and really changes the output (negative control);
//  - at top-k 1 dropping is a no-op (top expert pinned; threshold tracks the effective k);
//  - --n-expert-used K gives llama-completion's tokens with --override-kv expert_used_count=K;
//  - dropping without the cache is refused with the reason.
#include <gtest/gtest.h>
#include <cstdio>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

json run_json(const std::string & model, const std::string & flags, int * exit_code = nullptr,
              std::string * err = nullptr, std::string * out = nullptr) {
    static int counter = 0;
    std::string path = models_dir() + "/lossy-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".json";
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p " + sh_quote(kRouterPrompt) +
                          " -n 32 -t 1 " + flags + " --stats-json " + path);
    if (exit_code) *exit_code = r.exit_code;
    if (err) *err = r.err;
    if (out) *out = r.out;
    if (r.exit_code != 0) {
        if (!err)
            std::fprintf(stderr, "moestream run %s: exit %d\n%s\n", flags.c_str(), r.exit_code,
                         r.err.c_str());
        return json();
    }
    std::ifstream f(path);
    json j = json::parse(f);
    std::remove(path.c_str());
    return j;
}

// An architecture and the graph node its drop-cold deferral must learn as terminal.
struct DropCase {
    std::string arch, terminal;
};
void PrintTo(const DropCase & c, std::ostream * os) { *os << c.arch << ' ' << c.terminal; }

class DropCold : public ::testing::TestWithParam<DropCase> {};

TEST_P(DropCold, DeferralIsTransparentAndLearnsTheTerminalNode) {
    const std::string model = synth_model("tiny", GetParam().arch, "q8_0");
    json off = run_json(model, "--cache-mb 4 --force-cache");
    json tiny = run_json(model, "--cache-mb 4 --force-cache --drop-cold-experts 1e-9");
    ASSERT_FALSE(off.is_null());
    ASSERT_FALSE(tiny.is_null());
    EXPECT_EQ(tiny["tokens"], off["tokens"]);
    EXPECT_EQ(tiny["logits_sha"], off["logits_sha"]);
    EXPECT_EQ(tiny["experts_dropped"].get<uint64_t>(), 0u);
    EXPECT_GT(tiny["drop_deferred"].get<uint64_t>(), 0u) << "loads were never deferred";
    EXPECT_EQ(tiny["drop_fallbacks"].get<uint64_t>(), 0u);
    EXPECT_EQ(tiny["drop_terminal"].get<std::string>(), GetParam().terminal);
    EXPECT_TRUE(tiny["settings"]["lossy"].get<bool>());  // opt-in knob: reported as lossy
}

TEST_P(DropCold, FullStrengthAgainstAnEvictingCacheNeverReadsUnloadedSlots) {
    const std::string model = synth_model("tiny", GetParam().arch, "q8_0");
    int rc = -1;
    std::string err;
    json lossless = run_json(model, "--cache-mb 1 --force-cache --cache-debug");
    json full = run_json(model, "--cache-mb 1 --force-cache --cache-debug --drop-cold-experts 1.0", &rc, &err);
    ASSERT_EQ(rc, 0) << err;
    ASSERT_FALSE(lossless.is_null());
    EXPECT_EQ(full["n_generated"].get<int>(), 32);
    EXPECT_GT(full["experts_dropped"].get<uint64_t>(), 0u);
    EXPECT_GT(full["weight_mass_dropped"].get<double>(), 0.0);
    EXPECT_LT(full["flash_bytes_read"].get<uint64_t>(), lossless["flash_bytes_read"].get<uint64_t>());
    // Negative control: dropping at full strength does change the output.
    EXPECT_NE(full["logits_sha"], lossless["logits_sha"]);
}

TEST_P(DropCold, TopKOneIsANoOp) {
    const std::string model = synth_model("tiny", GetParam().arch, "q8_0");
    json k1 = run_json(model, "--cache-mb 1 --force-cache --n-expert-used 1");
    json k1drop = run_json(model, "--cache-mb 1 --force-cache --n-expert-used 1 --drop-cold-experts 1.0");
    ASSERT_FALSE(k1.is_null());
    ASSERT_FALSE(k1drop.is_null());
    EXPECT_EQ(k1drop["experts_dropped"].get<uint64_t>(), 0u);
    EXPECT_GT(k1drop["experts_routed"].get<uint64_t>(), 0u);
    EXPECT_EQ(k1drop["logits_sha"], k1["logits_sha"]);
}

INSTANTIATE_TEST_SUITE_P(Tiny, DropCold,
                         ::testing::Values(DropCase{"qwen3moe", "ffn_moe_weights_norm"},
                                           DropCase{"olmoe", "ffn_moe_weights"},
                                           DropCase{"glm4moe", "ffn_moe_weights_norm"}),
                         [](const auto & i) { return i.param.arch; });

// Drop-cold on the fixed slots (the default store of a budget; no switch to the LRU cache;
// 12 MiB holds 6 slots per layer of the tiny model's 32 experts, so slots are evicted): the
// lossless run and the run with `drop`, both checked to be on the fixed slots.
std::pair<json, json> fixed_slot_runs(const std::string & drop) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    json off = run_json(model, "--cache-mb 12 --force-cache");
    json on = run_json(model, "--cache-mb 12 --force-cache --drop-cold-experts " + drop);
    EXPECT_FALSE(off.is_null());
    EXPECT_FALSE(on.is_null());
    if (!off.is_null() && !on.is_null()) {
        EXPECT_EQ(off["settings"]["cache_store"], "fixed slots");
        EXPECT_EQ(on["settings"]["cache_store"], "fixed slots");
    }
    return {off, on};
}

// A threshold below any weight is byte-identical to lossless, tokens and logits.
TEST(DropColdFixedSlots, BelowAnyWeightIsByteIdenticalToLossless) {
    const auto [off, tiny] = fixed_slot_runs("1e-9");
    ASSERT_FALSE(off.is_null() || tiny.is_null());
    EXPECT_EQ(tiny["tokens"], off["tokens"]);
    EXPECT_EQ(tiny["logits_sha"], off["logits_sha"]);
    EXPECT_EQ(tiny["experts_dropped"].get<uint64_t>(), 0u);
    EXPECT_GT(tiny["drop_deferred"].get<uint64_t>(), 0u) << "loads were never deferred";
}

// The negative control: at full strength it drops misses, reads less and changes the output.
TEST(DropColdFixedSlots, FullStrengthDropsAndChangesTheOutput) {
    const auto [off, full] = fixed_slot_runs("1.0");
    ASSERT_FALSE(off.is_null() || full.is_null());
    EXPECT_EQ(full["n_generated"].get<int>(), 32);
    EXPECT_GT(full["experts_dropped"].get<uint64_t>(), 0u);
    EXPECT_LT(full["flash_bytes_read"].get<uint64_t>(), off["flash_bytes_read"].get<uint64_t>());
    EXPECT_NE(full["logits_sha"], off["logits_sha"]);
}

TEST(DropColdRules, RefusedWithoutTheCache) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    int rc = 0;
    std::string err;
    run_json(model, "--cache-mb 0 --drop-cold-experts 0.5", &rc, &err);
    EXPECT_EQ(rc, 64);
    EXPECT_NE(err.find("needs an expert cache"), std::string::npos) << err;
    run_json(model, "--drop-cold-experts 1.5", &rc, &err);
    EXPECT_EQ(rc, 64);
    run_json(model, "--drop-renorm", &rc, &err);
    EXPECT_EQ(rc, 64);
}

// --no-mmap is a choice of the resident loader: with streaming it is refused, not ignored.
TEST(LoaderRules, NoMmapNeedsNoStream) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    int rc = 0;
    std::string err;
    run_json(model, "--no-mmap", &rc, &err);
    EXPECT_EQ(rc, 64);
    EXPECT_NE(err.find("--no-mmap applies to --no-stream"), std::string::npos) << err;
}

TEST(NExpertUsed, MatchesLlamaCompletionWithTheOverride) {
    for (const char * arch : {"qwen3moe", "olmoe"}) {
        SCOPED_TRACE(arch);
        const std::string model = synth_model("tiny", arch, "q8_0");
        json j = run_json(model, "--cache-mb 0 --n-expert-used 2");
        ASSERT_FALSE(j.is_null());
        EXPECT_EQ(j["settings"]["n_expert_used"].get<int>(), 2);
        EXPECT_TRUE(j["settings"]["lossy"].get<bool>());
        json full = run_json(model, "--cache-mb 0");
        EXPECT_LT(j["bytes_per_token"].get<double>(), full["bytes_per_token"].get<double>());
        EXPECT_NE(j["logits_sha"], full["logits_sha"]);
        // llama.cpp with the same override generates the same ids (its session file).
        LlamaCompletionIds ref = llama_completion_ids(
            "-m " + sh_quote(model) + " -p " + sh_quote(kRouterPrompt) +
            " -n 32 --temp 0 -s 1 -no-cnv --no-warmup -lm mmap --no-repack -t 1 -fit off "
            "--no-display-prompt --override-kv " + arch + ".expert_used_count=int:2");
        ASSERT_EQ(ref.exit_code, 0) << ref.err;
        EXPECT_TRUE(same_generation(ref.ids, j["n_prompt"].get<int>(),
                                    j["tokens"].get<std::vector<int32_t>>()));
        // Control: moestream's full top-k run generates other ids, which the comparison rejects.
        EXPECT_FALSE(same_generation(ref.ids, full["n_prompt"].get<int>(),
                                     full["tokens"].get<std::vector<int32_t>>()));
    }
}

}  // namespace
