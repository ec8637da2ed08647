// huge_pages.h — transparent huge pages for the engine's own large buffers.
//
// The expert slots, the shared slots and the dense weight copies are read by every token's
// matmuls; backed by 2 MiB pages, the matmuls' walk over them and the O_DIRECT reads' page
// pinning go through 512 times fewer page-table entries. Advice only: a kernel without
// transparent huge pages (or set to "never") keeps 4 KiB pages and nothing fails.
// Thread-safety: stateless.
#pragma once

#include <cstdint>

namespace moestream {

constexpr uint64_t kHugePageBytes = 2ull << 20;

// Alignment for a buffer of `bytes` that must be aligned to `align` (a power of two): with
// `huge` and at least one huge page of bytes, the huge-page size, so the buffer starts on one.
uint64_t huge_page_alignment(uint64_t bytes, uint64_t align, bool huge);

// Advises the whole huge pages at the start of [p, p + len) (p aligned to kHugePageBytes) for
// transparent huge pages (MADV_HUGEPAGE): never the partial one at its end, so a buffer's RSS
// never grows past its own pages. Returns the bytes advised (0: no whole huge page, or the
// kernel refused: no THP).
uint64_t advise_huge_pages(void * p, uint64_t len);

// `bytes` of private anonymous read-write memory starting on a huge-page boundary (a mapping
// one huge page larger, its excess unmapped), not yet advised; unmap with munmap(p, bytes).
// nullptr (errno set) when it cannot be mapped.
uint8_t * map_huge_aligned(uint64_t bytes);

}  // namespace moestream
