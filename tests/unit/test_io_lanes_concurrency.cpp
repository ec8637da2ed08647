// test_io_lanes_concurrency.cpp — IoLanes (src/io/io_lanes.h) under concurrency, the TSan build's main
// subject (docs/reliability.md):
//  - many batches of unaligned slice reads spread over 4 lanes deliver exactly the file's
//    bytes, O_DIRECT and buffered, with and without short reads / EINTR from a hook;
//  - an EIO on one lane fails the batch with file, offset and errno, zero-fills what failed,
//    and the next batch succeeds;
//  - a file truncated under the lanes gives "unexpected end of file", never stale bytes;
//  - a batch stopped with stop_claims() (the warm set's tail) reads exactly the requests taken
//    before the stop, whole, and never touches the rest; unstopped, it reads them all;
//  - the same from another thread while the driving thread is in finish() (the warm preload,
//    stopped by the decode thread): one request per lane is read, the rest never touched.
#include <gtest/gtest.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io_faults.h"
#include "io_lanes.h"
#include "test_util.h"

using namespace moestream;
using namespace moestream::test;

namespace {

uint8_t pattern(uint64_t off) { return uint8_t((off * 2654435761u) >> 13); }

struct TempFile {
    std::string path;
    explicit TempFile(uint64_t bytes) {
        path = models_dir() + "/lanes-" + std::to_string(getpid()) + ".bin";
        std::vector<char> data(bytes);
        for (uint64_t i = 0; i < bytes; ++i) data[i] = char(pattern(i));
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(data.data(), std::streamsize(data.size()));
    }
    ~TempFile() { std::filesystem::remove(path); }
};

struct Faults {
    std::atomic<long> calls{0};
    std::atomic<int> mode{0};  // 0 none, 1 short + EINTR, 2 EIO on lane 2
    std::atomic<long> eio_at{-1};
};

long hook(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane, void * ud) {
    auto * f = static_cast<Faults *>(ud);
    const long c = f->calls.fetch_add(1);
    const int m = f->mode.load();
    if (m == 1) {
        if (c % 3 == 0) {
            errno = EINTR;
            return -1;
        }
        return preadv_short(fd, iov, iovcnt, off);
    } else if (m == 2 && lane == 2) {
        long expect = -1;
        if (f->eio_at.compare_exchange_strong(expect, long(off))) {
            errno = EIO;
            return -1;
        }
    }
    return ::preadv(fd, iov, iovcnt, off_t(off));
}

std::vector<ReadRequest> random_batch(std::mt19937_64 & rng, uint64_t file_bytes,
                                      std::vector<std::vector<uint8_t>> & bufs) {
    std::vector<ReadRequest> reqs;
    const int n = 1 + int(rng() % 24);
    bufs.assign(size_t(n), {});
    for (int i = 0; i < n; ++i) {
        const uint64_t len = 1 + rng() % (300 << 10);
        const uint64_t off = rng() % (file_bytes - len);
        bufs[size_t(i)].assign(len, 0xAB);
        reqs.push_back({off, len, bufs[size_t(i)].data()});
    }
    return reqs;
}

::testing::AssertionResult bytes_match(const ReadRequest & r) {
    const auto * d = static_cast<const uint8_t *>(r.dest);
    for (uint64_t i = 0; i < r.len; ++i)
        if (d[i] != pattern(r.file_offset + i))
            return ::testing::AssertionFailure() << "byte " << i << " of the read at " << r.file_offset;
    return ::testing::AssertionSuccess();
}

TEST(IoLanesConcurrency, ConcurrentBatchesDeliverTheFilesBytes) {
    TempFile f(24 << 20);
    for (bool direct : {true, false}) {
        for (int mode : {0, 1}) {
            SCOPED_TRACE(std::string(direct ? "O_DIRECT" : "buffered") + (mode ? " short+EINTR" : ""));
            IoLanes lanes;
            ASSERT_TRUE(lanes.open(f.path, 4, direct, 300 << 10).ok());
            Faults faults;
            faults.mode = mode;
            lanes.set_pread_hook(&hook, &faults);
            std::mt19937_64 rng(7 + mode);
            uint64_t reads = 0;
            for (int b = 0; b < 60; ++b) {
                std::vector<std::vector<uint8_t>> bufs;
                auto reqs = random_batch(rng, 24 << 20, bufs);
                IoBatchStats st;
                Status s = lanes.read_batch(reqs, &st);
                ASSERT_TRUE(s.ok()) << s.message();
                for (const auto & r : reqs) ASSERT_TRUE(bytes_match(r));
                reads += st.reads;
            }
            EXPECT_GT(reads, 300u);
            if (mode == 1) EXPECT_GT(faults.calls.load(), long(reads));  // retried / completed
            else EXPECT_GE(faults.calls.load(), long(reads));
        }
    }
}

TEST(IoLanesConcurrency, EioOnOneLaneFailsTheBatchAndTheNextOneWorks) {
    TempFile f(8 << 20);
    IoLanes lanes;
    ASSERT_TRUE(lanes.open(f.path, 4, true, 256 << 10).ok());
    Faults faults;
    faults.mode = 2;
    lanes.set_pread_hook(&hook, &faults);
    std::vector<std::vector<uint8_t>> bufs(64, std::vector<uint8_t>(100 << 10, 0xAB));
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < bufs.size(); ++i) reqs.push_back({i * (100 << 10) + 17, 100 << 10, bufs[i].data()});
    Status s;
    // Lane 2 is a worker thread: retry until it took part in a batch (it normally does at once).
    for (int tries = 0; tries < 50 && faults.eio_at.load() < 0; ++tries) s = lanes.read_batch(reqs, nullptr);
    ASSERT_GE(faults.eio_at.load(), 0) << "lane 2 never read";
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(f.path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("offset " + std::to_string(faults.eio_at.load())), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("errno 5"), std::string::npos) << s.message();
    // Every request either holds the file's bytes or zeros: never 0xAB (untouched) or a mix.
    for (const auto & r : reqs) {
        const auto * d = static_cast<const uint8_t *>(r.dest);
        bool zero = true;
        for (uint64_t i = 0; i < r.len && zero; ++i) zero = d[i] == 0;
        if (!zero) {
            EXPECT_TRUE(bytes_match(r));
        }
    }
    faults.mode = 0;
    s = lanes.read_batch(reqs, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    for (const auto & r : reqs) EXPECT_TRUE(bytes_match(r));
}

TEST(IoLanesConcurrency, TruncatedFileIsAnErrorNotStaleBytes) {
    TempFile f(8 << 20);
    for (bool direct : {true, false}) {
        SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
        {
            std::ofstream g(f.path, std::ios::binary | std::ios::trunc);
            std::vector<char> data(8 << 20);
            for (uint64_t i = 0; i < data.size(); ++i) data[i] = char(pattern(i));
            g.write(data.data(), std::streamsize(data.size()));
        }
        IoLanes lanes;
        ASSERT_TRUE(lanes.open(f.path, 4, direct, 1 << 20).ok());
        std::vector<std::vector<uint8_t>> bufs(8, std::vector<uint8_t>(1 << 20, 0xAB));
        std::vector<ReadRequest> reqs;
        for (size_t i = 0; i < bufs.size(); ++i) reqs.push_back({i * (1 << 20) + 1000, (1 << 20) - 2000, bufs[i].data()});
        ASSERT_TRUE(lanes.read_batch(reqs, nullptr).ok());
        ASSERT_EQ(truncate(f.path.c_str(), (5 << 20) + 333), 0);
        for (auto & b : bufs) std::fill(b.begin(), b.end(), 0xAB);
        Status s = lanes.read_batch(reqs, nullptr);
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos) << s.message();
        for (size_t i = 0; i < reqs.size(); ++i) {
            const auto * d = static_cast<const uint8_t *>(reqs[i].dest);
            bool zero = true;
            for (uint64_t j = 0; j < reqs[i].len && zero; ++j) zero = d[j] == 0;
            if (i < 5) {
                if (!zero) {
                    EXPECT_TRUE(bytes_match(reqs[i])) << i;
                }
            } else {
                EXPECT_TRUE(zero) << "request " << i << " lies past the new end: must be zero-filled";
            }
        }
    }
}

