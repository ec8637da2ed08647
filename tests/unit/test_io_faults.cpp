// test_io_faults.cpp — I/O faults during streaming (docs/reliability.md), through the library.
//  - short reads and EINTR give byte-identical output (O_DIRECT and buffered, cache on and off);
//  - EIO stops generation with one error naming the file, the offset and the errno, and leaves
//    no poisoned cache entry: once the fault has passed, the same engine generates exactly what a
//    fault-free engine does (the failed experts are re-read);
//  - a model file changed while the engine runs is detected and reported: appended to,
//    truncated or replaced between requests (replaced: even with the same size and mtime),
//    and truncated or rewritten in the middle of a generation, which stops within one token
//    with an error, never a SIGBUS (the test process would die) and never wrong text;
//  - a failed mmap/madvise through the model guard's interposers keeps the kernel's errno
//    (ENOMEM is what the cache's evict-and-retry looks for), and end to end a commit the
//    kernel refuses (strace's fault injection) is evicted for and retried, tokens unchanged.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mmap_guard.h"
#include "moestream/moestream.h"
#include "test_util.h"

using namespace moestream;
using namespace moestream::test;

namespace {

struct Out {
    Status st;
    GenerateResult g;
    std::string sha;
};

Out generate(Engine & e, const char * prompt = "Once upon a time") {
    Out o;
    o.st = e.generate(prompt, 24, nullptr, &o.g);
    o.sha = e.stats().logits_sha;
    return o;
}

std::unique_ptr<Engine> open_engine(const std::string & model, const char * fault, int64_t cache_mb,
                                    bool odirect, int io_threads = 2) {
    if (fault)
        setenv("MOESTREAM_DEBUG_IO_FAULT", fault, 1);
    else
        unsetenv("MOESTREAM_DEBUG_IO_FAULT");
    RunOptions o;
    o.model_path = model;
    o.n_threads = 1;
    o.n_ctx = 256;
    o.cache_mb = cache_mb;
    o.force_cache = true;
    o.cache_debug = cache_mb > 0;
    o.odirect = odirect;
    o.io_threads = io_threads;
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    unsetenv("MOESTREAM_DEBUG_IO_FAULT");
    EXPECT_TRUE(st.ok()) << st.message();
    return e;
}

TEST(IoFaults, ShortReadsAndEintrAreInvisible) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    for (int64_t cache : {0, 4}) {
        for (bool direct : {true, false}) {
            SCOPED_TRACE("cache " + std::to_string(cache) + (direct ? " O_DIRECT" : " buffered"));
            auto ref = open_engine(model, nullptr, cache, direct);
            Out r = generate(*ref);
            ASSERT_TRUE(r.st.ok()) << r.st.message();
            // Every read, every other read, one lane only, and random (seeded).
            for (const char * f : {"short", "eintr", "short,lane=1", "eintr,lane=0",
                                   "short,p=0.5,seed=3", "eintr,p=0.3,seed=9",
                                   "eintr,lane=1,p=0.9,seed=4"}) {
                auto e = open_engine(model, f, cache, direct);
                Out o = generate(*e);
                ASSERT_TRUE(o.st.ok()) << f << ": " << o.st.message();
                EXPECT_EQ(o.g.tokens, r.g.tokens) << f;
                EXPECT_EQ(o.sha, r.sha) << f;
            }
        }
    }
}

TEST(IoFaults, EioStopsWithFileOffsetErrnoAndPoisonsNothing) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    for (int64_t cache : {0, 4}) {
        SCOPED_TRACE("cache " + std::to_string(cache));
        auto ref = open_engine(model, nullptr, cache, true);
        Out r = generate(*ref);
        ASSERT_TRUE(r.st.ok());
        auto e = open_engine(model, "eio-once:40", cache, true);
        Out bad = generate(*e);
        ASSERT_FALSE(bad.st.ok());
        EXPECT_EQ(bad.st.code(), ErrorCode::kRuntime);
        EXPECT_NE(bad.st.message().find(model), std::string::npos) << bad.st.message();
        EXPECT_NE(bad.st.message().find("offset"), std::string::npos) << bad.st.message();
        EXPECT_NE(bad.st.message().find("errno 5"), std::string::npos) << bad.st.message();
        // The fault has passed: the same engine now produces the fault-free output.
        Out again = generate(*e);
        ASSERT_TRUE(again.st.ok()) << again.st.message();
        EXPECT_EQ(again.g.tokens, r.g.tokens);
        EXPECT_EQ(again.sha, r.sha);
    }
}

