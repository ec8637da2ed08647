// page_pool.cpp — PagePool (see page_pool.h).
#include "page_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

namespace moestream {
namespace {

// Whether a file may grow to `bytes` under RLIMIT_FSIZE. Growing past it would raise
// SIGXFSZ, whose default action kills the process: check first, never trigger it.
bool size_allowed(uint64_t bytes) {
    struct rlimit r;
    if (getrlimit(RLIMIT_FSIZE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return true;
    return bytes <= uint64_t(r.rlim_cur);
}

int make_memfd(const char * name) {
#ifdef MFD_CLOEXEC
    return memfd_create(name, MFD_CLOEXEC);
#else
    errno = ENOSYS;
    return -1;
#endif
}

}  // namespace

std::unique_ptr<PagePool> PagePool::create(uint64_t page_bytes, Status * st) {
    const int probe = make_memfd("moestream-probe");
    if (probe < 0) {
        *st = Status::Runtime(std::string("expert cache: memfd_create: ") + std::strerror(errno));
        return nullptr;
    }
    close(probe);
    *st = Status::Ok();
    int overcommit = 0;
    if (FILE * f = std::fopen("/proc/sys/vm/overcommit_memory", "r")) {
        if (std::fscanf(f, "%d", &overcommit) != 1) overcommit = 0;
        std::fclose(f);
    }
    return std::unique_ptr<PagePool>(new PagePool(page_bytes, overcommit == 2));
}

PagePool::~PagePool() {
    finish_warm(true);  // the thread uses the memfds
    for (Class & c : classes_)
        if (c.fd >= 0) close(c.fd);
}

uint32_t PagePool::class_for(uint64_t chunk_pages, uint64_t slices, Status * st) {
    *st = Status::Ok();
    for (size_t i = 0; i < classes_.size(); ++i)
        if (classes_[i].chunk_pages == chunk_pages) {
            classes_[i].slices += slices;
            return uint32_t(i);
        }
    Class c;
    c.chunk_pages = chunk_pages;
    c.slices = slices;
    // The name shows in /proc/PID/maps and /proc/PID/fd (tests find the pool's pages there).
    c.fd = make_memfd("moestream-pool");
    if (c.fd < 0)
        *st = Status::Runtime(std::string("expert cache: memfd_create: ") + std::strerror(errno));
    classes_.push_back(std::move(c));
    return uint32_t(classes_.size() - 1);
}

Status PagePool::size_files(uint64_t budget_bytes, uint64_t spare) {
    for (Class & c : classes_) {
        if (c.fd < 0) continue;
        const uint64_t cb = c.chunk_pages * page_;
        const uint64_t n = std::min(c.slices, budget_bytes / cb + spare);
        if (n > UINT64_MAX / cb) return Status::Runtime("expert cache: page pool too large");
        if (n * cb <= c.file_bytes) continue;
        if (!size_allowed(n * cb))
            return Status::Runtime("expert cache: cannot size the page pool to " +
                                   std::to_string(n * cb) + " bytes: above RLIMIT_FSIZE");
        if (ftruncate(c.fd, off_t(n * cb)) != 0)
            return Status::Runtime(std::string("expert cache: cannot size the page pool to ") +
                                   std::to_string(n * cb) + " bytes: " + std::strerror(errno));
        c.file_bytes = n * cb;
    }
    return Status::Ok();
}

bool PagePool::take(uint32_t cls, uint64_t * off, bool * recycled, int * err, bool * warmed) {
    Class & c = classes_[cls];
    const uint64_t cb = c.chunk_pages * page_;
    if (warmed) *warmed = false;
    if (!c.free.empty()) {
        *off = c.free.back();
        c.free.pop_back();
        *recycled = true;
        ++recycled_;
        return true;
    }
    if (!c.warm.empty()) {  // zeroed pages, already held
        *off = c.warm.back();
        c.warm.pop_back();
        *recycled = true;
        if (warmed) *warmed = true;
        ++warmed_taken_;
        return true;
    }
    if (warm_thread_.joinable() && cls < n_warm_) {
        WarmClass & w = warm_[cls];
        if (w.handed < w.done.load(std::memory_order_acquire)) {  // zeroed by the thread
            *off = w.handed++ * w.chunk;
            *recycled = true;
            if (warmed) *warmed = true;
            ++warmed_taken_;
            held_bytes_ += cb;
            return true;
        }
        // Demand overtook the warm-up (or it has finished): stop it, then take a chunk it
        // completed meanwhile, else a new one.
        finish_warm(true);
        if (!c.warm.empty()) return take(cls, off, recycled, err, warmed);
    }
    *recycled = false;
    if (c.fd < 0) {
        *err = EBADF;
        return false;
    }
    if (!c.holes.empty()) {
        *off = c.holes.back();
        c.holes.pop_back();
    } else {
        if (c.next_off > UINT64_MAX / 2 - cb) {
            *err = EFBIG;
            return false;
        }
        if (c.next_off + cb > c.file_bytes) {
            // Grow the (sparse) file geometrically: ftruncate allocates no pages.
            uint64_t want = std::max<uint64_t>(c.file_bytes * 2, c.next_off + cb);
            want = std::min<uint64_t>(want, std::max<uint64_t>(c.slices * cb, c.next_off + cb));
            if (!size_allowed(want)) want = c.next_off + cb;
            if (!size_allowed(want)) {
                *err = EFBIG;
                return false;
            }
            if (ftruncate(c.fd, off_t(want)) != 0) {
                *err = errno;
                return false;
            }
            c.file_bytes = want;
        }
        *off = c.next_off;
        c.next_off += cb;
    }
    if (eager_ && fallocate(c.fd, 0, off_t(*off), off_t(cb)) != 0) {
        *err = errno;
        c.holes.push_back(*off);  // no pages (any partly allocated go with a punch)
        fallocate(c.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(*off), off_t(cb));
        return false;
    }
    held_bytes_ += cb;
    return true;
}

void PagePool::give_back(uint32_t cls, uint64_t off) {
    classes_[cls].free.push_back(off);
}

bool PagePool::has_free(uint32_t cls) const {
    const Class & c = classes_[cls];
    if (!c.free.empty() || !c.warm.empty()) return true;
    return warm_thread_.joinable() && cls < n_warm_ &&
           warm_[cls].handed < warm_[cls].done.load(std::memory_order_acquire);
}

bool PagePool::punch_free_chunk(uint32_t keep_cls) {
    finish_warm(true);  // its chunks must be countable and punchable
    for (size_t i = 0; i < classes_.size(); ++i) {
        Class & c = classes_[i];
        if (i == keep_cls) continue;  // keep_cls = kAnyClass: none kept
        // Warmed chunks never taken first (nobody's bytes), then recycled ones.
        std::vector<uint64_t> & list = !c.warm.empty() ? c.warm : c.free;
        if (list.empty()) continue;
        const uint64_t off = list.back();
        const uint64_t cb = c.chunk_pages * page_;
        if (fallocate(c.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(off), off_t(cb)) != 0)
            continue;  // keep it (still counted as held): the budget stays honest
        list.pop_back();
        c.holes.push_back(off);
        held_bytes_ -= cb;
        ++punched_;
        return true;
    }
    return false;
}

void PagePool::start_warm(uint64_t budget_bytes) {
    if (warm_ || classes_.empty()) return;
    // Each class's share of a full cache: slices x chunk bytes (unsigned __int128: budget x
    // class bytes can exceed 64 bits).
    unsigned __int128 total = 0;
    for (const Class & c : classes_) total += (unsigned __int128)c.slices * c.chunk_pages * page_;
    if (total == 0) return;
    warm_.reset(new WarmClass[classes_.size()]);
    n_warm_ = classes_.size();
    uint64_t planned = 0;
    for (size_t i = 0; i < classes_.size(); ++i) {
        const Class & c = classes_[i];
        WarmClass & w = warm_[i];
        w.fd = c.fd;
        w.chunk = c.chunk_pages * page_;
        if (c.fd < 0 || w.chunk == 0) continue;
        const unsigned __int128 bytes = (unsigned __int128)c.slices * w.chunk;
        const uint64_t share = uint64_t((unsigned __int128)budget_bytes * bytes / total);
        w.planned = std::min({share / w.chunk, c.slices, c.file_bytes / w.chunk});
        planned += w.planned;
    }
    if (planned == 0) {
        warm_.reset();
        n_warm_ = 0;
        return;
    }
    warm_cancel_.store(false);
    try {
        warm_thread_ = std::thread([this] { warm_main(); });
    } catch (const std::system_error & e) {  // no thread: no warm-up, nothing allocated
        warm_error_ = e.code().value();
        for (size_t i = 0; i < n_warm_; ++i) warm_[i].planned = 0;
    }
}

// The warm-up thread: zero-fills the planned chunks of every class from offset 0, in 64
// rounds that each advance every class by 1/64 of its plan (a cancelled warm-up has warmed
// the classes evenly), one pwrite of at most 1 MiB at a time. pwrite (not fallocate): a
// fallocated shmem page is zero-filled only at its first access, which would be the mapping
// on the compute thread.
void PagePool::warm_main() {
    const auto t0 = std::chrono::steady_clock::now();
    // Idle CPU only: once the compute threads run, the warm-up must not take their cores
    // (best effort; the nice value of this thread alone).
    const pid_t tid = pid_t(syscall(SYS_gettid));
    errno = 0;
    const int nice_now = getpriority(PRIO_PROCESS, id_t(tid));
    if (errno == 0) setpriority(PRIO_PROCESS, id_t(tid), std::min(19, nice_now + 10));
    constexpr uint64_t kBuf = 1 << 20;
    // Read-only anonymous memory: every page is the shared zero page (no RAM, cache-hot).
    void * zeros = mmap(nullptr, kBuf, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int err = zeros == MAP_FAILED ? errno : 0;
    constexpr uint64_t kRounds = 64;
    for (uint64_t round = 1; round <= kRounds && err == 0; ++round)
        for (size_t i = 0; i < n_warm_ && err == 0; ++i) {
            WarmClass & w = warm_[i];
            const uint64_t goal = w.planned * round / kRounds;
            uint64_t done = w.done.load(std::memory_order_relaxed);
            while (done < goal && err == 0) {
                const off_t at = off_t(done * w.chunk);
                uint64_t left = w.chunk;
                while (left > 0) {
                    if (warm_cancel_.load(std::memory_order_relaxed)) {
                        err = -1;
                        break;
                    }
                    const ssize_t n = pwrite(w.fd, zeros, std::min(left, kBuf),
                                             at + off_t(w.chunk - left));
                    if (n < 0 && errno == EINTR) continue;
                    if (n <= 0) {
                        err = n < 0 ? errno : EIO;
                        break;
                    }
                    left -= uint64_t(n);
                }
                if (err != 0) {  // the part-written chunk's pages go back to the system
                    fallocate(w.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, off_t(w.chunk));
                    break;
                }
                w.done.store(++done, std::memory_order_release);
            }
        }
    if (zeros != MAP_FAILED) munmap(zeros, kBuf);
    warm_error_ = err > 0 ? err : 0;
    warm_cancelled_ = err < 0;
    warm_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    warm_ended_.store(true, std::memory_order_release);  // publishes the three above
}

void PagePool::finish_warm(bool cancel) {
    if (!warm_thread_.joinable()) return;
    if (cancel) warm_cancel_.store(true);
    warm_thread_.join();
    for (size_t i = 0; i < n_warm_; ++i) {
        Class & c = classes_[i];
        const WarmClass & w = warm_[i];
        const uint64_t n = w.done.load(std::memory_order_acquire);
        if (n == 0) continue;
        // The thread warmed chunks [0, n) and take() handed out [0, handed) (no new chunk is
        // taken while it runs): the rest become warmed free chunks, lowest offset first.
        c.next_off = std::max(c.next_off, n * w.chunk);
        for (uint64_t k = n; k-- > w.handed;) c.warm.push_back(k * w.chunk);
        held_bytes_ += (n - w.handed) * w.chunk;
    }
}

PagePool::WarmStats PagePool::warm_stats() const {
    WarmStats s;
    for (size_t i = 0; i < n_warm_; ++i) {
        s.planned_bytes += warm_[i].planned * warm_[i].chunk;
        s.warmed_bytes += warm_[i].done.load(std::memory_order_acquire) * warm_[i].chunk;
    }
    if (!warm_thread_.joinable() || warm_ended_.load(std::memory_order_acquire)) {
        // Ended (or never started): its results are final.
        s.ended = true;
        s.error = warm_error_;
        s.cancelled = warm_cancelled_;
        s.seconds = warm_seconds_;
    }
    return s;
}

int PagePool::map(uint32_t cls, uint64_t off, uint64_t first, uint64_t n, void * addr,
                  bool populate) {
    if (n == 0) return 0;
    const Class & c = classes_[cls];
    const int flags = MAP_SHARED | MAP_FIXED | (populate ? MAP_POPULATE : 0);
    void * p = mmap(addr, n * page_, PROT_READ | PROT_WRITE, flags,
                    c.fd, off_t(off + first * page_));
    if (p == MAP_FAILED) return errno;
    return 0;
}

int PagePool::write_page(uint32_t cls, uint64_t off, uint64_t idx, const void * src) {
    const Class & c = classes_[cls];
    const off_t at = off_t(off + idx * page_);
    uint64_t done = 0;
    while (done < page_) {
        const ssize_t w = pwrite(c.fd, static_cast<const uint8_t *>(src) + done, page_ - done,
                                 at + off_t(done));
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        done += uint64_t(w);
    }
    return 0;
}

}  // namespace moestream
