// io_lanes.h — parallel, checked reads from the model file: expert slices (the streamer) and,
// at load, the dense weights (WeightBinder::read_dense).
//
// IoLanes owns N lanes. Each lane has a private file descriptor per file (O_DIRECT unless
// refused or disabled; a split model has one file per shard and every request names its file)
// and a private aligned bounce buffer; lane 0 is the calling thread, lanes 1..N-1
// are persistent worker threads. read_batch() spreads a list of slice reads over the lanes
// (work stealing over the list) and returns when all are done.
//
// O_DIRECT: GGUF tensor offsets are aligned to 32 bytes, not to the device's block size, so
// each read rounds its offset down and its end up to the direct-I/O alignment (statx
// STATX_DIOALIGN where the kernel reports it, else 4096), reads into the bounce buffer and
// copies the wanted bytes out. Where the file system refuses O_DIRECT (tmpfs, some FUSE),
// lanes fall back to buffered pread with one warning.
//
// Reads straight into the destination: when the destination has the same phase as the file
// offset modulo the alignment (the residency stores place every expert tensor so that it
// does; ResidencyStore::tensor_base), a slice is one preadv of [head block -> bounce,
// aligned body -> destination, tail block -> bounce], and only the partial head and tail
// blocks are copied. Any other request, or a direct read that comes back short, goes
// through the bounce buffer whole (the fallback path).
//
// Every read completes short reads and retries EINTR. A failure (I/O error, the file
// ending early) fails the whole batch with one message naming file, offset, length and
// errno; the destination bytes of a failed request are zero-filled, never left partial.
//
// Asynchronous batches (overlapping reads with compute): start() hands a batch to the lanes
// and returns; wait_prefix() returns once its first `prefix` requests are done (the calling thread
// reads among them meanwhile), leaving the rest to the worker lanes; finish() waits for the
// whole batch. read_batch() = start + finish. A batch may end with a tail of speculative
// reads (streamer.h, "Prefetch"): start(reqs, prefix, own) marks requests [0, own) as the
// caller's own, wait_own() returns once those are done and leaves the tail to the worker lanes
// (the calling thread never reads tail requests). Requests are claimed in index order, so the
// tail starts only after every own request has been claimed. A batch may also mark a middle
// stage (start(reqs, prefix, own, mid), prefix <= mid <= own): wait_mid() returns once requests
// [0, mid) are done (the streamer's three-stage overlap: the second projection's reads).
// Staged reads (set_staged(true)): a lane claims a request of [prefix, mid) only once every
// request of [0, prefix) is done, and one of [mid, own) only once [0, mid) is done, so the
// reads the caller waits for first do not share the device with later ones (the tail is not
// held back). Lanes waiting for a stage sleep; a failure wakes them. A failure makes wait_prefix,
// wait_own and finish wait until no lane touches the batch any more, so the caller may
// release the destinations.
// Gated reads (start(..., released), release(n)): a lane takes request i only once i is
// below the release watermark, so the caller may hand over a batch whose later destinations
// are not mapped yet (the streamer's split staging, docs/cache.md) and release them as it
// maps them. Lanes that reach the watermark sleep until release() or a failure. Waiting for
// requests releases them first (wait_prefix releases [0, prefix), finish the whole batch), so
// no wait can block on the gate. cancel_unreleased() fails the batch instead: requests at or
// past the watermark are never read nor touched (not even zero-filled).
//
// Stopped batches (stop_claims()): no lane takes another request; the requests taken already
// are read to the end as usual, the rest are never read nor touched. The streamer stops a warm
// tail this way when the next routing's own reads arrive (streamer.h, "Warm set").
//
// Read times: every request's read (its preadv calls, retries included) is timed into
// read_latency() and the batch's longest into IoBatchStats::max_read_s.
//
// Thread-safety: one batch at a time, driven from one thread (start, wait_prefix, finish,
// read_batch); the batch vector must stay alive and unchanged until finish() returns.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "read_latency.h"
#include "status.h"

struct iovec;

