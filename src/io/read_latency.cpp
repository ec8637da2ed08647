#include "read_latency.h"

#include <cmath>

namespace moestream {

int ReadLatencyHistogram::bucket_of(double seconds) {
    const double us = seconds * 1e6;
    if (!(us > 1.0)) return 0;  // also NaN
    const double b = std::ceil(4.0 * std::log2(us));  // upper_edge(b) >= seconds
    if (b >= ReadLatencySnapshot::kBuckets - 1) return ReadLatencySnapshot::kBuckets - 1;
    return int(b);
}

double ReadLatencyHistogram::upper_edge(int bucket) {
    if (bucket < 0) bucket = 0;
    if (bucket > ReadLatencySnapshot::kBuckets - 1) bucket = ReadLatencySnapshot::kBuckets - 1;
    return std::exp2(bucket / 4.0) * 1e-6;
}

void ReadLatencyHistogram::record(double seconds) {
    n_[size_t(bucket_of(seconds))].fetch_add(1, std::memory_order_relaxed);
}

ReadLatencySnapshot ReadLatencyHistogram::snapshot() const {
    ReadLatencySnapshot s;
    for (size_t i = 0; i < s.n.size(); ++i) s.n[i] = n_[i].load(std::memory_order_relaxed);
    return s;
}

uint64_t ReadLatencySnapshot::count() const {
    uint64_t c = 0;
    for (uint64_t v : n) c += v;
    return c;
}

double ReadLatencySnapshot::quantile(double q) const {
    const uint64_t total = count();
    if (total == 0) return 0;
    if (!(q > 0)) q = 0;
    if (q > 1) q = 1;
    // The rank of the q-quantile, at least the first read.
    uint64_t rank = uint64_t(std::ceil(q * double(total)));
    if (rank == 0) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
        seen += n[size_t(i)];
        if (seen >= rank) return ReadLatencyHistogram::upper_edge(i);
    }
    return ReadLatencyHistogram::upper_edge(kBuckets - 1);
}

ReadLatencySnapshot ReadLatencySnapshot::since(const ReadLatencySnapshot & earlier) const {
    ReadLatencySnapshot d;
    for (size_t i = 0; i < n.size(); ++i) d.n[i] = n[i] >= earlier.n[i] ? n[i] - earlier.n[i] : 0;
    return d;
}

}  // namespace moestream
