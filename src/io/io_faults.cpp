#include "io_faults.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace moestream {

Status parse_io_fault(const char * v, IoFaultPlan * p) {
    const std::string all(v);
    auto bad = [&](const std::string & why) {
        return Status::Usage("MOESTREAM_DEBUG_IO_FAULT='" + all + "': " + why +
                             " (expected KIND[,lane=L][,p=P][,seed=S], KIND = short, eintr, "
                             "eio, eio-once:N, eio-after:N, touch:N or delay:US; see io_faults.h)");
    };
    // A whole decimal number in [lo, hi], or false.
    auto number = [](const std::string & t, long lo, long hi, long * out) {
        if (t.empty() || t.size() > 18) return false;
        for (char c : t)
            if (c < '0' || c > '9') return false;
        const long x = std::strtol(t.c_str(), nullptr, 10);
        if (x < lo || x > hi) return false;
        *out = x;
        return true;
    };
    std::vector<std::string> parts;
    size_t at = 0;
    for (;;) {
        const size_t comma = all.find(',', at);
        parts.push_back(all.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    const std::string & kind = parts[0];
    if (kind == "short")
        p->kind = IoFaultPlan::Kind::kShort;
    else if (kind == "eintr")
        p->kind = IoFaultPlan::Kind::kEintr;
    else if (kind == "eio")
        p->kind = IoFaultPlan::Kind::kEio;
    else if (kind.rfind("eio-once:", 0) == 0 || kind.rfind("eio-after:", 0) == 0) {
        const bool once = kind[4] == 'o';
        if (!number(kind.substr(once ? 9 : 10), 1, 1L << 40, &p->n))
            return bad("N must be a whole number >= 1");
        p->kind = once ? IoFaultPlan::Kind::kEioOnce : IoFaultPlan::Kind::kEioAfter;
    } else if (kind.rfind("touch:", 0) == 0) {
        if (!number(kind.substr(6), 1, 1L << 40, &p->n)) return bad("N must be a whole number >= 1");
        p->kind = IoFaultPlan::Kind::kTouch;
    } else if (kind.rfind("delay:", 0) == 0) {
        if (!number(kind.substr(6), 1, 1000000, &p->n))
            return bad("US must be a whole number of microseconds in 1..1000000");
        p->kind = IoFaultPlan::Kind::kDelay;
    } else {
        return bad("unknown kind '" + kind + "'");
    }
    bool have_p = false, have_seed = false, have_lane = false;
    for (size_t i = 1; i < parts.size(); ++i) {
        const std::string & t = parts[i];
        long x = 0;
        if (t.rfind("lane=", 0) == 0 && !have_lane) {
            if (!number(t.substr(5), 0, kIoFaultMaxLanes - 1, &x))
                return bad("lane must be 0.." + std::to_string(kIoFaultMaxLanes - 1));
            p->lane = int(x);
            have_lane = true;
        } else if (t.rfind("seed=", 0) == 0 && !have_seed) {
            if (!number(t.substr(5), 0, (1L << 62), &x)) return bad("seed must be a whole number");
            p->seed = uint64_t(x);
            have_seed = true;
        } else if (t.rfind("p=", 0) == 0 && !have_p) {
            const std::string num = t.substr(2);
            char * end = nullptr;
            const double d = std::strtod(num.c_str(), &end);
            if (num.empty() || end != num.c_str() + num.size() || !(d > 0 && d <= 1))
                return bad("p must be a probability in (0, 1]");
            p->p = d;
            have_p = true;
        } else {
            return bad("unknown or repeated option '" + t + "'");
        }
    }
    if (p->kind == IoFaultPlan::Kind::kEio && !have_p) return bad("eio needs p=");
    if (have_p && (p->kind == IoFaultPlan::Kind::kEioOnce || p->kind == IoFaultPlan::Kind::kEioAfter ||
                   p->kind == IoFaultPlan::Kind::kTouch))
        return bad("p= applies to short, eintr, eio and delay");
    if (have_seed && !have_p) return bad("seed= needs p=");
    if (p->kind == IoFaultPlan::Kind::kEintr && p->p >= 1)
        return bad("eintr needs p < 1 (every retry would be interrupted again)");
    return Status::Ok();
}

Status check_io_fault_lanes(const IoFaultPlan & p, int n_lanes) {
    if (p.lane >= n_lanes)
        return Status::Usage("MOESTREAM_DEBUG_IO_FAULT: lane=" + std::to_string(p.lane) +
                             " but only " + std::to_string(n_lanes) + " read lane" +
                             (n_lanes == 1 ? "" : "s") + " (RunOptions::io_threads)");
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

namespace {

// splitmix64: a fixed, well-mixed function of (seed, lane, count) for p=.
uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

}  // namespace

long io_fault_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane,
                     void * ud) {
    auto * p = static_cast<IoFaultPlan *>(ud);
    if (p->lane >= 0 && lane != p->lane) return ::preadv(fd, iov, iovcnt, off_t(off));
    const int li = lane >= 0 && lane < kIoFaultMaxLanes ? lane : 0;
    const long lane_call = p->lane_calls[li].fetch_add(1) + 1;
    const long call = p->lane >= 0 ? lane_call : p->calls.fetch_add(1) + 1;
    bool hit;
    if (p->p > 0) {
        const uint64_t h = mix(mix(p->seed ^ (uint64_t(li) << 56)) ^ uint64_t(lane_call));
        hit = double(h >> 11) * (1.0 / 9007199254740992.0) < p->p;
    } else {
        switch (p->kind) {
            case IoFaultPlan::Kind::kShort:
            case IoFaultPlan::Kind::kDelay:
                hit = true;
                break;
            case IoFaultPlan::Kind::kEintr:
                hit = call % 2 == 1;
                break;
            case IoFaultPlan::Kind::kEioOnce:
            case IoFaultPlan::Kind::kTouch:
                hit = call == p->n;
                break;
            case IoFaultPlan::Kind::kEioAfter:
                hit = call >= p->n;
                break;
            default:
                hit = false;
        }
    }
    if (!hit) return ::preadv(fd, iov, iovcnt, off_t(off));
    p->injected.fetch_add(1);
    switch (p->kind) {
        case IoFaultPlan::Kind::kShort:
            return preadv_short(fd, iov, iovcnt, off);
        case IoFaultPlan::Kind::kEintr:
            errno = EINTR;
            return -1;
        case IoFaultPlan::Kind::kEio:
        case IoFaultPlan::Kind::kEioOnce:
        case IoFaultPlan::Kind::kEioAfter:
            errno = EIO;
            return -1;
        case IoFaultPlan::Kind::kDelay:
            ::usleep(useconds_t(p->n));
            break;
        case IoFaultPlan::Kind::kTouch: {  // the file's ctime moves; its bytes stay
            struct stat st;
            if (::fstat(fd, &st) == 0) (void)::fchmod(fd, st.st_mode & 07777);
            break;
        }
        case IoFaultPlan::Kind::kNone:
            break;
    }
    return ::preadv(fd, iov, iovcnt, off_t(off));
}

}  // namespace moestream
