// test_stream_gates.cpp — the lossless-streaming gates (issue: bind/route/load).
//
// For every synth architecture x expert type (tiny preset), several prompts including a
// multi-token prefill, 32 greedy tokens:
//   token ids AND every step's logits (FNV hash) AND the final logits (raw bytes) identical
//   between (a) --no-stream (llama.cpp's own loading, all resident), (b) streaming with
//   O_DIRECT, (c) streaming with buffered reads, (d) --io-threads 1 and 4, the read path without
//   overlap (--no-io-overlap), (f) the LRU cache
//   with a budget holding everything, with a 1 MiB budget that evicts on every token (poison
//   and residency checks on), and cache off, and the default (auto);
//   and generated token ids identical to (e) Debian's llama-completion run greedily (read from
//   its session file).
// Negative control: corrupting one routed slice on purpose must break the comparison.
// Read accounting: with buffered reads, bytes read per decoded token equal exactly what the
// routing predicts (MoE layers x k distinct experts x expert bytes); with O_DIRECT, that plus
// at most the alignment over-read.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_stats_run.h"
#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

struct RunOut {
    int exit_code = 0;
    std::string err;  // stderr
    json stats;
    std::string stdout_text;
    std::string logits;  // raw final logits bytes
    std::string csv;
};

const char * kPrompts[] = {
    "Once upon a time",
    "A",
    "The expert streaming engine reads only what the router selects, token after token, "
    "layer after layer, and the output must not change by a single bit.",
};

// Runs moestream; must_succeed: a non-zero exit fails the calling test.
RunOut run_moestream(const std::string & model, const std::string & prompt, const std::string & flags,
                  const std::string & env = "", bool must_succeed = true) {
    static int counter = 0;
    std::string base = models_dir() + "/gate-" + std::to_string(getpid()) + "-" +
                       std::to_string(counter++);
    std::string cmd = env + " " + sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p " +
                      sh_quote(prompt) + " -n 32 -t 1 " + flags + " --stats-json " + base +
                      ".json --dump-logits " + base + ".logits --stats-csv " + base + ".csv";
    CmdResult r = run_cmd(cmd);
    if (must_succeed) {
        EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
    }
    RunOut out;
    out.exit_code = r.exit_code;
    out.err = r.err;
    out.stdout_text = r.out;
    if (r.exit_code == 0) {
        out.stats = json::parse(slurp(base + ".json"));
        out.logits = slurp(base + ".logits");
        out.csv = slurp(base + ".csv");
    }
    std::remove((base + ".json").c_str());
    std::remove((base + ".logits").c_str());
    std::remove((base + ".csv").c_str());
    return out;
}

// Debian's llama-completion's greedy ids (prompt and 32 generated) for the same run.
LlamaCompletionIds llama_completion_gen(const std::string & model, const std::string & prompt) {
    LlamaCompletionIds r = llama_completion_ids(
        "-m " + sh_quote(model) + " -p " + sh_quote(prompt) +
        " -n 32 --temp 0 -s 1 -no-cnv --no-warmup -lm mmap --no-repack -t 1 -fit off --no-display-prompt");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
}


class StreamGate : public ::testing::TestWithParam<ArchCase> {};

