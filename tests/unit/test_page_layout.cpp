// test_page_layout.cpp — PageLayout (src/residency/page_layout.h), the page arithmetic the cache and
// the replay share, against a byte-by-byte model: for random phases, slice sizes and sets of
// live experts, which pages each expert touches, which experts touch each page, and which of
// an expert's pages no other live expert touches; at 4 KiB, 16 KiB and 64 KiB pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "page_layout.h"

using namespace moestream;

namespace {

// Byte model: owner pages of expert x = { (phase + x * slice + i) / page : 0 <= i < slice },
// walked byte by byte.
std::set<uint64_t> pages_by_bytes(const PageLayout & L, uint32_t x) {
    std::set<uint64_t> s;
    uint64_t last = UINT64_MAX;
    for (uint64_t b = L.slice_begin(x); b < L.slice_begin(x) + L.slice_bytes; ++b)
        if (b / L.page_bytes != last) s.insert(last = b / L.page_bytes);
    return s;
}

}  // namespace

// The page size is a parameter, independent of the host's: 4 KiB (x86-64, most arm64
// kernels), 16 KiB (Apple silicon, some Android kernels) and 64 KiB (arm64 server and
// Raspberry Pi kernels built with 64 KiB pages). Slice sizes scale with the page so that every
// case occurs at every size: page multiples, a bit above one, below one page, many per page.
class PageLayoutSized : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PageLayoutSized, MatchesTheByteModel) {
    const uint64_t P = GetParam();
    std::mt19937_64 rng(5 + P);
    for (int iter = 0; iter < 300; ++iter) {
        PageLayout L;
        L.page_bytes = P;
        L.phase_bytes = iter % 3 == 0 ? 0 : rng() % P;
        const uint64_t choices[] = {P,         2 * P,           P * 1572 / 4096, P * 10000 / 4096,
                                    P + 100,   884736 / 64,     333,             3 * P};
        L.slice_bytes = choices[rng() % 8];
        L.n_expert = 2 + uint32_t(rng() % 12);
        std::vector<char> live(L.n_expert);
        for (auto & v : live) v = char(rng() % 2);
        SCOPED_TRACE("page " + std::to_string(P) + " phase " + std::to_string(L.phase_bytes) +
                     " slice " + std::to_string(L.slice_bytes) + " n " + std::to_string(L.n_expert));
        std::vector<std::set<uint64_t>> model(L.n_expert);
        for (uint32_t x = 0; x < L.n_expert; ++x) model[x] = pages_by_bytes(L, x);
        for (uint32_t e = 0; e < L.n_expert; ++e) {
            const std::set<uint64_t> & mine = model[e];
            uint64_t p0, p1;
            L.pages_of(e, &p0, &p1);
            ASSERT_EQ(p0, *mine.begin());
            ASSERT_EQ(p1, *mine.rbegin() + 1);
            // experts_on: exactly the experts whose bytes touch the page.
            for (uint64_t p = p0; p < p1; ++p) {
                uint64_t lo, hi;
                L.experts_on(p, &lo, &hi);
                for (uint32_t x = 0; x < L.n_expert; ++x)
                    ASSERT_EQ(model[x].count(p) == 1, x >= lo && x <= hi)
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
                    for (uint64_t p : model[x]) expect.erase(p);
            std::set<uint64_t> got;
            for (uint64_t p = q0; p < q1; ++p) got.insert(p);
            ASSERT_EQ(got, expect) << "expert " << e;
        }
        EXPECT_EQ(L.page_exclusive(), L.phase_bytes == 0 && L.slice_bytes % P == 0);
        // chunk_pages: the most pages one slice touches, by the byte model.
        uint64_t most = 0;
        for (uint32_t e = 0; e < L.n_expert; ++e)
            most = std::max<uint64_t>(most, model[e].size());
        EXPECT_EQ(L.chunk_pages(), most);
    }
}

// Negative control: the byte model really depends on the page size. A layout computed with
// 4 KiB pages disagrees with the byte model at the larger size (and the other way round), so
// the test above would catch arithmetic that ignored page_bytes or assumed 4096.
TEST_P(PageLayoutSized, AnotherPageSizeDisagreesWithTheByteModel) {
    const uint64_t P = GetParam();
    const uint64_t other = P == 4096 ? 65536 : 4096;
    PageLayout truth{/*phase*/ 100, /*slice*/ 3 * P + 7, P, /*n*/ 8};
    PageLayout wrong = truth;
    wrong.page_bytes = other;
    wrong.phase_bytes = truth.phase_bytes % other;
    int differing = 0;
    for (uint32_t e = 0; e < truth.n_expert; ++e) {
        const std::set<uint64_t> mine = pages_by_bytes(truth, e);
        uint64_t p0, p1;
        wrong.pages_of(e, &p0, &p1);
        if (p0 != *mine.begin() || p1 != *mine.rbegin() + 1) ++differing;
    }
    EXPECT_GT(differing, 0);
    EXPECT_NE(wrong.chunk_pages(), truth.chunk_pages());
}

INSTANTIATE_TEST_SUITE_P(PageSizes, PageLayoutSized,
                         ::testing::Values(uint64_t(4096), uint64_t(16384), uint64_t(65536)),
                         [](const ::testing::TestParamInfo<uint64_t> & i) {
                             return std::to_string(i.param >> 10) + "KiB";
                         });

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
