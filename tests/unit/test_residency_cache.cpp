// test_residency_cache.cpp — the bounded LRU expert cache (src/residency/residency_cache.cpp).
//
// Layouts are built by hand (no model file): the store only needs the expert map's shapes.
// "Reads" are simulated by filling each ReadRequest's destination with a pattern derived
// from its file offset, which is what IoLanes would do with the real bytes.
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moestream/cache_budget.h"
#include "moestream/gguf_index.h"
#include "io_lanes.h"
#include "page_layout.h"
#include "residency.h"
#include "moestream/synth.h"
#include "test_util.h"

using namespace moestream;
using moestream::test::pool_file_bytes;

namespace {

constexpr uint64_t kMiB = 1024 * 1024;
const uint64_t kSysPage = uint64_t(sysconf(_SC_PAGESIZE));
// The cache's page size in the test running now: the system's, or the parameter of the
// CachePageSize tests (CacheTestHooks::page_bytes, set by make()), which run the same checks at
// 4, 16 and 64 KiB pages on any host.
uint64_t kPage = kSysPage;

ModelIndex make_index(const std::vector<std::vector<uint64_t>> & layers, uint32_t n_expert,
                      uint64_t first_offset = 4096) {
    return moestream::test::hand_made_index(layers, n_expert, 1, first_offset);
}

uint8_t pattern_byte(uint64_t file_offset) {
    return uint8_t(1 + (file_offset * 131) % 251);
}

// pattern_byte is periodic in the file offset (period 251): the bytes of [off, off + len) are
// pieces of a table holding 64 periods, handed to f(piece, n) in order (slices of 64 KiB pages
// are too large to fill and check byte by byte).
template <class F>
void pattern_pieces(uint64_t off, uint64_t len, F && f) {
    static const std::vector<uint8_t> table = [] {
        std::vector<uint8_t> t(251 * 64);
        for (size_t i = 0; i < t.size(); ++i) t[i] = pattern_byte(i);
        return t;
    }();
    while (len > 0) {
        const uint64_t n = std::min<uint64_t>(len, 251 * 63);
        f(table.data() + off % 251, n);
        off += n;
        len -= n;
    }
}

// What IoLanes would do: every requested slice gets its bytes.
void simulate_reads(const std::vector<ReadRequest> & reads) {
    // Each byte's value follows from its own file offset, so a page mapped at the wrong place
    // (another page of the slice, another expert's chunk page) shows.
    for (const ReadRequest & r : reads) {
        auto * d = static_cast<uint8_t *>(r.dest);
        pattern_pieces(r.file_offset, r.len, [&](const uint8_t * p, uint64_t n) {
            std::memcpy(d, p, n);
            d += n;
        });
    }
}

// Expert e's slice of projection t holds its file bytes.
bool slice_intact_in(ResidencyStore & s, const ModelIndex & idx, size_t moe, size_t t, uint32_t e) {
    const ExpertTensor & et = idx.moe_layers[moe].tensors[t];
    const uint8_t * q = s.slice_addr(moe, t, e, et.slice_bytes);  // (fixed slots: its slot)
    bool same = true;
    pattern_pieces(et.slice_offset(e), et.slice_bytes, [&](const uint8_t * p, uint64_t n) {
        same = same && std::memcmp(q, p, n) == 0;
        q += n;
    });
    return same;
}

bool slice_intact(ResidencyStore & s, const ModelIndex & idx, size_t moe, uint32_t e) {
    bool same = true;
    for (size_t t = 0; t < idx.moe_layers[moe].tensors.size() && same; ++t)
        same = slice_intact_in(s, idx, moe, t, e);
    return same;
}

// What a test builds a cache with: production options, debug knobs, test hooks.
struct CacheSetup {
    CacheOptions opt;
    CacheDebug dbg;
    CacheTestHooks test;
};

std::unique_ptr<ResidencyStore> make(const ModelIndex & idx, uint64_t budget,
                                     const CacheSetup & cfg = {}) {
    Status st;
    CacheTestHooks test = cfg.test;
    if (kPage != kSysPage) test.page_bytes = kPage;
    auto s = make_lru_cache(idx, budget, cfg.opt, cfg.dbg, &st, test);
    EXPECT_TRUE(st.ok()) << st.message();
    if (s) {
        EXPECT_EQ(s->paged_memory()->page_stats().page_bytes, kPage);
    }
    return s;
}

// Stages, simulates the reads, returns the experts that got reads (the misses), in order.
std::vector<uint32_t> stage_and_read(ResidencyStore & s, const ModelIndex & idx, size_t moe,
                                     const std::vector<uint32_t> & experts,
                                     StageStats * ss = nullptr) {
    std::vector<ReadRequest> reads;
    StageStats local;
    Status st = s.stage(moe, experts, &reads, ss ? ss : &local);
    EXPECT_TRUE(st.ok()) << st.message();
    simulate_reads(reads);
    std::vector<uint32_t> missed;
    const uint8_t * base0 = s.tensor_base(moe, 0);
    const uint64_t sb0 = idx.moe_layers[moe].tensors[0].slice_bytes;
    for (const ReadRequest & r : reads) {
        const auto * d = static_cast<const uint8_t *>(r.dest);
        if (d >= base0 && d < base0 + idx.moe_layers[moe].tensors[0].tensor_bytes)
            missed.push_back(uint32_t((d - base0) / sb0));
    }
    return missed;
}

std::vector<uint32_t> random_routing(std::mt19937 & rng, uint32_t n_expert, uint32_t k) {
    std::vector<uint32_t> all(n_expert);
    for (uint32_t i = 0; i < n_expert; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(k);
    return all;
}

uint64_t rss_anon_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
    return 0;
}

// Anonymous + shared memory mapped by the process (the page pool's chunks are shmem).
uint64_t rss_anon_shmem_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    uint64_t total = 0;
    while (std::getline(f, line))
        if (line.rfind("RssAnon:", 0) == 0 || line.rfind("RssShmem:", 0) == 0)
            total += std::stoull(line.substr(9)) * 1024;
    return total;
}


// What the cache accounts for the live experts `es` of layer `moe`: with recycled pages, one
// pool chunk per projection each (PageLayout::chunk_pages); else the union of their pages.
uint64_t union_page_bytes(const ModelIndex & idx, size_t moe, const std::vector<uint32_t> & es);
uint64_t accounted_bytes(const ModelIndex & idx, size_t moe, const std::vector<uint32_t> & es,
                         bool recycle) {
    if (!recycle) return union_page_bytes(idx, moe, es);
    uint64_t per_expert = 0;
    for (const ExpertTensor & et : idx.moe_layers[moe].tensors)
        per_expert += PageLayout{et.file_offset % kPage, et.slice_bytes, kPage,
                                 uint32_t(et.ne[2])}.chunk_pages() * kPage;
    return es.size() * per_expert;
}

// Pages covered by the union of the given experts' slices, over all projections.
uint64_t union_page_bytes(const ModelIndex & idx, size_t moe, const std::vector<uint32_t> & es) {
    uint64_t total = 0;
    for (const ExpertTensor & et : idx.moe_layers[moe].tensors) {
        // The store places each tensor at its file offset's phase within a page.
        const uint64_t phase = et.file_offset % kPage;
        std::set<uint64_t> pages;
        for (uint32_t e : es)
            for (uint64_t b = phase + uint64_t(e) * et.slice_bytes;
                 b < phase + uint64_t(e + 1) * et.slice_bytes; b += 1)
                pages.insert(b / kPage);
        total += pages.size() * kPage;
    }
    return total;
}

bool page_in_core(const void * p) {  // the system page holding p
    unsigned char v = 0;
    auto a = reinterpret_cast<uintptr_t>(p) / kSysPage * kSysPage;
    EXPECT_EQ(mincore(reinterpret_cast<void *>(a), kSysPage, &v), 0);
    return v & 1;
}

// The reference: a plain LRU over (layer, expert) with byte accounting, evicting from the
// cold end but skipping the experts routed in the layer being staged.
class RefLru {
public:
    RefLru(const ModelIndex & idx, uint64_t budget) : idx_(idx), budget_(budget) {}

    // Returns the hit flags in routing order.
    std::vector<bool> stage(size_t moe, const std::vector<uint32_t> & experts) {
        std::vector<bool> hit;
        const std::set<uint32_t> routed(experts.begin(), experts.end());
        for (uint32_t e : experts) {
            const auto key = std::make_pair(moe, e);
            auto it = std::find(lru_.begin(), lru_.end(), key);
            if (it != lru_.end()) {
                lru_.erase(it);
                lru_.push_front(key);
                hit.push_back(true);
                continue;
            }
            hit.push_back(false);
            const uint64_t eb = idx_.moe_layers[moe].expert_bytes;
            while (used_ + eb > budget_) {
                auto v = lru_.end();
                for (auto r = lru_.rbegin(); r != lru_.rend(); ++r)
                    if (!(r->first == moe && routed.count(r->second))) {
                        v = std::next(r).base();
                        break;
                    }
                if (v == lru_.end()) break;
                used_ -= idx_.moe_layers[v->first].expert_bytes;
                lru_.erase(v);
                ++evictions;
            }
            lru_.push_front(key);
            used_ += eb;
        }
        return hit;
    }
    bool resident(size_t moe, uint32_t e) const {
        return std::find(lru_.begin(), lru_.end(), std::make_pair(moe, e)) != lru_.end();
    }
    uint64_t used() const { return used_; }
    uint64_t evictions = 0;

private:
    const ModelIndex & idx_;
    uint64_t budget_;
    uint64_t used_ = 0;
    std::list<std::pair<size_t, uint32_t>> lru_;  // front = most recent
};

}  // namespace

// --- LRU order ---------------------------------------------------------------------------

// Hits, misses, evictions and the resident set after every stage match the reference LRU on
// a seeded random routing sequence, for budgets from below one expert to above everything.
void run_matches_reference_lru() {
    // Page-multiple slices, two layer shapes (different expert sizes per layer).
    const uint64_t P = kPage;
    const ModelIndex idx = make_index(
        {{2 * P, 2 * P, 2 * P}, {P, P, 3 * P}, {2 * P, 2 * P, 2 * P}, {P, P, 3 * P}}, 16, P);
    const uint64_t eb0 = 6 * P, eb1 = 5 * P;
    const uint64_t budgets[] = {P, eb0, 3 * eb0, 10 * eb1 + 3 * P, 25 * eb0, 70 * eb0};
    for (uint64_t budget : budgets) {
        SCOPED_TRACE("budget " + std::to_string(budget));
        auto s = make(idx, budget);
        ASSERT_TRUE(s);
        RefLru ref(idx, budget);
        std::mt19937 rng(1234 + uint32_t(budget / P));
        uint64_t hits = 0, misses = 0;
        // (Fewer tokens at larger pages: the same number of page commits, 16x the bytes.)
        const int n_tok = kPage <= 4096 ? 150 : kPage <= 16384 ? 80 : 40;
        for (int tok = 0; tok < n_tok; ++tok) {
            for (size_t moe = 0; moe < idx.moe_layers.size(); ++moe) {
                // Skewed routing so that hits happen at every budget.
                std::vector<uint32_t> ex = random_routing(rng, 16, 4);
                for (uint32_t & e : ex)
                    if (rng() % 2) e = e % 6;
                std::sort(ex.begin(), ex.end());
                ex.erase(std::unique(ex.begin(), ex.end()), ex.end());
                std::shuffle(ex.begin(), ex.end(), rng);

                StageStats ss;
                const std::vector<uint32_t> missed = stage_and_read(*s, idx, moe, ex, &ss);
                const std::vector<bool> want = ref.stage(moe, ex);
                std::vector<uint32_t> want_missed;
                for (size_t i = 0; i < ex.size(); ++i)
                    if (!want[i]) want_missed.push_back(ex[i]);
                ASSERT_EQ(missed, want_missed) << "token " << tok << " layer " << moe;
                EXPECT_EQ(ss.lookups, ex.size());
                EXPECT_EQ(ss.misses, want_missed.size());
                EXPECT_EQ(ss.hits, ex.size() - want_missed.size());
                hits += ss.hits;
                misses += ss.misses;

                const LedgerStats cs = s->ledger_stats();
                ASSERT_EQ(cs.evictions, ref.evictions);
                ASSERT_EQ(cs.resident_expert_bytes, ref.used());
                const uint64_t routed_bytes = ex.size() * idx.moe_layers[moe].expert_bytes;
                ASSERT_LE(cs.resident_expert_bytes, std::max(budget, routed_bytes));
                for (size_t l = 0; l < idx.moe_layers.size(); ++l)
                    for (uint32_t e = 0; e < 16; ++e)
                        ASSERT_EQ(s->is_resident(l, e), ref.resident(l, e))
                            << "layer " << l << " expert " << e;
            }
        }
        const LedgerStats cs = s->ledger_stats();
        EXPECT_EQ(cs.hits, hits);
        EXPECT_EQ(cs.misses, misses);
        EXPECT_EQ(cs.lookups, hits + misses);
        EXPECT_GE(cs.peak_resident_bytes, cs.resident_expert_bytes);
        if (budget >= 25 * eb0) {
            EXPECT_GT(hits, 0u);
        }
        if (budget >= 70 * eb0) {
            EXPECT_EQ(cs.evictions, 0u);
        }
        // Every resident expert holds its own bytes.
        for (size_t l = 0; l < idx.moe_layers.size(); ++l)
            for (uint32_t e = 0; e < 16; ++e)
                if (s->is_resident(l, e)) {
                    EXPECT_TRUE(slice_intact(*s, idx, l, e));
                }
    }
}
TEST(ResidencyCache, MatchesReferenceLru) { run_matches_reference_lru(); }

