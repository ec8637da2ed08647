#include "mmap_guard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dlfcn.h>

#include <atomic>
#include <cerrno>

namespace moestream {
namespace {

std::atomic<bool> g_armed{false};
dev_t g_dev = 0;
ino_t g_ino = 0;
GuardedMapping g_seen;

bool fd_is_model(int fd) {
    if (!g_armed.load(std::memory_order_acquire) || fd < 0) return false;
    struct stat st;
    if (::fstat(fd, &st) != 0) return false;
    return st.st_dev == g_dev && st.st_ino == g_ino;
}

bool in_mapping(const void * addr, size_t len) {
    if (!g_armed.load(std::memory_order_acquire) || g_seen.addr == nullptr) return false;
    auto a = static_cast<const uint8_t *>(addr);
    return a >= g_seen.addr && a + len <= g_seen.addr + g_seen.len;
}

void * raw_mmap(void * addr, size_t len, int prot, int flags, int fd, off_t off) {
    long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (r < 0 && r > -4096) {
        errno = int(-r);
        return MAP_FAILED;
    }
    return reinterpret_cast<void *>(r);
}

}  // namespace

bool mmap_guard_arm(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return false;
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    g_seen = GuardedMapping{};
    g_armed.store(true, std::memory_order_release);
    return true;
}

GuardedMapping mmap_guard_disarm() {
    g_armed.store(false, std::memory_order_release);
    return g_seen;
}

bool mmap_guard_active() {
    // The process-wide definition of mmap (what libllama's calls resolve to) must be ours.
    void * sym = dlsym(RTLD_DEFAULT, "mmap");
    return sym == reinterpret_cast<void *>(static_cast<void * (*)(void *, size_t, int, int, int, off_t)>(&::mmap));
}

}  // namespace moestream

// ---- libc interposers (resolved before libc for calls from libllama / libggml) ----------
using moestream::fd_is_model;
using moestream::g_seen;
using moestream::in_mapping;

extern "C" void * mmap(void * addr, size_t len, int prot, int flags, int fd, off_t off) {
    const bool model = fd_is_model(fd);
    if (model && (flags & MAP_POPULATE)) {
        flags &= ~MAP_POPULATE;
        g_seen.populate_removed = true;
    }
    void * p = moestream::raw_mmap(addr, len, prot, flags, fd, off);
    if (model && p != MAP_FAILED && off == 0) {
        g_seen.addr = static_cast<uint8_t *>(p);
        g_seen.len = len;
    }
    return p;
}

extern "C" void * mmap64(void * addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(addr, len, prot, flags, fd, off);
}

extern "C" int madvise(void * addr, size_t len, int advice) {
    if ((advice == MADV_WILLNEED || advice == MADV_SEQUENTIAL) && in_mapping(addr, len)) {
        ++g_seen.advice_dropped;
        return 0;
    }
    long r = syscall(SYS_madvise, addr, len, advice);
    if (r < 0) {
        errno = int(-r);
        return -1;
    }
    return 0;
}

extern "C" int posix_madvise(void * addr, size_t len, int advice) {
    if ((advice == POSIX_MADV_WILLNEED || advice == POSIX_MADV_SEQUENTIAL) && in_mapping(addr, len)) {
        ++g_seen.advice_dropped;
        return 0;
    }
    long r = syscall(SYS_madvise, addr, len, advice);
    return r < 0 ? int(-r) : 0;
}

extern "C" int posix_fadvise(int fd, off_t off, off_t len, int advice) {
    if ((advice == POSIX_FADV_WILLNEED || advice == POSIX_FADV_SEQUENTIAL) && fd_is_model(fd)) {
        ++g_seen.advice_dropped;
        return 0;
    }
    long r = syscall(SYS_fadvise64, fd, off, len, advice);
    return r < 0 ? int(-r) : 0;
}

extern "C" int posix_fadvise64(int fd, off_t off, off_t len, int advice) {
    return posix_fadvise(fd, off, len, advice);
}
