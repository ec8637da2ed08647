// sysinfo.h — process and machine readings for the stats: RSS, peak RSS, major faults,
// available memory (cgroup v2 memory.max / v1 memory.limit_in_bytes, else MemAvailable).
// Thread-safety: reentrant; readings come from /proc and /sys at call time.
#pragma once

#include <cstdint>
#include <string>

namespace moestream {

// Bytes of this process's address space that map the file at `path` now (the sum of the
// /proc/self/maps ranges with the file's device and inode); 0 when none or unreadable.
uint64_t mapped_bytes_of_file(const std::string & path);
// Bytes of this process's mappings of the file (device, inode) that are resident now: the sum
// of their Rss in /proc/self/smaps (pages faulted in or prefaulted, e.g. by MAP_POPULATE);
// 0 when none or unreadable.
uint64_t resident_mapped_bytes_of_file(uint64_t dev, uint64_t ino);
// The system page size (sysconf), 4096 if it cannot be read: the expert cache's commit
// granularity.
uint64_t system_page_bytes();
uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();      // VmHWM
// Anonymous memory of this process backed by transparent huge pages (AnonHugePages of
// /proc/self/smaps_rollup), bytes; 0 when none or unreadable.
uint64_t anon_huge_bytes();
uint64_t major_faults();        // this process, from getrusage
double now_s();                 // steady clock, seconds

}  // namespace moestream

namespace moestream {

// Memory this process may still use, in bytes, and where the figure comes from:
// the cgroup's limit minus its current non-reclaimable usage when a cgroup limit applies
// (v2 memory.max / memory.current, v1 memory.limit_in_bytes / memory.usage_in_bytes minus
// the group's page cache), capped by /proc/meminfo MemAvailable. 0 if nothing is readable.
struct MemoryAvailability {
    uint64_t available_bytes = 0;
    uint64_t cgroup_limit_bytes = 0;  // 0 = no cgroup limit found
    uint64_t mem_available_bytes = 0; // MemAvailable
    const char * source = "none";     // "cgroup v2", "cgroup v1", "MemAvailable"
};
MemoryAvailability memory_availability();

}  // namespace moestream
