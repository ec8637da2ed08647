// test_page_pool.cpp — the page pool behind recycled cache pages (src/page_pool.{h,cpp}).
// The cache's use of it (boundary pages, budget, replay accounting) is tested in
// test_residency_cache.cpp and test_replay.cpp.
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "page_pool.h"
#include "test_util.h"

using namespace moestream;
using moestream::test::pool_file_bytes;

namespace {

const uint64_t kPage = uint64_t(sysconf(_SC_PAGESIZE));

std::unique_ptr<PagePool> make_pool() {
    Status st;
    auto p = PagePool::create(kPage, &st);
    EXPECT_TRUE(p) << st.message();
    return p;
}

// A pool with one class of `chunk_pages`-page chunks for `slices` slices, its file sized for
// `budget` (null on failure, reported).
std::unique_ptr<PagePool> one_class_pool(uint64_t chunk_pages, uint64_t slices, uint64_t budget,
                                         uint32_t * cls) {
    auto pool = make_pool();
    if (!pool) return nullptr;
    Status st;
    *cls = pool->class_for(chunk_pages, slices, &st);
    if (st.ok()) st = pool->size_files(budget, 1);
    EXPECT_TRUE(st.ok()) << st.message();
    return st.ok() ? std::move(pool) : nullptr;
}

uint8_t * reserve(uint64_t pages) {
    void * p = mmap(nullptr, pages * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    return static_cast<uint8_t *>(p);
}

}  // namespace

// A chunk given back is the next one taken, with its pages (and bytes) still there: mapping
// it elsewhere shows the earlier bytes, and no new memory was allocated.
TEST(PagePool, GivenBackChunksAreReusedWithTheirPages) {
    auto pool = make_pool();
    ASSERT_TRUE(pool);
    Status st;
    const uint32_t c = pool->class_for(4, 8, &st);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(pool->size_files(64 * kPage, 1).ok());
    uint8_t * a = reserve(4), * b = reserve(4);

    uint64_t off = 0;
    bool recycled = true;
    int err = 0;
    ASSERT_TRUE(pool->take(c, &off, &recycled, &err));
    EXPECT_FALSE(recycled);
    ASSERT_EQ(pool->map(c, off, 0, 4, a, false), 0);
    std::memset(a, 0x5A, 4 * kPage);
    EXPECT_EQ(pool->held_bytes(), 4 * kPage);
    const uint64_t ram = pool_file_bytes();
    EXPECT_EQ(ram, 4 * kPage);

    pool->give_back(c, off);
    uint64_t off2 = 1;
    ASSERT_TRUE(pool->take(c, &off2, &recycled, &err));
    EXPECT_TRUE(recycled);
    EXPECT_EQ(off2, off);
    ASSERT_EQ(pool->map(c, off2, 0, 4, b, true), 0);
    EXPECT_EQ(b[0], 0x5A);  // the same physical pages
    EXPECT_EQ(b[4 * kPage - 1], 0x5A);
    EXPECT_EQ(pool_file_bytes(), ram);  // nothing new allocated
    EXPECT_EQ(pool->held_bytes(), 4 * kPage);
    EXPECT_EQ(pool->recycled(), 1u);

    // Part of a chunk, at an offset: page 2 of the chunk lands on the first page mapped.
    ASSERT_EQ(pool->map(c, off2, 2, 1, a, true), 0);
    b[2 * kPage] = 0x11;
    EXPECT_EQ(a[0], 0x11);
    munmap(a, 4 * kPage);
    munmap(b, 4 * kPage);
}

// write_page() puts bytes into a chunk page that is not mapped anywhere (how a shared
// boundary page moves to its neighbour's chunk).
TEST(PagePool, WritePageFillsAnUnmappedChunkPage) {
    auto pool = make_pool();
    ASSERT_TRUE(pool);
    Status st;
    const uint32_t c = pool->class_for(3, 4, &st);
    ASSERT_TRUE(pool->size_files(16 * kPage, 1).ok());
    uint64_t off = 0;
    bool recycled = false;
    int err = 0;
    ASSERT_TRUE(pool->take(c, &off, &recycled, &err));
    std::string src(kPage, 'q');
    src[7] = 'Z';
    ASSERT_EQ(pool->write_page(c, off, 1, src.data()), 0);
    uint8_t * a = reserve(1);
    ASSERT_EQ(pool->map(c, off, 1, 1, a, true), 0);
    EXPECT_EQ(a[0], 'q');
    EXPECT_EQ(a[7], 'Z');
    munmap(a, kPage);
}

// Punching a free chunk of another class gives its memory back to the system, and the
// offset is reused (no pages) by the next take of that class.
TEST(PagePool, PunchGivesMemoryBack) {
    auto pool = make_pool();
    ASSERT_TRUE(pool);
    Status st;
    const uint32_t small = pool->class_for(2, 8, &st), big = pool->class_for(5, 8, &st);
    ASSERT_NE(small, big);
    EXPECT_EQ(pool->class_for(2, 1, &st), small);  // same size, same class
    ASSERT_TRUE(pool->size_files(64 * kPage, 1).ok());
    uint64_t o1 = 0, o2 = 0;
    bool recycled = false;
    int err = 0;
    ASSERT_TRUE(pool->take(big, &o1, &recycled, &err));
    uint8_t * a = reserve(5);
    ASSERT_EQ(pool->map(big, o1, 0, 5, a, false), 0);
    std::memset(a, 1, 5 * kPage);  // allocate its pages
    munmap(a, 5 * kPage);
    EXPECT_EQ(pool_file_bytes(), 5 * kPage);
    EXPECT_FALSE(pool->punch_free_chunk(small));  // nothing free yet
    pool->give_back(big, o1);
    EXPECT_FALSE(pool->punch_free_chunk(big));  // the class asking keeps its own
    EXPECT_TRUE(pool->punch_free_chunk(small));
    EXPECT_EQ(pool_file_bytes(), 0u);
    EXPECT_EQ(pool->held_bytes(), 0u);
    EXPECT_EQ(pool->punched(), 1u);
    ASSERT_TRUE(pool->take(big, &o2, &recycled, &err));
    EXPECT_FALSE(recycled);  // a hole: fresh pages
    EXPECT_EQ(o2, o1);
}

// Sizing the pool fails with a clear error where files cannot grow (RLIMIT_FSIZE): the
// cache then falls back to fresh pages (test_route_trace runs the CLI under such a limit).
// SIGXFSZ keeps its default action (kill the process): the pool checks the limit instead of
// running into it, so this test would die if it did not.
TEST(PagePool, SizingFailsCleanlyUnderAFileSizeLimit) {
    auto pool = make_pool();
    ASSERT_TRUE(pool);
    Status st;
    pool->class_for(4, 1000, &st);
    struct sigaction dfl = {}, old_sa = {};
    dfl.sa_handler = SIG_DFL;
    ASSERT_EQ(sigaction(SIGXFSZ, &dfl, &old_sa), 0);
    struct rlimit old, lim;
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 8 * kPage;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    const Status s = pool->size_files(1000 * 4 * kPage, 1);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    sigaction(SIGXFSZ, &old_sa, nullptr);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("cannot size the page pool"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("RLIMIT_FSIZE"), std::string::npos) << s.message();
}

// Warm-up: the thread zero-fills, per class, the chunks of its share of a full cache's bytes
// x the budget (here 60 x 4 pages and 30 x 6 pages: shares 4/7 and 3/7 of a 100-page
// budget, so 14 chunks of 4 pages and 7 of 6 pages, 98 pages), never more than the budget
// in total although the two files are sized for 26 + 17 chunks. The memfds then hold exactly
// those pages (st_blocks), held_bytes() counts them, take() hands them out populated and
// marked warmed, and writing one allocates nothing new. After the plan, take() makes new
// chunks again. Negative control: the same pool without start_warm() holds no pages and its
// take() is a new chunk.
TEST(PagePool, WarmUpAllocatesThePlannedChunksWithinTheBudget) {
    for (const bool warm : {true, false}) {
        SCOPED_TRACE(warm ? "warm-up" : "no warm-up (control)");
        auto pool = make_pool();
        ASSERT_TRUE(pool);
        Status st;
        const uint32_t a = pool->class_for(4, 60, &st), b = pool->class_for(6, 30, &st);
        ASSERT_TRUE(st.ok()) << st.message();
        const uint64_t budget = 100 * kPage;
        ASSERT_TRUE(pool->size_files(budget, 1).ok());
        EXPECT_EQ(pool_file_bytes(), 0u);
        if (warm) pool->start_warm(budget);
        pool->finish_warm(false);
        const PagePool::WarmStats w = pool->warm_stats();
        const uint64_t planned = warm ? (14 * 4 + 7 * 6) * kPage : 0;
        EXPECT_EQ(w.planned_bytes, planned);
        EXPECT_EQ(w.warmed_bytes, planned);
        EXPECT_LE(w.warmed_bytes, budget);
        EXPECT_EQ(w.error, 0);
        EXPECT_FALSE(w.cancelled);
        EXPECT_EQ(pool_file_bytes(), planned);
        EXPECT_EQ(pool->held_bytes(), planned);
        EXPECT_EQ(pool->has_free(a), warm);

        uint8_t * m = reserve(4);
        for (uint64_t i = 0; i < 15; ++i) {
            uint64_t off = ~0ull;
            bool recycled = false, warmed = false;
            int err = 0;
            ASSERT_TRUE(pool->take(a, &off, &recycled, &err, &warmed));
            const bool from_warm = warm && i < 14;
            EXPECT_EQ(recycled, from_warm) << i;
            EXPECT_EQ(warmed, from_warm) << i;
            EXPECT_EQ(off, i * 4 * kPage) << i;  // warmed chunks from offset 0, then new ones
            if (i == 0) {
                ASSERT_EQ(pool->map(a, off, 0, 4, m, recycled), 0);
                m[17] = 0x42;  // a new chunk gets a page here, a warmed one has its pages
                EXPECT_EQ(pool_file_bytes(), planned + (warm ? 0 : kPage));
                EXPECT_EQ(m[0], 0);  // zero-filled
                EXPECT_EQ(m[4 * kPage - 1], 0);
            }
        }
        EXPECT_EQ(pool->warmed_taken(), warm ? 14u : 0u);
        EXPECT_EQ(pool->held_bytes(), planned + (warm ? 1 : 15) * 4 * kPage);
        // The other class's warmed chunks are free chunks: a punch gives them back.
        EXPECT_EQ(pool->punch_free_chunk(a), warm);
        EXPECT_EQ(pool->held_bytes(), planned + (warm ? 1 : 15) * 4 * kPage - (warm ? 6 * kPage : 0));
        (void)b;
        munmap(m, 4 * kPage);
    }
}

// A warm-up cancelled at once stops early; whatever it completed is held, counted and
// handed out, and a part-written chunk leaves no pages behind: the memfds hold exactly the
// bytes warm_stats() and held_bytes() report.
TEST(PagePool, CancelledWarmUpHoldsExactlyWhatItReports) {
    const uint64_t budget = 2048 * 256 * kPage;  // 2 GiB at 4 KiB pages: far from done at once
    uint32_t c = 0;
    auto pool = one_class_pool(256, 4096, budget, &c);  // 1 MiB chunks at 4 KiB pages
    ASSERT_TRUE(pool);
    pool->start_warm(budget);
    pool->finish_warm(true);
    const PagePool::WarmStats w = pool->warm_stats();
    EXPECT_EQ(w.planned_bytes, budget);
    EXPECT_LT(w.warmed_bytes, budget);
    EXPECT_TRUE(w.cancelled);
    EXPECT_EQ(w.error, 0);
    EXPECT_EQ(pool_file_bytes(), w.warmed_bytes);
    EXPECT_EQ(pool->held_bytes(), w.warmed_bytes);
    EXPECT_EQ(pool->has_free(c), w.warmed_bytes > 0);
}

// The destructor of a pool whose warm-up still runs stops it (no thread outlives the memfds).
TEST(PagePool, DestroyedWhileWarmingStopsTheThread) {
    uint32_t c = 0;
    auto pool = one_class_pool(256, 4096, uint64_t(1024) * 256 * kPage, &c);
    ASSERT_TRUE(pool);
    pool->start_warm(uint64_t(1024) * 256 * kPage);
    pool.reset();
    EXPECT_EQ(pool_file_bytes(), 0u);
}

// take() while the warm-up runs: it hands out the chunks the thread completed, lowest offset
// first, as warmed; the first take() that finds none ready stops the thread. At every step
// the memfds hold no more than the plan (no new chunk while it runs), and once it is stopped
// held_bytes() is exactly what they hold.
TEST(PagePool, TakeDuringTheWarmUpUsesCompletedChunksThenStopsIt) {
    const uint64_t cb = 64 * kPage, budget = 512 * cb;
    uint32_t c = 0;
    auto pool = one_class_pool(64, 8192, budget, &c);  // 256 KiB chunks at 4 KiB pages
    ASSERT_TRUE(pool);
    pool->start_warm(budget);
    ASSERT_TRUE(pool->warm_running());
    // Some chunks completed before the first take: wait for that state (the 60 s bound only
    // catches a hang), so the first kReady takes are warmed chunks however loaded the machine.
    const uint64_t kReady = 8;
    for (int i = 0; i < 60000 && pool->warm_stats().warmed_bytes < kReady * cb; ++i) usleep(1000);
    ASSERT_GE(pool->warm_stats().warmed_bytes, kReady * cb) << "the warm-up made no progress in 60 s";
    uint64_t warmed_takes = 0, taken = 0;
    bool stopped = false;
    while (!stopped && taken < 4096) {
        uint64_t off = ~0ull;
        bool recycled = false, warmed = false;
        int err = 0;
        const bool was_running = pool->warm_running();
        ASSERT_TRUE(pool->take(c, &off, &recycled, &err, &warmed));
        ++taken;
        EXPECT_EQ(recycled, warmed);
        if (warmed) {
            EXPECT_EQ(off, warmed_takes * cb);
            ++warmed_takes;
        }
        stopped = was_running && !pool->warm_running();
        if (!stopped && taken % 64 == 1) {
            EXPECT_LE(pool_file_bytes(), budget);
        }
    }
    ASSERT_TRUE(stopped);
    EXPECT_GE(warmed_takes, kReady) << "the chunks completed before the first take were not handed out";
    const PagePool::WarmStats w = pool->warm_stats();
    EXPECT_EQ(pool->warmed_taken(), warmed_takes);
    // The new chunks taken after the stop have no pages yet (nothing wrote them).
    EXPECT_EQ(pool->held_bytes(), pool_file_bytes() + (taken - warmed_takes) * cb);
    // Every chunk taken, plus the completed warm chunks not taken (free now).
    EXPECT_EQ(pool->held_bytes(), taken * cb + w.warmed_bytes - warmed_takes * cb);
    EXPECT_EQ(pool->has_free(c), w.warmed_bytes > warmed_takes * cb);
    std::printf("warm-up stopped after %llu takes (%llu warmed), %llu of %llu KiB warmed\n",
                (unsigned long long)taken, (unsigned long long)warmed_takes,
                (unsigned long long)(w.warmed_bytes >> 10), (unsigned long long)(budget >> 10));
}
