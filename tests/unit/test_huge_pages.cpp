// The pages of the engine's own buffers: transparent huge pages (src/util/huge_pages.h,
// docs/design.md) and how the fixed slots' pages are populated (MOESTREAM_SLOT_POPULATE).
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "huge_pages.h"
#include "moestream/sysinfo.h"
#include "test_util.h"

using moestream::advise_huge_pages;
using moestream::kHugePageBytes;
using moestream::map_huge_aligned;
using namespace moestream::test;

namespace {

// Whether the kernel has transparent huge pages that MADV_HUGEPAGE can ask for.
bool thp_available(std::string * why) {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    if (!std::getline(f, line)) {
        *why = "no /sys/kernel/mm/transparent_hugepage/enabled (kernel without THP)";
        return false;
    }
    if (line.find("[never]") != std::string::npos) {
        *why = "transparent huge pages are set to never on this machine";
        return false;
    }
    return true;
}

// Whether the mapping that holds `p` carries the huge-page advice (smaps VmFlags "hg").
bool advised(const void * p) {
    std::ifstream f("/proc/self/smaps");
    const auto at = uintptr_t(p);
    bool inside = false;
    for (std::string line; std::getline(f, line);) {
        uintptr_t lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
            inside = at >= lo && at < hi;
            continue;
        }
        if (inside && line.rfind("VmFlags:", 0) == 0) return line.find(" hg") != std::string::npos;
    }
    return false;
}

}  // namespace

// Only whole huge pages are advised: the partial one at a buffer's end keeps 4 KiB pages, so
// the buffer never costs more RSS than its own pages. The control: advising the whole range
// marks the tail too.
TEST(HugePages, OnlyWholeHugePagesAreAdvised) {
    std::string why;
    if (!thp_available(&why)) GTEST_SKIP() << why;
    const uint64_t len = kHugePageBytes + kHugePageBytes / 2;
    uint8_t * p = map_huge_aligned(len);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(advise_huge_pages(p, len), kHugePageBytes);
    EXPECT_TRUE(advised(p));
    EXPECT_FALSE(advised(p + kHugePageBytes));
    EXPECT_EQ(advise_huge_pages(p, kHugePageBytes - 4096), 0u);  // no whole huge page
    ASSERT_EQ(madvise(p, len, MADV_HUGEPAGE), 0);  // control
    EXPECT_TRUE(advised(p + kHugePageBytes));
    munmap(p, len);
}

// anon_huge_bytes() (a run's `anon_huge_bytes`) counts the memory the kernel backed with huge
// pages: touching an advised 4 MiB region adds them; the control, the same region marked
// MADV_NOHUGEPAGE, adds none.
TEST(HugePages, AnonHugeBytesCountsTheHugePagesTheKernelBacked) {
    std::string why;
    if (!thp_available(&why)) GTEST_SKIP() << why;
    const uint64_t len = 2 * kHugePageBytes;
    auto backed_by_touching = [&](int advice) {
        uint8_t * p = map_huge_aligned(len);
        EXPECT_NE(p, nullptr);
        if (!p) return uint64_t(0);
        EXPECT_EQ(madvise(p, len, advice), 0);
        const uint64_t before = moestream::anon_huge_bytes();
        std::memset(p, 1, len);
        const uint64_t after = moestream::anon_huge_bytes();
        munmap(p, len);
        return after > before ? after - before : 0;
    };
    EXPECT_GE(backed_by_touching(MADV_HUGEPAGE), kHugePageBytes);
    EXPECT_EQ(backed_by_touching(MADV_NOHUGEPAGE), 0u);  // control
}

// By default the engine's dense copies and slots are advised (settings.huge_page_bytes);
// MOESTREAM_HUGEPAGES=0 advises nothing and the output is the same bytes.
TEST(HugePages, TheEnginesBuffersAreAdvisedByDefaultAndNotWithTheKnob) {
    std::string why;
    if (!thp_available(&why)) GTEST_SKIP() << why;
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    StatsRun on = run_with_stats(model, kRouterPrompt, 4, "", "", /*with_logits=*/true);
    StatsRun off = run_with_stats(model, kRouterPrompt, 4, "", "MOESTREAM_HUGEPAGES=0 ", true);
    ASSERT_EQ(on.rc, 0) << on.err;
    ASSERT_EQ(off.rc, 0) << off.err;
    const auto js_on = nlohmann::json::parse(on.stats), js_off = nlohmann::json::parse(off.stats);
    EXPECT_TRUE(js_on["settings"]["huge_pages"].get<bool>());
    EXPECT_GE(js_on["settings"]["huge_page_bytes"].get<uint64_t>(), kHugePageBytes);
    EXPECT_FALSE(js_off["settings"]["huge_pages"].get<bool>());
    EXPECT_EQ(js_off["settings"]["huge_page_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(js_on["logits_sha"], js_off["logits_sha"]);
    EXPECT_TRUE(on.logits == off.logits);
}

// A value other than 0 or 1 is refused by name.
TEST(HugePages, AKnobValueOtherThanZeroOrOneIsRefused) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    StatsRun bad = run_with_stats(model, kRouterPrompt, 1, "", "MOESTREAM_HUGEPAGES=yes ");
    EXPECT_EQ(bad.rc, 64) << bad.err;
    EXPECT_NE(bad.err.find("MOESTREAM_HUGEPAGES=yes: must be 0 or 1"), std::string::npos) << bad.err;
}

// MOESTREAM_SLOT_POPULATE (docs/cache.md, "Fixed slots"): populating the fixed slots' pages at
// nice +10, under SCHED_IDLE or not at all changes no byte of the output, and the settings say
// which ran. Negative control: another prompt's logits differ.
TEST(SlotPopulate, EveryModeGivesTheSameBytesAndIsReported) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    StatsRun base = run_with_stats(model, kRouterPrompt, 4, "--cache-mb 64", "", true);
    ASSERT_EQ(base.rc, 0) << base.err;
    const auto js = nlohmann::json::parse(base.stats);
    ASSERT_EQ(js["settings"]["cache_store"], "fixed slots") << base.stats;
    EXPECT_EQ(js["settings"]["cache_slot_populate"], "nice");
    for (const char * mode : {"idle", "off"}) {
        SCOPED_TRACE(mode);
        StatsRun r = run_with_stats(model, kRouterPrompt, 4, "--cache-mb 64",
                                    std::string("MOESTREAM_SLOT_POPULATE=") + mode + " ", true);
        ASSERT_EQ(r.rc, 0) << r.err;
        const auto j = nlohmann::json::parse(r.stats);
        EXPECT_EQ(j["settings"]["cache_slot_populate"], mode);
        EXPECT_EQ(j["logits_sha"], js["logits_sha"]);
        EXPECT_TRUE(r.logits == base.logits);
    }
    StatsRun other = run_with_stats(model, "A different prompt entirely", 4, "--cache-mb 64", "", true);
    ASSERT_EQ(other.rc, 0) << other.err;
    EXPECT_NE(nlohmann::json::parse(other.stats)["logits_sha"], js["logits_sha"]);
}

TEST(SlotPopulate, AnUnknownModeIsRefusedByName) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    StatsRun bad = run_with_stats(model, kRouterPrompt, 1, "", "MOESTREAM_SLOT_POPULATE=lazy ");
    EXPECT_EQ(bad.rc, 64) << bad.err;
    EXPECT_NE(bad.err.find("MOESTREAM_SLOT_POPULATE=lazy: must be nice, idle or off"),
              std::string::npos)
        << bad.err;
}
