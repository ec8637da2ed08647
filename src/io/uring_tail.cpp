// uring_tail.cpp — UringTail (see uring_tail.h).
#include "uring_tail.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "moestream/log.h"

namespace moestream {

struct UringTail::Impl {
    io_uring ring;
    bool ok = false;
    std::thread::id owner;  // the thread that made the ring (single issuer)
};

std::unique_ptr<UringTail> UringTail::create(const std::string & path, uint64_t align,
                                             std::string * why) {
    return create(std::vector<std::string>{path}, align, why);
}

std::unique_ptr<UringTail> UringTail::create(const std::vector<std::string> & paths,
                                             uint64_t align, std::string * why) {
    std::unique_ptr<UringTail> u(new UringTail());
    u->impl_ = std::make_unique<Impl>();
    u->paths_ = paths;
    u->align_ = align >= 512 && (align & (align - 1)) == 0 ? align : 4096;
    for (const std::string & path : paths) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd < 0) {
            *why = path + ": O_DIRECT open: " + std::strerror(errno);
            return nullptr;
        }
        u->fds_.push_back(fd);
    }
    void * p = nullptr;
    if (posix_memalign(&p, 4096, kMaxRequests * 2 * u->align_) != 0) {
        *why = "cannot allocate the bounce blocks";
        return nullptr;
    }
    std::memset(p, 0, kMaxRequests * 2 * u->align_);  // commit now, not under memory pressure
    u->bounce_ = static_cast<uint8_t *>(p);
    if (!u->setup_ring()) {
        *why = std::string("io_uring_queue_init: ") + std::strerror(errno);
        return nullptr;
    }
    u->pending_.reserve(kMaxRequests);
    u->iov_.reserve(3 * kMaxRequests);
    return u;
}

bool UringTail::setup_ring() {
    if (impl_->ok) io_uring_queue_exit(&impl_->ring);
    impl_->ok = false;
    // Completions processed only when reap() asks (6.1+), else cooperatively (5.19+), else
    // the default.
    const unsigned flag_sets[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
                                  IORING_SETUP_COOP_TASKRUN, 0};
    for (unsigned flags : flag_sets) {
        const int rc = io_uring_queue_init(unsigned(kMaxRequests), &impl_->ring, flags);
        if (rc == 0) {
            impl_->ok = true;
            impl_->owner = std::this_thread::get_id();
            return true;
        }
        errno = -rc;
    }
    return false;
}

UringTail::~UringTail() {
    if (n_ > 0) {
        IoBatchStats ignored;
        reap(&ignored);  // the kernel must not write into freed memory
    }
    if (impl_ && impl_->ok) io_uring_queue_exit(&impl_->ring);
    for (int fd : fds_) ::close(fd);
    std::free(bounce_);
}

bool UringTail::submit(const std::vector<ReadRequest> & reqs, size_t first) {
    if (n_ > 0 || first >= reqs.size() || reqs.size() - first > kMaxRequests) return false;
    const uint64_t a = align_;
    pending_.clear();
    iov_.clear();
    for (size_t i = first; i < reqs.size(); ++i) {
        Pending p;
        p.r = reqs[i];
        if (p.r.file >= fds_.size() || !InPlaceRead::plan(p.r, a, &p.span)) return false;
        pending_.push_back(p);
    }
    if (impl_->owner != std::this_thread::get_id() && !setup_ring()) return false;
    for (size_t k = 0; k < pending_.size(); ++k) {
        const Pending & p = pending_[k];
        const size_t at = iov_.size();
        struct iovec parts[3];
        const int n = p.span.iov(p.r, bounce_ + 2 * k * a, a, parts);
        iov_.insert(iov_.end(), parts, parts + n);
        io_uring_sqe * sqe = io_uring_get_sqe(&impl_->ring);
        if (sqe == nullptr) return false;  // (cannot happen: entries >= kMaxRequests)
        io_uring_prep_readv(sqe, fds_[p.r.file], &iov_[at], unsigned(n), p.span.io_off);
        io_uring_sqe_set_data64(sqe, k);
    }
    const int rc = io_uring_submit(&impl_->ring);
    if (rc < 0 || size_t(rc) != pending_.size()) {
        // Nothing or only part went to the kernel: wait for what did, then refuse. (With
        // fewer than all submitted, the rest stays queued: drop the ring.)
        n_ = rc > 0 ? size_t(rc) : 0;
        IoBatchStats ignored;
        if (n_) reap(&ignored);
        setup_ring();
        return false;
    }
    n_ = pending_.size();
    return true;
}

Status UringTail::reap(IoBatchStats * stats) {
    if (n_ == 0) return Status::Ok();
    const auto t0 = std::chrono::steady_clock::now();
    Status err;
    uint64_t bytes = 0;
    std::vector<uint8_t> failed(pending_.size(), 0);
    for (size_t done = 0; done < n_; ++done) {
        io_uring_cqe * cqe = nullptr;
        int rc;
        do rc = io_uring_wait_cqe(&impl_->ring, &cqe);
        while (rc == -EINTR);
        if (rc < 0) {
            // The ring itself failed: nothing more can be known; drop it (io_uring_queue_exit
            // waits for what is in flight) and fail every request not reaped.
            err = Status::Runtime(paths_.front() + ": io_uring_wait_cqe: " + std::strerror(-rc));
            for (size_t k = 0; k < pending_.size(); ++k) failed[k] = 1;
            setup_ring();
            break;
        }
        const uint64_t k = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&impl_->ring, cqe);
        if (k >= pending_.size()) continue;
        const Pending & p = pending_[k];
        // At the end of the file the aligned range reaches past it: only the slice's own bytes
        // must have come (as in IoLanes).
        const uint64_t need = p.r.file_offset + p.r.len - p.span.io_off;
        if (res < 0 || uint64_t(res) < need) {
            failed[k] = 1;
            if (err.ok())
                err = Status::Runtime(paths_[p.r.file] + ": read of the slice at offset " +
                                      std::to_string(p.r.file_offset) + " (" +
                                      std::to_string(p.r.len) + " bytes) " +
                                      (res < 0 ? std::string("failed: ") + std::strerror(-res)
                                               : "came back short (" + std::to_string(res) +
                                                     " of " + std::to_string(need) + " bytes)"));
            continue;
        }
        bytes += uint64_t(res);
        p.span.copy_ends(p.r, bounce_ + 2 * k * align_, align_);
    }
    for (size_t k = 0; k < pending_.size(); ++k)
        if (failed[k]) std::memset(pending_[k].r.dest, 0, pending_[k].r.len);
    if (stats) {
        stats->bytes_read += bytes;
        stats->reads += n_;
        stats->direct_reads += n_;
        stats->seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    n_ = 0;
    pending_.clear();
    iov_.clear();
    return err;
}

}  // namespace moestream
