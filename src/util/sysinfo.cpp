#include "moestream/sysinfo.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

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

uint64_t mapped_bytes_of_file(const std::string & path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return 0;
    std::ifstream f("/proc/self/maps");
    std::string line;
    uint64_t total = 0;
    while (std::getline(f, line)) {
        // "start-end perms offset major:minor inode path"
        unsigned long long lo = 0, hi = 0, off = 0, ino = 0;
        unsigned maj = 0, min = 0;
        char perms[8] = {0};
        if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &lo, &hi, perms, &off, &maj,
                        &min, &ino) != 7)
            continue;
        if (ino == uint64_t(st.st_ino) && makedev(maj, min) == st.st_dev && hi > lo)
            total += hi - lo;
    }
    return total;
}

uint64_t resident_mapped_bytes_of_file(uint64_t dev, uint64_t ino) {
    std::FILE * f = std::fopen("/proc/self/smaps", "re");
    if (!f) return 0;
    char line[4096];
    bool ours = false;
    uint64_t total = 0;
    while (std::fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, off, inode, kb;
        unsigned maj, min;
        char perms[8];
        if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &lo, &hi, perms, &off, &maj, &min,
                        &inode) == 7) {
            ours = inode == ino && makedev(maj, min) == dev;  // a mapping's header line
        } else if (ours && std::sscanf(line, "Rss: %llu kB", &kb) == 1) {
            total += kb * 1024;
        }
    }
    std::fclose(f);
    return total;
}

uint64_t system_page_bytes() {
    const long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? uint64_t(ps) : 4096;
}

uint64_t current_rss_bytes() { return status_kb("VmRSS:") * 1024; }
uint64_t peak_rss_bytes() { return status_kb("VmHWM:") * 1024; }

uint64_t anon_huge_bytes() {
    std::FILE * f = std::fopen("/proc/self/smaps_rollup", "re");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) break;
    std::fclose(f);
    return uint64_t(kb) * 1024;
}

uint64_t major_faults() {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return uint64_t(ru.ru_majflt);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace moestream

#include <fstream>
#include <sstream>
#include <string>

namespace moestream {
namespace {

bool read_u64_file(const std::string & path, uint64_t * v) {
    std::ifstream f(path);
    std::string s;
    if (!(f >> s)) return false;
    if (s == "max") {
        *v = UINT64_MAX;
        return true;
    }
    char * end = nullptr;
    unsigned long long x = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str()) return false;
    *v = x;
    return true;
}

uint64_t stat_field(const std::string & path, const std::string & key) {
    std::ifstream f(path);
    std::string k;
    uint64_t v;
    while (f >> k >> v)
        if (k == key) return v;
    return 0;
}

// The process's cgroup path for a controller ("" for v2's unified entry "0::").
std::string cgroup_path(bool v2) {
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    while (std::getline(f, line)) {
        // hierarchy-ID:controller-list:cgroup-path
        size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (v2 && line.compare(0, 3, "0::") == 0) return path;
        if (!v2) {
            std::stringstream ss(ctl);
            for (std::string c; std::getline(ss, c, ',');)
                if (c == "memory") return path;
        }
    }
    return "";
}

// Where one cgroup version keeps a group's limit, usage and page cache.
struct CgroupFiles {
    const char * name;                       // "cgroup v1" / "cgroup v2"
    const char * limit;                      // limit file, bytes
    const char * usage;                      // usage file, bytes (page cache included)
    std::vector<const char *> cache_fields;  // memory.stat fields holding the page cache
    bool (*limited)(uint64_t limit);         // false: the value means "no limit"
};

}  // namespace

MemoryAvailability memory_availability() {
    MemoryAvailability m;
    {
        std::ifstream f("/proc/meminfo");
        std::string k;
        uint64_t v;
        std::string unit;
        while (f >> k >> v >> unit)
            if (k == "MemAvailable:") m.mem_available_bytes = v * 1024;
    }
    m.available_bytes = m.mem_available_bytes;
    m.source = "MemAvailable";
    // The tightest cgroup limit on the path applies: walk up from this process's group.
    uint64_t best_free = UINT64_MAX, best_limit = 0;
    const char * src = nullptr;
    auto scan = [&](const std::string & group, const std::string & root, const CgroupFiles & f) {
        for (std::string q = group;; q = q.substr(0, q.rfind('/'))) {
            const std::string d = root + (q == "/" ? std::string() : q);
            uint64_t lim = 0, use = 0;
            if (read_u64_file(d + "/" + f.limit, &lim) && f.limited(lim) &&
                read_u64_file(d + "/" + f.usage, &use)) {
                uint64_t cache = 0;
                for (const char * field : f.cache_fields) cache += stat_field(d + "/memory.stat", field);
                const uint64_t hard = use > cache ? use - cache : 0;
                const uint64_t free = lim > hard ? lim - hard : 0;
                if (free < best_free) {
                    best_free = free;
                    best_limit = lim;
                    src = f.name;
                }
            }
            if (q.empty() || q == "/") break;
        }
    };
    static const CgroupFiles kV1{"cgroup v1", "memory.limit_in_bytes", "memory.usage_in_bytes",
                                 {"total_inactive_file", "total_active_file"},
                                 [](uint64_t lim) { return lim < (1ull << 60); }};
    static const CgroupFiles kV2{"cgroup v2", "memory.max", "memory.current", {"file"},
                                 [](uint64_t lim) { return lim != UINT64_MAX; }};
    const std::string p = cgroup_path(false);
    if (!p.empty()) scan(p, "/sys/fs/cgroup/memory", kV1);  // v1 (memory controller)
    const std::string p2 = cgroup_path(true);
    if (!p2.empty() || src == nullptr) scan(p2, "/sys/fs/cgroup", kV2);
    if (src != nullptr && best_free < m.available_bytes) {
        m.available_bytes = best_free;
        m.cgroup_limit_bytes = best_limit;
        m.source = src;
    } else if (src != nullptr) {
        m.cgroup_limit_bytes = best_limit;
    }
    return m;
}

}  // namespace moestream