TEST_P(StreamGate, ByteIdenticalToResidentAndToLlamaCompletion) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    for (const char * prompt : kPrompts) {
        SCOPED_TRACE(prompt);
        RunOut ref = run_moestream(model, prompt, "--no-stream");
        ASSERT_FALSE(ref.stats.is_null());
        ASSERT_EQ(ref.stats["n_generated"].get<int>(), 32) << "model stopped early; pick a prompt";
        ASSERT_EQ(ref.logits.size() % 4, 0u);
        ASSERT_GT(ref.logits.size(), 0u);
        // The resident reference read into memory instead of mapped (--no-mmap, the bench's
        // warm t_compute cell) computes the same bytes.
        if (prompt == kPrompts[2]) {
            RunOut nm = run_moestream(model, prompt, "--no-stream --no-mmap");
            ASSERT_FALSE(nm.stats.is_null());
            EXPECT_FALSE(nm.stats["settings"]["mmap"].get<bool>());
            EXPECT_TRUE(ref.stats["settings"]["mmap"].get<bool>());
            // Observed, not just the option: llama.cpp left the file mapped, or did not.
            EXPECT_EQ(nm.stats["settings"]["model_file_mapped_bytes"].get<uint64_t>(), 0u);
            EXPECT_GT(ref.stats["settings"]["model_file_mapped_bytes"].get<uint64_t>(), 0u);
            EXPECT_EQ(nm.stats["tokens"], ref.stats["tokens"]);
            EXPECT_EQ(nm.stats["logits_sha"], ref.stats["logits_sha"]);
            EXPECT_TRUE(nm.logits == ref.logits) << "--no-mmap: final logits differ";
        }
        // Room for 5-10 of the 32 slots per layer besides the shared slots for prompt
        // batches (more bytes per expert, more MiB).
        const std::string slot_mb = GetParam().type == std::string("f32")   ? "40"
                                    : GetParam().type == std::string("f16") ? "20"
                                    : GetParam().type == std::string("q8_0") ? "12"
                                                                             : "7";
        // Each run: its environment, its flags, and the store that must hold its budget
        // (settings.cache_store: the fixed slots by default, the LRU cache with what the slots
        // cannot run with or MOESTREAM_SLOT_CACHE=0).
        struct Variant {
            std::string env, flags, store;
        };
        const std::string slots = "fixed slots";
        // The full matrix on the long (multi-token prefill) prompt, the defaults on the others.
        std::vector<Variant> variants = {{"", "", slots}, {"", "--cache-mb 0", "off"}};
        if (prompt == kPrompts[2])
            variants = {
                {"", "", slots},  // the auto budget holds every expert in a slot
                {"", "--cache-mb 0", "off"},
                {"", "--cache-mb 0 --no-odirect", "off"},
                {"", "--cache-mb 0 --io-threads 1", "off"},
                {"", "--cache-mb 0 --io-threads 4", "off"},
                {"", "--cache-mb 0 --no-io-overlap", "off"},            // every read before gate/up
                {"", "--cache-mb 0 --prefetch", "off"},                 // second slot set
                {"", "--cache-mb 0 --io-threads 4 --prefetch", "off"},
                // The LRU cache: everything fits; evictions; + read-ahead; every token evicts.
                {"MOESTREAM_SLOT_CACHE=0", "--cache-mb 1000000", "lru"},
                {"MOESTREAM_SLOT_CACHE=0", "--cache-mb 4 --force-cache", "lru"},
                {"MOESTREAM_SLOT_CACHE=0", "--cache-mb 1000000 --prefetch", "lru"},
                {"", "--cache-mb 4 --force-cache --cache-debug --prefetch", "lru"},
                {"MOESTREAM_SLOT_CACHE=0", "--cache-mb 4 --force-cache --io-threads 4 --prefetch",
                 "lru"},
                {"", "--cache-mb 1 --force-cache --cache-debug", "lru"},
                // The fixed-slot cache (docs/cache.md, "Fixed slots"): slots that evict, every
                // expert slotted, more lanes; read-ahead into slots that evict, into free
                // slots, with one worker lane.
                {"", "--cache-mb " + slot_mb + " --force-cache", slots},
                {"", "--cache-mb 1000000", slots},
                {"MOESTREAM_SLOT_CACHE=1", "--cache-mb " + slot_mb + " --force-cache --io-threads 4",
                 slots},
                {"", "--cache-mb " + slot_mb + " --force-cache --io-threads 4 --prefetch", slots},
                {"", "--cache-mb 1000000 --prefetch", slots},
                {"", "--cache-mb " + slot_mb + " --force-cache --io-threads 2 --prefetch", slots}};
        for (const Variant & v : variants) {
            SCOPED_TRACE(v.env + " " + v.flags);
            const std::string & flags = v.flags;
            RunOut s = run_moestream(model, prompt, flags, v.env);
            ASSERT_FALSE(s.stats.is_null());
            EXPECT_EQ(s.stats["settings"]["cache_store"], v.store)
                << s.stats["settings"]["cache_store_reason"];
            EXPECT_TRUE(s.stats["settings"]["stream"].get<bool>());
            EXPECT_EQ(s.stats["tokens"], ref.stats["tokens"]);
            EXPECT_EQ(s.stats["logits_sha"], ref.stats["logits_sha"]);
            EXPECT_TRUE(s.logits == ref.logits) << "final logits differ";
            EXPECT_GT(s.stats["flash_bytes_read"].get<uint64_t>(), 0u);
            // The slots were used: some layer's expert ids were rewritten to them.
            EXPECT_EQ(s.stats["settings"]["cache_slots"].get<uint64_t>() > 0, v.store == slots);
            if (v.store == slots) {
                EXPECT_GT(s.stats["settings"]["cache_slot_rewrites"].get<uint64_t>(), 0u);
                // Fewer slots than the prompt routes: decode started from slots warmed by
                // the prompt's end (slot_rewriter.h, "Warm start"), covered by the identity.
                if (flags.find("--force-cache") != std::string::npos) {
                    EXPECT_GT(s.stats["settings"]["cache_slot_warm_copies"].get<uint64_t>(), 0u);
                }
            }
            // The default read path really overlapped the down reads with gate/up, so the
            // identity above covers it (off with one lane, --no-io-overlap, --cache-debug).
            const bool overlap = flags.find("no-io-overlap") == std::string::npos &&
                                 flags.find("io-threads 1") == std::string::npos &&
                                 flags.find("cache-debug") == std::string::npos;
            EXPECT_EQ(s.stats["settings"]["io_overlap"].get<bool>(), overlap);
            if (overlap) {
                EXPECT_GT(s.stats["settings"]["io_overlap_waits_at_input"].get<uint64_t>(), 0u);
            }
            // --prefetch (docs/prefetch.md) works with a worker lane, with the cache or (cache
            // off) a second slot set, so the identity above covers experts read ahead of their
            // routing.
            const bool prefetch = flags.find("--prefetch") != std::string::npos &&
                                  flags.find("io-threads 1") == std::string::npos;
            EXPECT_EQ(s.stats["prefetch"].get<bool>(), prefetch) << "cache " << s.stats["cache_budget_reason"];
            if (prefetch) {
                EXPECT_GT(s.stats["prefetch_predictions"].get<uint64_t>(), 0u);
            }
            // (A 1 MiB budget is below some models' routed set: no room to read ahead.)
            if (prefetch && flags.find("cache-mb 1 ") == std::string::npos) {
                EXPECT_GT(s.stats["prefetch_experts"].get<uint64_t>(), 0u);
                EXPECT_GT(s.stats["prefetch_used"].get<uint64_t>(), 0u);
            }
        }
        // Debian's llama-completion generates the same ids (from its session file, not its
        // stdout: docs/reliability.md).
        EXPECT_TRUE(same_generation(llama_completion_gen(model, prompt).ids,
                                    ref.stats["n_prompt"].get<int>(),
                                    ref.stats["tokens"].get<std::vector<int32_t>>()))
            << "llama-completion disagrees with moestream --no-stream";
    }
}