// Recycled pages with slices that share boundary pages (three sizes, one below a page): over
// a long random routing, every live expert's bytes stay intact after every stage, whichever
// neighbour's chunk backs a shared page and in whatever order neighbours leave; the pool
// recycles and never holds more than the budget. The same run with fresh pages is the
// control for the decisions (the accounting differs, so only integrity is compared). With
// recycled pages, both with chunks moved from their victims (mremap) and mapped afresh.
void run_recycled_pages_intact() {
    // (Sizes at 4 KiB pages; the same shapes at other page sizes.)
    const uint64_t k = kPage / 4096;
    const ModelIndex idx = make_index(
        {{10000 * k, 1500 * k, 3 * kPage + 7}, {5000 * k, 5000 * k, 9000 * k}}, 24);
    for (int mode : {0, 1, 2}) {
        const bool recycle = mode < 2, move = mode == 0;
        SCOPED_TRACE("recycle " + std::to_string(recycle) + " move " + std::to_string(move));
        CacheSetup cfg;
        cfg.opt.recycle_pages = recycle;
        cfg.opt.move_pages = move;
        cfg.dbg.poison = true;
        cfg.dbg.check_residency = true;
        const uint64_t budget = accounted_bytes(idx, 0, std::vector<uint32_t>(9, 0), true);
        auto s = make(idx, budget, cfg);
        ASSERT_TRUE(s);
        ASSERT_EQ(s->paged_memory()->page_stats().recycle_pages, recycle);
        std::mt19937 rng(99);
        for (int i = 0; i < 400; ++i) {
            const size_t moe = rng() % 2;
            std::vector<uint32_t> ex = random_routing(rng, 24, 1 + rng() % 4);
            for (uint32_t & e : ex)
                if (rng() % 3 == 0) e = e % 5;  // some locality, so neighbours overlap often
            std::sort(ex.begin(), ex.end());
            ex.erase(std::unique(ex.begin(), ex.end()), ex.end());
            stage_and_read(*s, idx, moe, ex);
            ASSERT_TRUE(s->verify_resident(moe, ex).ok()) << "stage " << i;
            for (size_t l = 0; l < 2; ++l)
                for (uint32_t e = 0; e < 24; ++e)
                    if (s->is_resident(l, e)) {
                        ASSERT_TRUE(slice_intact(*s, idx, l, e))
                            << "stage " << i << " layer " << l << " expert " << e;
                    }
            const LedgerStats cs = s->ledger_stats();
            const PageStats ps = s->paged_memory()->page_stats();
            if (recycle) {
                ASSERT_LE(ps.pool_bytes, std::max(budget, cs.resident_expert_bytes));
            }
        }
        const LedgerStats cs = s->ledger_stats();
        const PageStats ps = s->paged_memory()->page_stats();
        EXPECT_GT(cs.evictions, 100u);
        if (recycle) {
            EXPECT_GT(ps.recycled_commits, 200u);
        }
        if (move) {
            EXPECT_GT(ps.moved_commits, ps.recycled_commits / 2);
        } else {
            EXPECT_EQ(ps.moved_commits, 0u);
        }
    }
}
TEST(ResidencyCache, RecycledPagesKeepEveryLiveSliceIntact) { run_recycled_pages_intact(); }


// Moved pages (CacheOptions::move_pages): an evicted expert's chunk moves to the next miss's
// address. After every stage each routed expert holds its own bytes at its canonical
// address and every absent expert's pages (those no live neighbour covers) are gone from
// its address, for slices that are page multiples at a page-aligned file offset (every
// recycled commit moves) and at an unaligned one (slices straddle pages; ranges differ by a
// boundary page, so some moves are partial). The second layer has one projection, so a miss
// there that evicts a first-layer expert moves one of its three chunks and must unmap the
// other two. Negative control: a planted bug that leaves the victim's old mapping in place
// (Fault::kLeaveParked) is caught by the same check.
namespace {
// The first page of an absent expert's slice in projection t that no live expert covers
// and that is still backed by memory (mincore), or nullptr.
const uint8_t * absent_page_in_core(ResidencyStore & s, const ModelIndex & idx, size_t moe,
                                    size_t t, uint32_t n_expert) {
    const ExpertTensor & et = idx.moe_layers[moe].tensors[t];
    const uint8_t * base = s.tensor_base(moe, t);
    auto page_of = [&](uint64_t b) { return reinterpret_cast<uintptr_t>(base + b) / kPage; };
    std::set<uintptr_t> live_pages;
    for (uint32_t e = 0; e < n_expert; ++e)
        if (s.is_resident(moe, e))
            for (uintptr_t p = page_of(uint64_t(e) * et.slice_bytes);
                 p <= page_of(uint64_t(e + 1) * et.slice_bytes - 1); ++p)
                live_pages.insert(p);
    for (uint32_t e = 0; e < n_expert; ++e) {
        if (s.is_resident(moe, e)) continue;
        for (uintptr_t p = page_of(uint64_t(e) * et.slice_bytes);
             p <= page_of(uint64_t(e + 1) * et.slice_bytes - 1); ++p)
            if (!live_pages.count(p) && page_in_core(reinterpret_cast<void *>(p * kPage)))
                return reinterpret_cast<const uint8_t *>(p * kPage);
    }
    return nullptr;
}

bool kernel_at_least(int major, int minor) {
    struct utsname u;
    int a = 0, b = 0;
    if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &a, &b) != 2) return true;
    return a > major || (a == major && b >= minor);
}
}  // namespace

void run_moved_pages_follow() {
    for (uint64_t phase : {uint64_t(0), uint64_t(1000)}) {
        for (int mode : {0, 1, 2}) {  // moved, mapped afresh, planted bug
            SCOPED_TRACE("phase " + std::to_string(phase) + " mode " + std::to_string(mode));
            const uint32_t n = 32;
            const ModelIndex idx =
                make_index({{2 * kPage, 2 * kPage, 3 * kPage}, {2 * kPage}}, n, 2 * kPage + phase);
            CacheSetup cfg;
            cfg.opt.move_pages = mode != 1;
            if (mode == 2) cfg.test.fault = CacheTestHooks::Fault::kLeaveParked;
            const uint64_t budget = accounted_bytes(idx, 0, std::vector<uint32_t>(5, 0), true);
            auto s = make(idx, budget, cfg);
            ASSERT_TRUE(s);
            ASSERT_TRUE(s->paged_memory()->page_stats().recycle_pages);
            std::mt19937 rng(7);
            bool caught = false;
            for (int i = 0; i < 120 && !caught; ++i) {
                const size_t moe = rng() % 2;
                const std::vector<uint32_t> ex = random_routing(rng, n, 1 + rng() % 3);
                stage_and_read(*s, idx, moe, ex);
                if (i % 2 == 1) {  // prefetch into the other layer: its evictions park too
                    std::vector<ReadRequest> pr;
                    s->prefetch(1 - moe, random_routing(rng, n, 2), &pr);
                    simulate_reads(pr);
                    s->end_prefetch(true);
                }
                for (uint32_t e : ex) {
                    ASSERT_TRUE(slice_intact(*s, idx, moe, e)) << "stage " << i << " expert " << e;
                }
                for (size_t l = 0; l < 2; ++l)
                    for (uint32_t e = 0; e < n; ++e)
                        if (s->is_resident(l, e)) {
                            ASSERT_TRUE(slice_intact(*s, idx, l, e))
                                << "stage " << i << " layer " << l << " expert " << e;
                        }
                for (size_t l = 0; l < 2; ++l)
                    for (size_t t = 0; t < idx.moe_layers[l].tensors.size() && !caught; ++t)
                        if (const uint8_t * p = absent_page_in_core(*s, idx, l, t, n)) {
                            caught = true;
                            if (mode != 2) {
                                ADD_FAILURE() << "stage " << i << ": page " << (const void *)p
                                              << " of an absent expert is still mapped";
                            }
                        }
            }
            const LedgerStats cs = s->ledger_stats();
            const PageStats ps = s->paged_memory()->page_stats();
            if (mode != 2) {
                EXPECT_GT(cs.evictions, 100u);
            }
            if (mode == 2) {
                EXPECT_TRUE(caught) << "the planted stale mapping went unnoticed";
            } else if (mode == 1) {
                EXPECT_EQ(ps.moved_commits, 0u);
                EXPECT_GT(ps.recycled_commits, 200u);
            } else if (kernel_at_least(5, 13)) {  // MREMAP_DONTUNMAP for shared mappings
                EXPECT_GT(ps.moved_commits, ps.recycled_commits / 2);
                EXPECT_GT(ps.moved_commits, 100u);
            }
        }
    }
}
TEST(ResidencyCache, MovedPagesFollowTheirExpert) { run_moved_pages_follow(); }
// Split staging (stage_split / commit_deferred; docs/cache.md, "Split staging"), as the
// streamer drives it: stage_split commits the first projection's slices only, a prefetch
// may follow, the first projection's reads run, then commit_deferred maps the second's,
// their reads run, then down's. Over a long random routing with slices sharing boundary pages
// (the shapes of the test above): before its commit a deferred slice has no memory under it
// (a read there would fault: what the lanes' release gate protects); the first stage's bytes
// survive the later commits (no page under a read is remapped); afterwards every live expert
// is intact and verify_resident passes; and the cache decides exactly as one staged at once
// (the same residency after every stage, the same evictions), moving chunks and not.
void run_split_staging() {
    const uint64_t k = kPage / 4096;
    const ModelIndex idx = make_index(
        {{10000 * k, 1500 * k, 3 * kPage + 7}, {5000 * k, 5000 * k, 9000 * k}}, 24);
    for (bool move : {true, false}) {
        SCOPED_TRACE(move ? "moved chunks" : "mapped chunks");
        CacheSetup cfg;
        cfg.opt.move_pages = move;
        cfg.dbg.poison = true;
        cfg.dbg.check_residency = true;
        const uint64_t budget = accounted_bytes(idx, 0, std::vector<uint32_t>(9, 0), true);
        auto s = make(idx, budget, cfg);
        auto ref = make(idx, budget, cfg);
        ASSERT_TRUE(s && ref);
        ASSERT_TRUE(s->paged_memory()->page_stats().recycle_pages);
        std::mt19937 rng(99);
        uint64_t unmapped_seen = 0;
        for (int i = 0; i < 400; ++i) {
            const size_t moe = rng() % 2;
            std::vector<uint32_t> ex = random_routing(rng, 24, 1 + rng() % 4);
            for (uint32_t & e : ex)
                if (rng() % 3 == 0) e = e % 5;  // neighbours overlap often
            std::sort(ex.begin(), ex.end());
            ex.erase(std::unique(ex.begin(), ex.end()), ex.end());
            const bool pf = i % 3 == 1;
            const std::vector<uint32_t> guess = random_routing(rng, 24, 2);

            stage_and_read(*ref, idx, moe, ex);
            if (pf) {
                std::vector<ReadRequest> pr;
                ref->prefetch(1 - moe, guess, &pr);
                simulate_reads(pr);
                ref->end_prefetch(true);
            }

            std::vector<ReadRequest> reads, pr;
            StageStats ss;
            bool deferred = false;
            ASSERT_TRUE(s->split_staging()->stage_split(moe, ex, /*now_mask=*/1, &reads, &ss, &deferred).ok());
            EXPECT_EQ(deferred, ss.misses > 0) << "stage " << i;
            if (pf) s->prefetch(1 - moe, guess, &pr);
            const MoeLayer & L = idx.moe_layers[moe];
            std::vector<std::vector<ReadRequest>> by_t(L.tensors.size());
            std::vector<uint32_t> missed;
            for (const ReadRequest & r : reads)
                for (size_t t = 0; t < L.tensors.size(); ++t) {
                    const uint8_t * b = s->tensor_base(moe, t);
                    const auto * d = static_cast<const uint8_t *>(r.dest);
                    if (d < b || d >= b + L.tensors[t].tensor_bytes) continue;
                    by_t[t].push_back(r);
                    if (t == 0) missed.push_back(uint32_t((d - b) / L.tensors[0].slice_bytes));
                }
            // Deferred slices: no memory yet under their pages (those no neighbour shares).
            for (size_t t = 1; t < L.tensors.size(); ++t)
                for (const ReadRequest & r : by_t[t]) {
                    const auto a = reinterpret_cast<uintptr_t>(r.dest);
                    const uintptr_t p = (a + kPage - 1) / kPage * kPage;
                    if (p + kPage <= a + r.len) {
                        EXPECT_FALSE(page_in_core(reinterpret_cast<const void *>(p)))
                            << "stage " << i << ": a deferred slice is mapped before its commit";
                        ++unmapped_seen;
                    }
                }
            simulate_reads(by_t[0]);
            ASSERT_TRUE(s->split_staging()->commit_deferred(moe, 2).ok());
            simulate_reads(by_t[1]);
            ASSERT_TRUE(s->split_staging()->commit_deferred(moe, ~uint64_t(3)).ok());
            for (uint32_t e : missed) {  // the first stage's bytes survived the later commits
                ASSERT_TRUE(slice_intact_in(*s, idx, moe, 0, e)) << "stage " << i << " expert " << e;
                if (L.tensors.size() > 1) {
                    ASSERT_TRUE(slice_intact_in(*s, idx, moe, 1, e)) << "stage " << i;
                }
            }
            for (size_t t = 2; t < L.tensors.size(); ++t) simulate_reads(by_t[t]);
            if (pf) {
                simulate_reads(pr);
                s->end_prefetch(true);
            }
            ASSERT_TRUE(s->verify_resident(moe, ex).ok()) << "stage " << i;
            for (size_t l = 0; l < 2; ++l)
                for (uint32_t e = 0; e < 24; ++e) {
                    ASSERT_EQ(s->is_resident(l, e), ref->is_resident(l, e))
                        << "stage " << i << " layer " << l << " expert " << e;
                    if (s->is_resident(l, e)) {
                        ASSERT_TRUE(slice_intact(*s, idx, l, e))
                            << "stage " << i << " layer " << l << " expert " << e;
                    }
                }
            ASSERT_LE(s->paged_memory()->page_stats().pool_bytes,
                      std::max(budget, s->ledger_stats().resident_expert_bytes));
        }
        const LedgerStats cs = s->ledger_stats(), rs = ref->ledger_stats();
        const PageStats ps = s->paged_memory()->page_stats(), rps = ref->paged_memory()->page_stats();
        EXPECT_EQ(cs.evictions, rs.evictions);
        EXPECT_EQ(cs.misses, rs.misses);
        EXPECT_GT(cs.evictions, 100u);
        EXPECT_GT(ps.deferred_commits, cs.misses);  // two deferred projections per miss
        EXPECT_EQ(rps.deferred_commits, 0u);
        EXPECT_GT(unmapped_seen, 100u);
        if (move && kernel_at_least(5, 13)) {
            EXPECT_GT(ps.moved_commits, ps.recycled_commits / 2);
        }
    }
}
TEST(ResidencyCache, SplitStagingDecidesAsStagedAtOnceAndKeepsReadsIntact) { run_split_staging(); }

