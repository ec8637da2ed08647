#include "io_faults.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace moestream {

Status parse_io_fault(const char * v, IoFaultPlan * p) {
    auto bad = [&] {
        return Status::Usage(std::string("MOESTREAM_DEBUG_IO_FAULT='") + v +
                             "': expected short, eintr, eio-once:N or eio-after:N");
    };
    if (!std::strcmp(v, "short"))
        p->kind = IoFaultPlan::Kind::kShort;
    else if (!std::strcmp(v, "eintr"))
        p->kind = IoFaultPlan::Kind::kEintr;
    else if (!std::strncmp(v, "eio-once:", 9) || !std::strncmp(v, "eio-after:", 10)) {
        const bool once = v[4] == 'o';
        const char * num = v + (once ? 9 : 10);
        char * end = nullptr;
        long n = std::strtol(num, &end, 10);
        if (end == num || *end != '\0' || n < 1) return bad();
        p->kind = once ? IoFaultPlan::Kind::kEioOnce : IoFaultPlan::Kind::kEioAfter;
        p->n = n;
    } else {
        return bad();
    }
    return Status::Ok();
}

long preadv_short(int fd, const struct iovec * iov, int iovcnt, uint64_t off) {
    // Half, kept a multiple of 512 (the smallest direct-I/O alignment): an O_DIRECT transfer
    // length must stay aligned, as the kernel's own short reads are.
    size_t len = 0;
    for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
    if (len < 1024 || iovcnt > 8) return ::preadv(fd, iov, iovcnt, off_t(off));
    struct iovec cut[8];
    size_t keep = len / 2 / 512 * 512;
    int n = 0;
    for (; n < iovcnt && keep > 0; ++n) {
        cut[n] = iov[n];
        if (cut[n].iov_len > keep) cut[n].iov_len = keep;
        keep -= cut[n].iov_len;
    }
    return ::preadv(fd, cut, n, off_t(off));
}

long io_fault_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int, void * ud) {
    auto * p = static_cast<IoFaultPlan *>(ud);
    const long call = p->calls.fetch_add(1) + 1;
    switch (p->kind) {
        case IoFaultPlan::Kind::kShort:
            return preadv_short(fd, iov, iovcnt, off);
        case IoFaultPlan::Kind::kEintr:
            if (call % 2 == 1) {
                errno = EINTR;
                return -1;
            }
            break;
        case IoFaultPlan::Kind::kEioOnce:
            if (call == p->n) {
                errno = EIO;
                return -1;
            }
            break;
        case IoFaultPlan::Kind::kEioAfter:
            if (call >= p->n) {
                errno = EIO;
                return -1;
            }
            break;
        case IoFaultPlan::Kind::kNone:
            break;
    }
    return ::preadv(fd, iov, iovcnt, off_t(off));
}

}  // namespace moestream