// The negative control: one wrong slice must make the comparison fail.
TEST_P(StreamGate, NegativeControlCorruptSliceIsDetected) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    const char * prompt = kPrompts[0];
    RunOut ref = run_moestream(model, prompt, "--no-stream");
    RunOut bad = run_moestream(model, prompt, "", "MOESTREAM_DEBUG_CORRUPT_EXPERT='1:*'",
                               /*must_succeed=*/false);
    if (bad.exit_code != 0) {
        // Corrupted f16 bytes can make the logits NaN or inf: then the engine stops with an
        // error naming them instead of emitting tokens. Detected too; any other failure is not.
        EXPECT_EQ(bad.exit_code, 1) << bad.err;
        EXPECT_NE(bad.err.find("non-finite logit"), std::string::npos) << bad.err;
        return;
    }
    ASSERT_FALSE(bad.stats.is_null());
    EXPECT_NE(bad.stats["logits_sha"], ref.stats["logits_sha"]);
    EXPECT_FALSE(bad.logits == ref.logits);
}

std::vector<ArchCase> all_cases() {
    std::vector<ArchCase> v;
    for (const char * a : {"qwen3moe", "olmoe", "glm4moe"})
        for (const char * t : {"f32", "f16", "q8_0", "q4_k"}) v.push_back({a, t});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Tiny, StreamGate, ::testing::ValuesIn(all_cases()), arch_case_name);

