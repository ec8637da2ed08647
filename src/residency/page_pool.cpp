// page_pool.cpp — PagePool (see page_pool.h).
#include "page_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

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

bool PagePool::take(uint32_t cls, uint64_t * off, bool * recycled, int * err) {
    Class & c = classes_[cls];
    const uint64_t cb = c.chunk_pages * page_;
    if (!c.free.empty()) {
        *off = c.free.back();
        c.free.pop_back();
        *recycled = true;
        ++recycled_;
        return true;
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

bool PagePool::punch_free_chunk(uint32_t keep_cls) {
    for (size_t i = 0; i < classes_.size(); ++i) {
        Class & c = classes_[i];
        if (i == keep_cls || c.free.empty()) continue;  // keep_cls = kAnyClass: none kept
        const uint64_t off = c.free.back();
        const uint64_t cb = c.chunk_pages * page_;
        if (fallocate(c.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(off), off_t(cb)) != 0)
            continue;  // keep it (still counted as held): the budget stays honest
        c.free.pop_back();
        c.holes.push_back(off);
        held_bytes_ -= cb;
        ++punched_;
        return true;
    }
    return false;
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
