#include "io_lanes.h"

#include <fcntl.h>
#include <linux/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "moestream/log.h"

namespace moestream {
namespace {

// Direct-I/O offset alignment the file system reports for `fd` (statx STATX_DIOALIGN,
// Linux >= 6.1), or 0 when unknown.
uint64_t statx_dio_alignment(int fd) {
    struct statx stx;
    std::memset(&stx, 0, sizeof stx);
    long rc = syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx);
    if (rc != 0 || !(stx.stx_mask & STATX_DIOALIGN)) return 0;
    uint64_t a = stx.stx_dio_offset_align;
    if (stx.stx_dio_mem_align > a) a = stx.stx_dio_mem_align;
    return a;
}

uint64_t round_down(uint64_t v, uint64_t a) {
    return v - v % a;
}
uint64_t round_up(uint64_t v, uint64_t a) {
    return round_down(v + a - 1, a);
}

std::string errno_text(int e) {
    return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

}  // namespace

IoLanes::~IoLanes() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_work_.notify_all();
    for (auto & t : threads_) t.join();
    for (auto & l : lanes_) {
        for (int fd : l.fds)
            if (fd >= 0) ::close(fd);
        std::free(l.bounce);
    }
}

Status IoLanes::open(const std::string & path, int n_lanes, bool odirect,
                     uint64_t max_request_bytes) {
    return open(std::vector<std::string>{path}, n_lanes, odirect, max_request_bytes);
}

Status IoLanes::open(const std::vector<std::string> & paths, int n_lanes, bool odirect,
                     uint64_t max_request_bytes) {
    if (n_lanes < 1)
        return Status::Usage("io: " + std::to_string(n_lanes) + " read lanes (at least 1)");
    if (paths.empty()) return Status::Usage("io: no file to read");
    paths_ = paths;
    direct_ = odirect;
    lanes_.resize(static_cast<size_t>(n_lanes));
    for (int i = 0; i < n_lanes; ++i) {
        Lane & l = lanes_[i];
        l.fds.assign(paths.size(), -1);
        for (size_t f = 0; f < paths.size(); ++f) {
            const std::string & path = paths[f];
            if (direct_) {
                l.fds[f] = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
                if (l.fds[f] < 0 && errno == EINVAL) break;  // handled below
            } else {
                l.fds[f] = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
            }
            if (l.fds[f] < 0)
                return Status::Runtime(path + ": cannot open for reading: " + errno_text(errno));
        }
        if (direct_ && !l.fds.empty() && l.fds.back() < 0) {
            MS_LOG_WARN("%s: the file system refuses O_DIRECT; using buffered reads",
                        paths.front().c_str());
            direct_ = false;
            for (int j = 0; j <= i; ++j) {
                for (int & fd : lanes_[j].fds) {
                    if (fd >= 0) ::close(fd);
                    fd = -1;
                }
            }
            i = -1;  // reopen every lane buffered
        }
    }
    if (direct_) {
        // The largest alignment any of the files asks for serves them all (powers of two).
        align_ = 4096;
        uint64_t most = 0;
        bool known = true;
        for (int fd : lanes_[0].fds) {
            const uint64_t a = statx_dio_alignment(fd);
            if (a >= 512 && (a & (a - 1)) == 0)
                most = std::max(most, a);
            else
                known = false;
        }
        if (known && most > 0) align_ = most;
    } else {
        align_ = 64;  // memory alignment of the bounce buffer only
    }
    // Bounce buffer: a request of max_request_bytes at any offset spans at most
    // max_request_bytes + 2 alignment units once rounded. Capped: larger requests loop.
    const uint64_t cap = 16ull << 20;
    uint64_t want = max_request_bytes + 2 * align_;
    if (want > cap) want = cap;
    want = (want + align_ - 1) / align_ * align_;
    for (auto & l : lanes_) {
        void * p = nullptr;
        if (posix_memalign(&p, align_ < 4096 ? 4096 : align_, want) != 0)
            return Status::Runtime("cannot allocate " + std::to_string(want) +
                                   " bytes of I/O buffer");
        std::memset(p, 0, want);  // commit now, not under memory pressure during decode
        l.bounce = static_cast<uint8_t *>(p);
        l.bounce_bytes = want;
    }
    for (int i = 1; i < n_lanes; ++i) threads_.emplace_back(&IoLanes::worker, this, i);
    MS_LOG_INFO("io: %d lane(s), %s, alignment %llu, bounce %llu KiB each", n_lanes,
                direct_ ? "O_DIRECT" : "buffered", (unsigned long long)align_,
                (unsigned long long)(want >> 10));
    return Status::Ok();
}

