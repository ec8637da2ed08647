// read_latency.h — how long single reads take: a log-scale histogram of read service times
// (one request's preadv calls, from the lane taking it to its bytes being in place), for the
// run's read latency figures (docs/metrics.md, "Read latency"): the median and 99th
// percentile say what the storage does normally, the longest read says whether a token's
// read wait was one stalled request.
//
// Buckets: 4 per octave from 1 µs (bucket 0 holds everything faster), so a quantile is known
// to within 19 %; the last bucket (up to 226 s) also holds every slower read. Quantiles report a
// bucket's upper edge (never below the true value, except for reads slower than 226 s).
//
// Thread-safety: record() may be called from any number of threads at once (relaxed atomic
// counters); snapshot() may run meanwhile and sees each counter at some point of its history.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace moestream {

struct ReadLatencySnapshot {
    static constexpr int kBuckets = 112;
    std::array<uint64_t, kBuckets> n{};  // reads per bucket

    uint64_t count() const;
    // The smallest bucket upper edge, in seconds, at or below which at least q (in [0, 1]) of
    // the reads fall; 0 when there are no reads.
    double quantile(double q) const;
    // The reads recorded between `earlier` and this snapshot (of the same histogram).
    ReadLatencySnapshot since(const ReadLatencySnapshot & earlier) const;
};

class ReadLatencyHistogram {
public:
    void record(double seconds);  // one read's service time; negative counts as 0
    ReadLatencySnapshot snapshot() const;

    static int bucket_of(double seconds);   // the bucket a time falls in
    static double upper_edge(int bucket);   // seconds: 2^(bucket/4) µs

private:
    std::array<std::atomic<uint64_t>, ReadLatencySnapshot::kBuckets> n_{};
};

}  // namespace moestream
