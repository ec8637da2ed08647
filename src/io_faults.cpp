#include "io_faults.h"

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
    if (!std::strcmp(v, "short")) p->kind = IoFaultPlan::Kind::kShort;
    else if (!std::strcmp(v, "eintr")) p->kind = IoFaultPlan::Kind::kEintr;
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

long io_fault_pread(int fd, void * buf, size_t len, uint64_t off, int, void * ud) {
    auto * p = static_cast<IoFaultPlan *>(ud);
    const long call = p->calls.fetch_add(1) + 1;
    switch (p->kind) {
        case IoFaultPlan::Kind::kShort:
            // Half, kept a multiple of 512 (the smallest direct-I/O alignment): an O_DIRECT
            // transfer length must stay aligned, as the kernel's own short reads are.
            if (len >= 1024) len = len / 2 / 512 * 512;
            break;
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
        case IoFaultPlan::Kind::kNone: break;
    }
    return ::pread(fd, buf, len, off_t(off));
}

}  // namespace moestream