long IoLanes::do_preadv(int lane, uint32_t file, const struct iovec * iov, int iovcnt,
                        uint64_t off) {
    const int fd = lanes_[lane].fds[file];
    if (hook_) return hook_(fd, iov, iovcnt, off, lane, hook_ud_);
    return ::preadv(fd, iov, iovcnt, static_cast<off_t>(off));
}

long IoLanes::do_pread(int lane, uint32_t file, void * buf, size_t len, uint64_t off) {
    struct iovec v = {buf, len};
    return do_preadv(lane, file, &v, 1, off);
}

bool InPlaceRead::plan(const ReadRequest & r, uint64_t a, InPlaceRead * out) {
    const uint64_t off = r.file_offset;
    if (r.len == 0 || reinterpret_cast<uintptr_t>(r.dest) % a != off % a) return false;
    if (r.len > UINT64_MAX - off - 2 * a) return false;  // the bounce path reports the bad range
    const uint64_t end = off + r.len;
    const uint64_t body0 = round_up(off, a), body1 = round_down(end, a);
    if (body1 <= body0) return false;  // no whole aligned block inside: nothing to gain
    out->io_off = round_down(off, a);
    out->io_len = round_up(end, a) - out->io_off;
    out->head = body0 - off;
    out->tail = end - body1;
    return true;
}

int InPlaceRead::iov(const ReadRequest & r, uint8_t * bounce, uint64_t a,
                     struct iovec iov[3]) const {
    int n = 0;
    if (head) iov[n++] = {bounce, a};  // head block: the slice starts inside
    // aligned, because dest ≡ off (mod a)
    iov[n++] = {static_cast<uint8_t *>(r.dest) + head, r.len - head - tail};
    if (tail) iov[n++] = {bounce + a, a};  // tail block: the slice ends inside
    return n;
}

void InPlaceRead::copy_ends(const ReadRequest & r, const uint8_t * bounce, uint64_t a) const {
    uint8_t * dest = static_cast<uint8_t *>(r.dest);
    if (head) std::memcpy(dest, bounce + (r.file_offset - io_off), head);
    if (tail) std::memcpy(dest + (r.len - tail), bounce + a, tail);
}

int IoLanes::read_direct(int lane, const ReadRequest & r, uint64_t * transferred, Status * err) {
    InPlaceRead p;
    if (!direct_ || !InPlaceRead::plan(r, align_, &p)) return 0;
    Lane & l = lanes_[lane];
    struct iovec iov[3];
    const int n = p.iov(r, l.bounce, align_, iov);
    long got;
    do got = do_preadv(lane, r.file, iov, n, p.io_off);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
        const int e = errno;
        std::memset(r.dest, 0, r.len);
        *err = Status::Runtime(paths_[r.file] + ": read failed at offset " + std::to_string(p.io_off) +
                               " length " + std::to_string(p.io_len) + " (slice at offset " +
                               std::to_string(r.file_offset) + ", " + std::to_string(r.len) +
                               " bytes): " + errno_text(e));
        return -1;
    }
    *transferred += static_cast<uint64_t>(got);
    if (static_cast<uint64_t>(got) < p.io_len) return 0;  // short: redo via the bounce path
    p.copy_ends(r, l.bounce, align_);
    return 1;
}

