// page_layout.h — where an expert's slice falls on the pages of its tensor's reservation.
//
// The residency cache (residency_cache.cpp) reserves each expert tensor (layer, projection)
// as its own page-aligned range and places the tensor `phase` bytes into it (the tensor's
// file offset modulo the page size, so slices are congruent to their file offsets and
// O_DIRECT reads land in place: io_lanes.h). Expert e's slice then covers bytes
// [phase + e * slice, phase + (e + 1) * slice) of the range. Slices need not be page
// multiples, so neighbouring experts can share a boundary page. The cache commits and
// releases whole pages; the replay simulator (replay.cpp) accounts the same pages. Both use
// these functions, so their accounting cannot drift apart.
//
// All arithmetic is on byte offsets within one reservation; callers guarantee
// phase < page_bytes, slice_bytes > 0 and (e + 1) * slice_bytes + phase fits in 64 bits
// (the tensor exists in a file).
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moestream {

struct PageLayout {
    uint64_t phase_bytes = 0;  // tensor start within the reservation's first page
    uint64_t slice_bytes = 0;  // one expert
    uint64_t page_bytes = 4096;
    uint32_t n_expert = 0;

    // Offset of expert e's first byte from the reservation start.
    uint64_t slice_begin(uint32_t e) const { return phase_bytes + uint64_t(e) * slice_bytes; }

    // Pages [*p0, *p1) that expert e's slice touches.
    void pages_of(uint32_t e, uint64_t * p0, uint64_t * p1) const {
        const uint64_t begin = slice_begin(e), end = begin + slice_bytes;
        *p0 = begin / page_bytes;
        *p1 = (end + page_bytes - 1) / page_bytes;
    }

    // Experts [*lo, *hi] whose slices touch page p (empty when *lo > *hi).
    void experts_on(uint64_t p, uint64_t * lo, uint64_t * hi) const {
        const uint64_t first = p * page_bytes, last = (p + 1) * page_bytes - 1;
        if (last < phase_bytes || n_expert == 0) {
            *lo = 1;
            *hi = 0;
            return;
        }
        *lo = first > phase_bytes ? (first - phase_bytes) / slice_bytes : 0;
        *hi = std::min<uint64_t>(n_expert - 1, (last - phase_bytes) / slice_bytes);
    }

    // Whether every slice owns whole pages (none shared): then committing any expert costs
    // exactly slice_bytes.
    bool page_exclusive() const { return phase_bytes == 0 && slice_bytes % page_bytes == 0; }

    // The most pages one slice touches: the chunk size of the page pool (page_pool.h), and
    // what one live expert costs per projection when the cache recycles pool chunks.
    uint64_t chunk_pages() const {
        uint64_t most = 0;
        for (uint32_t e = 0; e < n_expert; ++e) {
            uint64_t p0, p1;
            pages_of(e, &p0, &p1);
            most = std::max(most, p1 - p0);
        }
        return most;
    }

    // The pages of expert e that no other live expert touches: [*q0, *q1). `live(x)` says
    // whether expert x of the same tensor holds pages now. Only the two boundary pages can
    // be shared; interior pages lie inside the slice.
    template <class Live>
    void exclusive_pages(uint32_t e, Live && live, uint64_t * q0, uint64_t * q1) const {
        uint64_t p0, p1;
        pages_of(e, &p0, &p1);
        auto shared = [&](uint64_t p) {
            uint64_t lo, hi;
            experts_on(p, &lo, &hi);
            for (uint64_t x = lo; x <= hi; ++x)
                if (x != e && live(uint32_t(x))) return true;
            return false;
        };
        if (shared(p0)) ++p0;
        if (p1 > p0 && shared(p1 - 1)) --p1;
        *q0 = p0;
        *q1 = std::max(p0, p1);
    }
};

}  // namespace moestream
