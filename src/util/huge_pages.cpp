#include "huge_pages.h"

#include <sys/mman.h>

#include <algorithm>

namespace moestream {

uint64_t huge_page_alignment(uint64_t bytes, uint64_t align, bool huge) {
    return huge && bytes >= kHugePageBytes ? std::max(align, kHugePageBytes) : align;
}

bool advise_huge_pages(void * p, uint64_t len) {
    const uint64_t whole = len / kHugePageBytes * kHugePageBytes;
    return whole > 0 && madvise(p, whole, MADV_HUGEPAGE) == 0;
}

}  // namespace moestream
