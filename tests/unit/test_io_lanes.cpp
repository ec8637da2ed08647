// test_io_lanes.cpp — IoLanes on its own: every request lands byte-exact, on the no-copy
// direct path (destination congruent to the file offset) and on the bounce path, with
// short reads, EINTR and EIO injected through the read hook.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "io_faults.h"
#include "io_lanes.h"
#include "uring_tail.h"
#include "test_util.h"

using namespace moestream;

namespace {

constexpr uint64_t kFileBytes = 8u << 20;

uint8_t file_byte(uint64_t off) {
    return uint8_t((off * 2654435761u) >> 13);
}

// A file of known bytes next to the test models (a real file system: O_DIRECT works there,
// unlike on tmpfs).
std::string make_file() {
    const std::string dir = moestream::test::models_dir();
    std::string cmd = "mkdir -p '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) return "";
    const std::string path = dir + "/io-lanes-" + std::to_string(getpid()) + ".bin";
    std::vector<uint8_t> buf(kFileBytes);
    for (uint64_t i = 0; i < kFileBytes; ++i) buf[i] = file_byte(i);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return "";
    const bool ok = ::write(fd, buf.data(), buf.size()) == ssize_t(buf.size());
    ::close(fd);
    return ok ? path : "";
}

struct Scratch {
    // One big 4 KiB-aligned arena; each request gets its own region at a chosen phase.
    std::vector<uint8_t> mem;
    uint8_t * base = nullptr;
    explicit Scratch(uint64_t bytes) : mem(bytes + 4096) {
        base = mem.data() + (4096 - reinterpret_cast<uintptr_t>(mem.data()) % 4096) % 4096;
    }
};

// Requests at random offsets and lengths; `congruent` places each destination at its file
// offset's phase modulo 4096 (what the residency stores do), otherwise deliberately off it.
std::vector<ReadRequest> make_requests(Scratch * s, bool congruent, uint32_t seed, int n) {
    std::mt19937_64 rng(seed);
    std::vector<ReadRequest> reqs;
    uint64_t at = 0;
    for (int i = 0; i < n; ++i) {
        const uint64_t len = 1 + rng() % (i % 3 == 0 ? 2000 : 300000);  // tiny and large
        const uint64_t off = rng() % (kFileBytes - len);
        const uint64_t phase = congruent ? off % 4096 : (off + 1 + rng() % 7) % 4096;
        ReadRequest r;
        r.file_offset = off;
        r.len = len;
        r.dest = s->base + at + phase;
        at += (phase + len + 2 * 4096) / 4096 * 4096;
        reqs.push_back(r);
    }
    return reqs;
}

uint64_t arena_bytes(int n) {
    return uint64_t(n) * (300000 + 3 * 4096);
}

::testing::AssertionResult all_exact(const std::vector<ReadRequest> & reqs) {
    for (size_t i = 0; i < reqs.size(); ++i) {
        const auto * d = static_cast<const uint8_t *>(reqs[i].dest);
        for (uint64_t k = 0; k < reqs[i].len; ++k)
            if (d[k] != file_byte(reqs[i].file_offset + k))
                return ::testing::AssertionFailure()
                       << "request " << i << " (offset " << reqs[i].file_offset << ", len "
                       << reqs[i].len << ") differs at byte " << k;
    }
    return ::testing::AssertionSuccess();
}

class IoLanesTest : public ::testing::Test {
protected:
    void SetUp() override {
        path_ = make_file();
        ASSERT_FALSE(path_.empty()) << "cannot write the test file";
    }
    void TearDown() override {
        if (!path_.empty()) ::unlink(path_.c_str());
    }
    std::string path_;
};

}  // namespace

TEST_F(IoLanesTest, DirectPathIsUsedAndExact) {
    for (int lanes : {1, 3}) {
        IoLanes io;
        ASSERT_TRUE(io.open(path_, lanes, true, 300000).ok());
        if (!io.direct()) GTEST_SKIP() << "file system refuses O_DIRECT here";
        Scratch s(arena_bytes(64));
        auto reqs = make_requests(&s, true, 7, 64);
        IoBatchStats st;
        ASSERT_TRUE(io.read_batch(reqs, &st).ok());
        EXPECT_TRUE(all_exact(reqs));
        // Every request with a whole aligned block inside goes the no-copy way.
        uint64_t eligible = 0;
        const uint64_t a = io.dio_alignment();
        for (const auto & r : reqs)
            if ((r.file_offset + r.len) / a * a > (r.file_offset + a - 1) / a * a) ++eligible;
        EXPECT_GT(eligible, 30u);
        EXPECT_EQ(st.direct_reads, eligible) << "lanes " << lanes;
    }
}