// With the cache off the down reads stay in flight while gate/up compute (streamer.h,
// "Overlap"); a failure can then surface at the topk (a gate/up read) or only at the node
// feeding the down matmul (a down read). Twelve consecutive read calls cover both kinds in
// every layer (4 experts x 3 projections): each must stop generation, and the next
// generation of the same engine must match the fault-free one.
TEST(IoFaults, EioOnEarlyAndLateReadsWithOverlap) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    auto ref = open_engine(model, nullptr, 0, true);
    ASSERT_NE(ref->settings_json().find("\"io_overlap\":true"), std::string::npos)
        << ref->settings_json();
    Out r = generate(*ref);
    ASSERT_TRUE(r.st.ok());
    // Read calls before the third decoded token (the routing is deterministic, so a faulty
    // engine issues the same calls): faults from there on hit decode layers, whose input node
    // of the down matmul is learned.
    const RunStats & rs = ref->stats();
    ASSERT_GE(rs.tokens.size(), 3u);
    uint64_t first = rs.flash_reads;
    for (const TokenStats & t : rs.tokens) first -= t.flash_reads;
    first += rs.tokens[0].flash_reads + rs.tokens[1].flash_reads;
    int at_input = 0;
    for (int n = int(first) + 1; n <= int(first) + 12; ++n) {
        SCOPED_TRACE("eio-once:" + std::to_string(n));
        const std::string spec = "eio-once:" + std::to_string(n);
        auto e = open_engine(model, spec.c_str(), 0, true);
        Out bad = generate(*e);
        ASSERT_FALSE(bad.st.ok());
        EXPECT_NE(bad.st.message().find("errno 5"), std::string::npos) << bad.st.message();
        if (e->settings_json().find("\"io_overlap_waits_at_input\":0") == std::string::npos)
            ++at_input;
        Out again = generate(*e);
        ASSERT_TRUE(again.st.ok()) << again.st.message();
        EXPECT_EQ(again.g.tokens, r.g.tokens);
        EXPECT_EQ(again.sha, r.sha);
    }
    EXPECT_EQ(at_input, 12);  // every faulty run got as far as overlapped decode layers
}

TEST(IoFaults, PersistentEioNeverProducesText) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    auto e = open_engine(model, "eio-after:1", 0, true);
    Out o = generate(*e);
    EXPECT_FALSE(o.st.ok());
    EXPECT_TRUE(o.g.tokens.empty());  // the first read fails during prefill: no token is produced
}

TEST(IoFaults, ModelFileChangedWhileRunningIsReported) {
    const std::string src = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string copy = models_dir() + "/changed-" + std::to_string(getpid()) + ".gguf";
    std::filesystem::copy_file(src, copy, std::filesystem::copy_options::overwrite_existing);
    auto e = open_engine(copy, nullptr, 0, true);
    ASSERT_TRUE(generate(*e).st.ok());
    {
        std::ofstream f(copy, std::ios::app | std::ios::binary);
        f << "appended";
    }
    Out o = generate(*e);
    EXPECT_FALSE(o.st.ok());
    EXPECT_NE(o.st.message().find("changed"), std::string::npos) << o.st.message();
    std::filesystem::remove(copy);
}

std::string private_copy(const std::string & src, const char * tag) {
    const std::string copy = models_dir() + "/" + tag + "-" + std::to_string(getpid()) + ".gguf";
    std::filesystem::copy_file(src, copy, std::filesystem::copy_options::overwrite_existing);
    return copy;
}

TEST(IoFaults, ModelFileTruncatedBetweenRequestsIsReported) {
    const std::string copy = private_copy(synth_model("tiny", "qwen3moe", "q8_0"), "trunc");
    for (int64_t cache : {0, 4}) {
        SCOPED_TRACE("cache " + std::to_string(cache));
        std::filesystem::copy_file(synth_model("tiny", "qwen3moe", "q8_0"), copy,
                                   std::filesystem::copy_options::overwrite_existing);
        auto e = open_engine(copy, nullptr, cache, true);
        ASSERT_TRUE(generate(*e).st.ok());
        ASSERT_EQ(truncate(copy.c_str(), off_t(std::filesystem::file_size(copy) / 2)), 0);
        Out o = generate(*e);
        EXPECT_FALSE(o.st.ok());
        EXPECT_NE(o.st.message().find("changed"), std::string::npos) << o.st.message();
        EXPECT_NE(o.st.message().find(copy), std::string::npos) << o.st.message();
    }
    std::filesystem::remove(copy);
}

