// uring_tail.h — the prefetch tail's reads through io_uring: submitted by the compute thread,
// reaped at the next routing, with no reader thread to wake in between.
//
// Why: read through the worker lanes, a read-ahead costs compute time on a 2-core machine.
// Each completion wakes a lane thread, which preempts a compute thread, and ggml's threads
// wait for each other at every op (docs/prefetch.md, bench `prefetch`). With io_uring the
// compute thread submits the tail in one system call. The ring is set up with
// IORING_SETUP_DEFER_TASKRUN | SINGLE_ISSUER where the kernel has them (6.1+), so completions
// are processed only when reap() asks. Nothing runs on our behalf while the matmuls compute.
//
// Only in-place O_DIRECT reads are submitted, like IoLanes::read_direct:
// - The destination must be congruent to the file offset modulo the alignment, with at least
//   one whole aligned block inside.
// - Each request is one READV of [head block -> bounce, aligned body -> destination, tail
//   block -> bounce]; reap() copies the partial head and tail.
// - Anything else makes submit() refuse the whole tail (the caller reads it another way).
// - A failed, short or refused read fails reap() with a message naming file, offset and errno.
//   Its destination is zero-filled, never left partial.
//
// Invariants: at most one tail in flight; the destinations stay valid and untouched until
// reap() returns.
// Thread-safety: one thread submits and reaps (the ring is single-issuer where supported;
// a ring made on another thread is remade).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io_lanes.h"
#include "status.h"

namespace moestream {

class UringTail {
public:
    // Null (with the reason in *why) when io_uring or O_DIRECT is not available for `path`.
    static std::unique_ptr<UringTail> create(const std::string & path, uint64_t align,
                                             std::string * why);
    // The same for several files (a split model's shards): a request reads paths[r.file].
    static std::unique_ptr<UringTail> create(const std::vector<std::string> & paths,
                                             uint64_t align, std::string * why);
    ~UringTail();
    UringTail(const UringTail &) = delete;
    UringTail & operator=(const UringTail &) = delete;

    // Submits reqs[first..]. False (nothing submitted) when one of them cannot go in place,
    // there are more than kMaxRequests, or the ring refuses; the caller then reads them itself.
    bool submit(const std::vector<ReadRequest> & reqs, size_t first);
    // Waits for every submitted read; adds their bytes, count and the time waited to stats.
    Status reap(IoBatchStats * stats);
    bool in_flight() const { return n_ > 0; }

    static constexpr size_t kMaxRequests = 128;

private:
    UringTail() = default;
    bool setup_ring();

    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::vector<std::string> paths_;
    std::vector<int> fds_;  // one O_DIRECT descriptor per file
    uint64_t align_ = 4096;
    uint8_t * bounce_ = nullptr;  // kMaxRequests x 2 blocks: each request's head and tail
    size_t n_ = 0;                // reads in flight
    struct Pending {
        ReadRequest r;     // a copy: the caller's vector may go (its destinations may not)
        InPlaceRead span;  // how it is read (io_lanes.h)
    };
    std::vector<Pending> pending_;
    std::vector<struct iovec> iov_;  // 3 per request, alive until reap()
};

}  // namespace moestream