// A budget smaller than one layer's routed set: the routed set is kept whole (it is needed
// by the matmul about to run), everything else goes.
TEST(ResidencyCache, NeverEvictsTheStagedLayersRoutedSet) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 16);
    const uint64_t eb = 3 * kPage;
    auto s = make(idx, 2 * eb);
    ASSERT_TRUE(s);
    const std::vector<uint32_t> a = {0, 1, 2, 3, 4, 5};
    EXPECT_EQ(stage_and_read(*s, idx, 0, a).size(), 6u);
    for (uint32_t e : a) EXPECT_TRUE(s->is_resident(0, e));
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, 6 * eb);
    EXPECT_EQ(s->ledger_stats().over_budget_stages, 1u);

    // Same layer, overlapping set: 4 and 5 hit, 0..3 (not routed now) are the victims.
    const std::vector<uint32_t> b = {4, 5, 6, 7, 8, 9};
    StageStats ss;
    EXPECT_EQ(stage_and_read(*s, idx, 0, b, &ss), (std::vector<uint32_t>{6, 7, 8, 9}));
    EXPECT_EQ(ss.hits, 2u);
    for (uint32_t e : b) EXPECT_TRUE(s->is_resident(0, e));
    for (uint32_t e : {0u, 1u, 2u, 3u}) EXPECT_FALSE(s->is_resident(0, e));

    // Another layer: all of layer 0 may go; layer 1's routed set stays whole.
    EXPECT_EQ(stage_and_read(*s, idx, 1, a).size(), 6u);
    for (uint32_t e = 0; e < 16; ++e) EXPECT_FALSE(s->is_resident(0, e));
    for (uint32_t e : a) EXPECT_TRUE(s->is_resident(1, e));
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, 6 * eb);
    for (uint32_t e : a) EXPECT_TRUE(slice_intact(*s, idx, 1, e));
}

// forget() (--miss-fallback's lossy copies): a resident expert is released at once, its
// memory uncounted, and its next routing is a miss that reads it again; an absent one is a
// no-op.
TEST(ResidencyCache, ForgetReleasesAResidentExpertSoItIsReadAgain) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}}, 8);
    const uint64_t eb = 3 * kPage;
    auto s = make(idx, 4 * eb);
    ASSERT_TRUE(s);
    EXPECT_EQ(stage_and_read(*s, idx, 0, {0, 1}).size(), 2u);
    EXPECT_TRUE(s->forget(0, 1));
    EXPECT_FALSE(s->is_resident(0, 1));
    EXPECT_TRUE(s->is_resident(0, 0));
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, eb);
    EXPECT_FALSE(s->forget(0, 1));  // no longer resident
    EXPECT_FALSE(s->forget(0, 5));  // never was
    StageStats ss;
    EXPECT_EQ(stage_and_read(*s, idx, 0, {0, 1}, &ss), (std::vector<uint32_t>{1}));
    EXPECT_EQ(ss.hits, 1u);  // control: the expert not forgotten is still a hit
    EXPECT_TRUE(slice_intact(*s, idx, 0, 1));
}

// --- prefetch (streamer.h, "Prefetch") --------------------------------------------------

// Reads ahead fit the budget by evicting least recently used experts, never the last stage's
// routed set nor each other; they become resident only once end_prefetch(true) says their
// reads landed, and a later routing of them is a hit that reads nothing.
TEST(ResidencyCache, PrefetchStaysWithinBudgetAndSparesTheRoutedSet) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 16);
    const uint64_t eb = 3 * kPage;
    auto s = make(idx, 6 * eb);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {0, 1});        // oldest
    stage_and_read(*s, idx, 0, {2, 3, 4, 5});  // routed now (the layer "computing")
    ASSERT_EQ(s->ledger_stats().resident_expert_bytes, 6 * eb);

    // Layer 1's guess: 4 absent experts. Room for them comes from 0 and 1 only.
    std::vector<ReadRequest> reads;
    EXPECT_EQ(s->prefetch(1, {7, 8, 9, 10}, &reads), 2u);
    EXPECT_EQ(reads.size(), 6u);  // 2 experts x 3 projections
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, 6 * eb);  // never above the budget
    EXPECT_EQ(s->ledger_stats().prefetch_skipped, 2u);
    for (uint32_t e : {2u, 3u, 4u, 5u}) EXPECT_TRUE(s->is_resident(0, e));
    for (uint32_t e : {0u, 1u}) EXPECT_FALSE(s->is_resident(0, e));
    // No stage while the reads are open.
    std::vector<ReadRequest> r2;
    StageStats ss;
    EXPECT_FALSE(s->stage(1, {7}, &r2, &ss).ok());
    simulate_reads(reads);
    s->end_prefetch(true);

    // The routing of layer 1: 7 and 8 hit (no read), 11 misses.
    EXPECT_EQ(stage_and_read(*s, idx, 1, {7, 8, 11}, &ss), (std::vector<uint32_t>{11}));
    EXPECT_EQ(ss.hits, 2u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 7));
    EXPECT_TRUE(slice_intact(*s, idx, 1, 8));
    const LedgerStats cs = s->ledger_stats();
    EXPECT_EQ(cs.prefetched, 2u);
    EXPECT_EQ(cs.prefetch_used, 2u);
    EXPECT_EQ(cs.prefetch_unused, 0u);
    EXPECT_LE(cs.peak_resident_bytes, 6 * eb);
}

// The warm set's preload (prefetch_free) takes free budget only: on a store full of what
// demand reads brought in it reads nothing and evicts nothing. The control: prefetch() of the
// same guess evicts them.
TEST(ResidencyCache, PrefetchFreeTakesFreeRoomOnlyAndNeverEvicts) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 16);
    const uint64_t eb = 3 * kPage;
    auto s = make(idx, 4 * eb);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {0, 1});
    stage_and_read(*s, idx, 1, {5});  // (layer 0's experts are no longer the routed set)
    std::vector<ReadRequest> reads;
    EXPECT_EQ(s->prefetch_free(1, {6, 7, 8}, &reads), 1u);  // room for one
    EXPECT_EQ(reads.size(), 3u);
    simulate_reads(reads);
    s->end_prefetch(true);
    reads.clear();
    EXPECT_EQ(s->prefetch_free(1, {7, 8}, &reads), 0u);  // full: nothing
    EXPECT_TRUE(reads.empty());
    for (uint32_t e : {0u, 1u}) EXPECT_TRUE(s->is_resident(0, e));
    EXPECT_EQ(s->ledger_stats().evictions, 0u);
    EXPECT_EQ(s->prefetch(1, {7, 8}, &reads), 2u);  // control: a prediction evicts
    s->end_prefetch(true);
    EXPECT_GT(s->ledger_stats().evictions, 0u);
}

// A warm tail stopped early (end_prefetch_first): the experts whose reads were all taken stay
// resident and hit; the rest are released as never read (their memory uncounted, not counted
// as prefetched) and miss at their routing.
TEST(ResidencyCache, EndPrefetchFirstKeepsOnlyTheExpertsRead) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 16);
    const uint64_t eb = 3 * kPage;
    auto s = make(idx, 8 * eb);
    ASSERT_TRUE(s);
    std::vector<ReadRequest> reads;
    ASSERT_EQ(s->prefetch_free(1, {2, 3, 4}, &reads), 3u);
    reads.resize(3);  // the lanes took expert 2's reads only
    simulate_reads(reads);
    s->end_prefetch_first(1);
    EXPECT_TRUE(s->is_resident(1, 2));
    EXPECT_FALSE(s->is_resident(1, 3));
    EXPECT_FALSE(s->is_resident(1, 4));
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, eb);
    EXPECT_EQ(s->ledger_stats().prefetched, 1u);
    StageStats ss;
    EXPECT_EQ(stage_and_read(*s, idx, 1, {2, 3}, &ss), (std::vector<uint32_t>{3}));
    EXPECT_EQ(ss.hits, 1u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 2));
}