TEST_F(IoLanesTest, IncongruentDestinationsTakeTheBouncePath) {
    IoLanes io;
    ASSERT_TRUE(io.open(path_, 2, true, 300000).ok());
    if (!io.direct()) GTEST_SKIP() << "file system refuses O_DIRECT here";
    Scratch s(arena_bytes(32));
    auto reqs = make_requests(&s, false, 11, 32);
    IoBatchStats st;
    ASSERT_TRUE(io.read_batch(reqs, &st).ok());
    EXPECT_TRUE(all_exact(reqs));
    EXPECT_EQ(st.direct_reads, 0u);  // negative control of the counter above
}

TEST_F(IoLanesTest, BufferedReadsAreExact) {
    IoLanes io;
    ASSERT_TRUE(io.open(path_, 2, false, 300000).ok());
    Scratch s(arena_bytes(32));
    auto reqs = make_requests(&s, true, 13, 32);
    IoBatchStats st;
    ASSERT_TRUE(io.read_batch(reqs, &st).ok());
    EXPECT_TRUE(all_exact(reqs));
    EXPECT_EQ(st.direct_reads, 0u);
}

TEST_F(IoLanesTest, ShortReadsAndEintrStayExactOnBothPaths) {
    for (const char * spec : {"short", "eintr"}) {
        for (bool congruent : {true, false}) {
            SCOPED_TRACE(std::string(spec) + (congruent ? " congruent" : " incongruent"));
            IoFaultPlan plan;
            ASSERT_TRUE(parse_io_fault(spec, &plan).ok());
            IoLanes io;
            ASSERT_TRUE(io.open(path_, 2, true, 300000).ok());
            io.set_pread_hook(&io_fault_preadv, &plan);
            Scratch s(arena_bytes(40));
            auto reqs = make_requests(&s, congruent, 17, 40);
            IoBatchStats st;
            ASSERT_TRUE(io.read_batch(reqs, &st).ok());
            EXPECT_TRUE(all_exact(reqs));
            EXPECT_GT(plan.calls.load(), 40);  // the hook really saw the reads
        }
    }
}

TEST_F(IoLanesTest, EioFailsTheBatchNamingFileOffsetAndErrno) {
    for (bool congruent : {true, false}) {
        IoFaultPlan plan;
        ASSERT_TRUE(parse_io_fault("eio-once:5", &plan).ok());
        IoLanes io;
        ASSERT_TRUE(io.open(path_, 1, true, 300000).ok());
        io.set_pread_hook(&io_fault_preadv, &plan);
        Scratch s(arena_bytes(16));
        auto reqs = make_requests(&s, congruent, 19, 16);
        for (auto & r : reqs) std::memset(r.dest, 0xAB, r.len);
        const Status st = io.read_batch(reqs, nullptr);
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.message().find(path_), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("offset"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("errno 5"), std::string::npos) << st.message();
        // The failed request's destination is zero-filled, never partial.
        const ReadRequest & bad = reqs[4];
        for (uint64_t k = 0; k < bad.len; ++k) ASSERT_EQ(static_cast<uint8_t *>(bad.dest)[k], 0);
    }
}

namespace {
struct LaneLog {
    std::mutex mu;
    std::vector<std::pair<uint64_t, int>> reads;  // (aligned offset, lane)
};
long logging_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane,
                    void * ud) {
    auto * log = static_cast<LaneLog *>(ud);
    {
        std::lock_guard<std::mutex> lk(log->mu);
        log->reads.push_back({off, lane});
    }
    return ::preadv(fd, iov, iovcnt, off_t(off));
}
}  // namespace

