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