// Renamed over by a file of the same size and mtime: only the inode tells.
TEST(IoFaults, ModelFileReplacedBetweenRequestsIsReported) {
    const std::string src = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string copy = private_copy(src, "replaced");
    auto e = open_engine(copy, nullptr, 0, true);
    ASSERT_TRUE(generate(*e).st.ok());
    const std::string other = private_copy(synth_model("tiny", "qwen3moe", "q8_0", 2), "other");
    ASSERT_EQ(std::filesystem::file_size(other), std::filesystem::file_size(copy));
    struct stat st;
    ASSERT_EQ(stat(copy.c_str(), &st), 0);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, other.c_str(), times, 0), 0);
    std::filesystem::rename(other, copy);
    Out o = generate(*e);
    EXPECT_FALSE(o.st.ok());
    EXPECT_NE(o.st.message().find("replaced by another file: yes"), std::string::npos) << o.st.message();
    std::filesystem::remove(copy);
}

// Rewritten in place at the same size with the mtime put back (`dd conv=notrunc` then
// `touch -r`): size, mtime and inode are all unchanged, only the ctime tells. The next request
// fails naming it, and model_file_status() says so before any request.
TEST(IoFaults, InPlaceRewriteWithRestoredMtimeIsReported) {
    const std::string src = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string copy = private_copy(src, "touched");
    auto e = open_engine(copy, nullptr, 0, true);
    ASSERT_TRUE(generate(*e).st.ok());
    ASSERT_TRUE(e->model_file_status().ok());
    struct stat st;
    ASSERT_EQ(stat(copy.c_str(), &st), 0);
    {
        std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(st.st_size - 4096));
        f.write("\x55\xaa\x55\xaa", 4);
    }
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
    struct stat now;
    ASSERT_EQ(stat(copy.c_str(), &now), 0);
    ASSERT_EQ(now.st_size, st.st_size);
    ASSERT_EQ(now.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
    ASSERT_EQ(now.st_ino, st.st_ino);
    const Status fs = e->model_file_status();
    EXPECT_FALSE(fs.ok());
    EXPECT_NE(fs.message().find("mtime changed: no, ctime changed: yes"), std::string::npos)
        << fs.message();
    Out o = generate(*e);
    EXPECT_FALSE(o.st.ok());
    EXPECT_NE(o.st.message().find("ctime changed: yes"), std::string::npos) << o.st.message();
    std::filesystem::remove(copy);
}

// Truncated (or rewritten in place) while tokens are being generated: the generation stops with
// an error within one token; the pieces before are the fault-free run's. With the cache off every
// token reads its experts, so without the per-token check the reads themselves would fail.
TEST(IoFaults, ModelFileChangedMidGenerationStopsWithinOneToken) {
    const std::string src = synth_model("tiny", "qwen3moe", "q8_0");
    auto ref_e = open_engine(src, nullptr, 0, true);
    Out ref = generate(*ref_e);
    ASSERT_TRUE(ref.st.ok());
    ASSERT_GE(ref.g.tokens.size(), 10u);
    for (const char * how : {"truncate", "rewrite"}) {
        for (int64_t cache : {0, 4}) {
            SCOPED_TRACE(std::string(how) + " cache " + std::to_string(cache));
            const std::string copy = private_copy(src, "midgen");
            auto e = open_engine(copy, nullptr, cache, true);
            int pieces = 0;
            GenerateResult g;
            Status st = e->generate("Once upon a time", 24, [&](const std::string &) {
                if (++pieces == 5) {
                    if (std::string(how) == "truncate") {
                        EXPECT_EQ(truncate(copy.c_str(), 4096), 0);
                    } else {
                        // Same size, other bytes (a different seed's experts): an in-place rewrite.
                        std::ifstream in(synth_model("tiny", "qwen3moe", "q8_0", 2), std::ios::binary);
                        std::fstream out(copy, std::ios::in | std::ios::out | std::ios::binary);
                        out << in.rdbuf();
                    }
                }
                return true;
            }, &g);
            EXPECT_FALSE(st.ok());
            EXPECT_NE(st.message().find("changed"), std::string::npos) << st.message();
            ASSERT_EQ(g.tokens.size(), 5u);
            EXPECT_TRUE(std::equal(g.tokens.begin(), g.tokens.end(), ref.g.tokens.begin()));
            std::filesystem::remove(copy);
        }
    }
}

