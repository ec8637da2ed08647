// mmap_guard.h — keeps llama.cpp's mmap loader from prefaulting the model file.
//
// llama.cpp 0.7.0 loads with load_mode MMAP by mapping the whole file with MAP_POPULATE,
// POSIX_MADV_WILLNEED and sequential advice: every byte of a model larger than RAM would be
// read at load. No public parameter turns that off. moestream interposes the libc entry points
// libllama calls (mmap, madvise, posix_madvise, posix_fadvise; ELF symbol interposition from
// the executable, no code of llama.cpp involved): while a guard is armed for a file (device +
// inode; a split model arms it for every shard at once), a mapping of such a file loses
// MAP_POPULATE, WILLNEED/SEQUENTIAL advice on it is dropped, and the mapping is recorded per
// file. Nothing else in the process is affected.
//
// Invariant: the guard only ever removes prefetching; it never changes what is mapped.
// Thread-safety: arm/disarm from one thread; the interposers are safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moestream {

struct GuardedMapping {
    uint8_t * addr = nullptr;  // nullptr: no mapping of the file was seen
    size_t len = 0;
    bool populate_removed = false;  // a MAP_POPULATE was stripped
    int advice_dropped = 0;         // WILLNEED/SEQUENTIAL calls suppressed
};

// Arms the guard for the files open as `fds` (matched by st_dev/st_ino; at most
// kMaxGuardedFiles). Returns false if an fstat fails or there are too many.
constexpr size_t kMaxGuardedFiles = 1024;
bool mmap_guard_arm(const std::vector<int> & fds);
// Disarms and returns what was seen while armed, one entry per armed file (in `fds` order).
std::vector<GuardedMapping> mmap_guard_disarm();
// True when the process-wide mmap (what libllama calls) is moestream's interposer.
bool mmap_guard_active();

}  // namespace moestream
