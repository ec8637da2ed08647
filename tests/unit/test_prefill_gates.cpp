// test_prefill_gates.cpp — prefill read-ahead (docs/prefetch.md, "Prefill read-ahead") is
// lossless.
//
// A prompt several ubatches long (-b 64 --ubatch-size 32 on a ~190-token prompt of the tiny synth's
// byte vocabulary), 8 greedy tokens: token ids, every step's logits (hash) and the final
// logits (raw bytes) identical to --no-stream with the same -b/--ubatch-size (a different ubatch may
// change llama.cpp's float results), with --prefill-readahead and the cache off (the second
// set of shared slots), with a cache that holds everything, with a small cache that evicts
// (under --cache-debug: poison and residency checks), and together with --prefetch. Each run
// must really have read ahead (prefetch bytes > 0, the settings say on).
// Negative control: a corrupted routed slice under read-ahead breaks the comparison.
// Refusals: --prefill-readahead with one read lane or --no-stream exits 64 naming the flag.
// The guess (MOESTREAM_PREFILL_GUESS=bank|rows): both modes byte-identical, with the union's own
// corrupted-slice negative control; a bad value exits 64 naming the variable.
// Prompt batch (RunOptions::n_batch 0): chosen larger only when the cache cannot hold every
// expert and the memory allows; a larger ubatch reads the banks fewer times, and its logits
// equal --no-stream's with the same ubatch.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "moestream/gguf_index.h"
#include "run_config.h"
#include "test_stats_run.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

using Out = ParsedRun;

// ~190 byte tokens: six ubatches of 32.
const char kLongPrompt[] =
    "Prefill reads each layer's bank of experts once per micro-batch, so while one layer "
    "computes the next layer's experts can be read; the output must stay the same to the "
    "last bit of every logit.";

Out run(const std::string & model, const std::string & flags, const std::string & env = "",
        const std::string & batch = "-b 64 --ubatch-size 32", int n = 8) {
    return run_parsed(model, kLongPrompt, n, batch + " " + flags, env.empty() ? "" : env + " ",
                      /*with_logits=*/true);
}

// A budget of half the experts: prefill evicts, and there is room to read a layer ahead
// ("" if the model cannot be inspected).
std::string half_cache(const std::string & model) {
    CmdResult ins = run_cmd(sh_quote(cli_bin()) + " inspect --json -m " + sh_quote(model));
    if (ins.exit_code != 0) return "";
    return "--cache-mb " +
           std::to_string(json::parse(ins.out)["cache_all_experts_mib"].get<int>() / 2) +
           " --force-cache";
}

class PrefillReadahead : public ::testing::TestWithParam<ArchCase> {};

TEST_P(PrefillReadahead, ByteIdenticalToResidentWithTheSameUbatch) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    Out ref = run(model, "--no-stream");
    ASSERT_EQ(ref.rc, 0) << ref.err;
    ASSERT_GT(ref.stats["n_prompt"].get<int>(), 2 * 32) << "the prompt must span ubatches";
    ASSERT_GT(ref.logits.size(), 0u);
    const std::string half = half_cache(model);
    ASSERT_FALSE(half.empty());
    for (const std::string & flags :
         {std::string("--cache-mb 0 --prefill-readahead"),
          std::string("--cache-mb 0 --prefill-readahead --io-threads 2"),
          std::string("--cache-mb 1000000 --prefill-readahead"),
          half + " --cache-debug --prefill-readahead", half + " --prefill-readahead --prefetch"}) {
        SCOPED_TRACE(flags);
        Out s = run(model, flags);
        ASSERT_EQ(s.rc, 0) << s.err;
        EXPECT_TRUE(s.stats["settings"]["prefill_readahead"].get<bool>()) << s.err;
        EXPECT_EQ(s.stats["settings"]["n_ubatch"].get<int>(), 32);
        // It really read ahead, so the identity below covers experts read ahead.
        EXPECT_GT(s.stats["prefetch_bytes"].get<uint64_t>(), 0u);
        if (flags.find("force-cache") != std::string::npos) {
            EXPECT_GT(s.stats["evictions"].get<uint64_t>(), 0u);
        }
        EXPECT_EQ(s.stats["tokens"], ref.stats["tokens"]);
        EXPECT_EQ(s.stats["logits_sha"], ref.stats["logits_sha"]);
        EXPECT_TRUE(s.logits == ref.logits) << "final logits differ";
    }
}