// A fixed-slot run on the long prompt is the resident run's, byte for byte, and `counter` (of
// settings) shows the feature worked; with the test knob `bad_env` planting that feature's
// bug, the output changes (or a logit turns non-finite, also detected).
// `counter`: a JSON pointer into --stats-json that the good run must count above zero.
void check_slot_control(const std::string & counter, const std::string & bad_env,
                        const std::string & more_flags = "") {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    const char * prompt = kPrompts[2];
    // 8 of 32 slots per layer
    const std::string flags = "--cache-mb 7 --force-cache" + more_flags;
    RunOut ref = run_moestream(model, prompt, "--no-stream");
    RunOut good = run_moestream(model, prompt, flags, "MOESTREAM_SLOT_CACHE=1");
    ASSERT_FALSE(good.stats.is_null());
    EXPECT_EQ(good.stats["logits_sha"], ref.stats["logits_sha"]);
    EXPECT_GT(good.stats.at(json::json_pointer(counter)).get<uint64_t>(), 0u);
    RunOut bad = run_moestream(model, prompt, flags, "MOESTREAM_SLOT_CACHE=1 " + bad_env,
                               /*must_succeed=*/false);
    if (bad.exit_code != 0) {
        EXPECT_NE(bad.err.find("non-finite logit"), std::string::npos) << bad.err;
        return;
    }
    EXPECT_NE(bad.stats["logits_sha"], ref.stats["logits_sha"]);
}

// The fixed-slot cache's rewrite is what makes its output right: ids rewritten to the wrong
// slots change it.
TEST(FixedSlots, IdsRewrittenToTheWrongSlotsChangeTheOutput) {
    check_slot_control("/settings/cache_slot_rewrites", "MOESTREAM_DEBUG_SLOT_MISPLACE=1");
}

// The warm start's copy is what makes decode's first hits right: skipped, the output changes.
TEST(FixedSlots, AWarmStartWithoutItsCopyChangesTheOutput) {
    check_slot_control("/settings/cache_slot_warm_copies", "MOESTREAM_DEBUG_SLOT_WARM_SKIP_COPY=1");
}

// Decode's read-ahead into slots is what makes its hits right: experts put in slots without
// their reads change the output.
TEST(FixedSlots, AReadAheadIntoSlotsWithoutItsReadsChangesTheOutput) {
    check_slot_control("/prefetch_used", "MOESTREAM_DEBUG_SLOT_PREFETCH_SKIP_READ=1",
                       " --prefetch");
}

