#include "mmap_guard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <vector>

namespace moestream {
namespace {

// Fixed-size tables (no allocation inside the interposers), written only while disarmed.
std::atomic<bool> g_armed{false};
size_t g_n = 0;
dev_t g_dev[kMaxGuardedFiles];
ino_t g_ino[kMaxGuardedFiles];
GuardedMapping g_seen[kMaxGuardedFiles];
std::atomic<int> g_advice_dropped{0};  // not attributable to one file (fadvise by fd is)

// The armed file `fd` is, or -1.
int model_file(int fd) {
    if (!g_armed.load(std::memory_order_acquire) || fd < 0) return -1;
    struct stat st;
    if (::fstat(fd, &st) != 0) return -1;
    for (size_t i = 0; i < g_n; ++i)
        if (st.st_dev == g_dev[i] && st.st_ino == g_ino[i]) return int(i);
    return -1;
}

// The armed file whose recorded mapping holds [addr, addr + len), or -1.
int in_mapping(const void * addr, size_t len) {
    if (!g_armed.load(std::memory_order_acquire)) return -1;
    auto a = static_cast<const uint8_t *>(addr);
    for (size_t i = 0; i < g_n; ++i)
        if (g_seen[i].addr && a >= g_seen[i].addr && a + len <= g_seen[i].addr + g_seen[i].len)
            return int(i);
    return -1;
}

// glibc's syscall() already turns a failed call into -1 with errno set (the kernel's -4095..-1
// never reach the caller): the callers keep that errno as it is.
void * raw_mmap(void * addr, size_t len, int prot, int flags, int fd, off_t off) {
    long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    return r == -1 ? MAP_FAILED : reinterpret_cast<void *>(r);
}

}  // namespace

bool mmap_guard_arm(const std::vector<int> & fds) {
    if (fds.size() > kMaxGuardedFiles) return false;
    for (size_t i = 0; i < fds.size(); ++i) {
        struct stat st;
        if (::fstat(fds[i], &st) != 0) return false;
        g_dev[i] = st.st_dev;
        g_ino[i] = st.st_ino;
        g_seen[i] = GuardedMapping{};
    }
    g_n = fds.size();
    g_armed.store(true, std::memory_order_release);
    return true;
}

std::vector<GuardedMapping> mmap_guard_disarm() {
    g_armed.store(false, std::memory_order_release);
    std::vector<GuardedMapping> out(g_seen, g_seen + g_n);
    if (!out.empty()) out[0].advice_dropped += g_advice_dropped.exchange(0);
    g_n = 0;
    return out;
}

bool mmap_guard_active() {
    // The process-wide definition of mmap (what libllama's calls resolve to) must be ours.
    void * sym = dlsym(RTLD_DEFAULT, "mmap");
    return sym == reinterpret_cast<void *>(static_cast<void * (*)(void *, size_t, int, int, int, off_t)>(&::mmap));
}

}  // namespace moestream

// ---- libc interposers (resolved before libc for calls from libllama / libggml) ----------
using moestream::g_advice_dropped;
using moestream::g_seen;
using moestream::in_mapping;
using moestream::model_file;

extern "C" void * mmap(void * addr, size_t len, int prot, int flags, int fd, off_t off) {
    const int file = model_file(fd);
    if (file >= 0 && (flags & MAP_POPULATE)) {
        flags &= ~MAP_POPULATE;
        g_seen[file].populate_removed = true;
    }
    void * p = moestream::raw_mmap(addr, len, prot, flags, fd, off);
    if (file >= 0 && p != MAP_FAILED && off == 0) {
        g_seen[file].addr = static_cast<uint8_t *>(p);
        g_seen[file].len = len;
    }
    return p;
}

extern "C" void * mmap64(void * addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(addr, len, prot, flags, fd, off);
}

extern "C" int madvise(void * addr, size_t len, int advice) {
    if ((advice == MADV_WILLNEED || advice == MADV_SEQUENTIAL) && in_mapping(addr, len) >= 0) {
        g_advice_dropped.fetch_add(1);
        return 0;
    }
    return int(syscall(SYS_madvise, addr, len, advice));  // -1 with errno set, as madvise
}

extern "C" int posix_madvise(void * addr, size_t len, int advice) {
    if ((advice == POSIX_MADV_WILLNEED || advice == POSIX_MADV_SEQUENTIAL) &&
        in_mapping(addr, len) >= 0) {
        g_advice_dropped.fetch_add(1);
        return 0;
    }
    // posix_madvise returns the error number instead of setting errno.
    const int saved = errno;
    const long r = syscall(SYS_madvise, addr, len, advice);
    const int e = r == -1 ? errno : 0;
    errno = saved;
    return e;
}

extern "C" int posix_fadvise(int fd, off_t off, off_t len, int advice) {
    if ((advice == POSIX_FADV_WILLNEED || advice == POSIX_FADV_SEQUENTIAL) && model_file(fd) >= 0) {
        g_advice_dropped.fetch_add(1);
        return 0;
    }
    const int saved = errno;  // like posix_madvise: the error number is the result
    const long r = syscall(SYS_fadvise64, fd, off, len, advice);
    const int e = r == -1 ? errno : 0;
    errno = saved;
    return e;
}

extern "C" int posix_fadvise64(int fd, off_t off, off_t len, int advice) {
    return posix_fadvise(fd, off, len, advice);
}