namespace moestream {

struct ReadRequest {
    uint64_t file_offset = 0;  // absolute offset in the file
    uint64_t len = 0;          // bytes wanted
    void * dest = nullptr;     // where the bytes go (len bytes, writable)
    // Needed only by a later matmul of the layer (the down projection): may still be in
    // flight while the first matmuls (gate, up) compute (streamer.h, "Overlap").
    bool late = false;
    // Which of the files given to IoLanes::open holds the bytes (a split model's shard:
    // TensorInfo::shard).
    uint32_t file = 0;
};

// How one request is read in place with O_DIRECT (above, "Reads straight into the
// destination"): the aligned file range [io_off, io_off + io_len) in one vectored read of up
// to three parts: the head block into the first of two bounce blocks when the slice starts
// inside it, the aligned body straight into the destination, the tail block into the second
// bounce block when the slice ends inside it. IoLanes and UringTail both read this way.
struct InPlaceRead {
    uint64_t io_off = 0, io_len = 0;  // the aligned file range read
    uint64_t head = 0, tail = 0;      // slice bytes that arrive in the head / tail bounce block
    // False when r cannot be read in place with alignment a: empty, destination not congruent
    // to the file offset mod a, a range that would overflow, or no whole aligned block inside.
    static bool plan(const ReadRequest & r, uint64_t a, InPlaceRead * out);
    // The parts for `bounce` (2 x a bytes, a-aligned) into iov[0..n); returns n (1..3).
    int iov(const ReadRequest & r, uint8_t * bounce, uint64_t a, struct iovec iov[3]) const;
    // After the read: copies the head and tail bytes from `bounce` into r.dest.
    void copy_ends(const ReadRequest & r, const uint8_t * bounce, uint64_t a) const;
};

struct IoBatchStats {
    uint64_t bytes_read = 0;    // bytes transferred from the file, alignment over-read included
    uint64_t reads = 0;         // requests served
    uint64_t direct_reads = 0;  // of those, read straight into their destination (no copy)
    double seconds = 0;         // wall time of the batch
    double max_read_s = 0;      // the longest single request's read, seconds (read_latency.h)
};

// Fault injection for tests (docs/reliability.md): every read (a preadv of iovcnt >= 1
// buffers) goes through this hook when set. It may return -1 with errno set, or fewer bytes
// than asked, to simulate faults.
using PreadvFn = long (*)(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane,
                          void * ud);
// Tests only: the clock a request's read time is taken with (nanoseconds, any epoch, never
// decreasing on one thread); null is the steady clock. Called on the lane's thread before and
// after the request's reads, so a test that advances a per-thread clock from its PreadvFn
// gets exact, load-independent read times.
using ReadClockFn = uint64_t (*)(void * ud);

class IoLanes {
public:
    IoLanes() = default;
    ~IoLanes();
    IoLanes(const IoLanes &) = delete;
    IoLanes & operator=(const IoLanes &) = delete;

    // Opens `path` once per lane. n_lanes >= 1. odirect=false forces buffered reads.
    // max_request_bytes sizes each lane's bounce buffer (plus two alignment units).
    Status open(const std::string & path, int n_lanes, bool odirect, uint64_t max_request_bytes);
    // The same for several files (a split model's shards): every lane opens each of them,
    // and a request reads from paths[request.file].
    Status open(const std::vector<std::string> & paths, int n_lanes, bool odirect,
                uint64_t max_request_bytes);

    Status read_batch(const std::vector<ReadRequest> & reqs, IoBatchStats * stats);

    // Starts a batch whose first `prefix` requests wait_prefix() waits for, and whose first
    // `own` (>= prefix; the rest is a speculative tail) wait_own() waits for.
    // mid (clamped to [prefix, own]) marks requests [0, mid) for wait_mid().
    // released: requests [0, released) may be read now, the rest after release() (above,
    // "Gated reads").
    void start(const std::vector<ReadRequest> & reqs, size_t prefix = SIZE_MAX,
               size_t own = SIZE_MAX, size_t mid = SIZE_MAX, size_t released = SIZE_MAX);
    // Raises the release watermark to n (never lowers it): the lanes may read requests
    // [0, n). Called by the batch's driving thread.
    void release(size_t n);
    // Fails the batch with `why` (unless it failed already): no lane takes another request,
    // and requests at or past the watermark stay untouched. finish() then returns the error.
    void cancel_unreleased(const Status & why);
    // Stops the batch at its claim point (above, "Stopped batches"): returns n such that
    // requests [0, n) were taken by a lane (finish() waits for them; a failure among them is
    // the batch's error as usual) and [n, size) are never read nor touched. Not a failure.
    // Called by the batch's driving thread, after the waits for what it needs, or by any other
    // thread while the driving thread is in finish() (the streamer's warm preload, driven by
    // its own thread and stopped by the decode thread); between batches it does nothing.
    size_t stop_claims();
    // After finish(): where the finished batch was stopped (stop_claims' n), SIZE_MAX if it
    // was not. Driving thread.
    size_t last_stopped_at() const { return last_stopped_at_; }
    // Ok once requests [0, prefix) are done; on a failure anywhere in the batch, the batch's
    // error (after every lane stopped). stats->seconds gets the time spent waiting.
    Status wait_prefix(IoBatchStats * stats);
    // The same for requests [0, mid) (the calling thread reads among them meanwhile).
    Status wait_mid(IoBatchStats * stats);
    // The same for requests [0, own). In a batch with a tail it adds the own requests' bytes
    // and count to stats (finish() then adds only the tail's).
    Status wait_own(IoBatchStats * stats);
    // Waits for the whole batch; adds its bytes/reads (and the time waited) to stats.
    Status finish(IoBatchStats * stats);
    bool in_flight() const { return batch_ != nullptr; }
    // Worker lanes sleeping at the release watermark now (gated reads): when it equals
    // n_lanes() - 1 (every worker; lane 0 is the caller's thread) and the caller is not in a
    // wait, no read is in flight and none starts before release() or a failure. Any thread.
    int lanes_at_gate();
    // Every request's read time since open (read_latency.h), whichever lane read it.
    const ReadLatencyHistogram & read_latency() const { return latency_; }