// A batch with a speculative tail (prefetch): wait_own() returns once the caller's own
// requests are exact, reporting only them; until finish() the calling thread (lane 0) reads
// no tail request (it computes meanwhile); finish() completes the tail (the caller helps
// then) and reports the rest.
TEST_F(IoLanesTest, TailIsLeftToTheWorkerLanes) {
    for (int lanes : {2, 3}) {
        SCOPED_TRACE(lanes);
        IoLanes io;
        ASSERT_TRUE(io.open(path_, lanes, true, 300000).ok());
        LaneLog log;
        io.set_pread_hook(&logging_preadv, &log);
        Scratch s(arena_bytes(40));
        std::vector<ReadRequest> reqs = make_requests(&s, true, 77, 40);
        const size_t own = 12, prefix = 5;
        io.start(reqs, prefix, own);
        IoBatchStats st;
        ASSERT_TRUE(io.wait_prefix(&st).ok());
        ASSERT_TRUE(io.wait_own(&st).ok());
        EXPECT_EQ(st.reads, own);
        EXPECT_TRUE(all_exact(std::vector<ReadRequest>(reqs.begin(), reqs.begin() + own)));
        EXPECT_TRUE(io.in_flight());
        std::vector<std::pair<uint64_t, int>> before_finish;
        {
            std::lock_guard<std::mutex> lk(log.mu);
            before_finish = log.reads;
        }
        IoBatchStats tail;
        ASSERT_TRUE(io.finish(&tail).ok());
        EXPECT_EQ(tail.reads, reqs.size() - own);
        EXPECT_GT(tail.bytes_read, 0u);
        EXPECT_TRUE(all_exact(reqs));
        // Which lane read each tail request (matched by its aligned start offset).
        for (size_t i = own; i < reqs.size(); ++i) {
            const uint64_t at = reqs[i].file_offset / 4096 * 4096;
            for (const auto & [off, lane] : before_finish) {
                if (off == at) {
                    EXPECT_NE(lane, 0) << "tail request " << i << " read by the caller";
                }
            }
        }
    }
}

// A tail of one request alone (no own reads) still gets a worker lane.
TEST_F(IoLanesTest, TailOnlyBatch) {
    IoLanes io;
    ASSERT_TRUE(io.open(path_, 2, true, 300000).ok());
    Scratch s(arena_bytes(1));
    std::vector<ReadRequest> reqs = make_requests(&s, true, 5, 1);
    io.start(reqs, 0, 0);
    IoBatchStats st;
    ASSERT_TRUE(io.wait_prefix(&st).ok());
    ASSERT_TRUE(io.wait_own(&st).ok());
    EXPECT_EQ(st.reads, 0u);
    ASSERT_TRUE(io.finish(&st).ok());
    EXPECT_EQ(st.reads, 1u);
    EXPECT_TRUE(all_exact(reqs));
}

// --- UringTail: the prefetch tail through io_uring (src/io/uring_tail.h) ---------------------

namespace {
bool has_body(const ReadRequest & r) {
    const uint64_t b0 = (r.file_offset + 4095) / 4096 * 4096;
    const uint64_t b1 = (r.file_offset + r.len) / 4096 * 4096;
    return b1 > b0;
}
}  // namespace

TEST_F(IoLanesTest, UringTailReadsInPlaceExactly) {
    std::string why;
    auto u = UringTail::create(path_, 4096, &why);
    if (!u) GTEST_SKIP() << "io_uring unavailable here: " << why;
    Scratch s(arena_bytes(60));
    std::vector<ReadRequest> all = make_requests(&s, true, 91, 60), big;
    for (const ReadRequest & r : all)
        if (has_body(r)) big.push_back(r);
    ASSERT_GT(big.size(), 10u);
    // One request without an aligned body, or one off its file offset's phase: refused whole.
    EXPECT_FALSE(u->submit(all, 0));
    EXPECT_FALSE(u->in_flight());
    std::vector<ReadRequest> off_phase = big;
    off_phase[3].dest = static_cast<uint8_t *>(off_phase[3].dest) + 1;
    EXPECT_FALSE(u->submit(off_phase, 0));
    // Congruent requests with a body: read in place, exact, head and tail blocks included.
    ASSERT_TRUE(u->submit(big, 2));
    EXPECT_TRUE(u->in_flight());
    IoBatchStats st;
    ASSERT_TRUE(u->reap(&st).ok());
    EXPECT_FALSE(u->in_flight());
    EXPECT_EQ(st.reads, big.size() - 2);
    EXPECT_TRUE(all_exact(std::vector<ReadRequest>(big.begin() + 2, big.end())));
    // The file's last bytes: the aligned range reaches past the end (a short read that is not
    // an error), twice in a row on the same ring.
    for (int round = 0; round < 2; ++round) {
        ReadRequest last;
        last.len = 3 * 4096 + 100;
        last.file_offset = kFileBytes - last.len;
        last.dest = s.base + last.file_offset % 4096;
        std::memset(s.base, 0, 5 * 4096);
        ASSERT_TRUE(u->submit({last}, 0));
        ASSERT_TRUE(u->reap(&st).ok());
        EXPECT_TRUE(all_exact({last}));
    }
}

