// sysinfo.h — process and machine readings for the stats: RSS, peak RSS, major faults,
// available memory (cgroup v2 memory.max / v1 memory.limit_in_bytes, else MemAvailable).
// Thread-safety: reentrant; readings come from /proc and /sys at call time.
#pragma once

#include <cstdint>

namespace moestream {

uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();      // VmHWM
uint64_t major_faults();        // this process, from getrusage
double now_s();                 // steady clock, seconds

}  // namespace moestream