// A failed read-ahead leaves nothing resident; an unused one is counted when evicted;
// resident experts are not read again.
TEST(ResidencyCache, PrefetchAbandonedAndUnused) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 8);
    const uint64_t eb = 3 * kPage;
    auto s = make(idx, 4 * eb);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {0, 1});
    std::vector<ReadRequest> reads;
    EXPECT_EQ(s->prefetch(1, {2, 3}, &reads), 2u);
    s->end_prefetch(false);  // e.g. an I/O error
    EXPECT_FALSE(s->is_resident(1, 2));
    EXPECT_FALSE(s->is_resident(1, 3));
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, 2 * eb);
    EXPECT_EQ(s->ledger_stats().abandoned, 2u);
    EXPECT_EQ(s->ledger_stats().prefetch_unused, 2u);

    reads.clear();
    EXPECT_EQ(s->prefetch(0, {0, 1, 5}, &reads), 1u);  // 0 and 1 are resident
    EXPECT_EQ(reads.size(), 3u);
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_TRUE(s->is_resident(0, 5));
    // Layer 1 needs all the room: 5 (never routed) goes, counted unused.
    stage_and_read(*s, idx, 1, {4, 5, 6, 7});
    EXPECT_FALSE(s->is_resident(0, 5));
    EXPECT_EQ(s->ledger_stats().prefetch_unused, 3u);
    EXPECT_EQ(s->ledger_stats().prefetch_used, 0u);
}

// --- the shared slots of cache off (two sets: read-ahead) ---------------------------------

std::unique_ptr<ResidencyStore> make_slots(const ModelIndex & idx, bool two_sets) {
    Status st;
    auto s = make_shared_slots(idx, &st, two_sets);
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
}

// The next layer's guess goes into the other set: the layer computing now keeps its bytes,
// and the next layer's stage finds the guessed experts read (hits) and reads only the rest.
TEST(SharedSlots, PrefetchReadsIntoTheOtherSetAndTheNextStageHits) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 8);
    auto s = make_slots(idx, true);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {0, 1});
    std::vector<ReadRequest> reads;
    EXPECT_EQ(s->prefetch(1, {2, 3, 5}, &reads), 3u);
    EXPECT_EQ(reads.size(), 9u);  // whole experts: 3 x 3 projections
    EXPECT_TRUE(s->is_resident(1, 2));
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_TRUE(slice_intact(*s, idx, 0, 0));  // layer 0's set untouched by layer 1's reads
    EXPECT_TRUE(slice_intact(*s, idx, 0, 1));
    StageStats ss;
    EXPECT_EQ(stage_and_read(*s, idx, 1, {2, 4, 3}, &ss), (std::vector<uint32_t>{4}));
    EXPECT_EQ(ss.hits, 2u);
    for (uint32_t e : {2u, 3u, 4u}) EXPECT_TRUE(slice_intact(*s, idx, 1, e));
    const LedgerStats cs = s->ledger_stats();
    EXPECT_EQ(cs.prefetched, 3u);
    EXPECT_EQ(cs.prefetch_used, 2u);
    EXPECT_EQ(cs.prefetch_unused, 1u);  // 5: read ahead, not routed
    // After its stage the set is the layer's: a later stage of it reads everything again.
    EXPECT_FALSE(s->is_resident(1, 2));
}

// A layer whose set is the one the last stage handed out (its matmuls may still read it) is
// never read ahead; the other set is (the control).
TEST(SharedSlots, PrefetchNeverTargetsTheSetOfTheLayerLastStaged) {
    const ModelIndex idx =
        make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}, {kPage, kPage, kPage}}, 8);
    auto s = make_slots(idx, true);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {0, 1});
    std::vector<ReadRequest> reads;
    EXPECT_EQ(s->prefetch(2, {0, 2}, &reads), 0u);  // layer 2 shares set 0 with layer 0
    EXPECT_TRUE(reads.empty());
    EXPECT_TRUE(slice_intact(*s, idx, 0, 0));
    EXPECT_EQ(s->prefetch(1, {0, 2}, &reads), 2u);  // control: set 1 is free
    simulate_reads(reads);
    s->end_prefetch(true);
}

// One set (no memory for a second): nothing is ever read ahead; a failed read-ahead is
// dropped and counted unused.
TEST(SharedSlots, OneSetNeverReadsAheadAndAFailedReadAheadIsDropped) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}}, 8);
    auto one = make_slots(idx, false);
    ASSERT_TRUE(one);
    stage_and_read(*one, idx, 0, {0});
    std::vector<ReadRequest> reads;
    EXPECT_EQ(one->prefetch(1, {1, 2}, &reads), 0u);
    EXPECT_TRUE(reads.empty());

    auto two = make_slots(idx, true);
    ASSERT_TRUE(two);
    stage_and_read(*two, idx, 0, {0});
    EXPECT_EQ(two->prefetch(1, {1, 2}, &reads), 2u);  // control
    two->end_prefetch(false);
    EXPECT_FALSE(two->is_resident(1, 1));
    StageStats ss;
    EXPECT_EQ(stage_and_read(*two, idx, 1, {1}, &ss), (std::vector<uint32_t>{1}));
    EXPECT_EQ(ss.hits, 0u);
    EXPECT_EQ(two->ledger_stats().prefetch_unused, 2u);
}

// --- the fixed-slot cache (docs/cache.md, "Fixed slots") ----------------------------------

// Three layers x {gate, up, down} of one page each, 64 experts (so that a few slots and the
// shared slots take less than all of them), routing width 1 (hand_made_index).
ModelIndex slot_index() {
    return make_index({{kPage, kPage, kPage}, {kPage, kPage, kPage}, {kPage, kPage, kPage}}, 64);
}

// A budget of exactly n slots in every layer besides two sets of shared slots.
uint64_t slot_budget(const ModelIndex & idx, uint32_t n) {
    uint64_t per_slot = 0;
    for (const MoeLayer & L : idx.moe_layers) per_slot += L.expert_bytes;
    return n * per_slot + 2 * shared_slot_set_bytes(idx);
}

std::unique_ptr<ResidencyStore> make_slot_store(const ModelIndex & idx, uint32_t n,
                                                Status * st, const SlotTestHooks & test = {}) {
    return make_slot_cache(idx, slot_budget(idx, n), /*two_sets=*/true, st, test);
}

// make_slot_store that must succeed.
std::unique_ptr<ResidencyStore> slot_store(const ModelIndex & idx, uint32_t n,
                                           const SlotTestHooks & test = {}) {
    Status st;
    auto s = make_slot_store(idx, n, &st, test);
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
}

// Stages a routing of layer moe, reads it, returns its misses.
uint64_t stage_slots(ResidencyStore & s, size_t moe, const std::vector<uint32_t> & experts) {
    std::vector<ReadRequest> reads;
    StageStats ss;
    Status st = s.stage(moe, experts, &reads, &ss);
    EXPECT_TRUE(st.ok()) << st.message();
    simulate_reads(reads);
    return ss.misses;
}

// Hits keep their slot; a miss takes a free slot, else the least recently routed one that
// this routing does not route; the slot map names where each routed expert's bytes are.
TEST(SlotCache, HitsKeepTheirSlotAndAMissEvictsTheLeastRecentlyRouted) {
    const ModelIndex idx = slot_index();
    auto s = slot_store(idx, 3);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->slot_placement()->slot_stats().slots_per_layer, 3u);
    EXPECT_EQ(stage_slots(*s, 0, {0, 1, 2}), 3u);
    EXPECT_EQ(stage_slots(*s, 0, {1}), 0u);  // 1 is now the most recently routed
    EXPECT_EQ(stage_slots(*s, 0, {3}), 1u);  // evicts 0 or 2 (routed together), not 1
    EXPECT_TRUE(s->is_resident(0, 1));
    EXPECT_EQ(int(s->is_resident(0, 0)) + int(s->is_resident(0, 2)), 1);
    const int32_t * map = s->slot_placement()->slot_map(0);
    ASSERT_NE(map, nullptr);
    for (uint32_t e : {1u, 3u}) {
        EXPECT_GE(map[e], 0);
        EXPECT_LT(map[e], 3);
        EXPECT_TRUE(slice_intact(*s, idx, 0, e)) << "expert " << e;
    }
    EXPECT_NE(map[1], map[3]);
    // The bytes are in the slots, not at the experts' canonical offsets (the control:
    // the same check at the canonical offset fails).
    const ExpertTensor & et = idx.moe_layers[0].tensors[0];
    EXPECT_NE(std::memcmp(s->tensor_base(0, 0) + 3 * et.slice_bytes,
                          s->slice_addr(0, 0, 3, et.slice_bytes), et.slice_bytes), 0);
    // Each layer evicts only its own experts.
    EXPECT_EQ(stage_slots(*s, 1, {0, 1, 2}), 3u);
    EXPECT_TRUE(s->is_resident(0, 1));
    EXPECT_TRUE(s->is_resident(0, 3));
    EXPECT_EQ(s->ledger_stats().evictions, 1u);
}

// A routing wider than the slots (a prompt ubatch) is placed at the canonical offsets of the
// shared slots, and leaves the layer's slots as they were.
TEST(SlotCache, ARoutingWiderThanTheSlotsGoesToTheCanonicalOffsets) {
    const ModelIndex idx = slot_index();
    auto s = slot_store(idx, 2);
    ASSERT_TRUE(s);
    EXPECT_EQ(stage_slots(*s, 0, {5}), 1u);
    EXPECT_NE(s->slot_placement()->slot_map(0), nullptr);
    EXPECT_EQ(stage_slots(*s, 0, {0, 1, 5}), 3u);  // wide: every expert read
    EXPECT_EQ(s->slot_placement()->slot_map(0), nullptr);
    EXPECT_EQ(s->slot_placement()->placement_base(0, 0), s->tensor_base(0, 0));
    for (uint32_t e : {0u, 1u, 5u}) EXPECT_TRUE(slice_intact(*s, idx, 0, e));
    EXPECT_EQ(stage_slots(*s, 0, {5}), 0u);  // its slot kept it
    EXPECT_NE(s->slot_placement()->placement_base(0, 0), s->tensor_base(0, 0));
    EXPECT_TRUE(slice_intact(*s, idx, 0, 5));
}

// A stage whose reads failed leaves none of its misses resident; its hits stay.
TEST(SlotCache, AnAbandonedStageForgetsItsMisses) {
    const ModelIndex idx = slot_index();
    auto s = slot_store(idx, 3);
    ASSERT_TRUE(s);
    EXPECT_EQ(stage_slots(*s, 0, {0}), 1u);
    EXPECT_EQ(stage_slots(*s, 0, {0, 1, 2}), 2u);
    s->abandon_stage(0);
    EXPECT_TRUE(s->is_resident(0, 0));
    EXPECT_FALSE(s->is_resident(0, 1));
    EXPECT_FALSE(s->is_resident(0, 2));
    EXPECT_EQ(stage_slots(*s, 0, {1}), 1u);
    EXPECT_EQ(s->ledger_stats().abandoned, 2u);
}

// After a wide routing, warm_slots() copies its most recent experts (as many as there are
// slots) from the shared slots into the layer's slots: the next routings of them hit, and the
// slots hold their bytes. The negative control: with the copy skipped (SlotTestHooks), the
// same hits find wrong bytes.
void check_warm_start(bool skip_copy, uint64_t slice = kPage) {
    const ModelIndex idx =
        make_index({{slice, slice, slice}, {slice, slice, slice}, {slice, slice, slice}}, 64);
    SlotTestHooks test;
    test.warm_skip_copy = skip_copy;
    auto s = slot_store(idx, 2, test);
    ASSERT_TRUE(s);
    EXPECT_EQ(stage_slots(*s, 0, {0, 1, 5}), 3u);  // wide: the shared slots
    EXPECT_EQ(s->slot_placement()->warm_slots(0, {5, 1, 0}), 2u);    // 2 slots: the two most recent
    EXPECT_EQ(s->slot_placement()->slot_stats().warm_copies, 2u);
    EXPECT_EQ(stage_slots(*s, 0, {5, 1}), 0u);  // both warm: no read
    ASSERT_NE(s->slot_placement()->slot_map(0), nullptr);
    EXPECT_EQ(slice_intact(*s, idx, 0, 5) && slice_intact(*s, idx, 0, 1), !skip_copy);
    EXPECT_EQ(stage_slots(*s, 0, {0}), 1u);  // the third was not warmed
}