// Tail reads (offset >= tail_from) wait in the hook until `go`; `entered` counts them.
struct TailGate {
    uint64_t tail_from = 0;
    std::mutex mu;
    std::condition_variable cv;
    int entered = 0;
    bool go = false;
};

long gated(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int, void * ud) {
    auto * g = static_cast<TailGate *>(ud);
    if (off >= g->tail_from) {
        std::unique_lock<std::mutex> lk(g->mu);
        ++g->entered;
        g->cv.notify_all();
        g->cv.wait(lk, [&] { return g->go; });
    }
    return ::preadv(fd, iov, iovcnt, off_t(off));
}

// Requests [0, n) hold the file's bytes; the rest were never touched (still 0xAB).
void expect_read_up_to(const std::vector<ReadRequest> & reqs,
                       const std::vector<std::vector<uint8_t>> & bufs, size_t n) {
    for (size_t i = 0; i < reqs.size(); ++i) {
        if (i < n) {
            EXPECT_TRUE(bytes_match(reqs[i])) << i;
        } else {
            EXPECT_TRUE(std::all_of(bufs[i].begin(), bufs[i].end(), [](uint8_t b) { return b == 0xAB; }))
                << "request " << i << " past the stop was touched";
        }
    }
}

// One own request, then a tail of 12 that the worker lanes read, each held in the hook.
// stop: stop_claims() once a tail read is in flight. Returns the count stop_claims() gave
// (the batch size without a stop); every request's bytes are checked against it.
size_t run_tail_batch(bool stop) {
    TempFile f(4 << 20);
    IoLanes lanes;
    EXPECT_TRUE(lanes.open(f.path, 4, false, 256 << 10).ok());
    TailGate g;
    g.tail_from = 256 << 10;
    lanes.set_pread_hook(&gated, &g);
    constexpr size_t kOwn = 1, kAll = 13;
    std::vector<std::vector<uint8_t>> bufs(kAll, std::vector<uint8_t>(100 << 10, 0xAB));
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < kAll; ++i)
        reqs.push_back({i * (256 << 10) + 17, 100 << 10, bufs[i].data()});
    lanes.start(reqs, kOwn, kOwn);
    EXPECT_TRUE(lanes.wait_own(nullptr).ok());
    {
        std::unique_lock<std::mutex> lk(g.mu);  // a worker lane holds a tail read
        g.cv.wait(lk, [&] { return g.entered > 0; });
    }
    const size_t taken = stop ? lanes.stop_claims() : kAll;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        g.go = true;
    }
    g.cv.notify_all();
    IoBatchStats io;
    EXPECT_TRUE(lanes.finish(&io).ok());
    EXPECT_EQ(io.reads, taken);
    expect_read_up_to(reqs, bufs, taken);
    return taken;
}