    bool direct() const { return direct_; }
    uint64_t dio_alignment() const { return align_; }
    int n_lanes() const { return static_cast<int>(lanes_.size()); }
    void set_pread_hook(PreadvFn fn, void * ud) {
        hook_ = fn;
        hook_ud_ = ud;
    }
    // Tests only (ReadClockFn above); set between batches.
    void set_read_clock(ReadClockFn fn, void * ud) {
        clock_ = fn;
        clock_ud_ = ud;
    }
    // true: later stages wait for the earlier ones to complete (above, "Staged reads").
    void set_staged(bool on) { staged_ = on; }

private:
    struct Lane {
        std::vector<int> fds;  // one per file, as given to open()
        uint8_t * bounce = nullptr;
        uint64_t bounce_bytes = 0;
    };

    void worker(int lane);
    // Claims and reads requests with index < limit until none is left (or one failed).
    void run_lane(int lane, size_t limit);
    void wait_lanes_idle();
    // Staged reads: blocks until request i's earlier stages are done (or the batch failed).
    void wait_stage(size_t i);
    // Gated reads: blocks until request i is released (or the batch failed).
    void wait_gate(size_t i);
    // Fails the batch with st unless it failed already (the first failure is the batch's error).
    void record_failure(const Status & st);
    // Sleeps on cv_done_ until ready(), counted in *waiters (guarded by mu_) meanwhile.
    template <class Ready>
    void sleep_until(int * waiters, Ready ready);
    Status wait_first(size_t n, const std::atomic<size_t> & done, IoBatchStats * stats);
    Status read_one(int lane, const ReadRequest & r, uint64_t * transferred);
    // The no-copy path: 1 = done, 0 = not applicable or short (use the bounce path), -1 =
    // failed with *err set.
    int read_direct(int lane, const ReadRequest & r, uint64_t * transferred, Status * err);
    // Now on the read-time clock (clock_, or the steady clock), ns.
    uint64_t read_clock_ns() const;
    long do_preadv(int lane, uint32_t file, const struct iovec * iov, int iovcnt, uint64_t off);
    long do_pread(int lane, uint32_t file, void * buf, size_t len, uint64_t off);

    std::vector<std::string> paths_;
    bool direct_ = false;
    uint64_t align_ = 4096;
    std::vector<Lane> lanes_;
    std::vector<std::thread> threads_;
    PreadvFn hook_ = nullptr;
    bool staged_ = false;
    int stage_waiters_ = 0;  // lanes sleeping in wait_stage (guarded by mu_)
    int gate_waiters_ = 0;   // lanes sleeping in wait_gate (guarded by mu_)
    void * hook_ud_ = nullptr;
    ReadClockFn clock_ = nullptr;  // tests only: the read-time clock (null: steady clock)
    void * clock_ud_ = nullptr;

    // Current batch, shared with the workers.
    std::mutex mu_;
    std::condition_variable cv_work_;
    std::condition_variable cv_done_;
    const std::vector<ReadRequest> * batch_ = nullptr;
    uint64_t generation_ = 0;
    int lanes_busy_ = 0;
    bool stop_ = false;
    std::atomic<size_t> next_{0};
    std::atomic<size_t> released_{SIZE_MAX};  // requests [0, released_) may be taken
    bool cancelled_ = false;                  // cancel_unreleased() (driving thread only)
    // stop_claims() may come from another thread: batch_'s changes, next_'s reset and
    // stopped_at_ are made under stop_mu_.
    std::mutex stop_mu_;
    size_t stopped_at_ = SIZE_MAX;       // stop_claims(): requests taken (guarded by stop_mu_)
    size_t last_stopped_at_ = SIZE_MAX;  // the last finished batch's (driving thread)
    size_t prefix_ = 0;                   // requests [0, prefix_) for wait_prefix (set by start)
    std::atomic<size_t> prefix_done_{0};  // completed requests with index < prefix_
    size_t mid_ = 0;                      // requests [0, mid_) for wait_mid (set by start)
    std::atomic<size_t> mid_done_{0};     // completed requests with index < mid_
    size_t own_ = 0;                      // requests [0, own_) for wait_own (set by start)
    std::atomic<size_t> own_done_{0};     // completed requests with index < own_
    std::atomic<uint64_t> own_bytes_{0};  // bytes of own requests (a batch with a tail)
    bool own_reported_ = false;           // wait_own() reported them (finish() skips them)
    bool waiting_prefix_ = false;         // guarded by mu_
    std::atomic<uint64_t> bytes_{0};
    std::atomic<uint64_t> direct_reads_{0};
    std::atomic<uint64_t> max_read_ns_{0};  // the batch's longest request read, ns
    ReadLatencyHistogram latency_;
    std::atomic<bool> failed_{false};
    std::mutex err_mu_;
    Status err_;
};

}  // namespace moestream