TEST(SlotCache, AWarmStartCopiesTheWideRoutingsMostRecentExpertsIntoTheSlots) {
    check_warm_start(/*skip_copy=*/false);
}

TEST(SlotCache, AWarmStartWithoutItsCopyLeavesWrongBytesInTheSlots) {
    check_warm_start(/*skip_copy=*/true);
}

// Copies of several MiB are split over threads: every byte still lands where it belongs.
TEST(SlotCache, AWarmStartOfManyMiBCopiesEveryByte) {
    check_warm_start(/*skip_copy=*/false, kMiB);
}

// warm_slots() copies only from shared slots that still hold the layer's wide routing: not
// after a narrow routing (its slots are current), nor once a read-ahead has reused the set.
TEST(SlotCache, AWarmStartFromSharedSlotsReusedSinceCopiesNothing) {
    const ModelIndex idx = slot_index();
    auto s = slot_store(idx, 2);
    ASSERT_TRUE(s);
    EXPECT_EQ(stage_slots(*s, 0, {3}), 1u);  // narrow
    EXPECT_EQ(s->slot_placement()->warm_slots(0, {3}), 0u);
    EXPECT_EQ(stage_slots(*s, 0, {0, 1, 5}), 3u);  // wide: set 0
    EXPECT_EQ(stage_slots(*s, 1, {0, 1, 5}), 3u);  // wide: set 1
    std::vector<ReadRequest> reads;
    ASSERT_GT(s->prefetch(2, {6, 7}, &reads), 0u);  // layer 2 reads ahead into set 0
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_EQ(s->slot_placement()->warm_slots(0, {5, 1}), 0u);
    EXPECT_EQ(s->slot_placement()->warm_slots(1, {5, 1}), 2u);  // control: set 1 still holds layer 1's routing
    EXPECT_TRUE(slice_intact(*s, idx, 1, 5));
    EXPECT_EQ(s->slot_placement()->slot_stats().warm_copies, 2u);
}

// What a stage will hit (what the route trace records): a routing of at most K experts hits
// the layer's slots; a wider one is read into the shared slots and hits only what read-ahead
// put there, not the experts holding a slot (which is_resident() still reports).
TEST(SlotCache, AWideRoutingHitsTheSharedSlotsReadAheadNotTheSlots) {
    const ModelIndex idx = slot_index();
    auto s = slot_store(idx, 2);
    ASSERT_TRUE(s);
    EXPECT_EQ(stage_slots(*s, 1, {5}), 1u);        // 5 holds a slot of layer 1
    EXPECT_EQ(stage_slots(*s, 0, {0, 1, 2}), 3u);  // wide: set 0
    std::vector<ReadRequest> reads;
    ASSERT_EQ(s->prefetch(1, {0, 1}, &reads), 2u);  // a wide guess: into set 1
    ASSERT_TRUE(s->last_read_ahead().shared);
    simulate_reads(reads);
    s->end_prefetch(true);
    std::vector<uint8_t> hit;
    s->stage_hits(1, {5}, &hit);  // narrow: its slot
    EXPECT_EQ(hit, std::vector<uint8_t>({1}));
    s->stage_hits(1, {0, 5, 6}, &hit);  // wide: the read-ahead only
    EXPECT_EQ(hit, std::vector<uint8_t>({1, 0, 0}));
    EXPECT_TRUE(s->is_resident(1, 5));
    std::vector<ReadRequest> stage_reads;
    StageStats ss;
    ASSERT_TRUE(s->stage(1, {0, 5, 6}, &stage_reads, &ss).ok());  // the stage agrees
    simulate_reads(stage_reads);
    EXPECT_EQ(ss.hits, 1u);
    EXPECT_EQ(ss.misses, 2u);
}

// Fewer slots than the routing width cannot hold a token's routing: refused, naming both.
TEST(SlotCache, ABudgetBelowTheRoutingWidthIsRefused) {
    ModelIndex idx = slot_index();
    idx.n_expert_used = 2;
    Status st;
    EXPECT_FALSE(make_slot_store(idx, 1, &st));
    EXPECT_NE(st.message().find("needs at least 2 slots"), std::string::npos) << st.message();
    EXPECT_TRUE(make_slot_store(idx, 2, &st)) << st.message();  // control
}

// The slots and the shared slots together stay within the budget: a byte less than n slots
// and the shared slots gives n - 1 slots (the control), and a budget that holds every expert
// needs no shared slots (no routing is wider than the slots).
TEST(SlotCache, TheSlotsAndTheSharedSlotsFitInTheBudget) {
    const ModelIndex idx = slot_index();
    for (uint32_t n : {1u, 3u, 7u}) {
        SCOPED_TRACE(n);
        const uint64_t b = slot_budget(idx, n);
        EXPECT_EQ(slot_cache_slots(idx, b, /*two_sets=*/true), n);
        EXPECT_EQ(slot_cache_slots(idx, b - 1, /*two_sets=*/true), n - 1);
        EXPECT_EQ(slot_cache_slots(idx, b - shared_slot_set_bytes(idx), /*two_sets=*/false), n);
        Status st;
        auto s = make_slot_cache(idx, b, /*two_sets=*/true, &st);
        ASSERT_TRUE(s) << st.message();
        EXPECT_LE(s->reserved_bytes(), b);
        EXPECT_LE(s->ledger_stats().peak_resident_bytes, b);
        EXPECT_GT(s->reserved_bytes(), b - shared_slot_set_bytes(idx)) << "shared slots counted";
    }
    uint64_t all = 0;
    for (const MoeLayer & L : idx.moe_layers) all += L.expert_bytes * idx.n_expert;
    EXPECT_EQ(slot_cache_slots(idx, all, /*two_sets=*/true), idx.n_expert);
    // A byte less: fewer slots, and the shared slots besides them (the control).
    EXPECT_LT(slot_cache_slots(idx, all - 1, /*two_sets=*/true), idx.n_expert);
    Status st;
    auto s = make_slot_cache(idx, all, /*two_sets=*/true, &st);
    ASSERT_TRUE(s) << st.message();
    EXPECT_EQ(s->reserved_bytes(), all);
}

// With a slot for every expert there are no shared slots, and read-ahead goes into free
// slots: the next routing of them hits and finds their bytes; a read-ahead whose reads failed
// is forgotten (the control: its expert misses).
TEST(SlotCache, ReadAheadWhenEveryExpertHasASlotFillsFreeSlots) {
    const ModelIndex idx = slot_index();
    uint64_t all = 0;
    for (const MoeLayer & L : idx.moe_layers) all += L.expert_bytes * idx.n_expert;
    Status st;
    auto s = make_slot_cache(idx, all, /*two_sets=*/true, &st);
    ASSERT_TRUE(s) << st.message();
    std::vector<ReadRequest> reads;
    ASSERT_EQ(s->prefetch(1, {2, 3}, &reads), 2u);
    EXPECT_EQ(reads.size(), 2u * idx.moe_layers[1].tensors.size());
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_EQ(stage_slots(*s, 1, {2, 3}), 0u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 2));
    EXPECT_EQ(s->ledger_stats().prefetch_used, 2u);
    reads.clear();
    ASSERT_EQ(s->prefetch(2, {4}, &reads), 1u);
    s->end_prefetch(false);
    EXPECT_EQ(stage_slots(*s, 2, {4}), 1u);
    EXPECT_EQ(s->ledger_stats().evictions, 0u);
}

// The warm set's preload into slots (prefetch_free) takes the layer's free slots only: once
// every slot holds an expert a routing brought in, it reads nothing and evicts nothing. The
// control: one token's guess through prefetch() evicts the least recently used slot.
TEST(SlotCache, PrefetchFreeTakesFreeSlotsOnly) {
    const ModelIndex idx = slot_index();  // routing width 1
    auto s = slot_store(idx, 3);
    ASSERT_TRUE(s);
    for (uint32_t e : {0u, 1u}) EXPECT_EQ(stage_slots(*s, 1, {e}), 1u);
    std::vector<ReadRequest> reads;
    EXPECT_EQ(s->prefetch_free(1, {5, 6}, &reads), 1u);  // one free slot
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_EQ(stage_slots(*s, 1, {5}), 0u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 5));
    reads.clear();
    EXPECT_EQ(s->prefetch_free(1, {6}, &reads), 0u);  // every slot taken
    EXPECT_TRUE(reads.empty());
    for (uint32_t e : {0u, 1u, 5u}) EXPECT_TRUE(s->is_resident(1, e));
    EXPECT_EQ(s->prefetch(1, {6}, &reads), 1u);  // control: one token's guess evicts
    s->end_prefetch(true);
    EXPECT_FALSE(s->is_resident(1, 0));
}

// One token's guess (at most the routing width) is read into the layer's slots, evicting the
// least recently used one; experts of the guess already slotted are spared (they become the
// most recent); the next routing of a read-ahead expert hits and finds its bytes, and a
// read-ahead whose reads failed is forgotten. The control: a wider guess (a prompt ubatch's)
// goes to the shared slots, so a narrow routing of it still misses in the slots.
TEST(SlotCache, OneTokensGuessIsReadIntoTheLeastRecentlyUsedSlot) {
    const ModelIndex idx = slot_index();  // routing width 1
    auto s = slot_store(idx, 3);
    ASSERT_TRUE(s);
    for (uint32_t e : {0u, 1u, 2u}) EXPECT_EQ(stage_slots(*s, 1, {e}), 1u);
    std::vector<ReadRequest> reads;
    ASSERT_EQ(s->prefetch(1, {5}, &reads), 1u);
    EXPECT_EQ(reads.size(), idx.moe_layers[1].tensors.size());
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_FALSE(s->is_resident(1, 0));  // the least recently routed
    EXPECT_EQ(stage_slots(*s, 1, {5}), 0u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 5));
    EXPECT_EQ(s->ledger_stats().prefetch_used, 1u);
    reads.clear();
    EXPECT_EQ(s->prefetch(1, {1}, &reads), 0u);  // slotted: no read, now the most recent
    s->end_prefetch(true);
    ASSERT_EQ(s->prefetch(1, {6}, &reads), 1u);
    s->end_prefetch(false);
    EXPECT_TRUE(s->is_resident(1, 1));
    EXPECT_FALSE(s->is_resident(1, 2));  // evicted for 6
    EXPECT_FALSE(s->is_resident(1, 6));  // its read failed
    EXPECT_EQ(stage_slots(*s, 1, {6}), 1u);
    EXPECT_EQ(s->ledger_stats().prefetch_unused, 1u);
    reads.clear();
    ASSERT_GT(s->prefetch(1, {7, 8}, &reads), 0u);  // control: wider than one token's routing
    simulate_reads(reads);
    s->end_prefetch(true);
    EXPECT_EQ(stage_slots(*s, 1, {7}), 1u);
    // A wide guess with nothing to read (no tail, so no end_prefetch) leaves the slots' next
    // read-ahead free to run and to end.
    EXPECT_EQ(stage_slots(*s, 1, {0, 1, 2, 3}), 4u);  // wide: into the shared slots' set 1
    reads.clear();
    ASSERT_EQ(s->prefetch(1, {7, 8}, &reads), 0u);  // never into the set staged last
    for (uint32_t e : {9u, 10u}) {
        reads.clear();
        ASSERT_EQ(s->prefetch(1, {e}, &reads), 1u) << "expert " << e;
        simulate_reads(reads);
        s->end_prefetch(true);
    }
}

// --- budget is real RAM ----------------------------------------------------------------

// RSS figures include a sanitizer's shadow memory (TSan shadows every written page several
// times over), so the RSS assertions only hold in uninstrumented builds.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SKIP_RSS_UNDER_SANITIZER() GTEST_SKIP() << "RSS includes the sanitizer's shadow memory"
#else
#define SKIP_RSS_UNDER_SANITIZER() (void)0
#endif