// A slice the file does not hold (truncated file): an error naming the file and offset, and
// the destination zero-filled, never partial.
TEST_F(IoLanesTest, UringTailReportsAShortFile) {
    std::string why;
    auto u = UringTail::create(path_, 4096, &why);
    if (!u) GTEST_SKIP() << "io_uring unavailable here: " << why;
    Scratch s(6 * 4096);
    ReadRequest r;
    r.file_offset = kFileBytes - 2 * 4096;
    r.len = 4 * 4096;  // two blocks past the end
    r.dest = s.base;
    std::memset(s.base, 0x77, 4 * 4096);
    std::vector<ReadRequest> reqs = {r};
    ASSERT_TRUE(u->submit(reqs, 0));
    IoBatchStats st;
    Status e = u->reap(&st);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.message().find(path_), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(std::to_string(r.file_offset)), std::string::npos) << e.message();
    for (uint64_t i = 0; i < r.len; ++i) ASSERT_EQ(s.base[i], 0) << "byte " << i;
}

// --- Staged reads (set_staged) and the middle wait mark (wait_mid) ----------------------------

namespace {
// Every read sleeps 2 ms and logs when it began and ended (one sequence for both), by its
// aligned start offset.
struct StageLog {
    std::mutex mu;
    int seq = 0;
    std::vector<std::pair<uint64_t, int>> begins, ends;
};

long staging_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int lane,
                    void * ud) {
    auto * log = static_cast<StageLog *>(ud);
    {
        std::lock_guard<std::mutex> lk(log->mu);
        log->begins.push_back({off, log->seq++});
    }
    ::usleep(2000);
    const long n = ::preadv(fd, iov, iovcnt, off_t(off));
    std::lock_guard<std::mutex> lk(log->mu);
    log->ends.push_back({off, log->seq++});
    return n;
}

// Requests at distinct 64 KiB blocks (their aligned starts identify them in the log).
std::vector<ReadRequest> block_requests(Scratch * s, int n) {
    std::vector<ReadRequest> reqs;
    for (int i = 0; i < n; ++i) {
        ReadRequest r;
        r.file_offset = uint64_t(i) * 65536 + 100;
        r.len = 30000;
        r.dest = s->base + uint64_t(i) * 65536 + 100;
        reqs.push_back(r);
    }
    return reqs;
}

int seq_of(const std::vector<std::pair<uint64_t, int>> & v, uint64_t off, bool last) {
    int best = -1;
    for (const auto & [o, q] : v)
        if (o == off && (best < 0 || (last ? q > best : q < best))) best = q;
    return best;
}
}  // namespace