// The check before a token is emitted, made deterministic: the model file changes (its ctime,
// touch:N: the N-th expert read first fchmods the file) inside a step's reads, after that
// step's check before its reads. No token may be emitted once the file has changed: every
// piece callback sees the file's ctime as validated, and the run stops naming the change.
// N = half the clean run's reads, and all of them: mid-decode and near the end. Control: a
// touch that never fires (N past every read) emits every token.
TEST(IoFaults, FileChangedDuringAStepsReadsNeverEmitsThatStepsToken) {
    const std::string src = synth_model("tiny", "qwen3moe", "q8_0");
    auto ref_e = open_engine(src, nullptr, 0, true, 1);
    Out ref = generate(*ref_e);
    ASSERT_TRUE(ref.st.ok()) << ref.st.message();
    const uint64_t reads = ref_e->stats().flash_reads;
    ASSERT_GT(reads, 2u);
    auto ctime_of = [](const std::string & path) {
        struct stat st {};
        EXPECT_EQ(::stat(path.c_str(), &st), 0);
        return int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    };
    for (uint64_t at : {reads / 2, reads, uint64_t(1) << 40}) {
        SCOPED_TRACE("touch:" + std::to_string(at));
        const std::string copy = private_copy(src, "touch");
        auto e = open_engine(copy, ("touch:" + std::to_string(at)).c_str(), 0, true, 1);
        const int64_t validated = ctime_of(copy);
        size_t pieces = 0, after_change = 0;
        GenerateResult g;
        Status st = e->generate("Once upon a time", 24, [&](const std::string &) {
            ++pieces;
            after_change += ctime_of(copy) != validated;
            return true;
        }, &g);
        EXPECT_EQ(after_change, 0u) << "a token was emitted after the model file changed";
        EXPECT_EQ(pieces, g.tokens.size());
        EXPECT_TRUE(std::equal(g.tokens.begin(), g.tokens.end(), ref.g.tokens.begin()));
        if (at <= reads) {
            EXPECT_FALSE(st.ok());
            EXPECT_NE(st.message().find("the model file changed"), std::string::npos) << st.message();
            EXPECT_NE(ctime_of(copy), validated) << "the fault did not fire";
            EXPECT_GT(g.tokens.size(), 0u) << "the change came before any token: not mid-decode";
            EXPECT_LT(g.tokens.size(), ref.g.tokens.size());
        } else {
            EXPECT_TRUE(st.ok()) << st.message();
            EXPECT_EQ(g.tokens.size(), ref.g.tokens.size());
        }
        std::filesystem::remove(copy);
    }
}

