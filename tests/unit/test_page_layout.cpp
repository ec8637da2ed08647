// test_page_layout.cpp — PageLayout (src/residency/page_layout.h), the page arithmetic the cache and
// the replay share, against a byte-by-byte model: for random phases, slice sizes and sets of
// live experts, which pages each expert touches, which experts touch each page, and which of
// an expert's pages no other live expert touches.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "page_layout.h"

using namespace moestream;

namespace {

// Byte model: owner pages of expert x = { (phase + x * slice + i) / page : 0 <= i < slice }.
std::set<uint64_t> pages_by_bytes(const PageLayout & L, uint32_t x) {
    std::set<uint64_t> s;
    for (uint64_t b = L.slice_begin(x); b < L.slice_begin(x) + L.slice_bytes; ++b)
        s.insert(b / L.page_bytes);
    return s;
}

}  // namespace

TEST(PageLayout, MatchesTheByteModel) {
    std::mt19937_64 rng(5);
    for (int iter = 0; iter < 300; ++iter) {
        PageLayout L;
        L.page_bytes = 4096;
        L.phase_bytes = iter % 3 == 0 ? 0 : rng() % 4096;
        const uint64_t choices[] = {4096, 8192, 1572, 10000, 4196, 884736 / 64, 333, 12288};
        L.slice_bytes = choices[rng() % 8];
        L.n_expert = 2 + uint32_t(rng() % 12);
        std::vector<char> live(L.n_expert);
        for (auto & v : live) v = char(rng() % 2);
        SCOPED_TRACE("phase " + std::to_string(L.phase_bytes) + " slice " +
                     std::to_string(L.slice_bytes) + " n " + std::to_string(L.n_expert));
        for (uint32_t e = 0; e < L.n_expert; ++e) {
            const std::set<uint64_t> mine = pages_by_bytes(L, e);
            uint64_t p0, p1;
            L.pages_of(e, &p0, &p1);
            ASSERT_EQ(p0, *mine.begin());
            ASSERT_EQ(p1, *mine.rbegin() + 1);
            // experts_on: exactly the experts whose bytes touch the page.
            for (uint64_t p = p0; p < p1; ++p) {
                uint64_t lo, hi;
                L.experts_on(p, &lo, &hi);
                for (uint32_t x = 0; x < L.n_expert; ++x)
                    ASSERT_EQ(pages_by_bytes(L, x).count(p) == 1, x >= lo && x <= hi)
                        << "page " << p << " expert " << x;
            }
            // exclusive_pages: e's pages that no OTHER live expert touches (a contiguous range,
            // since only the boundary pages can be shared).
            uint64_t q0, q1;
            L.exclusive_pages(
                e, [&](uint32_t x) { return live[x] != 0; }, &q0, &q1);
            std::set<uint64_t> expect = mine;
            for (uint32_t x = 0; x < L.n_expert; ++x)
                if (x != e && live[x])
                    for (uint64_t p : pages_by_bytes(L, x)) expect.erase(p);
            std::set<uint64_t> got;
            for (uint64_t p = q0; p < q1; ++p) got.insert(p);
            ASSERT_EQ(got, expect) << "expert " << e;
        }
        EXPECT_EQ(L.page_exclusive(), L.phase_bytes == 0 && L.slice_bytes % 4096 == 0);
    }
}

TEST(PageLayout, EdgesOfTheReservation) {
    uint64_t lo, hi;
    const PageLayout L{/*phase*/ 4000, /*slice*/ 8192, /*page*/ 4096, /*n*/ 4};
    L.experts_on(0, &lo, &hi);  // bytes 0..4095: padding, then expert 0 from byte 4000
    EXPECT_EQ(lo, 0u);
    EXPECT_EQ(hi, 0u);
    const PageLayout M{0, 8192, 4096, 4};
    M.experts_on(7, &lo, &hi);  // the last page of expert 3
    EXPECT_EQ(lo, 3u);
    EXPECT_EQ(hi, 3u);
    M.experts_on(8, &lo, &hi);  // past the tensor: no expert
    EXPECT_GT(lo, hi);
}
