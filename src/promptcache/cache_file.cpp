// cache_file.cpp — see cache_file.h.
#include "cache_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hash.h"
#include "moestream/atomic_file.h"

namespace moestream {

// Reads the whole regular file at path (at most max_bytes); false with *why otherwise.
bool read_whole(const std::string & path, uint64_t max_bytes, std::vector<uint8_t> * out,
                std::string * why) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        *why = std::string("cannot open it: ") + std::strerror(errno);
        return false;
    }
    struct stat st;
    bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (!ok) *why = "not a regular file";
    if (ok && uint64_t(st.st_size) > max_bytes) {
        *why = "larger (" + std::to_string(st.st_size) + " bytes) than the cache budget";
        ok = false;
    }
    if (ok) {
        out->resize(size_t(st.st_size));
        size_t got = 0;
        while (got < out->size()) {
            const ssize_t r = ::read(fd, out->data() + got, out->size() - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                *why = r < 0 ? std::string("read error: ") + std::strerror(errno)
                             : "it shrank while being read";
                ok = false;
                break;
            }
            got += size_t(r);
        }
    }
    ::close(fd);
    return ok;
}

Status write_atomic(const std::string & path, const std::vector<uint8_t> & bytes,
                    const std::string & what) {
    AtomicFile af;
    Status st = af.create(path, what);
    if (!st.ok()) return st;
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t w = ::write(af.fd(), bytes.data() + done, bytes.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return Status::Runtime(path + ": not written: " +
                                   std::strerror(w < 0 ? errno : ENOSPC));
        done += size_t(w);
    }
    return af.commit();
}

std::string envelope_error(const std::vector<uint8_t> & b, const char (&magic)[8], size_t header,
                           const char * format) {
    constexpr size_t kTrailer = 8;  // the checksum
    if (b.size() < header + kTrailer) return "truncated (" + std::to_string(b.size()) + " bytes)";
    if (std::memcmp(b.data(), magic, sizeof magic) != 0)
        return std::string("not a moestream ") + format + " of this format";
    if (get<uint64_t>(b, 8) != b.size())
        return "truncated or extended (" + std::to_string(b.size()) + " bytes, header says " +
               std::to_string(get<uint64_t>(b, 8)) + ")";
    if (get<uint64_t>(b, b.size() - kTrailer) != fnv1a64(kFnv1a64Basis, b.data(), b.size() - kTrailer))
        return "checksum mismatch (corrupt)";
    return "";
}

}  // namespace moestream