// The interposers are the process's mmap/madvise (also in this test program): a failed call
// must report the kernel's error, not EPERM (errno 1, the -1 glibc's syscall() returns).
TEST(MmapGuard, FailedCallsKeepTheKernelsErrno) {
    ASSERT_TRUE(mmap_guard_active());
    errno = 0;
    void * p = ::mmap(nullptr, size_t(1) << 62, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    EXPECT_EQ(p, MAP_FAILED);
    EXPECT_EQ(errno, ENOMEM);
    errno = 0;
    EXPECT_EQ(::mmap(nullptr, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), MAP_FAILED);
    EXPECT_EQ(errno, EINVAL);
    errno = 0;
    EXPECT_EQ(::madvise(reinterpret_cast<void *>(1), 4096, MADV_DONTNEED), -1);
    EXPECT_EQ(errno, EINVAL);
    // The posix_ forms return the error number and leave errno alone.
    errno = 0;
    EXPECT_EQ(::posix_madvise(reinterpret_cast<void *>(1), 4096, POSIX_MADV_DONTNEED), EINVAL);
    EXPECT_EQ(::posix_fadvise(-1, 0, 0, POSIX_FADV_DONTNEED), EBADF);
    EXPECT_EQ(errno, 0);
}

TEST(IoFaults, BadFaultSpecIsAUsageError) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const char * bad[] = {"eio-once:zero", "eio",          "short,p=0",   "short,p=1.5",
                          "eintr,p=1",     "short,lane=x", "short,seed=2", "eio-after:3,p=0.5",
                          "short,lane=1,lane=1", "short,bogus=1", "eio,p=0.1,seed=-1",
                          "delay:0",       "delay:x",      "delay:2000000",
                          "touch:0",       "touch:x",      "touch:3,p=0.5",
                          "short,lane=2"};  // 2 lanes open: lanes 0 and 1
    for (const char * spec : bad) {
        SCOPED_TRACE(spec);
        setenv("MOESTREAM_DEBUG_IO_FAULT", spec, 1);
        RunOptions o;
        o.model_path = model;
        o.io_threads = 2;
        std::unique_ptr<Engine> e;
        Status st = Engine::open(o, &e);
        unsetenv("MOESTREAM_DEBUG_IO_FAULT");
        EXPECT_EQ(st.code(), ErrorCode::kUsage) << st.message();
        EXPECT_NE(st.message().find("MOESTREAM_DEBUG_IO_FAULT"), std::string::npos);
    }
}

// The environment knobs are parsed at open: a malformed value is refused by name, never
// silently ignored (src/engine/env_knobs.h). Control: a well-formed value opens.
TEST(EnvKnobs, MalformedValuesAreUsageErrorsNamingTheVariable) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::pair<const char *, const char *> cases[] = {
        {"MOESTREAM_DEBUG_CORRUPT_EXPERT", "1"},   {"MOESTREAM_DEBUG_CORRUPT_EXPERT", "1:x"},
        {"MOESTREAM_DEBUG_CORRUPT_EXPERT", "-1:2"}, {"MOESTREAM_DEBUG_CORRUPT_EXPERT", "1:2junk"},
        {"MOESTREAM_PREFETCH_NO_URING", "yes"}, {"MOESTREAM_POOL_WARM", "2"},
        {"MOESTREAM_POOL_WARM", "on"}};
    for (const auto & [var, value] : cases) {
        SCOPED_TRACE(std::string(var) + "=" + value);
        setenv(var, value, 1);
        RunOptions o;
        o.model_path = model;
        std::unique_ptr<Engine> e;
        Status st = Engine::open(o, &e);
        unsetenv(var);
        EXPECT_EQ(st.code(), ErrorCode::kUsage) << st.message();
        EXPECT_NE(st.message().find(var), std::string::npos) << st.message();
    }
    setenv("MOESTREAM_DEBUG_CORRUPT_EXPERT", "1:*", 1);
    RunOptions o;
    o.model_path = model;
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    unsetenv("MOESTREAM_DEBUG_CORRUPT_EXPERT");
    EXPECT_TRUE(st.ok()) << st.message();
}

// EIO on one lane only: the generation stops with errno 5 (the other lane's reads do not
// hide it), and every later one too while it persists.
TEST(IoFaults, PersistentEioOnOneLaneStopsEveryGeneration) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    for (int lane : {0, 1}) {
        const std::string spec = "eio-after:1,lane=" + std::to_string(lane);
        SCOPED_TRACE(spec);
        auto e = open_engine(model, spec.c_str(), 0, true);
        for (int i = 0; i < 2; ++i) {
            Out bad = generate(*e);
            ASSERT_FALSE(bad.st.ok());
            EXPECT_NE(bad.st.message().find("errno 5"), std::string::npos) << bad.st.message();
            EXPECT_TRUE(bad.g.tokens.empty() || bad.g.tokens.size() < 24u);
        }
    }
}

