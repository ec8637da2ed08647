// test_stage_split.cpp — split staging (MOESTREAM_STAGE_SPLIT, streamer.h "Split staging",
// docs/cache.md) on tiny synth models through the CLI:
//   (a) byte-identical to --no-stream (token ids, logits hash, final logits bytes) with the
//       knob on and off: an evicting cache with --cache-debug (poison before every read and
//       the residency check after), without it (overlap on, three and two stages), with
//       --prefetch tails and 4 lanes; with the knob on, slices really were committed while
//       earlier reads ran (cache_deferred_commits > 0), with it off none were;
//   (b) the corrupted-slice negative control still changes the output with the split on;
//   (c) an injected read failure with the split on is one clean error (exit 1, naming the
//       read), and a bad knob value is one usage error naming the variable (exit 64).
// The lanes' release gate itself: test_io_lanes.cpp (IoLanesGate); the cache's deferred
// commits: test_residency_cache.cpp (SplitStaging).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_stats_run.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

ParsedRun run(const std::string & model, const std::string & flags, const std::string & env) {
    return run_gate(model, flags, env);
}

class StageSplit : public ::testing::TestWithParam<ArchCase> {};

TEST_P(StageSplit, ByteIdenticalWithTheKnobOnAndOff) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    const ParsedRun ref = run(model, "--no-stream", "");
    ASSERT_EQ(ref.rc, 0) << ref.err;
    ASSERT_GT(ref.logits.size(), 0u);
    struct Variant {
        const char * flags;
        const char * env;
    };
    const Variant variants[] = {
        {"--cache-mb 1 --force-cache --cache-debug", ""},  // evicts on every token, checked
        {"--cache-mb 1 --force-cache", ""},                // three-stage overlap
        {"--cache-mb 1 --force-cache", "MOESTREAM_OVERLAP_STAGES=2 "},
        {"--cache-mb 4 --force-cache --prefetch", ""},     // tails behind the own reads
        {"--cache-mb 2 --force-cache --io-threads 4 --cache-debug", ""},
    };
    for (const Variant & v : variants) {
        for (const char * knob : {"1", "0"}) {
            SCOPED_TRACE(std::string(v.env) + v.flags + ", split " + knob);
            const ParsedRun s =
                run(model, v.flags, std::string(v.env) + "MOESTREAM_STAGE_SPLIT=" + knob + " ");
            ASSERT_EQ(s.rc, 0) << s.err;
            EXPECT_EQ(s.stats["settings"]["io_stage_split"].get<bool>(), knob[0] == '1');
            EXPECT_EQ(s.stats["tokens"], ref.stats["tokens"]);
            EXPECT_EQ(s.stats["logits_sha"], ref.stats["logits_sha"]);
            EXPECT_TRUE(s.logits == ref.logits) << "final logits differ";
            EXPECT_GT(s.stats["evictions"].get<uint64_t>(), 0u);
            const uint64_t deferred = s.stats["cache_deferred_commits"].get<uint64_t>();
            if (knob[0] == '1') {
                EXPECT_GT(deferred, s.stats["cache_misses"].get<uint64_t>() / 2);
            } else {
                EXPECT_EQ(deferred, 0u);
            }
        }
    }
    // The default is on.
    const ParsedRun dflt = run(model, "--cache-mb 1 --force-cache", "");
    ASSERT_EQ(dflt.rc, 0) << dflt.err;
    EXPECT_TRUE(dflt.stats["settings"]["io_stage_split"].get<bool>());
    EXPECT_GT(dflt.stats["cache_deferred_commits"].get<uint64_t>(), 0u);
    EXPECT_EQ(dflt.stats["logits_sha"], ref.stats["logits_sha"]);
}

// One wrong slice must still make the comparison fail with the split on.
TEST_P(StageSplit, NegativeControlCorruptSliceIsDetected) {
    const std::string model = synth_model("tiny", GetParam().arch, GetParam().type);
    const ParsedRun ref = run(model, "--no-stream", "");
    ASSERT_EQ(ref.rc, 0) << ref.err;
    const ParsedRun bad = run(model, "--cache-mb 1 --force-cache",
                              "MOESTREAM_STAGE_SPLIT=1 MOESTREAM_DEBUG_CORRUPT_EXPERT='1:*' ");
    if (bad.rc != 0) {
        // Corrupted f16 bytes can make the logits non-finite: then the engine stops with an
        // error naming them. Detected too; any other failure is not.
        EXPECT_EQ(bad.rc, 1) << bad.err;
        EXPECT_NE(bad.err.find("non-finite logit"), std::string::npos) << bad.err;
        return;
    }
    EXPECT_GT(bad.stats["cache_deferred_commits"].get<uint64_t>(), 0u);
    EXPECT_NE(bad.stats["logits_sha"], ref.stats["logits_sha"]);
    EXPECT_FALSE(bad.logits == ref.logits);
}

INSTANTIATE_TEST_SUITE_P(Tiny, StageSplit,
                         ::testing::Values(ArchCase{"qwen3moe", "q8_0"}, ArchCase{"olmoe", "f16"},
                                           ArchCase{"glm4moe", "q4_k"}),
                         arch_case_name);

// A read that fails while the deferred slices are committed ends the request cleanly.
TEST(StageSplitFailures, ReadFailureIsOneCleanError) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    for (const char * plan : {"eio-once:40", "eio-once:40,lane=1"}) {
        SCOPED_TRACE(plan);
        const ParsedRun r = run(model, "--cache-mb 1 --force-cache",
                                std::string("MOESTREAM_STAGE_SPLIT=1 MOESTREAM_DEBUG_IO_FAULT=") +
                                    plan + " ");
        EXPECT_EQ(r.rc, 1) << r.err;
        EXPECT_NE(r.err.find("read failed at offset"), std::string::npos) << r.err;
    }
}

TEST(StageSplitKnob, BadValueIsOneErrorNamingIt) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    for (const char * v : {"2", "yes", "on"}) {
        const ParsedRun r = run(model, "--cache-mb 1 --force-cache",
                                std::string("MOESTREAM_STAGE_SPLIT=") + v + " ");
        EXPECT_EQ(r.rc, 64) << v;
        EXPECT_NE(r.err.find(std::string("MOESTREAM_STAGE_SPLIT=") + v), std::string::npos)
            << r.err;
    }
}

}  // namespace
