#include "sysinfo.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>

namespace moestream {
namespace {
uint64_t status_kb(const char * key) {
    FILE * f = std::fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = std::strlen(key);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, key, kl) == 0) {
            v = std::strtoull(line + kl, nullptr, 10);
            break;
        }
    }
    std::fclose(f);
    return v;
}
}  // namespace

uint64_t current_rss_bytes() { return status_kb("VmRSS:") * 1024; }
uint64_t peak_rss_bytes() { return status_kb("VmHWM:") * 1024; }

uint64_t major_faults() {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return uint64_t(ru.ru_majflt);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace moestream
