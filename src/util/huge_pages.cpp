#include "huge_pages.h"

#include <sys/mman.h>

#include <algorithm>

namespace moestream {

uint64_t huge_page_alignment(uint64_t bytes, uint64_t align, bool huge) {
    return huge && bytes >= kHugePageBytes ? std::max(align, kHugePageBytes) : align;
}

uint64_t advise_huge_pages(void * p, uint64_t len) {
    const uint64_t whole = len / kHugePageBytes * kHugePageBytes;
    return whole > 0 && madvise(p, whole, MADV_HUGEPAGE) == 0 ? whole : 0;
}

uint8_t * map_huge_aligned(uint64_t bytes) {
    const uint64_t len = bytes + kHugePageBytes;
    void * p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    auto * base = static_cast<uint8_t *>(p);
    const uint64_t head = (kHugePageBytes - uint64_t(uintptr_t(base)) % kHugePageBytes) % kHugePageBytes;
    uint8_t * at = base + head;
    if (head > 0) munmap(base, head);
    munmap(at + bytes, len - head - bytes);  // len - head - bytes >= 0: head < a huge page
    return at;
}

}  // namespace moestream