void run_rss_budget(CacheDebug::Mapping mapping, bool recycle, int n_stages) {
    // 64 layers x 3 x 64 experts x 1 MiB = 12 GiB reserved; 64 MiB budget; top-8 routing.
    std::vector<std::vector<uint64_t>> shapes(64, {kMiB, kMiB, kMiB});
    const ModelIndex idx = make_index(shapes, 64);
    const uint64_t budget = 64 * kMiB;
    const uint64_t layer_set = 8 * 3 * kMiB;
    const uint64_t slack = 16 * kMiB;  // allocator noise, the test's own vectors

    const uint64_t rss0 = rss_anon_shmem_bytes();
    ASSERT_GT(rss0, 0u);
    CacheSetup cfg;
    cfg.dbg.mapping = mapping;
    cfg.opt.recycle_pages = recycle;
    auto s = make(idx, budget, cfg);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->paged_memory()->page_stats().recycle_pages, recycle);
    EXPECT_EQ(s->reserved_bytes(), 12ull * 1024 * kMiB);
    EXPECT_LE(rss_anon_shmem_bytes(), rss0 + slack);  // reserving costs no RAM

    std::mt19937 rng(7);
    uint64_t peak_rss = 0;
    for (int i = 0; i < n_stages; ++i) {
        const size_t moe = size_t(i) % 64;
        stage_and_read(*s, idx, moe, random_routing(rng, 64, 8));
        const uint64_t rss = rss_anon_shmem_bytes();
        peak_rss = std::max(peak_rss, rss);
        ASSERT_LE(rss, rss0 + budget + layer_set + slack) << "stage " << i;
        // The pool's memory, mapped or not (free chunks included), stays within it too.
        ASSERT_LE(pool_file_bytes(), budget + layer_set) << "stage " << i;
        if (recycle) {
            ASSERT_LE(s->paged_memory()->page_stats().pool_bytes, std::max(budget, layer_set));
        }
        ASSERT_LE(s->ledger_stats().resident_expert_bytes, std::max(budget, layer_set));
        ASSERT_EQ(s->resident_bytes(), s->ledger_stats().resident_expert_bytes);
    }
    const LedgerStats cs = s->ledger_stats();
    const PageStats ps = s->paged_memory()->page_stats();
    EXPECT_LE(cs.peak_resident_bytes, budget);
    EXPECT_GT(cs.evictions, 100u);
    // The cache did fill up to its budget (RSS really tracked the committed bytes).
    EXPECT_GE(peak_rss, rss0 + budget - 3 * kMiB);
    EXPECT_GE(cs.resident_expert_bytes, budget - layer_set);
    if (recycle) {
        // Misses took the pages evicted experts left: after the first fill, nearly all.
        EXPECT_GT(ps.recycled_commits, 3 * (cs.misses - budget / (3 * kMiB)) * 9 / 10);
        EXPECT_GE(pool_file_bytes(), budget - layer_set);
    } else {
        EXPECT_EQ(ps.recycled_commits, 0u);
        EXPECT_EQ(pool_file_bytes(), 0u);
    }
    s.reset();
    EXPECT_LE(rss_anon_shmem_bytes(), rss0 + slack);
    EXPECT_EQ(pool_file_bytes(), 0u);  // the pool's memory went with the cache
}

TEST(ResidencyCache, RssStaysWithinBudgetRecycled) {
    SKIP_RSS_UNDER_SANITIZER();
    run_rss_budget(CacheDebug::Mapping::kProtect, true, 96);
}
TEST(ResidencyCache, RssStaysWithinBudgetProtected) {
    SKIP_RSS_UNDER_SANITIZER();
    run_rss_budget(CacheDebug::Mapping::kProtect, false, 96);
}
TEST(ResidencyCache, RssStaysWithinBudgetFlat) {
    SKIP_RSS_UNDER_SANITIZER();
    run_rss_budget(CacheDebug::Mapping::kFlat, false, 64);
}

// A ~200 GiB reservation (far more than RAM + swap) succeeds under the default overcommit
// heuristic: PROT_NONE / MAP_NORESERVE address space is not charged.
TEST(ResidencyCache, ReservesFarMoreThanRam) {
    SKIP_RSS_UNDER_SANITIZER();
    std::ifstream oc("/proc/sys/vm/overcommit_memory");
    int mode = -1;
    oc >> mode;
    std::printf("vm.overcommit_memory = %d\n", mode);
    // 48 layers x 3 x 128 experts x ~11.3 MiB (not a page multiple) ~ 203 GiB.
    const uint64_t sb = 11 * kMiB + 300 * 1000 + 17;
    std::vector<std::vector<uint64_t>> shapes(48, {sb, sb, sb});
    const ModelIndex idx = make_index(shapes, 128);
    for (auto mapping : {CacheDebug::Mapping::kAuto, CacheDebug::Mapping::kFlat}) {
        CacheSetup cfg;
        cfg.dbg.mapping = mapping;
        Status st;
        const uint64_t rss0 = rss_anon_bytes();
        auto s = make_lru_cache(idx, 256 * kMiB, cfg.opt, cfg.dbg, &st);
        ASSERT_TRUE(st.ok()) << st.message();
        EXPECT_GE(s->reserved_bytes(), 200ull * 1024 * kMiB);
        // Use it: a couple of layers' experts land at their canonical offsets.
        stage_and_read(*s, idx, 47, {127, 0, 64});
        stage_and_read(*s, idx, 3, {5, 6});
        EXPECT_TRUE(slice_intact(*s, idx, 47, 127));
        EXPECT_TRUE(slice_intact(*s, idx, 3, 6));
        EXPECT_LE(s->ledger_stats().resident_expert_bytes, 256 * kMiB);
        EXPECT_LE(rss_anon_bytes(), rss0 + 256 * kMiB + 16 * kMiB);
    }
}

// --- shared boundary pages -------------------------------------------------------------

void run_boundary(uint64_t sb, uint32_t a, CacheDebug::Mapping mapping, bool recycle) {
    SCOPED_TRACE("slice bytes " + std::to_string(sb) + " recycle " + std::to_string(recycle));
    ASSERT_NE(sb % kPage, 0u);
    // Projections of different sizes, none a page multiple.
    const ModelIndex idx = make_index({{sb, sb + 24, 2 * sb + 8}}, 32);
    const uint32_t b = a + 1, far = 20;
    // a and b share a page in every projection; a also has a page of its own.
    CacheSetup cfg;
    cfg.dbg.poison = true;
    cfg.dbg.check_residency = true;
    cfg.dbg.mapping = mapping;
    cfg.opt.recycle_pages = recycle;
    auto cost = [&](const std::vector<uint32_t> & es) {
        return accounted_bytes(idx, 0, es, recycle);
    };
    // Budget: exactly b + far, so staging far after {a, b} must evict a (the colder one).
    auto s = make(idx, cost({b, far}), cfg);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->paged_memory()->page_stats().recycle_pages, recycle);
    stage_and_read(*s, idx, 0, {a, b});
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, cost({a, b}));
    EXPECT_TRUE(slice_intact(*s, idx, 0, a));
    EXPECT_TRUE(slice_intact(*s, idx, 0, b));

    stage_and_read(*s, idx, 0, {far});
    EXPECT_FALSE(s->is_resident(0, a));
    EXPECT_TRUE(s->is_resident(0, b));
    EXPECT_EQ(s->ledger_stats().evictions, 1u);
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, cost({b, far}));
    EXPECT_TRUE(slice_intact(*s, idx, 0, b));  // the shared page survived a's release
    EXPECT_TRUE(s->verify_resident(0, {b}).ok());
    for (size_t t = 0; t < 3; ++t) {
        const uint64_t slice = idx.moe_layers[0].tensors[t].slice_bytes;
        const uint8_t * base = s->tensor_base(0, t);  // page phase of the file offset
        const uint8_t * a_first = base + uint64_t(a) * slice;
        const uint8_t * a_last = a_first + slice - 1;
        const uint8_t * b_first = base + uint64_t(b) * slice;
        auto page = [](const uint8_t * p) { return reinterpret_cast<uintptr_t>(p) / kPage; };
        // a's pages not shared with b (b precedes far by many slices) are freed; b's kept.
        if (page(a_first) != page(b_first)) {
            EXPECT_FALSE(page_in_core(a_first));
        }
        EXPECT_TRUE(page(a_last) == page(b_first));  // the layouts make a and b share a page
        EXPECT_TRUE(page_in_core(b_first));
    }

    // Re-reading a next to b (poison on) must not clobber b's bytes on the shared page: b is
    // a hit (routed, so protected), far is evicted to make room.
    StageStats ss;
    std::vector<ReadRequest> reads;
    ASSERT_TRUE(s->stage(0, {b, a}, &reads, &ss).ok());
    EXPECT_EQ(ss.hits, 1u);
    ASSERT_EQ(reads.size(), 3u);
    for (const ReadRequest & r : reads) {  // poisoned before the read
        EXPECT_EQ(static_cast<uint8_t *>(r.dest)[0], 0xFF);
        EXPECT_EQ(static_cast<uint8_t *>(r.dest)[r.len - 1], 0xFF);
    }
    EXPECT_TRUE(slice_intact(*s, idx, 0, b));
    simulate_reads(reads);
    EXPECT_TRUE(slice_intact(*s, idx, 0, a));
    EXPECT_TRUE(slice_intact(*s, idx, 0, b));
    EXPECT_TRUE(s->verify_resident(0, {b, a}).ok());
    EXPECT_FALSE(s->is_resident(0, far));
    EXPECT_EQ(s->ledger_stats().rereads, 1u);
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, cost({a, b}));
    if (recycle) {
        EXPECT_GE(s->paged_memory()->page_stats().recycled_commits, 3u);  // a took far's chunks
    }
}

TEST(ResidencyCache, BoundaryPagesLargeSlices) {
    const uint64_t sb = 2 * kPage + 1808;  // 10000 B at 4 KiB
    run_boundary(sb, 3, CacheDebug::Mapping::kProtect, true);
    run_boundary(sb, 3, CacheDebug::Mapping::kProtect, false);
    run_boundary(sb, 3, CacheDebug::Mapping::kFlat, false);
}
TEST(ResidencyCache, BoundaryPagesSmallSlices) {
    // Several experts per page; expert 2 straddles pages 0/1, expert 3 lies inside page 1.
    run_boundary(kPage * 3 / 8 + 36, 2, CacheDebug::Mapping::kProtect, true);
    run_boundary(kPage * 3 / 8 + 36, 2, CacheDebug::Mapping::kProtect, false);
}

// --- page sizes ----------------------------------------------------------------------------

// The page arithmetic at 4 KiB, 16 KiB and 64 KiB pages (arm64 kernels come with each), on any
// host: the cache takes the page size as a parameter (CacheTestHooks::page_bytes, a multiple of
// the system's), and the checks above run again with every size computed from it: LRU order and
// byte accounting against the reference, slices sharing boundary pages, recycled and moved
// chunks, and the planted stale mapping (the negative control, caught at every size).
class CachePageSize : public ::testing::TestWithParam<uint64_t> {
protected:
    void SetUp() override {
        if (GetParam() < kSysPage || GetParam() % kSysPage != 0)
            GTEST_SKIP() << "page size " << GetParam() << " is below the system's " << kSysPage;
        kPage = GetParam();
    }
    void TearDown() override { kPage = kSysPage; }
};

