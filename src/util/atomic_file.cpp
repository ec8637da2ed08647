// atomic_file.cpp — see atomic_file.h.
#include "moestream/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace moestream {

const char * file_kind(unsigned st_mode) {
    const mode_t m = mode_t(st_mode);
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
}

namespace {

const char * kind(mode_t m) {
    return S_ISREG(m) || S_ISLNK(m) ? "not a regular file" : file_kind(m);
}

// The file to replace: `path`, or the target of a symlink at `path`.
Status resolve(const std::string & path, const std::string & what, std::string * target) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) {
            *target = path;
            return Status::Ok();
        }
        return Status::BadInput(what + ": cannot use '" + path + "': " + std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) {
        char buf[PATH_MAX];
        if (!::realpath(path.c_str(), buf)) {
            // A link to a file not there yet: write its target (one level, as given).
            const int rerr = errno;
            const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
            if (n <= 0 || rerr != ENOENT)
                return Status::BadInput(what + ": cannot resolve the symbolic link '" + path + "'");
            std::string t(buf, size_t(n));
            const size_t slash = path.rfind('/');
            if (t[0] != '/' && slash != std::string::npos) t = path.substr(0, slash + 1) + t;
            if (::lstat(t.c_str(), &st) == 0 || errno != ENOENT)
                return Status::BadInput(what + ": cannot resolve the symbolic link '" + path + "'");
            *target = t;
            return Status::Ok();
        }
        if (::stat(buf, &st) != 0)
            return Status::BadInput(what + ": cannot use '" + path + "': " + std::strerror(errno));
        if (!S_ISREG(st.st_mode))
            return Status::BadInput(what + ": '" + path + "' links to " + kind(st.st_mode) +
                                 ", not a regular file; refusing to replace it");
        *target = buf;
        return Status::Ok();
    }
    if (!S_ISREG(st.st_mode))
        return Status::BadInput(what + ": '" + path + "' exists and is " + kind(st.st_mode) +
                             ", not a regular file; refusing to replace it");
    *target = path;
    return Status::Ok();
}

}  // namespace

Status check_output_path(const std::string & path, const std::string & what) {
    std::string target;
    return resolve(path, what, &target);
}

AtomicFile::~AtomicFile() { discard(); }

Status AtomicFile::create(const std::string & path, const std::string & what) {
    discard();
    create_errno_ = 0;
    what_ = what;
    Status st = resolve(path, what, &target_);
    if (!st.ok()) return st;
    tmp_ = target_ + ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        const int e = errno;
        create_errno_ = e;
        const std::string t = tmp_;
        tmp_.clear();
        return Status::Runtime(what + ": cannot create '" + t + "': " + std::strerror(e));
    }
    return Status::Ok();
}

Status AtomicFile::commit() {
    if (tmp_.empty()) return Status::Runtime(what_ + ": internal: nothing to commit");
    if (fd_ >= 0) {
        const bool ok = ::fsync(fd_) == 0;
        const int e = errno;
        const bool closed = ::close(fd_) == 0;
        fd_ = -1;
        if (!ok || !closed) {
            const Status st =
                Status::Runtime(what_ + ": cannot write '" + tmp_ + "': " + std::strerror(ok ? errno : e));
            discard();
            return st;
        }
    }
    // The target may have been replaced by a special file meanwhile: never rename over one.
    std::string again;
    Status st = resolve(target_, what_, &again);
    if (!st.ok()) {
        discard();
        return st;
    }
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
        st = Status::Runtime(what_ + ": cannot rename '" + tmp_ + "' to '" + target_ +
                             "': " + std::strerror(errno));
        discard();
        return st;
    }
    tmp_.clear();
    return Status::Ok();
}

void AtomicFile::discard() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    tmp_.clear();
}

}  // namespace moestream
