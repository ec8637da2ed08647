// test_time_breakdown.cpp — the time breakdown (docs/metrics.md, "Time breakdown") on the tiny
// synth model through the CLI:
//   (a) streamed: every --stats-csv row's buckets are non-negative and add up to its step_s,
//       decode_s lies within the step, and the --stats-json totals are the rows' sums (prefill
//       too, which has no sampling); with a cache, a token that misses spends time in the store.
//   (b) reads slowed on purpose (MOESTREAM_DEBUG_IO_FAULT=delay:US): the read wait is what
//       grows; the negative control is that compute and the hook do not absorb the delay.
//   (c) --no-stream: no read wait, no store time, no hook; compute is most of the step.
//   (d) a few reads stalled on purpose show in the read latency figures (longest read per
//       token and per run), not in the median.
// Only structural and ratio checks: no absolute speed (that is bench/'s job).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

const char * kBuckets[] = {"compute_s", "io_s", "stage_s", "hook_s", "sampling_s", "other_s"};

struct RunOut {
    json stats;
    std::vector<std::map<std::string, double>> rows;  // --stats-csv, by column name
};

std::string slurp(const std::string & p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

RunOut run_cli(const std::string & flags, const std::string & env = "", int n = 24) {
    TempDir dir("breakdown");
    const std::string cmd = env + " " + sh_quote(cli_bin()) + " run -m " +
                            sh_quote(synth_model("tiny", "qwen3moe", "q8_0")) +
                            " -p 'Once upon a time' -n " + std::to_string(n) + " -t 1 " + flags +
                            " --stats-json " + dir.path("s.json") + " --stats-csv " +
                            dir.path("s.csv");
    CmdResult r = run_cmd(cmd);
    RunOut out;
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
    if (r.exit_code != 0) return out;
    EXPECT_NE(r.err.find("time/token "), std::string::npos) << r.err;  // the summary line
    out.stats = json::parse(slurp(dir.path("s.json")));
    std::istringstream csv(slurp(dir.path("s.csv")));
    std::string line;
    std::vector<std::string> cols;
    std::getline(csv, line);
    for (std::stringstream ls(line); std::getline(ls, line, ',');) cols.push_back(line);
    while (std::getline(csv, line)) {
        std::map<std::string, double> row;
        size_t i = 0;
        for (std::stringstream ls(line); std::getline(ls, line, ',') && i < cols.size(); ++i)
            row[cols[i]] = std::stod(line);
        EXPECT_EQ(i, cols.size());
        out.rows.push_back(row);
    }
    return out;
}

double mean(const RunOut & r, const std::string & col) {
    double s = 0;
    for (const auto & row : r.rows) s += row.at(col);
    return r.rows.empty() ? 0 : s / double(r.rows.size());
}

// The buckets of one row (or JSON object) add up to step_s and none is negative. The CSV
// prints 6 significant digits: allow that rounding.
void expect_adds_up(const std::map<std::string, double> & b, const std::string & what) {
    double sum = 0;
    for (const char * k : kBuckets) {
        EXPECT_GE(b.at(k), -1e-6) << what << ": " << k;
        sum += b.at(k);
    }
    EXPECT_NEAR(sum, b.at("step_s"), 1e-5 + 1e-4 * b.at("step_s")) << what;
}

std::map<std::string, double> as_map(const json & o) {
    std::map<std::string, double> m;
    for (auto it = o.begin(); it != o.end(); ++it) m[it.key()] = it.value().get<double>();
    return m;
}

TEST(TimeStats, StreamedBucketsAddUpPerTokenAndInTotal) {
    for (const char * flags : {"--cache-mb 0", "--cache-mb 1 --force-cache"}) {
        SCOPED_TRACE(flags);
        RunOut r = run_cli(flags);
        ASSERT_EQ(r.rows.size(), 23u);  // 24 tokens: the first comes from the prefill
        const json & tb = r.stats["time_breakdown"];
        std::map<std::string, double> sum;
        uint64_t missed = 0, missed_with_store_time = 0;
        for (size_t i = 0; i < r.rows.size(); ++i) {
            const auto & row = r.rows[i];
            expect_adds_up(row, "row " + std::to_string(i));
            EXPECT_LE(row.at("decode_s"), row.at("step_s") * (1 + 1e-4) + 1e-6) << i;
            EXPECT_GT(row.at("compute_s"), 0) << i;
            if (row.at("flash_reads") > 0) {
                EXPECT_GT(row.at("io_s"), 0) << i;
            }
            if (row.at("cache_misses") > 0) {
                ++missed;
                if (row.at("stage_s") > 0) ++missed_with_store_time;
            }
            for (const auto & [k, v] : row) sum[k] += v;
        }
        EXPECT_GT(missed, r.rows.size() / 2);  // cache off, or 1 MiB: most tokens miss
        // Cache off: the shared slots' stage; 1 MiB: commits and evictions.
        EXPECT_EQ(missed_with_store_time, missed);
        // The JSON totals are the rows' sums; the per-token means the same over the rows.
        const auto dec = as_map(tb["decode"]), per = as_map(tb["decode_per_token"]);
        EXPECT_EQ(tb["decode"]["steps"].get<uint64_t>(), r.rows.size());
        expect_adds_up(dec, "decode totals");
        expect_adds_up(per, "decode means");
        for (const char * k : kBuckets) {
            EXPECT_NEAR(dec.at(k), sum[k], 1e-5 + 1e-4 * dec.at("step_s")) << k;
            EXPECT_NEAR(per.at(k) * double(r.rows.size()), dec.at(k), 1e-9 + 1e-9 * dec.at(k)) << k;
        }
        EXPECT_NEAR(r.stats["decode_s"].get<double>(), sum["decode_s"], 1e-4);
        // The remainder is small: the measured buckets cover the step.
        EXPECT_LT(dec.at("other_s"), 0.25 * dec.at("step_s"));
        // The prefill: its own steps, no sampling, within the prefill's wall time; its read
        // wait is the prefill's share of the run's io_s.
        const auto pre = as_map(tb["prefill"]);
        expect_adds_up(pre, "prefill");
        EXPECT_GE(tb["prefill"]["steps"].get<uint64_t>(), 1u);
        EXPECT_EQ(pre.at("sampling_s"), 0);
        EXPECT_GT(pre.at("io_s"), 0);
        EXPECT_LE(pre.at("step_s"), r.stats["prefill_s"].get<double>() + 1e-6);
        EXPECT_NEAR(r.stats["io_s"].get<double>(), pre.at("io_s") + dec.at("io_s"), 1e-6);
    }
}

TEST(TimeStats, ReadWaitIsWhatGrowsWhenReadsAreSlowed) {
    // Cache off: every decoded token reads n_moe x k x projections slices, each now 20 ms late.
    // --no-io-overlap: every read of a layer is waited for before its first expert matmul, so
    // no delay hides behind compute (which a loaded machine slows); and a delay long against
    // the tiny model's compute keeps the cross-run comparisons clear of load noise.
    const std::string flags = "--cache-mb 0 --no-io-overlap";
    const RunOut base = run_cli(flags, "", 12);
    const RunOut slow = run_cli(flags, "MOESTREAM_DEBUG_IO_FAULT=delay:20000", 12);
    ASSERT_EQ(base.rows.size(), 11u);
    ASSERT_EQ(slow.rows.size(), 11u);
    const double reads = mean(slow, "flash_reads");
    ASSERT_GT(reads, 0);
    const double d_step = mean(slow, "step_s") - mean(base, "step_s");
    const double d_io = mean(slow, "io_s") - mean(base, "io_s");
    // At least every lane's share of the delays (4 lanes) is waited for, per token (a sleep
    // never ends early, so this lower bound holds on any machine)...
    EXPECT_GE(mean(slow, "io_s"), 0.020 * reads / 4) << "reads/token " << reads;
    EXPECT_GE(d_io, 0.020 * reads / 4 * 0.9) << "reads/token " << reads;
    // ...and the read wait takes most of what the step grew by.
    EXPECT_GE(d_io, 0.8 * d_step);
    // Negative control: compute, the hook and the remainder do not absorb the delay.
    for (const char * k : {"compute_s", "hook_s", "other_s", "stage_s"})
        EXPECT_LT(mean(slow, k) - mean(base, k), 0.1 * d_io) << k;
    for (const auto & row : slow.rows) expect_adds_up(row, "slowed row");
    // The output is the same: a delay is not a fault of the data.
    EXPECT_EQ(base.stats["logits_sha"], slow.stats["logits_sha"]);
}

// Read latency (docs/metrics.md, "Read latency"): a few reads stalled on purpose (100 ms, 2 %
// of read calls) are the run's longest read and the longest of the tokens they fell in, while
// the median stays with the undelayed reads (the negative control: a figure that charged every
// read the stall, or the batch's time, fails it).
TEST(TimeStats, ReadLatencyShowsAFewStalledReads) {
    const RunOut r = run_cli("--cache-mb 0", "MOESTREAM_DEBUG_IO_FAULT=delay:100000,p=0.02", 12);
    ASSERT_EQ(r.rows.size(), 11u);
    const json & s = r.stats;
    ASSERT_TRUE(s.contains("read_max_s")) << s.dump();
    EXPECT_GT(s["reads_timed"].get<uint64_t>(), s["flash_reads"].get<uint64_t>() / 2);
    EXPECT_LE(s["reads_timed"].get<uint64_t>(), s["flash_reads"].get<uint64_t>());
    EXPECT_GE(s["read_max_s"].get<double>(), 0.1);
    EXPECT_GE(s["read_p99_s"].get<double>(), s["read_p50_s"].get<double>());
    EXPECT_LE(s["read_p99_s"].get<double>(), s["read_max_s"].get<double>());
    EXPECT_LT(s["read_p50_s"].get<double>(), 0.1);
    double row_max = 0;
    int stalled_rows = 0;
    for (const auto & row : r.rows) {
        if (row.at("flash_reads") > 0) EXPECT_GT(row.at("read_max_s"), 0);
        row_max = std::max(row_max, row.at("read_max_s"));
        // A token with a stalled read waited at least part of it.
        if (row.at("read_max_s") >= 0.1) {
            ++stalled_rows;
            EXPECT_GT(row.at("io_s"), 0.0);
        }
    }
    EXPECT_LE(row_max, s["read_max_s"].get<double>() + 1e-6);
    EXPECT_GT(stalled_rows, 0);
}

TEST(TimeStats, ResidentRunHasNoReadWaitNoCommitNoHook) {
    const RunOut r = run_cli("--no-stream");
    ASSERT_EQ(r.rows.size(), 23u);
    for (size_t i = 0; i < r.rows.size(); ++i) {
        const auto & row = r.rows[i];
        expect_adds_up(row, "row " + std::to_string(i));
        EXPECT_EQ(row.at("io_s"), 0) << i;
        EXPECT_EQ(row.at("stage_s"), 0) << i;
        EXPECT_EQ(row.at("hook_s"), 0) << i;
        EXPECT_GT(row.at("compute_s"), 0) << i;
    }
    const json & tb = r.stats["time_breakdown"];
    for (const char * part : {"decode", "prefill"}) {
        EXPECT_EQ(tb[part]["io_s"].get<double>(), 0) << part;
        EXPECT_EQ(tb[part]["stage_s"].get<double>(), 0) << part;
        EXPECT_EQ(tb[part]["hook_s"].get<double>(), 0) << part;
    }
    EXPECT_GT(tb["decode"]["compute_s"].get<double>(), 0.5 * tb["decode"]["step_s"].get<double>());
}

}  // namespace