// The negative control: with read-ahead on (cache off and on, either guess), one layer's
// corrupted routed slices must make the same comparison fail.
TEST_P(PrefillReadahead, NegativeControlCorruptSliceIsDetected) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    Out ref = run(model, "--no-stream");
    ASSERT_EQ(ref.rc, 0) << ref.err;
    for (const std::string mode : {"bank", "rows"})  // both guesses (MOESTREAM_PREFILL_GUESS)
        for (const std::string flags :
             {"--cache-mb 0 --prefill-readahead", "--cache-mb 1000000 --prefill-readahead"}) {
            SCOPED_TRACE(mode + " " + flags);
            Out bad = run(model, flags,
                          "MOESTREAM_PREFILL_GUESS=" + mode + " MOESTREAM_DEBUG_CORRUPT_EXPERT='1:*'");
            if (bad.rc != 0) {  // non-finite logits stop the run: detected too
                EXPECT_EQ(bad.rc, 1) << bad.err;
                EXPECT_NE(bad.err.find("non-finite logit"), std::string::npos) << bad.err;
                continue;
            }
            EXPECT_EQ(bad.stats["settings"]["prefill_guess"], mode);
            EXPECT_GT(bad.stats["prefetch_bytes"].get<uint64_t>(), 0u);
            EXPECT_NE(bad.stats["logits_sha"], ref.stats["logits_sha"]);
            EXPECT_FALSE(bad.logits == ref.logits);
        }
}

// Per-row guesses (MOESTREAM_PREFILL_GUESS=rows: the union of the ubatch rows' guesses for the
// next MoE layer) against the whole bank (=bank): both byte-identical to --no-stream, each mode
// really ran, and the union read ahead no more than the bank where nothing is evicted (the
// negative control above covers both guesses).
TEST_P(PrefillReadahead, UnionAndBankGuessesByteIdenticalToResident) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    Out ref = run(model, "--no-stream");
    ASSERT_EQ(ref.rc, 0) << ref.err;
    const std::string half = half_cache(model);
    ASSERT_FALSE(half.empty());
    for (const std::string & flags :
         {std::string("--cache-mb 0 --prefill-readahead"),
          std::string("--cache-mb 1000000 --prefill-readahead"),
          half + " --cache-debug --prefill-readahead"}) {
        SCOPED_TRACE(flags);
        uint64_t bank_ahead = 0;
        for (const std::string mode : {"bank", "rows"}) {
            SCOPED_TRACE(mode);
            Out s = run(model, flags, "MOESTREAM_PREFILL_GUESS=" + mode);
            ASSERT_EQ(s.rc, 0) << s.err;
            EXPECT_EQ(s.stats["settings"]["prefill_guess"], mode);
            EXPECT_GT(s.stats["prefetch_bytes"].get<uint64_t>(), 0u);
            const uint64_t layers = s.stats["prefill_guess_layers"].get<uint64_t>();
            if (mode == "bank") {
                EXPECT_EQ(layers, 0u);
                bank_ahead = s.stats["prefetch_bytes"].get<uint64_t>();
            } else {
                EXPECT_GT(layers, 0u);
                EXPECT_GT(s.stats["prefill_guess_rows"].get<uint64_t>(), layers);
                EXPECT_GT(s.stats["guess_s"].get<double>(), 0.0);
                if (flags.find("force-cache") == std::string::npos) {
                    EXPECT_LE(s.stats["prefetch_bytes"].get<uint64_t>(), bank_ahead);
                }
            }
            EXPECT_EQ(s.stats["tokens"], ref.stats["tokens"]);
            EXPECT_EQ(s.stats["logits_sha"], ref.stats["logits_sha"]);
            EXPECT_TRUE(s.logits == ref.logits) << "final logits differ";
        }
    }
}

// A prompt of one ubatch is the engine's first graph, before the graph has shown the next
// layers' routers: the per-row guess runs there too (the routers preset at open), byte-identical.
TEST(PrefillReadaheadFirstGraph, OneUbatchGuessesPerRow) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    const std::string one = "-b 256 --ubatch-size 256";
    Out ref = run(model, "--no-stream", "", one);
    ASSERT_EQ(ref.rc, 0) << ref.err;
    Out rows = run(model, "--cache-mb 0 --prefill-readahead", "MOESTREAM_PREFILL_GUESS=rows", one);
    ASSERT_EQ(rows.rc, 0) << rows.err;
    EXPECT_GT(rows.stats["prefill_guess_layers"].get<uint64_t>(), 0u);
    EXPECT_EQ(rows.stats["logits_sha"], ref.stats["logits_sha"]);
    EXPECT_TRUE(rows.logits == ref.logits);
    Out bank = run(model, "--cache-mb 0 --prefill-readahead", "MOESTREAM_PREFILL_GUESS=bank", one);
    ASSERT_EQ(bank.rc, 0) << bank.err;
    EXPECT_EQ(bank.stats["prefill_guess_layers"].get<uint64_t>(), 0u);
    EXPECT_LT(rows.stats["prefetch_bytes"].get<uint64_t>(),
              bank.stats["prefetch_bytes"].get<uint64_t>());
}

