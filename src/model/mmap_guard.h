// mmap_guard.h — keeps llama.cpp's mmap loader from prefaulting the model file.
//
// llama.cpp 0.7.0 loads with load_mode MMAP by mapping the whole file with MAP_POPULATE,
// POSIX_MADV_WILLNEED and sequential advice: every byte of a model larger than RAM would be
// read at load. No public parameter turns that off. moestream interposes the libc entry points
// libllama calls (mmap, madvise, posix_madvise, posix_fadvise; ELF symbol interposition from
// the executable, no code of llama.cpp involved): while a guard is armed for a file (device +
// inode), a mapping of that file loses MAP_POPULATE and WILLNEED/SEQUENTIAL advice on it is
// dropped, and the mapping is recorded. Nothing else in the process is affected.
//
// Invariant: the guard only ever removes prefetching; it never changes what is mapped.
// Thread-safety: arm/disarm from one thread; the interposers are safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moestream {

struct GuardedMapping {
    uint8_t * addr = nullptr;  // nullptr: no mapping of the file was seen
    size_t len = 0;
    bool populate_removed = false;  // a MAP_POPULATE was stripped
    int advice_dropped = 0;         // WILLNEED/SEQUENTIAL calls suppressed
};

// Arms the guard for the file open as `fd` (matched by st_dev/st_ino). Returns false if fstat fails.
bool mmap_guard_arm(int fd);
// Disarms and returns what was seen while armed.
GuardedMapping mmap_guard_disarm();
// True when the process-wide mmap (what libllama calls) is moestream's interposer.
bool mmap_guard_active();

}  // namespace moestream
