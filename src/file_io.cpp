#include "file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace moestream {

Status read_exact_at(int fd, const std::string & path, void * buf, uint64_t len, uint64_t off) {
    uint8_t * p = static_cast<uint8_t *>(buf);
    uint64_t done = 0;
    while (done < len) {
        uint64_t chunk = len - done;
        if (chunk > (1ull << 30)) chunk = 1ull << 30;
        ssize_t n = ::pread(fd, p + done, chunk, static_cast<off_t>(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            return Status::Runtime(path + ": read failed at offset " + std::to_string(off + done) +
                                   " length " + std::to_string(len - done) + ": " +
                                   std::strerror(e) + " (errno " + std::to_string(e) + ")");
        }
        if (n == 0)
            return Status::Runtime(path + ": unexpected end of file at offset " +
                                   std::to_string(off + done) + " (wanted " + std::to_string(len) +
                                   " bytes at " + std::to_string(off) + ")");
        done += uint64_t(n);
    }
    return Status::Ok();
}

}  // namespace moestream