TEST_P(CachePageSize, MatchesReferenceLru) { run_matches_reference_lru(); }
TEST_P(CachePageSize, RecycledPagesKeepEveryLiveSliceIntact) { run_recycled_pages_intact(); }
TEST_P(CachePageSize, MovedPagesFollowTheirExpert) { run_moved_pages_follow(); }
TEST_P(CachePageSize, SplitStaging) { run_split_staging(); }
TEST_P(CachePageSize, BoundaryPages) {
    run_boundary(2 * kPage + 1808, 3, CacheDebug::Mapping::kProtect, true);
    run_boundary(2 * kPage + 1808, 3, CacheDebug::Mapping::kFlat, false);
    run_boundary(kPage * 3 / 8 + 36, 2, CacheDebug::Mapping::kProtect, true);
}
// What the cache reports and accounts follows the page size: one expert of a slice just
// above a page costs two pages of it, and a reservation's phase is the file offset modulo it.
TEST_P(CachePageSize, AccountsInItsPages) {
    const ModelIndex idx = make_index({{kPage + 8, kPage + 8, kPage + 8}}, 4, 3 * kPage + 512);
    CacheSetup cfg;
    cfg.opt.recycle_pages = false;
    auto s = make(idx, 64 * kPage, cfg);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {1});
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, 3 * 2 * kPage);
    for (size_t t = 0; t < 3; ++t) {
        const uint64_t off = idx.moe_layers[0].tensors[t].file_offset;
        // The tensor lies at its file offset's phase within the cache page, so O_DIRECT reads
        // (aligned to at most the system page) land in place.
        EXPECT_EQ(reinterpret_cast<uintptr_t>(s->tensor_base(0, t)) % kSysPage, off % kSysPage);
    }
    EXPECT_TRUE(slice_intact(*s, idx, 0, 1));
    // The oracle's negative control: one wrong byte, in the last projection's last page.
    const ExpertTensor & et = idx.moe_layers[0].tensors[2];
    uint8_t * last = s->tensor_base(0, 2) + 2 * et.slice_bytes - 1;
    *last ^= 0x5a;
    EXPECT_FALSE(slice_intact(*s, idx, 0, 1));
    *last ^= 0x5a;
    EXPECT_TRUE(slice_intact(*s, idx, 0, 1));
}

INSTANTIATE_TEST_SUITE_P(Sizes, CachePageSize,
                         ::testing::Values(uint64_t(4096), uint64_t(16384), uint64_t(65536)),
                         [](const ::testing::TestParamInfo<uint64_t> & i) {
                             return std::to_string(i.param >> 10) + "KiB";
                         });

// A page size the system cannot map is refused with one clear error, not used.
TEST(ResidencyCache, RejectsAPageSizeTheSystemCannotMap) {
    const ModelIndex idx = make_index({{3000, 5000, 9000}}, 16);
    for (uint64_t bad : {kSysPage / 2, kSysPage * 3, kSysPage + 512}) {
        CacheTestHooks test;
        test.page_bytes = bad;
        Status st;
        EXPECT_FALSE(make_lru_cache(idx, kMiB, CacheOptions{}, CacheDebug{}, &st, test)) << bad;
        EXPECT_NE(st.message().find("is not a power-of-two multiple of the system page size"),
                  std::string::npos)
            << st.message();
    }
}

// --- failed reads -------------------------------------------------------------------------

TEST(ResidencyCache, AbandonStageLeavesNothingResident) {
    const ModelIndex idx = make_index({{kPage, 2 * kPage, kPage}, {kPage, 2 * kPage, kPage}}, 8);
    const uint64_t eb = 4 * kPage;
    auto s = make(idx, 5 * eb);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {1, 2, 3});
    const uint64_t before = s->ledger_stats().resident_expert_bytes;

    // Layer 1: 1 and 2 are misses, then the reads "fail".
    std::vector<ReadRequest> reads;
    StageStats ss;
    ASSERT_TRUE(s->stage(1, {1, 2}, &reads, &ss).ok());
    EXPECT_EQ(reads.size(), 6u);
    std::memset(reads[0].dest, 0, reads[0].len);  // IoLanes zero-fills a failed request
    s->abandon_stage(1);
    EXPECT_FALSE(s->is_resident(1, 1));
    EXPECT_FALSE(s->is_resident(1, 2));
    EXPECT_EQ(s->ledger_stats().resident_expert_bytes, before);
    EXPECT_EQ(s->ledger_stats().abandoned, 2u);
    for (uint32_t e : {1u, 2u, 3u}) EXPECT_TRUE(s->is_resident(0, e));

    // The next routing re-reads them (no poisoned entry); never resident, so no reread.
    EXPECT_EQ(stage_and_read(*s, idx, 1, {2, 1}), (std::vector<uint32_t>{2, 1}));
    EXPECT_EQ(s->ledger_stats().rereads, 0u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 1));

    // Push layer 0's experts out, then route them again: those are rereads.
    stage_and_read(*s, idx, 1, {3, 4, 5, 6, 7});  // 5 experts: everything else evicted
    for (uint32_t e : {1u, 2u, 3u}) EXPECT_FALSE(s->is_resident(0, e));
    EXPECT_EQ(stage_and_read(*s, idx, 0, {1, 2}).size(), 2u);
    EXPECT_EQ(s->ledger_stats().rereads, 2u);
    EXPECT_TRUE(slice_intact(*s, idx, 0, 2));

    // A stage whose reads failed for an expert resident before: counted as a reread, and
    // still not resident afterwards.
    reads.clear();
    ASSERT_TRUE(s->stage(0, {3}, &reads, &ss).ok());
    EXPECT_EQ(s->ledger_stats().rereads, 3u);
    s->abandon_stage(0);
    EXPECT_FALSE(s->is_resident(0, 3));
}

// --- debug mode: poison, protection, verify_resident ------------------------------------

TEST(ResidencyCache, PoisonFillsBeforeTheRead) {
    const ModelIndex idx = make_index({{4096 + 100, 4096 + 100, 4096 + 100}}, 8);
    CacheSetup cfg;
    cfg.dbg.poison = true;
    auto s = make(idx, kMiB, cfg);
    ASSERT_TRUE(s);
    std::vector<ReadRequest> reads;
    StageStats ss;
    ASSERT_TRUE(s->stage(0, {5}, &reads, &ss).ok());
    ASSERT_EQ(reads.size(), 3u);
    for (const ReadRequest & r : reads) {
        const auto * p = static_cast<const uint8_t *>(r.dest);
        for (uint64_t i = 0; i < r.len; ++i) ASSERT_EQ(p[i], 0xFF);
        float f;
        std::memcpy(&f, p, 4);
        EXPECT_TRUE(std::isnan(f));  // an unread f32 weight poisons the matmul
    }
}

TEST(ResidencyCache, ReleasedPagesFault) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    const ModelIndex idx = make_index({{2 * kPage, 2 * kPage, 2 * kPage}}, 8);
    CacheSetup cfg;
    cfg.dbg.poison = true;
    auto s = make(idx, 6 * kPage, cfg);  // room for one expert
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->paged_memory()->page_stats().page_protect);
    stage_and_read(*s, idx, 0, {1});
    stage_and_read(*s, idx, 0, {4});  // evicts 1
    ASSERT_FALSE(s->is_resident(0, 1));
    volatile const uint8_t * gone = s->tensor_base(0, 0) + 1 * 2 * kPage;
    volatile const uint8_t * never = s->tensor_base(0, 2) + 6 * 2 * kPage;
    EXPECT_DEATH({ std::printf("%d", int(*gone)); }, "");
    EXPECT_DEATH({ std::printf("%d", int(*never)); }, "");
    EXPECT_EQ(*(s->tensor_base(0, 1) + 4 * 2 * kPage),
              pattern_byte(idx.moe_layers[0].tensors[1].slice_offset(4)));
}

void expect_caught(CacheTestHooks::Fault fault, bool poison, CacheDebug::Mapping mapping,
                   const std::string & want, bool recycle = true) {
    SCOPED_TRACE("fault " + std::to_string(int(fault)) + " poison " + std::to_string(poison) +
                 " mapping " + std::to_string(int(mapping)) + " recycle " + std::to_string(recycle));
    const ModelIndex idx = make_index({{3000, 5000, 9000}, {3000, 5000, 9000}}, 16);
    CacheSetup cfg;
    cfg.dbg.poison = poison;
    cfg.dbg.check_residency = true;
    cfg.dbg.mapping = mapping;
    cfg.opt.recycle_pages = recycle;
    cfg.test.fault = fault;
    auto s = make(idx, kMiB, cfg);
    ASSERT_TRUE(s);
    // Warm: layer 0 {0, 1, 2} (layer 1 first so kForgetRead does not fire yet for kDrop).
    if (fault == CacheTestHooks::Fault::kDropRouted) {
        stage_and_read(*s, idx, 0, {0, 1, 2});
        EXPECT_TRUE(s->verify_resident(0, {0, 1, 2}).ok());
        const std::vector<uint32_t> r = {9, 1, 2};  // 1 is the first hit: dropped
        stage_and_read(*s, idx, 0, r);
        const Status st = s->verify_resident(0, r);
        EXPECT_FALSE(st.ok());
        EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("expert 1 of layer 0"), std::string::npos) << st.message();
    } else {
        const std::vector<uint32_t> r = {7, 8, 9};  // 7 is the first miss: never read
        stage_and_read(*s, idx, 1, r);
        const Status st = s->verify_resident(1, r);
        EXPECT_FALSE(st.ok());
        EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("expert 7 of layer 1"), std::string::npos) << st.message();
        EXPECT_TRUE(s->verify_resident(1, {8, 9}).ok());
    }
    // The fault fires once: later stages are clean and verify passes.
    stage_and_read(*s, idx, 0, {12, 13});
    EXPECT_TRUE(s->verify_resident(0, {12, 13}).ok());
}

TEST(ResidencyCache, VerifyResidentCatchesPlantedBugs) {
    using F = CacheTestHooks::Fault;
    using M = CacheDebug::Mapping;
    expect_caught(F::kForgetRead, true, M::kProtect, "poison pattern");
    expect_caught(F::kForgetRead, true, M::kProtect, "poison pattern", false);
    // Fresh pages are caught by mincore alone. Recycled ones hold an earlier expert's bytes
    // and are in RAM: only the poison catches them, which is why --cache-debug turns both on.
    expect_caught(F::kForgetRead, false, M::kProtect, "not in RAM", false);
    expect_caught(F::kForgetRead, false, M::kFlat, "not in RAM");
    expect_caught(F::kDropRouted, true, M::kProtect, "not in RAM");
    expect_caught(F::kDropRouted, false, M::kProtect, "not in RAM", false);
    expect_caught(F::kDropRouted, false, M::kFlat, "not in RAM");
}

TEST(ResidencyCache, VerifyResidentPassesAndReportsAbsent) {
    const ModelIndex idx = make_index({{3000, 5000, 9000}}, 16);
    CacheSetup cfg;
    cfg.dbg.poison = true;
    cfg.dbg.check_residency = true;
    auto s = make(idx, 64 * 1024, cfg);
    ASSERT_TRUE(s);
    std::mt19937 rng(3);
    for (int i = 0; i < 200; ++i) {
        const auto r = random_routing(rng, 16, 3);
        stage_and_read(*s, idx, 0, r);
        ASSERT_TRUE(s->verify_resident(0, r).ok()) << i;
    }
    uint32_t absent = 0;
    while (s->is_resident(0, absent)) ++absent;
    const Status st = s->verify_resident(0, {absent});
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("does not hold it"), std::string::npos) << st.message();

    // Without check_residency the call is free and always Ok.
    auto quiet = make(idx, 64 * 1024);
    EXPECT_TRUE(quiet->verify_resident(0, {absent}).ok());
}

TEST(ResidencyCache, RejectsBadArguments) {
    const ModelIndex idx = make_index({{kPage, kPage, kPage}}, 8);
    Status st;
    EXPECT_FALSE(make_lru_cache(idx, 0, {}, {}, &st));
    EXPECT_FALSE(st.ok());
    auto s = make(idx, kMiB);
    std::vector<ReadRequest> reads;
    StageStats ss;
    EXPECT_FALSE(s->stage(0, {8}, &reads, &ss).ok());
    EXPECT_FALSE(s->stage(1, {0}, &reads, &ss).ok());
    EXPECT_TRUE(reads.empty());
    // A duplicated id is looked up once.
    ASSERT_TRUE(s->stage(0, {3, 3}, &reads, &ss).ok());
    EXPECT_EQ(reads.size(), 3u);
    EXPECT_EQ(ss.lookups, 1u);
}

// --- a real file ------------------------------------------------------------------------