TEST(PrefillReadaheadFlags, ABadGuessKnobIsRefusedByName) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    Out o = run(model, "--prefill-readahead", "MOESTREAM_PREFILL_GUESS=union");
    EXPECT_EQ(o.rc, 64) << o.err;
    EXPECT_NE(o.err.find("MOESTREAM_PREFILL_GUESS"), std::string::npos) << o.err;
    Out ok = run(model, "--prefill-readahead", "MOESTREAM_PREFILL_GUESS=bank");
    EXPECT_EQ(ok.rc, 0) << ok.err;
}

INSTANTIATE_TEST_SUITE_P(Tiny, PrefillReadahead,
                         ::testing::Values(ArchCase{"qwen3moe", "q4_k"}, ArchCase{"olmoe", "f16"},
                                           ArchCase{"glm4moe", "q8_0"}),
                         arch_case_name);

TEST(PrefillReadaheadFlags, RefusedByNameWhereItCannotWork) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    for (const std::string flags :
         {"--prefill-readahead --io-threads 1", "--prefill-readahead --no-stream",
          "--prefill-readahead --drop-cold-experts 0.5"}) {
        SCOPED_TRACE(flags);
        Out o = run(model, flags);
        EXPECT_EQ(o.rc, 64) << o.err;
        EXPECT_NE(o.err.find("--prefill-readahead"), std::string::npos) << o.err;
    }
    // Control: the same run without the conflicting flag is accepted.
    Out ok = run(model, "--prefill-readahead --io-threads 2");
    EXPECT_EQ(ok.rc, 0) << ok.err;
}

// Without the flag, read-ahead is on where it applies, a route trace included (the trace
// records it), and off (the run goes on, the settings say so) where it cannot: one read lane,
// drop-cold. --no-prefill-readahead turns it off. The settings field is what the engine ran,
// so each expectation can fail.
TEST(PrefillReadaheadFlags, OnByDefaultWhereItApplies) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    Out on = run(model, "--cache-mb 0");
    ASSERT_EQ(on.rc, 0) << on.err;
    EXPECT_TRUE(on.stats["settings"]["prefill_readahead"].get<bool>()) << on.err;
    EXPECT_FALSE(on.stats["settings"]["prefill_readahead_requested"].get<bool>());
    EXPECT_GT(on.stats["prefetch_bytes"].get<uint64_t>(), 0u) << on.err;
    const std::string trace = models_dir() + "/ra-default-" + std::to_string(getpid()) + ".trace";
    Out traced = run(model, "--cache-mb 0 --route-trace " + trace);
    ASSERT_EQ(traced.rc, 0) << traced.err;
    EXPECT_TRUE(traced.stats["settings"]["prefill_readahead"].get<bool>()) << traced.err;
    EXPECT_EQ(traced.stats["prefetch_bytes"], on.stats["prefetch_bytes"]) << traced.err;
    for (const std::string & flags :
         {std::string("--cache-mb 0 --io-threads 1"), std::string("--drop-cold-experts 0.5"),
          std::string("--cache-mb 0 --no-prefill-readahead")}) {
        SCOPED_TRACE(flags);
        Out off = run(model, flags);
        ASSERT_EQ(off.rc, 0) << off.err;
        EXPECT_FALSE(off.stats["settings"]["prefill_readahead"].get<bool>()) << off.err;
        EXPECT_EQ(off.stats["prefetch_bytes"].get<uint64_t>(), 0u) << off.err;
    }
    std::remove(trace.c_str());
    // Given both ways, the CLI refuses it.
    Out both = run(model, "--prefill-readahead --no-prefill-readahead");
    EXPECT_EQ(both.rc, 64) << both.err;
}

