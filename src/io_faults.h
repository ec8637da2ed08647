// io_faults.h — deterministic I/O fault injection for the tests (docs/reliability.md).
//
// MOESTREAM_DEBUG_IO_FAULT (env, read by the engine when streaming starts) installs a read
// hook on the I/O lanes. Forms (N counts read calls (pread/preadv) from 1, over all lanes):
//   short          every read returns at most half of what was asked (then the rest)
//   eintr          every other read fails once with EINTR
//   eio-once:N     the N-th read fails with EIO, later reads succeed
//   eio-after:N    every read from the N-th on fails with EIO
// Short reads and EINTR must leave output byte-identical; EIO must stop generation with an
// error naming file, offset and errno, and poison nothing.
// Thread-safety: the hook is called from all lanes; its counter is atomic.
#pragma once

#include <atomic>
#include <string>

#include "io_lanes.h"
#include "status.h"

namespace moestream {

struct IoFaultPlan {
    enum class Kind { kNone, kShort, kEintr, kEioOnce, kEioAfter } kind = Kind::kNone;
    long n = 0;
    std::atomic<long> calls{0};
};

// Parses the env value; Usage error naming the variable on a bad value.
Status parse_io_fault(const char * value, IoFaultPlan * plan);
// A preadv that transfers about half of what was asked, in whole 512-byte units (buffers of
// fewer than 1024 bytes, or more than 8 buffers, are read whole): the `short` fault.
long preadv_short(int fd, const struct iovec * iov, int iovcnt, uint64_t off);
// The PreadvFn to install with IoLanes::set_pread_hook(io_fault_preadv, plan).
long io_fault_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane,
                     void * plan);

}  // namespace moestream
