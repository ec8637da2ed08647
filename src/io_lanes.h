// io_lanes.h — parallel, checked reads of expert slices from the model file.
//
// IoLanes owns N lanes. Each lane has a private file descriptor (O_DIRECT unless refused or
// disabled) and a private aligned bounce buffer; lane 0 is the calling thread, lanes 1..N-1
// are persistent worker threads. read_batch() spreads a list of slice reads over the lanes
// (work stealing over the list) and returns when all are done.
//
// O_DIRECT: GGUF tensor offsets are aligned to 32 bytes, not to the device's block size, so
// each read rounds its offset down and its end up to the direct-I/O alignment (statx
// STATX_DIOALIGN where the kernel reports it, else 4096), reads into the bounce buffer and
// copies the wanted bytes out. Where the file system refuses O_DIRECT (tmpfs, some FUSE),
// lanes fall back to buffered pread with one warning.
//
// Every read completes short reads and retries EINTR. A failure (I/O error, the file
// ending early) fails the whole batch with one message naming file, offset, length and
// errno; the destination bytes of a failed request are zero-filled, never left partial.
//
// Thread-safety: read_batch() must not be called concurrently with itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "status.h"

namespace moestream {

struct ReadRequest {
    uint64_t file_offset = 0;  // absolute offset in the model file
    uint64_t len = 0;          // bytes wanted
    void * dest = nullptr;     // where the bytes go (len bytes, writable)
};

struct IoBatchStats {
    uint64_t bytes_read = 0;   // bytes transferred from the file, alignment over-read included
    uint64_t reads = 0;        // requests served
    double seconds = 0;        // wall time of the batch
};

// Fault injection for tests (docs/reliability.md): every read goes through this hook when
// set. It may return -1 with errno set, or fewer bytes than asked, to simulate faults.
using PreadFn = long (*)(int fd, void * buf, size_t len, uint64_t off, int lane, void * ud);

class IoLanes {
public:
    IoLanes() = default;
    ~IoLanes();
    IoLanes(const IoLanes &) = delete;
    IoLanes & operator=(const IoLanes &) = delete;

    // Opens `path` once per lane. n_lanes >= 1. odirect=false forces buffered reads.
    // max_request_bytes sizes each lane's bounce buffer (plus two alignment units).
    Status open(const std::string & path, int n_lanes, bool odirect, uint64_t max_request_bytes);

    Status read_batch(const std::vector<ReadRequest> & reqs, IoBatchStats * stats);

    bool direct() const { return direct_; }
    uint64_t dio_alignment() const { return align_; }
    int n_lanes() const { return static_cast<int>(lanes_.size()); }
    void set_pread_hook(PreadFn fn, void * ud) { hook_ = fn; hook_ud_ = ud; }

private:
    struct Lane {
        int fd = -1;
        uint8_t * bounce = nullptr;
        uint64_t bounce_bytes = 0;
    };

    void worker(int lane);
    void run_lane(int lane);
    Status read_one(int lane, const ReadRequest & r, uint64_t * transferred);
    long do_pread(int lane, void * buf, size_t len, uint64_t off);

    std::string path_;
    bool direct_ = false;
    uint64_t align_ = 4096;
    std::vector<Lane> lanes_;
    std::vector<std::thread> threads_;
    PreadFn hook_ = nullptr;
    void * hook_ud_ = nullptr;

    // Current batch, shared with the workers.
    std::mutex mu_;
    std::condition_variable cv_work_;
    std::condition_variable cv_done_;
    const std::vector<ReadRequest> * batch_ = nullptr;
    uint64_t generation_ = 0;
    int lanes_busy_ = 0;
    bool stop_ = false;
    std::atomic<size_t> next_{0};
    std::atomic<uint64_t> bytes_{0};
    std::atomic<bool> failed_{false};
    std::mutex err_mu_;
    Status err_;
};

}  // namespace moestream