// With MOESTREAM_SLOT_CACHE=1, what the fixed-slot cache cannot run with is refused by name,
// with a usage exit: a budget below one slot per routed expert besides the shared slots, and
// the knobs that rewrite routings or manage the LRU cache's pages. By default the LRU cache
// runs them instead, saying why (the control).
TEST(FixedSlots, WhatItCannotRunWithIsRefusedByNameOrLeftToTheLruCache) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    RunOut small = run_moestream(model, "A", "--cache-mb 4 --force-cache",
                                 "MOESTREAM_SLOT_CACHE=1", /*must_succeed=*/false);
    EXPECT_EQ(small.exit_code, 64) << small.err;
    EXPECT_NE(small.err.find("fixed-slot cache needs at least 4 slots"), std::string::npos)
        << small.err;
    RunOut lru = run_moestream(model, "A", "--cache-mb 4 --force-cache");
    ASSERT_EQ(lru.exit_code, 0);
    EXPECT_EQ(lru.stats["settings"]["cache_store"], "lru");
    EXPECT_NE(lru.stats["settings"]["cache_store_reason"].get<std::string>().find(
                  "fewer than the routing width 4"),
              std::string::npos);
    RunOut nm = run_moestream(model, "A", "--cache-mb 7 --force-cache --cache-no-move",
                              "MOESTREAM_SLOT_CACHE=1", /*must_succeed=*/false);
    EXPECT_EQ(nm.exit_code, 64) << nm.err;
    EXPECT_NE(nm.err.find("MOESTREAM_SLOT_CACHE=1: the fixed-slot cache cannot be combined with "
                          "--cache-no-move"),
              std::string::npos) << nm.err;
    RunOut nm_lru = run_moestream(model, "A", "--cache-mb 7 --force-cache --cache-no-move");
    ASSERT_EQ(nm_lru.exit_code, 0);
    EXPECT_EQ(nm_lru.stats["settings"]["cache_store"], "lru");
    EXPECT_NE(nm_lru.stats["settings"]["cache_store_reason"].get<std::string>().find("cache_move"),
              std::string::npos);
    // The summary says which store and why, in the CLI's words.
    EXPECT_NE(nm_lru.err.find("LRU cache: the fixed-slot cache cannot be combined with --cache-no-move"),
              std::string::npos) << nm_lru.err;
    EXPECT_EQ(lru.err.find("fixed slots:"), std::string::npos) << lru.err;
}

// Only routed experts are read: bytes per decoded token follow from the routing alone.
TEST(StreamReads, BytesPerTokenEqualRoutedSlices) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CmdResult ins = run_cmd(sh_quote(cli_bin()) + " inspect --json -m " + sh_quote(model));
    ASSERT_EQ(ins.exit_code, 0) << ins.err;
    json m = json::parse(ins.out);
    const uint64_t n_moe = m["n_moe_layer"].get<uint64_t>();
    const uint64_t k = m["n_expert_used"].get<uint64_t>();
    const uint64_t expert_bytes = m["expert_bytes"].get<uint64_t>();  // one expert, all projections
    const uint64_t n_proj = m["projections"].size();
    const uint64_t predicted = n_moe * k * expert_bytes;  // one token: k distinct experts/layer
    ASSERT_GT(predicted, 0u);

    for (bool direct : {false, true}) {
        SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
        RunOut r = run_moestream(model, kPrompts[0], direct ? "--cache-mb 0" : "--cache-mb 0 --no-odirect");
        ASSERT_FALSE(r.stats.is_null());
        std::istringstream csv(r.csv);
        std::string line;
        std::getline(csv, line);  // header
        int rows = 0;
        while (std::getline(csv, line)) {
            // step,token,decode_s,io_s,flash_bytes_read,flash_reads,token_demand_bytes,...
            std::vector<std::string> f;
            std::stringstream ls(line);
            for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
            ASSERT_GE(f.size(), 8u);
            const uint64_t bytes = std::stoull(f[4]), reads = std::stoull(f[5]),
                           demand = std::stoull(f[6]);
            EXPECT_EQ(demand, predicted);
            EXPECT_EQ(reads, n_moe * k * n_proj);
            if (!direct) {
                EXPECT_EQ(bytes, predicted);
            } else {
                EXPECT_GE(bytes, predicted);
                EXPECT_LE(bytes, predicted + reads * 2 * 4096);
            }
            ++rows;
        }
        EXPECT_EQ(rows, 31);  // 32 tokens: the first comes from the prefill
    }
}

}  // namespace