// Staged: no request of a later stage begins before every request of the earlier stages has
// ended, and wait_mid() returns with [0, mid) exact. The negative control: without staging
// the same batch on the same lanes starts a later stage while an earlier one is still read.
TEST_F(IoLanesTest, StagedReadsStartAStageOnlyAfterTheEarlierOnes) {
    for (bool staged : {true, false}) {
        SCOPED_TRACE(staged ? "staged" : "not staged");
        IoLanes io;
        ASSERT_TRUE(io.open(path_, 4, true, 300000).ok());
        io.set_staged(staged);
        StageLog log;
        io.set_pread_hook(&staging_preadv, &log);
        Scratch s(uint64_t(12) * 65536);
        std::vector<ReadRequest> reqs = block_requests(&s, 12);
        const size_t prefix = 3, mid = 7, own = 12;
        io.start(reqs, prefix, own, mid);
        IoBatchStats st;
        ASSERT_TRUE(io.wait_prefix(&st).ok());
        EXPECT_TRUE(all_exact(std::vector<ReadRequest>(reqs.begin(), reqs.begin() + prefix)));
        ASSERT_TRUE(io.wait_mid(&st).ok());
        EXPECT_TRUE(all_exact(std::vector<ReadRequest>(reqs.begin(), reqs.begin() + mid)));
        ASSERT_TRUE(io.finish(&st).ok());
        EXPECT_TRUE(all_exact(reqs));
        EXPECT_EQ(st.reads, reqs.size());
        // Per stage boundary: the last end before it vs the first begin after it.
        const auto aligned = [&](size_t i) { return reqs[i].file_offset / 4096 * 4096; };
        bool overlapped = false;
        for (size_t boundary : {prefix, mid}) {
            int last_end = -1, first_begin = 1 << 30;
            for (size_t i = 0; i < boundary; ++i)
                last_end = std::max(last_end, seq_of(log.ends, aligned(i), true));
            for (size_t i = boundary; i < own; ++i)
                first_begin = std::min(first_begin, seq_of(log.begins, aligned(i), false));
            if (staged) {
                EXPECT_GT(first_begin, last_end) << "a read at or past " << boundary
                                                 << " began before the earlier stages ended";
            }
            overlapped = overlapped || first_begin < last_end;
        }
        if (!staged) {
            EXPECT_TRUE(overlapped) << "the lanes never mixed stages: a blind test";
        }
    }
}

// Gated reads (split staging): a request past the release watermark is never read before
// release() raises it past the request, while the worker lanes read what is released without
// the caller; finish() completes the batch exactly. The negative control: with the gate
// disabled the same batch is read past the watermark at once.
namespace {
// Indices (by 64 KiB block, block_requests) of the requests the log shows read so far.
std::vector<size_t> read_indices(LaneLog & log) {
    std::lock_guard<std::mutex> lk(log.mu);
    std::vector<size_t> v;
    for (const auto & r : log.reads) v.push_back(size_t(r.first / 65536));
    return v;
}
size_t count_at_or_past(const std::vector<size_t> & v, size_t n) {
    return size_t(std::count_if(v.begin(), v.end(), [n](size_t i) { return i >= n; }));
}
// Waits until done() holds, polling; the 60 s bound only catches a hang (no threshold).
template <class Done>
bool poll_until(Done done) {
    for (int i = 0; i < 60000; ++i) {
        if (done()) return true;
        ::usleep(1000);
    }
    return done();
}
// Waits until every worker lane (lane 0 is this thread) sleeps at the release watermark or a read at or past `past` is logged
// (a broken gate): either way the state the checks below look at is final, whatever the load.
void wait_gate_or_leak(IoLanes & io, LaneLog & log, size_t past) {
    EXPECT_TRUE(poll_until([&] {
        return io.lanes_at_gate() == io.n_lanes() - 1 || count_at_or_past(read_indices(log), past) > 0;
    })) << "the lanes neither reached the gate nor read past it within 60 s";
}
}  // namespace

TEST_F(IoLanesTest, GatedReadsWaitForTheirRelease) {
    for (bool honoured : {true, false}) {
        SCOPED_TRACE(honoured ? "gate" : "gate disabled (negative control)");
        IoLanes io;
        ASSERT_TRUE(io.open(path_, 3, true, 300000).ok());
        io.set_staged(true);  // as in the engine (overlap on)
        LaneLog log;
        io.set_pread_hook(&logging_preadv, &log);
        Scratch s(uint64_t(12) * 65536);
        std::vector<ReadRequest> reqs = block_requests(&s, 12);
        const size_t prefix = 3, mid = 7, own = 12, released = 3;
        // The control starts the same batch with everything released.
        io.start(reqs, prefix, own, mid, honoured ? released : SIZE_MAX);
        if (!honoured) {
            wait_gate_or_leak(io, log, released);
            EXPECT_GT(count_at_or_past(read_indices(log), released), 0u)
                << "without the gate no read passed the watermark: a blind test";
            ASSERT_TRUE(io.finish(nullptr).ok());
            continue;
        }
        // The worker lanes read the released requests on their own (the caller waits for
        // nothing yet), and nothing past them: once every lane sleeps at the gate, none reads
        // again before release(), however long the caller takes.
        wait_gate_or_leak(io, log, released);
        EXPECT_EQ(io.lanes_at_gate(), io.n_lanes() - 1);
        EXPECT_EQ(count_at_or_past(read_indices(log), 0), released);
        EXPECT_EQ(count_at_or_past(read_indices(log), released), 0u)
            << "a read past the watermark was taken before its release";
        io.release(mid);
        // Lanes woken by release() may still count as sleeping: wait for the released reads too.
        EXPECT_TRUE(poll_until([&] {
            return count_at_or_past(read_indices(log), released) >= mid - released &&
                   io.lanes_at_gate() == io.n_lanes() - 1;
        })) << "the released reads did not all happen within 60 s";
        EXPECT_EQ(count_at_or_past(read_indices(log), released), mid - released);
        EXPECT_EQ(count_at_or_past(read_indices(log), mid), 0u)
            << "a read past the raised watermark was taken before its release";
        IoBatchStats st;
        ASSERT_TRUE(io.wait_prefix(&st).ok());
        ASSERT_TRUE(io.finish(&st).ok());  // releases the rest
        EXPECT_EQ(st.reads, reqs.size());
        EXPECT_TRUE(all_exact(reqs));
    }
}