// Random EIO, 12 seeds, one lane (so each seed's sequence of faulted reads is reproducible):
// every generation either stops with errno 5 naming the file, or produces exactly the
// fault-free output (with the cache on: a clean run after earlier misses were read fine).
// Never different text. The seeds give both outcomes.
TEST(IoFaults, RandomEioNeverGivesWrongText) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    auto ref = open_engine(model, nullptr, 4, true, 1);
    Out r = generate(*ref);
    ASSERT_TRUE(r.st.ok()) << r.st.message();
    const double reads = double(ref->stats().flash_reads);
    ASSERT_GT(reads, 100);
    // About one faulted read per generation: some generations get none.
    char spec[64];
    int failed = 0, clean = 0;
    for (int seed = 1; seed <= 12; ++seed) {
        std::snprintf(spec, sizeof spec, "eio,p=%.6f,seed=%d", 0.7 / reads, seed);
        SCOPED_TRACE(spec);
        auto e = open_engine(model, spec, 4, true, 1);
        Out o = generate(*e);
        if (o.st.ok()) {
            ++clean;
            EXPECT_EQ(o.g.tokens, r.g.tokens);
            EXPECT_EQ(o.sha, r.sha);
        } else {
            ++failed;
            EXPECT_NE(o.st.message().find("errno 5"), std::string::npos) << o.st.message();
            EXPECT_NE(o.st.message().find(model), std::string::npos) << o.st.message();
        }
    }
    std::printf("random EIO over 12 seeds: %d generations stopped, %d clean and identical\n",
                failed, clean);
    EXPECT_GT(failed, 0);
    EXPECT_GT(clean, 0);
}

}  // namespace

// The cache's evict-and-retry end to end: strace makes the kernel refuse (ENOMEM) the first
// mmap of a cache commit (the page pool's MAP_SHARED|MAP_FIXED map, located in a traced clean
// run: the n-th mmap of the main thread). The guard passes ENOMEM on, the ledger evicts and
// commits again, and the run gives the clean run's tokens and logits. Non-blind: the stats
// count the refused commit.
TEST(CacheEnomem, InjectedMmapEnomemIsEvictedAndRetriedWithIdenticalTokens) {
    if (std::system("command -v strace >/dev/null 2>&1") != 0)
        GTEST_SKIP() << "strace is not installed (scripts/setup-deps.sh installs it)";
    const std::string copy = private_copy(synth_model("tiny", "qwen3moe", "q8_0"), "enomem");
    TempDir dir("enomem");
    const std::string run = sh_quote(cli_bin()) + " run -m " + sh_quote(copy) +
                            " -p 'Once upon a time' -n 16 -t 1 --cache-mb 5 --force-cache --stats-json ";
    CmdResult clean = run_cmd("strace -f -qq -e trace=mmap -o " + sh_quote(dir.path("t")) + " " +
                              run + sh_quote(dir.path("c.json")));
    if (clean.exit_code != 0 && clean.err.find("ptrace") != std::string::npos)
        GTEST_SKIP() << "strace cannot trace here: " << clean.err;
    ASSERT_EQ(clean.exit_code, 0) << clean.err;
    // The main thread's mmap calls, in order (strace -f prefixes each line with the thread id).
    std::istringstream lines(slurp(dir.path("t")));
    std::string line, main_tid;
    long n = 0, at = 0;
    while (std::getline(lines, line) && at == 0) {
        const std::string tid = line.substr(0, line.find(' '));
        if (main_tid.empty()) main_tid = tid;
        if (tid != main_tid) continue;
        ++n;
        if (line.find("PROT_READ|PROT_WRITE, MAP_SHARED|MAP_FIXED, ") != std::string::npos) at = n;
    }
    ASSERT_GT(at, 0) << "no cache commit map in the trace";
    CmdResult inj = run_cmd("strace -f -qq -e trace=mmap -o /dev/null -e inject=mmap:error=ENOMEM:when=" +
                            std::to_string(at) + " " + run + sh_quote(dir.path("i.json")));
    ASSERT_EQ(inj.exit_code, 0) << inj.err;
    const nlohmann::json a = nlohmann::json::parse(slurp(dir.path("c.json")));
    const nlohmann::json b = nlohmann::json::parse(slurp(dir.path("i.json")));
    EXPECT_EQ(a["cache_commit_failures"].get<uint64_t>(), 0u);
    EXPECT_GE(b["cache_commit_failures"].get<uint64_t>(), 1u) << "the injected ENOMEM hit no commit";
    EXPECT_NE(inj.err.find("the system refused to commit memory (Cannot allocate memory)"),
              std::string::npos) << inj.err;
    EXPECT_EQ(b["tokens"], a["tokens"]);
    EXPECT_EQ(b["logits_sha"], a["logits_sha"]);
    std::filesystem::remove(copy);
}