TEST(PromptBatch, ChosenForTheMemory) {
    moestream::ModelIndex m;
    ASSERT_TRUE(moestream::load_model_index(synth_model("tiny", "qwen3moe", "q8_0"), &m).ok());
    moestream::RunOptions o;
    o.n_ctx = 4096;
    moestream::MemoryAvailability lots;
    lots.available_bytes = 4ull << 30;
    lots.source = "test";
    std::string why;
    o.cache_mb = 0;  // cache off: each ubatch reads the banks again
    EXPECT_EQ(moestream::choose_n_batch(o, m, lots, &why), 4096) << why;
    EXPECT_NE(why.find("the cache is off"), std::string::npos) << why;
    o.n_ctx = 1024;  // never above the context
    EXPECT_EQ(moestream::choose_n_batch(o, m, lots, &why), 1024) << why;
    // Controls: the default where a larger batch saves nothing or does not fit.
    moestream::MemoryAvailability little = lots;
    little.available_bytes = 64ull << 20;  // 1/8 = 8 MiB < the tiny's 34 MiB more at 1024
    EXPECT_EQ(moestream::choose_n_batch(o, m, little, &why), 512) << why;
    o.cache_mb = -1;  // auto, and every expert fits in 4 GiB
    EXPECT_EQ(moestream::choose_n_batch(o, m, lots, &why), 512) << why;
    EXPECT_NE(why.find("can hold every expert"), std::string::npos) << why;
    o.cache_mb = 1;  // 1 MiB cannot hold the tiny's 13 MiB of experts
    EXPECT_EQ(moestream::choose_n_batch(o, m, lots, &why), 1024) << why;
    EXPECT_NE(why.find("do not fit in the cache"), std::string::npos) << why;
    o.stream = false;
    o.cache_mb = -1;
    EXPECT_EQ(moestream::choose_n_batch(o, m, lots, &why), 512) << why;
    o.stream = true;
    EXPECT_EQ(moestream::choose_n_batch(o, m, moestream::MemoryAvailability{}, &why), 512) << why;
}

TEST(PromptBatch, ALargerUbatchReadsTheBanksFewerTimesWithTheResidentLogitsOfTheSameUbatch) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    uint64_t prev = 0;
    for (const std::string batch : {"-b 256", "-b 64", "-b 32"}) {
        SCOPED_TRACE(batch);
        Out ref = run(model, "--no-stream", "", batch, 2);
        Out s = run(model, "--cache-mb 0", "", batch, 2);
        ASSERT_EQ(ref.rc, 0) << ref.err;
        ASSERT_EQ(s.rc, 0) << s.err;
        EXPECT_EQ(s.stats["logits_sha"], ref.stats["logits_sha"]);
        EXPECT_TRUE(s.logits == ref.logits) << "final logits differ";
        const uint64_t bytes = s.stats["flash_bytes_read"].get<uint64_t>();
        EXPECT_GT(bytes, prev) << "a smaller batch must read more";
        prev = bytes;
    }
    // Not given: chosen (cache off: larger than 512, within the context) and said; given: kept.
    Out a = run(model, "--cache-mb 0 -c 2048", "", "", 2);
    ASSERT_EQ(a.rc, 0) << a.err;
    EXPECT_GT(a.stats["settings"]["n_batch"].get<int>(), 512);
    EXPECT_LE(a.stats["settings"]["n_batch"].get<int>(), 2048);
    EXPECT_NE(a.stats["settings"]["n_batch_reason"].get<std::string>().find("the cache is off"),
              std::string::npos);
    // The model's context (512 here) caps the choice as -c does.
    Out mc = run(model, "--cache-mb 0", "", "", 2);
    ASSERT_EQ(mc.rc, 0) << mc.err;
    EXPECT_EQ(mc.stats["settings"]["n_ctx"].get<int>(), 512);
    EXPECT_EQ(mc.stats["settings"]["n_batch"].get<int>(), 512);
    EXPECT_EQ(mc.stats["settings"]["n_batch_reason"].get<std::string>().find("caps it"), std::string::npos)
        << "chosen above the context, then capped by llama.cpp";
    Out g = run(model, "--cache-mb 0", "", "-b 64", 2);
    ASSERT_EQ(g.rc, 0) << g.err;
    EXPECT_EQ(g.stats["settings"]["n_batch"].get<int>(), 64);
    EXPECT_EQ(g.stats["settings"]["n_batch_reason"], "requested");
    // Above the context llama.cpp caps it; the settings say what it uses, and why.
    Out c = run(model, "--cache-mb 0 -c 1024", "", "-b 4096", 2);
    ASSERT_EQ(c.rc, 0) << c.err;
    EXPECT_EQ(c.stats["settings"]["n_batch"].get<int>(), 1024);
    EXPECT_NE(c.stats["settings"]["n_batch_reason"].get<std::string>().find("caps it at n_ctx 1024"),
              std::string::npos);
}

}  // namespace