Status IoLanes::read_one(int lane, const ReadRequest & r, uint64_t * transferred) {
    if (r.file >= paths_.size()) {
        std::memset(r.dest, 0, r.len);
        return Status::Runtime("io: request for file #" + std::to_string(r.file) + " of " +
                               std::to_string(paths_.size()));
    }
    Status derr;
    const int direct = read_direct(lane, r, transferred, &derr);
    if (direct == 1) {
        direct_reads_.fetch_add(1, std::memory_order_relaxed);
        return Status::Ok();
    }
    if (direct < 0) return derr;
    Lane & l = lanes_[lane];
    uint8_t * dest = static_cast<uint8_t *>(r.dest);
    uint64_t done = 0;  // bytes of the request delivered to dest
    while (done < r.len) {
        const uint64_t want_off = r.file_offset + done;
        const uint64_t want_len = r.len - done;
        uint64_t io_off, skip, io_len;
        if (direct_) {
            io_off = round_down(want_off, align_);
            skip = want_off - io_off;
            io_len = skip + want_len;
            io_len = (io_len + align_ - 1) / align_ * align_;
            if (io_len > l.bounce_bytes) io_len = l.bounce_bytes;
        } else {
            io_off = want_off;
            skip = 0;
            io_len = want_len < l.bounce_bytes ? want_len : l.bounce_bytes;
        }
        // One transfer of io_len bytes into the bounce buffer; short reads completed.
        // Under O_DIRECT a transfer must start aligned: after a short read that ends unaligned
        // the partial block is read again from its aligned start. If that read ends at the
        // same place, the file ends there.
        uint64_t got = 0;
        uint64_t unaligned_end = 0;
        while (got < io_len) {
            long n = do_pread(lane, r.file, l.bounce + got, io_len - got, io_off + got);
            if (n < 0) {
                if (errno == EINTR) continue;
                int e = errno;
                std::memset(dest, 0, r.len);
                return Status::Runtime(paths_[r.file] + ": read failed at offset " +
                                       std::to_string(io_off + got) + " length " +
                                       std::to_string(io_len - got) + " (slice at offset " +
                                       std::to_string(r.file_offset) + ", " +
                                       std::to_string(r.len) + " bytes): " + errno_text(e));
            }
            if (n == 0) break;  // end of file
            const uint64_t end = got + static_cast<uint64_t>(n);
            if (direct_ && end % align_ != 0 && end < io_len) {
                if (end <= unaligned_end) {  // no progress: the file ends at unaligned_end
                    got = unaligned_end;
                    break;
                }
                unaligned_end = end;
                got = round_down(end, align_);
                continue;
            }
            got = end;
        }
        *transferred += got;
        if (got <= skip) {
            std::memset(dest, 0, r.len);
            return Status::Runtime(paths_[r.file] + ": unexpected end of file at offset " +
                                   std::to_string(io_off + got) + " reading the slice at offset " +
                                   std::to_string(r.file_offset) + " (" + std::to_string(r.len) +
                                   " bytes): the file is shorter than the model says (truncated?)");
        }
        uint64_t useful = got - skip;
        if (useful > want_len) useful = want_len;
        std::memcpy(dest + done, l.bounce + skip, useful);
        done += useful;
        if (got < io_len && done < r.len) {
            std::memset(dest, 0, r.len);
            return Status::Runtime(paths_[r.file] + ": unexpected end of file at offset " +
                                   std::to_string(io_off + got) + " reading the slice at offset " +
                                   std::to_string(r.file_offset) + " (" + std::to_string(r.len) +
                                   " bytes): the file is shorter than the model says (truncated?)");
        }
    }
    return Status::Ok();
}