TEST_F(IoLanesTest, WaitingReleasesWhatItWaitsFor) {
    IoLanes io;
    ASSERT_TRUE(io.open(path_, 2, true, 300000).ok());
    Scratch s(uint64_t(8) * 65536);
    std::vector<ReadRequest> reqs = block_requests(&s, 8);
    io.start(reqs, 2, 8, 5, /*released=*/0);
    IoBatchStats st;
    ASSERT_TRUE(io.wait_mid(&st).ok());
    EXPECT_TRUE(all_exact(std::vector<ReadRequest>(reqs.begin(), reqs.begin() + 5)));
    ASSERT_TRUE(io.finish(&st).ok());
    EXPECT_TRUE(all_exact(reqs));
}

// cancel_unreleased(): the batch fails with the given error and the requests past the
// watermark are never touched, not even zero-filled: their destinations here are PROT_NONE
// (an access would fault), as deferred cache slices are before their commit.
TEST_F(IoLanesTest, CancelledBatchLeavesUnreleasedDestinationsUntouched) {
    for (int lanes : {1, 3}) {
        SCOPED_TRACE(lanes);
        IoLanes io;
        ASSERT_TRUE(io.open(path_, lanes, true, 300000).ok());
        LaneLog log;
        io.set_pread_hook(&logging_preadv, &log);
        const size_t n = 10, released = 4;
        void * m = mmap(nullptr, n * 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
        ASSERT_NE(m, MAP_FAILED);
        auto * base = static_cast<uint8_t *>(m);
        ASSERT_EQ(mprotect(base + released * 65536, (n - released) * 65536, PROT_NONE), 0);
        std::vector<ReadRequest> reqs;
        for (size_t i = 0; i < n; ++i) {
            ReadRequest r;
            r.file_offset = uint64_t(i) * 65536 + 100;
            r.len = 30000;
            r.dest = base + i * 65536 + 100;
            reqs.push_back(r);
        }
        io.start(reqs, released, n, n, released);
        IoBatchStats st;
        ASSERT_TRUE(io.wait_prefix(&st).ok());
        EXPECT_TRUE(all_exact(std::vector<ReadRequest>(reqs.begin(), reqs.begin() + released)));
        io.cancel_unreleased(Status::Runtime("commit refused (test)"));
        const Status fin = io.finish(&st);
        EXPECT_FALSE(fin.ok());
        EXPECT_NE(fin.message().find("commit refused (test)"), std::string::npos) << fin.message();
        EXPECT_FALSE(io.in_flight());
        EXPECT_EQ(count_at_or_past(read_indices(log), released), 0u);
        munmap(m, n * 65536);
    }
}

// Read latency (read_latency.h): quantiles are bucket upper edges, at most 19 % above the true
// value and never below it.
TEST(ReadLatency, QuantilesAreBucketEdgesJustAboveTheTrueValue) {
    ReadLatencyHistogram h;
    for (int i = 0; i < 99; ++i) h.record(0.001);
    h.record(0.1);
    const ReadLatencySnapshot s = h.snapshot();
    EXPECT_EQ(s.count(), 100u);
    EXPECT_GE(s.quantile(0.5), 0.001);
    EXPECT_LT(s.quantile(0.5), 0.001 * 1.19);
    EXPECT_LT(s.quantile(0.99), 0.001 * 1.19);  // 99 of 100 reads took 1 ms
    EXPECT_GE(s.quantile(1.0), 0.1);            // the slow one
    EXPECT_LT(s.quantile(1.0), 0.1 * 1.19);
    // Edges: nothing below 1 µs is told apart; the slowest bucket holds everything above it.
    EXPECT_EQ(ReadLatencyHistogram::bucket_of(0), 0);
    EXPECT_EQ(ReadLatencyHistogram::bucket_of(-1), 0);
    EXPECT_EQ(ReadLatencyHistogram::bucket_of(1e9), ReadLatencySnapshot::kBuckets - 1);
    for (double t : {2e-6, 3.7e-4, 0.0123, 4.2}) {
        const int b = ReadLatencyHistogram::bucket_of(t);
        EXPECT_GE(ReadLatencyHistogram::upper_edge(b), t) << t;
        EXPECT_LT(ReadLatencyHistogram::upper_edge(b - 1), t) << t;
    }
    EXPECT_EQ(ReadLatencySnapshot{}.quantile(0.5), 0);  // no reads
}

TEST(ReadLatency, SinceCountsOnlyTheReadsInBetween) {
    ReadLatencyHistogram h;
    for (int i = 0; i < 10; ++i) h.record(0.5);  // before: slow
    const ReadLatencySnapshot before = h.snapshot();
    for (int i = 0; i < 4; ++i) h.record(0.0002);
    const ReadLatencySnapshot d = h.snapshot().since(before);
    EXPECT_EQ(d.count(), 4u);
    EXPECT_LT(d.quantile(1.0), 0.001);
    // Negative control: the whole history still has the slow reads.
    EXPECT_GE(h.snapshot().quantile(1.0), 0.5);
}

namespace {
// Read times on a clock of the test's own (IoLanes::set_read_clock): each lane's thread has its
// own clock, which only the read hook advances: 150 ms for the read that starts in the 4 KiB
// block of one request's first byte (direct reads start at the aligned block, buffered ones at
// the byte), 1 us for every other read. The times measured are then exact whatever the load.
thread_local uint64_t t_fake_ns = 0;
uint64_t fake_clock(void *) { return t_fake_ns; }
constexpr uint64_t kStallNs = 150000000, kReadNs = 1000;
struct OneSlowRead {
    uint64_t slow_off = 0;
    bool stall = true;
};
long one_slow_preadv(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int, void * ud) {
    const auto * s = static_cast<OneSlowRead *>(ud);
    t_fake_ns += s->stall && off / 4096 == s->slow_off / 4096 ? kStallNs : kReadNs;
    return ::preadv(fd, iov, iovcnt, off_t(off));
}
}  // namespace

// Every request is timed on its own: one stalled request shows as the batch's longest read
// and in the slowest bucket, while the median stays at the others' speed.
TEST_F(IoLanesTest, OneStalledRequestIsTheBatchsLongestRead) {
    IoLanes io;
    ASSERT_TRUE(io.open(path_, 3, true, 300000).ok());
    Scratch s(arena_bytes(30));
    std::vector<ReadRequest> reqs = make_requests(&s, true, 5, 30);
    OneSlowRead slow{reqs[7].file_offset};
    io.set_pread_hook(&one_slow_preadv, &slow);
    io.set_read_clock(&fake_clock, nullptr);
    const ReadLatencySnapshot before = io.read_latency().snapshot();
    IoBatchStats st;
    ASSERT_TRUE(io.read_batch(reqs, &st).ok());
    EXPECT_TRUE(all_exact(reqs));
    EXPECT_GE(st.max_read_s, kStallNs * 1e-9);
    const ReadLatencySnapshot d = io.read_latency().snapshot().since(before);
    EXPECT_EQ(d.count(), reqs.size());
    EXPECT_GE(d.quantile(1.0), kStallNs * 1e-9);
    // Negative control: the other reads are not charged the stall (the median is theirs).
    EXPECT_LT(d.quantile(0.5), kStallNs * 1e-9);
    // A batch without the stall reports its own longest read, not the last batch's.
    slow.stall = false;
    IoBatchStats fast;
    ASSERT_TRUE(io.read_batch(reqs, &fast).ok());
    EXPECT_GT(fast.max_read_s, 0);
    EXPECT_LT(fast.max_read_s, st.max_read_s);
}