TEST(IoLanesConcurrency, StoppedTailReadsExactlyTheRequestsTakenBeforeTheStop) {
    const size_t taken = run_tail_batch(/*stop=*/true);
    EXPECT_GT(taken, 1u) << "the tail read in flight is finished";
    EXPECT_LE(taken, 4u) << "at most one request per worker lane was taken";
}

// The negative control: the same batch, not stopped, reads its whole tail.
TEST(IoLanesConcurrency, UnstoppedTailIsReadWhole) { EXPECT_EQ(run_tail_batch(false), 13u); }

// A batch of 13 requests, all a tail, driven by its own thread (start, then finish: that
// thread is lane 0), every read held in the hook. stop: this thread calls stop_claims() once
// all 4 lanes hold a read. Returns what the driving thread saw: last_stopped_at() (SIZE_MAX
// when not stopped) and the reads finish() counted; every request's bytes are checked.
std::pair<size_t, uint64_t> run_driven_batch(bool stop) {
    TempFile f(4 << 20);
    IoLanes lanes;
    EXPECT_TRUE(lanes.open(f.path, 4, false, 256 << 10).ok());
    TailGate g;  // tail_from 0: every read waits
    lanes.set_pread_hook(&gated, &g);
    constexpr size_t kAll = 13;
    std::vector<std::vector<uint8_t>> bufs(kAll, std::vector<uint8_t>(100 << 10, 0xAB));
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < kAll; ++i)
        reqs.push_back({i * (256 << 10) + 17, 100 << 10, bufs[i].data()});
    size_t stopped_at = 0;
    IoBatchStats io;
    Status st;
    std::mutex start_mu;  // the driver starts under it, as the streamer's preload does
    std::thread driver([&] {
        {
            std::lock_guard<std::mutex> lk(start_mu);
            lanes.start(reqs, 0, 0);
        }
        st = lanes.finish(&io);
        stopped_at = lanes.last_stopped_at();
    });
    {
        std::unique_lock<std::mutex> lk(g.mu);  // every lane (the driver too) holds a read
        g.cv.wait(lk, [&] { return g.entered == 4; });
    }
    if (stop) {
        std::lock_guard<std::mutex> lk(start_mu);
        EXPECT_EQ(lanes.stop_claims(), 4u);
    }
    {
        std::lock_guard<std::mutex> lk(g.mu);
        g.go = true;
    }
    g.cv.notify_all();
    driver.join();
    EXPECT_TRUE(st.ok()) << st.message();
    const size_t read = stop ? 4 : kAll;
    expect_read_up_to(reqs, bufs, read);
    return {stopped_at, io.reads};
}

TEST(IoLanesConcurrency, StopFromAnotherThreadReadsOneRequestPerLane) {
    const auto [stopped_at, reads] = run_driven_batch(/*stop=*/true);
    EXPECT_EQ(stopped_at, 4u);
    EXPECT_EQ(reads, 4u) << "only the reads in flight at the stop, one per lane";
}

// The negative control: the same driven batch, not stopped, reads all 13.
TEST(IoLanesConcurrency, DrivenBatchNotStoppedIsReadWhole) {
    const auto [stopped_at, reads] = run_driven_batch(/*stop=*/false);
    EXPECT_EQ(stopped_at, SIZE_MAX);
    EXPECT_EQ(reads, 13u);
}

}  // namespace