uint64_t IoLanes::read_clock_ns() const {
    if (clock_) return clock_(clock_ud_);
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

void IoLanes::run_lane(int lane, size_t limit) {
    const auto & reqs = *batch_;
    if (limit > reqs.size()) limit = reqs.size();
    uint64_t transferred = 0;
    for (;;) {
        if (failed_.load(std::memory_order_relaxed)) break;
        size_t i = next_.load(std::memory_order_relaxed);
        bool claimed = false;
        while (i < limit && !failed_.load(std::memory_order_relaxed)) {
            if (i >= released_.load(std::memory_order_acquire)) {
                wait_gate(i);  // the next request is not released yet: sleep, then look again
                i = next_.load(std::memory_order_relaxed);
                continue;
            }
            if (next_.compare_exchange_weak(i, i + 1, std::memory_order_relaxed)) {
                claimed = true;
                break;
            }
        }
        if (!claimed) break;
        if (staged_ && i >= prefix_ && i < own_) wait_stage(i);
        if (failed_.load(std::memory_order_relaxed)) break;
        const uint64_t before = transferred;
        const uint64_t t0 = read_clock_ns();
        Status st = read_one(lane, reqs[i], &transferred);
        const uint64_t ns = read_clock_ns() - t0;
        latency_.record(double(ns) * 1e-9);
        for (uint64_t m = max_read_ns_.load(std::memory_order_relaxed);
             ns > m && !max_read_ns_.compare_exchange_weak(m, ns, std::memory_order_relaxed);) {
        }
        if (i < own_ && own_ < reqs.size())
            own_bytes_.fetch_add(transferred - before, std::memory_order_relaxed);
        if (!st.ok()) record_failure(st);
        const bool prefix_now = i < prefix_ && prefix_done_.fetch_add(1) + 1 == prefix_;
        const bool mid_now = i < mid_ && mid_done_.fetch_add(1) + 1 == mid_;
        const bool own_now = i < own_ && own_done_.fetch_add(1) + 1 == own_;
        if (prefix_now || mid_now || own_now) {
            std::lock_guard<std::mutex> lk(mu_);
            if (waiting_prefix_ || stage_waiters_ > 0) cv_done_.notify_all();
        }
        if (!st.ok()) {
            std::lock_guard<std::mutex> lk(mu_);
            cv_done_.notify_all();  // a waiter for the prefix must see the failure
        }
    }
    bytes_.fetch_add(transferred, std::memory_order_relaxed);
}

void IoLanes::wait_stage(size_t i) {
    const bool second = i < mid_;  // else the third stage: needs [0, mid)
    const auto ready = [&] {
        return failed_.load() ||
               (second ? prefix_done_.load() >= prefix_ : mid_done_.load() >= mid_);
    };
    sleep_until(&stage_waiters_, ready);
}

void IoLanes::wait_gate(size_t i) {
    sleep_until(&gate_waiters_, [&] {
        return failed_.load() || released_.load(std::memory_order_acquire) > i;
    });
}

template <class Ready>
void IoLanes::sleep_until(int * waiters, Ready ready) {
    if (ready()) return;
    std::unique_lock<std::mutex> lk(mu_);
    ++*waiters;
    cv_done_.wait(lk, ready);
    --*waiters;
}

int IoLanes::lanes_at_gate() {
    std::lock_guard<std::mutex> lk(mu_);
    return gate_waiters_;
}

void IoLanes::release(size_t n) {
    if (batch_ == nullptr || cancelled_ || n <= released_.load()) return;
    std::lock_guard<std::mutex> lk(mu_);  // a lane checks the watermark under mu_ before it sleeps
    if (n > released_.load()) released_.store(n, std::memory_order_release);
    if (gate_waiters_ > 0) cv_done_.notify_all();
}

void IoLanes::record_failure(const Status & st) {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (!failed_.exchange(true)) err_ = st;
}

void IoLanes::cancel_unreleased(const Status & why) {
    if (batch_ == nullptr) return;
    cancelled_ = true;
    record_failure(why);
    std::lock_guard<std::mutex> lk(mu_);
    cv_done_.notify_all();  // lanes at the gate or at a stage wait see the failure
}

size_t IoLanes::stop_claims() {
    std::lock_guard<std::mutex> lk(stop_mu_);  // (any thread: batch_ changes under it)
    if (batch_ == nullptr) return 0;
    // A lane takes request i by moving next_ from i to i + 1: moving it past the end instead
    // leaves every later claim failing, and what it held is the count taken.
    const size_t n = std::min(next_.exchange(batch_->size()), batch_->size());
    stopped_at_ = n;
    return n;
}

void IoLanes::worker(int lane) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
        }
        run_lane(lane, SIZE_MAX);
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (--lanes_busy_ == 0) cv_done_.notify_all();
        }
    }
}

