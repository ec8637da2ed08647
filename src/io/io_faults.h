// io_faults.h — deterministic I/O fault injection for the tests (docs/reliability.md).
//
// MOESTREAM_DEBUG_IO_FAULT (env, read by the engine when streaming starts) installs a read
// hook on the I/O lanes once the dense weights are read (so N counts expert reads). The value is
// KIND[,lane=L][,p=P][,seed=S]. KIND (N counts read calls (pread/preadv) from 1):
//   short          a read returns at most half of what was asked (then the rest)
//   eintr          a read fails once with EINTR (without p=: every other read)
//   eio            a read fails with EIO (needs p=)
//   eio-once:N     the N-th read fails with EIO, later reads succeed
//   eio-after:N    every read from the N-th on fails with EIO
//   touch:N        the N-th read first changes the model file's ctime (fchmod to its own
//                  mode; the bytes stay), then succeeds: a file changed in the middle of a
//                  step's reads, for the check before a token is emitted
//   delay:US       every read sleeps US microseconds (1..1000000) first, then succeeds: slow
//                  reads for the time breakdown's tests (docs/metrics.md)
// lane=L   only reads on lane L (0 = the calling thread; L < --io-threads), and N counts that
//          lane's reads only.
// p=P      random: each read the fault applies to is hit with probability P (0 < P <= 1),
//          decided by a hash of (seed, lane, that lane's read count): the same seed hits the
//          same read calls of each lane. Which slices those are depends on how the reads
//          spread over lanes; with --io-threads 1 the whole sequence is reproducible.
// seed=S   the seed of p= (default 1).
// Short reads and EINTR must leave output byte-identical; EIO must stop generation with an
// error naming file, offset and errno, and poison nothing.
// Thread-safety: the hook is called from all lanes; its counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "io_lanes.h"
#include "status.h"

namespace moestream {

constexpr int kIoFaultMaxLanes = 64;  // --io-threads' upper bound

struct IoFaultPlan {
    enum class Kind { kNone, kShort, kEintr, kEio, kEioOnce, kEioAfter, kTouch, kDelay } kind = Kind::kNone;
    long n = 0;  // eio-once / eio-after / touch: the read call; delay: microseconds
    int lane = -1;         // -1 = every lane
    double p = 0;          // 0 = not random
    uint64_t seed = 1;
    std::atomic<long> calls{0};                      // all lanes (when lane < 0)
    std::atomic<long> lane_calls[kIoFaultMaxLanes];  // per lane (random decisions, lane=L)
    std::atomic<long> injected{0};                   // faults injected so far
    IoFaultPlan() {
        for (auto & c : lane_calls) c.store(0);
    }
};

// Parses the env value; Usage error naming the variable and the bad part on a bad value.
Status parse_io_fault(const char * value, IoFaultPlan * plan);
// Checks the plan against the lanes actually opened (lane=L must exist).
Status check_io_fault_lanes(const IoFaultPlan & plan, int n_lanes);
// A preadv that transfers about half of what was asked, in whole 512-byte units (buffers of
// fewer than 1024 bytes, or more than 8 buffers, are read whole): the `short` fault.
long preadv_short(int fd, const struct iovec * iov, int iovcnt, uint64_t off);
// The PreadvFn to install with IoLanes::set_pread_hook(io_fault_preadv, plan).
long io_fault_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane,
                     void * plan);

}  // namespace moestream