// On a synth model, reads planned by the cache and served by IoLanes put each expert's exact
// file bytes at its canonical offset, through evictions and hits. (The tiny preset's slices
// are page multiples; shared boundary pages are covered by the hand-made layouts above.)
TEST(ResidencyCache, RealModelBytesThroughIoLanes) {
    // Written through the library (no CLI or test environment needed), removed at the end.
    SynthOptions so;
    so.preset = "tiny";
    so.expert_type = "q4_k";  // the smallest tiny file (~120 MiB)
    so.out_path = "/tmp/moestream-test-cache-" + std::to_string(getpid()) + ".gguf";
    SynthResult sr;
    ASSERT_TRUE(synth_model(so, &sr).ok());
    const std::string path = so.out_path;
    struct Unlink {
        std::string p;
        ~Unlink() { std::remove(p.c_str()); }
    } unlink_at_exit{path};
    ModelIndex idx;
    Status st = load_model_index(path, &idx);
    ASSERT_TRUE(st.ok()) << st.message();
    const MoeLayer & L0 = idx.moe_layers[0];
    // Budget: a handful of experts, so the run evicts.
    CacheSetup cfg;
    cfg.dbg.poison = true;
    cfg.dbg.check_residency = true;
    auto s = make(idx, 6 * L0.expert_bytes + 6 * kPage, cfg);
    ASSERT_TRUE(s);
    IoLanes lanes;
    uint64_t max_slice = 0;
    for (const MoeLayer & L : idx.moe_layers)
        for (const ExpertTensor & et : L.tensors) max_slice = std::max(max_slice, et.slice_bytes);
    ASSERT_TRUE(lanes.open(path, 2, false, max_slice).ok());

    std::ifstream f(path, std::ios::binary);
    auto file_bytes = [&](uint64_t off, uint64_t len) {
        std::string b(len, '\0');
        f.seekg(std::streamoff(off));
        f.read(b.data(), std::streamsize(len));
        return b;
    };
    std::mt19937 rng(11);
    const uint32_t k = std::max<uint32_t>(2, idx.n_expert_used);
    for (int tok = 0; tok < 6; ++tok) {
        for (size_t moe = 0; moe < idx.moe_layers.size(); ++moe) {
            const auto r = random_routing(rng, idx.n_expert, std::min(k, idx.n_expert));
            std::vector<ReadRequest> reads;
            StageStats ss;
            ASSERT_TRUE(s->stage(moe, r, &reads, &ss).ok());
            IoBatchStats io;
            ASSERT_TRUE(lanes.read_batch(reads, &io).ok());
            ASSERT_TRUE(s->verify_resident(moe, r).ok());
            for (uint32_t e : r)
                for (size_t t = 0; t < idx.moe_layers[moe].tensors.size(); ++t) {
                    const ExpertTensor & et = idx.moe_layers[moe].tensors[t];
                    const std::string want = file_bytes(et.slice_offset(e), et.slice_bytes);
                    ASSERT_EQ(std::memcmp(s->tensor_base(moe, t) + uint64_t(e) * et.slice_bytes,
                                          want.data(), want.size()),
                              0)
                        << et.name << " expert " << e;
                }
        }
    }
    EXPECT_GT(s->ledger_stats().evictions, 0u);
    EXPECT_LE(s->ledger_stats().peak_resident_bytes,
              std::max<uint64_t>(6 * L0.expert_bytes + 6 * kPage, k * L0.expert_bytes + 6 * kPage));
}

namespace {

// A refused commit (CacheTestHooks::commit_limit_bytes stands in for mprotect's ENOMEM) shrinks
// the cache: more is evicted, the budget drops to what could be committed, every stage still
// returns the reads of all its misses and the data stays intact. Both mappings.
TEST(ResidencyCache, RefusedCommitShrinksTheCache) {
    const ModelIndex idx = make_index({{kPage, 2 * kPage, kPage}, {kPage, 2 * kPage, kPage}}, 16);
    const uint64_t eb = 4 * kPage;
    for (auto mapping : {CacheDebug::Mapping::kProtect, CacheDebug::Mapping::kFlat}) {
        SCOPED_TRACE(mapping == CacheDebug::Mapping::kProtect ? "protect" : "flat");
        CacheSetup cfg;
        cfg.dbg.mapping = mapping;
        cfg.test.commit_limit_bytes = 6 * eb;  // the "system" allows 6 experts, the budget says 12
        auto s = make(idx, 12 * eb, cfg);
        ASSERT_TRUE(s);
        std::mt19937 rng(5);
        for (int step = 0; step < 200; ++step) {
            const size_t moe = size_t(step % 2);
            std::set<uint32_t> pick;
            while (pick.size() < 3) pick.insert(uint32_t(rng() % 16));
            std::vector<uint32_t> experts(pick.begin(), pick.end());
            stage_and_read(*s, idx, moe, experts);
            for (uint32_t e : experts) {
                ASSERT_TRUE(s->is_resident(moe, e));
                ASSERT_TRUE(slice_intact(*s, idx, moe, e)) << "step " << step << " expert " << e;
            }
            const LedgerStats cs = s->ledger_stats();
            const PageStats ps = s->paged_memory()->page_stats();
            ASSERT_LE(cs.resident_expert_bytes, 6 * eb);
            if (ps.recycle_pages) {  // evicted chunks are punched down to the shrunk budget
                ASSERT_LE(ps.pool_bytes, std::max(cs.budget_bytes, cs.resident_expert_bytes));
            }
        }
        const LedgerStats cs = s->ledger_stats();
        EXPECT_GT(cs.commit_failures, 0u);
        EXPECT_EQ(cs.budget_shrinks, 1u);  // once shrunk, the budget is never hit again
        EXPECT_LE(cs.budget_bytes, 6 * eb);
        EXPECT_GE(cs.budget_bytes, 3 * eb);
        EXPECT_GT(cs.hits, 0u);
    }
}

// When even the staged layer's own routed set cannot be committed, stage() fails with a clear
// error, nothing of that stage stays resident, earlier residents stay intact, and the store
// keeps working for a routing that fits.
TEST(ResidencyCache, RefusedCommitWithNothingToEvictFailsCleanly) {
    const ModelIndex idx = make_index({{kPage, 2 * kPage, kPage}, {kPage, 2 * kPage, kPage}}, 16);
    const uint64_t eb = 4 * kPage;
    CacheSetup cfg;
    cfg.dbg.mapping = CacheDebug::Mapping::kProtect;
    cfg.test.commit_limit_bytes = 3 * eb;
    auto s = make(idx, 12 * eb, cfg);
    ASSERT_TRUE(s);
    stage_and_read(*s, idx, 0, {1, 2});
    std::vector<ReadRequest> reads;
    StageStats ss;
    Status st = s->stage(1, {3, 4, 5, 6}, &reads, &ss);  // 4 experts: never fits in 3
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("cannot commit"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("nothing left to evict"), std::string::npos) << st.message();
    for (uint32_t e : {3u, 4u, 5u, 6u}) EXPECT_FALSE(s->is_resident(1, e));
    EXPECT_LE(s->ledger_stats().resident_expert_bytes, 3 * eb);
    // The next, smaller routing works; nothing poisoned.
    EXPECT_EQ(stage_and_read(*s, idx, 1, {4, 5}).size(), 2u);
    EXPECT_TRUE(slice_intact(*s, idx, 1, 4));
    EXPECT_TRUE(slice_intact(*s, idx, 1, 5));
}

}  // namespace

// cache_bytes_for_all_experts() is the cap of every budget ("capped at what holds every
// expert"): a cache of exactly that many bytes holds every expert of every layer at once, in
// both page modes, with no eviction. The experts' file bytes (the cap before) do not: with
// slices that are not page multiples each live slice costs a whole pool chunk.
TEST(ResidencyCache, AllExpertsBudgetHoldsEveryExpert) {
    const uint32_t n_expert = 16;
    const ModelIndex idx = make_index({{18 * 1024 + 100, 18 * 1024 + 100, 18 * 1024 + 100},
                                       {kPage * 3 + 1, kPage * 3 + 1, kPage * 3 + 1}},
                                      n_expert);
    const uint64_t all = cache_bytes_for_all_experts(idx, kPage);
    EXPECT_GT(all, idx.expert_bytes_total);
    std::vector<uint32_t> every(n_expert);
    for (uint32_t e = 0; e < n_expert; ++e) every[e] = e;
    for (bool recycle : {true, false}) {
        SCOPED_TRACE(recycle ? "recycled pages" : "fresh pages");
        CacheSetup cfg;
        cfg.opt.recycle_pages = recycle;
        auto fits = make(idx, all, cfg);
        auto short_of = make(idx, idx.expert_bytes_total, cfg);
        ASSERT_TRUE(fits && short_of);
        for (int round = 0; round < 2; ++round)
            for (size_t moe = 0; moe < idx.moe_layers.size(); ++moe)
                for (uint32_t e = 0; e < n_expert; ++e) {  // one expert per stage, every one
                    stage_and_read(*fits, idx, moe, {e});
                    stage_and_read(*short_of, idx, moe, {e});
                }
        EXPECT_EQ(fits->ledger_stats().evictions, 0u);
        EXPECT_EQ(fits->ledger_stats().misses, uint64_t(n_expert) * idx.moe_layers.size());
        for (size_t moe = 0; moe < idx.moe_layers.size(); ++moe)
            for (uint32_t e = 0; e < n_expert; ++e) EXPECT_TRUE(slice_intact(*fits, idx, moe, e));
        // The control: the old cap evicts with pool chunks (fresh pages are page-exact and
        // share boundary pages, so there the file bytes round up to the same pages or fewer).
        if (recycle) {
            EXPECT_GT(short_of->ledger_stats().evictions, 0u);
        }
    }
}

// decide_cache_budget() applies that cap to an explicit budget and to auto (the wiring the
// test above relies on: the engine passes the system page size).
TEST(ResidencyCache, BudgetsAreCappedAtWhatHoldsEveryExpert) {
    const ModelIndex idx = make_index({{18 * 1024 + 100, 18 * 1024 + 100, 18 * 1024 + 100}}, 16);
    const uint64_t all = cache_bytes_for_all_experts(idx, kPage);
    MemoryAvailability plenty;
    plenty.available_bytes = 64ull << 30;
    plenty.source = "test";
    BudgetDecision d;
    ASSERT_TRUE(decide_cache_budget(idx, 1000000, false, 0, plenty, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, all);
    EXPECT_NE(d.reason.find("capped at what holds every expert"), std::string::npos) << d.reason;
    ASSERT_TRUE(decide_cache_budget(idx, -1, false, 1 << 20, plenty, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, all);
    // Not enough memory for auto: cache off.
    MemoryAvailability little;
    little.available_bytes = 256ull << 20;
    little.source = "test";
    ASSERT_TRUE(decide_cache_budget(idx, -1, false, 1 << 20, little, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, 0u);
}

// An explicit budget above the memory limit is clamped to available - needs (no floor), or the
// cache is off below 1.5 x the working set; within the limit it is kept as asked (control).
TEST(ResidencyCache, ExplicitBudgetAboveTheMemoryLimitIsClamped) {
    const ModelIndex idx = make_index({{1 << 20, 1 << 20, 1 << 20}}, 64);
    MemoryAvailability mem;
    mem.available_bytes = 40ull << 20;
    mem.source = "cgroup test";
    BudgetDecision d;
    ASSERT_TRUE(decide_cache_budget(idx, 30, true, 4ull << 20, mem, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, 30ull << 20);  // fits: as asked
    EXPECT_FALSE(d.clamped);
    ASSERT_TRUE(decide_cache_budget(idx, 60, true, 4ull << 20, mem, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, 36ull << 20);  // 40 available - 4 needed
    EXPECT_TRUE(d.clamped);
    EXPECT_NE(d.reason.find("--cache-mb 60 clamped to 36 MiB (cgroup test 40 MiB available"),
              std::string::npos)
        << d.reason;
    // Nothing (below 1.5 x the working set) would fit: cache off.
    const uint64_t needs = mem.available_bytes - idx.token_working_set_bytes;  // ws + ws/2 > ws
    ASSERT_TRUE(decide_cache_budget(idx, 60, true, needs, mem, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, 0u);
    EXPECT_TRUE(d.clamped);
    EXPECT_NE(d.reason.find("cache off"), std::string::npos) << d.reason;
    ASSERT_TRUE(decide_cache_budget(idx, 60, true, 4ull << 20, MemoryAvailability{}, kPage, &d).ok());
    EXPECT_EQ(d.budget_bytes, 60ull << 20);  // no limit known: no clamp
}