void IoLanes::start(const std::vector<ReadRequest> & reqs, size_t prefix, size_t own,
                    size_t mid, size_t released) {
    {
        std::lock_guard<std::mutex> lk(stop_mu_);
        batch_ = &reqs;
        next_.store(0);
        stopped_at_ = SIZE_MAX;
    }
    released_.store(released);
    cancelled_ = false;
    bytes_.store(0);
    direct_reads_.store(0);
    max_read_ns_.store(0);
    failed_.store(false);
    own_ = own < reqs.size() ? own : reqs.size();
    prefix_ = prefix < own_ ? prefix : own_;
    prefix_done_.store(0);
    mid_ = std::min(std::max(mid, prefix_), own_);
    mid_done_.store(0);
    own_done_.store(0);
    own_bytes_.store(0);
    own_reported_ = false;
    err_ = Status::Ok();
    // Worker lanes join when there is more than one request, or a tail the caller leaves to them.
    const bool wake = reqs.size() > 1 || own_ < reqs.size();
    const int helpers = wake ? static_cast<int>(lanes_.size()) - 1 : 0;
    if (helpers > 0) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            lanes_busy_ = static_cast<int>(lanes_.size()) - 1;
            ++generation_;
        }
        cv_work_.notify_all();
    }
}

void IoLanes::wait_lanes_idle() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return lanes_busy_ == 0; });
}

Status IoLanes::wait_prefix(IoBatchStats * stats) {
    return wait_first(prefix_, prefix_done_, stats);
}

Status IoLanes::wait_mid(IoBatchStats * stats) {
    return wait_first(mid_, mid_done_, stats);
}

Status IoLanes::wait_own(IoBatchStats * stats) {
    Status st = wait_first(own_, own_done_, stats);
    if (!st.ok() || batch_ == nullptr) return st;  // failed: finish() has reported everything
    if (stats && own_ < batch_->size()) {
        // Only the own requests here; finish() reports the tail.
        stats->bytes_read += own_bytes_.load();
        stats->reads += own_;
        own_reported_ = true;
    }
    return st;
}

Status IoLanes::wait_first(size_t n, const std::atomic<size_t> & done, IoBatchStats * stats) {
    if (batch_ == nullptr) return Status::Ok();
    auto t0 = std::chrono::steady_clock::now();
    release(n);      // what is waited for may be read (no wait blocks on the gate)
    run_lane(0, n);  // the calling thread reads among [0, n) only, never the tail
    {
        std::unique_lock<std::mutex> lk(mu_);
        waiting_prefix_ = true;
        cv_done_.wait(lk, [&] { return failed_.load() || done.load() >= n || lanes_busy_ == 0; });
        waiting_prefix_ = false;
    }
    if (stats) {
        stats->seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stats->max_read_s = std::max(stats->max_read_s, double(max_read_ns_.load()) * 1e-9);
    }
    if (failed_.load()) return finish(stats);
    return Status::Ok();
}

Status IoLanes::finish(IoBatchStats * stats) {
    if (batch_ == nullptr) return Status::Ok();
    auto t0 = std::chrono::steady_clock::now();
    const auto & reqs = *batch_;
    release(SIZE_MAX);
    run_lane(0, SIZE_MAX);
    wait_lanes_idle();
    size_t stopped_at = SIZE_MAX;
    {
        std::lock_guard<std::mutex> lk(stop_mu_);
        batch_ = nullptr;
        stopped_at = stopped_at_;
    }
    last_stopped_at_ = stopped_at;
    if (stats) {
        stats->bytes_read += bytes_.load() - (own_reported_ ? own_bytes_.load() : 0);
        stats->reads += std::min(reqs.size(), stopped_at) - (own_reported_ ? own_ : 0);
        stats->direct_reads += direct_reads_.load();
        stats->seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stats->max_read_s = std::max(stats->max_read_s, double(max_read_ns_.load()) * 1e-9);
    }
    if (failed_.load()) {
        // Requests never started by any lane leave their destination untouched: zero them
        // so no consumer ever sees stale bytes presented as this batch's result.
        // Requests past the release watermark of a cancelled batch may have no memory under
        // them: never touched.
        // A stopped batch's requests past the stop are never touched either.
        size_t started = stopped_at != SIZE_MAX ? reqs.size() : next_.load();
        const size_t end = std::min(reqs.size(), released_.load());
        for (size_t i = started; i < end; ++i) std::memset(reqs[i].dest, 0, reqs[i].len);
        return err_;
    }
    return Status::Ok();
}

Status IoLanes::read_batch(const std::vector<ReadRequest> & reqs, IoBatchStats * stats) {
    if (reqs.empty()) return Status::Ok();
    start(reqs);
    return finish(stats);
}

}  // namespace moestream
