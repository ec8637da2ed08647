// text_file.cpp — bounded reading of prompt and text files (include/moestream/text_file.h).
#include "moestream/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace moestream {

Status read_text_file(const std::string & path, const std::string & what, std::string * out,
                      uint64_t max_bytes) {
    out->clear();
    const bool std_in = path == "-";
    const std::string name = std_in ? std::string("standard input") : path;
    const int fd = std_in ? 0 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return Status::BadInput(path + ": cannot read the " + what + " file: " +
                                std::strerror(errno));
    struct Closer {
        int fd;
        bool own;
        ~Closer() {
            if (own) ::close(fd);
        }
    } closer{fd, !std_in};
    struct stat st;
    if (::fstat(fd, &st) != 0)
        return Status::BadInput(name + ": cannot stat: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return Status::BadInput(name + ": is a directory, not a " + what + " file");
    try {
        // A regular file is sized up front; anything else grows chunk by chunk to the limit.
        if (S_ISREG(st.st_mode) && uint64_t(st.st_size) <= max_bytes) out->reserve(size_t(st.st_size));
        char buf[1 << 16];
        while (true) {
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0)
                return Status::BadInput(name + ": offset " + std::to_string(out->size()) +
                                        ": read failed: " + std::strerror(errno));
            if (n == 0) break;
            if (out->size() + size_t(n) > max_bytes) {
                out->clear();
                return Status::BadInput(name + ": more than " + std::to_string(max_bytes >> 20) +
                                        " MiB, the limit of a " + what + " file" +
                                        (S_ISREG(st.st_mode) ? "" : " (a device or a stream that does not end?)"));
            }
            out->append(buf, size_t(n));
        }
    } catch (const std::bad_alloc &) {
        out->clear();
        return Status::BadInput(name + ": out of memory reading the " + what + " file");
    }
    if (out->empty()) return Status::BadInput(name + ": the " + what + " file is empty");
    return Status::Ok();
}

}  // namespace moestream
