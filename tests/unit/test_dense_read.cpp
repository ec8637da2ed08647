// test_dense_read.cpp — WeightBinder::read_dense: the dense weights (every tensor that is not
// an expert tensor) are read at load by the I/O lanes into heap copies that hold exactly the
// file's bytes, in place (the copy has the file offset's phase), split into chunks the lanes
// share; short reads and EINTR change nothing, EIO fails naming file, offset and errno.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "moestream/gguf_index.h"
#include "io_faults.h"
#include "io_lanes.h"
#include "weight_binder.h"
#include "test_util.h"

using namespace moestream;

namespace {

std::vector<uint8_t> file_bytes(const std::string & path, uint64_t off, uint64_t n) {
    std::vector<uint8_t> b(n);
    std::ifstream f(path, std::ios::binary);
    f.seekg(std::streamoff(off));
    f.read(reinterpret_cast<char *>(b.data()), std::streamsize(n));
    return b;
}

// Every dense tensor's copy equals the file's bytes at `shift` past its offset (shift 0: the
// check; shift 1: the negative control, which must fail).
::testing::AssertionResult copies_match(const ModelIndex & idx, const WeightBinder & b,
                                        uint64_t shift, size_t * n_checked) {
    *n_checked = 0;
    for (const TensorInfo & ti : idx.tensors) {
        if (idx.expert_tensor_names.count(ti.name)) {
            if (b.dense_copy(ti.name) != nullptr)
                return ::testing::AssertionFailure() << "expert tensor " << ti.name << " copied";
            continue;
        }
        const void * c = b.dense_copy(ti.name);
        if (c == nullptr) return ::testing::AssertionFailure() << ti.name << ": no copy";
        const auto want = file_bytes(idx.path, ti.file_offset + shift, ti.nbytes);
        if (std::memcmp(c, want.data(), ti.nbytes) != 0)
            return ::testing::AssertionFailure() << ti.name << ": copy differs from the file";
        ++*n_checked;
    }
    return ::testing::AssertionSuccess();
}

struct Fixture {
    ModelIndex idx;
    LoadedModel lm;  // no mapping: read_dense does not need one
};

}  // namespace

TEST(DenseRead, CopiesHoldTheFileBytesOnEveryPath) {
    const std::string model = test::synth_model("tiny", "qwen3moe", "q8_0");
    Fixture fx;
    ASSERT_TRUE(load_model_index(model, &fx.idx).ok());
    for (bool odirect : {true, false}) {
        for (int lanes : {1, 3}) {
            // 8 KiB chunks: every tensor above that is split, the lanes share its parts; with
            // 16 KiB batches the reads go in many batches (each dropped from the page cache
            // when buffered).
            for (uint64_t chunk : {WeightBinder::kDenseChunkBytes, uint64_t(8192)}) {
                const uint64_t batch =
                    chunk == 8192 ? uint64_t(16384) : WeightBinder::kDenseBatchBytes;
                SCOPED_TRACE(::testing::Message() << (odirect ? "O_DIRECT" : "buffered")
                                                  << ", lanes " << lanes << ", chunk " << chunk);
                IoLanes io;
                ASSERT_TRUE(io.open(model, lanes, odirect, 65536).ok());
                if (odirect && !io.direct()) {
                    std::printf("O_DIRECT refused by this file system: its cases are skipped\n");
                    continue;
                }
                WeightBinder b(fx.idx, nullptr, fx.lm);
                ASSERT_TRUE(b.read_dense(&io, chunk, batch).ok());
                // Direct lanes read the bodies in place; buffered ones never do.
                if (io.direct()) {
                    EXPECT_GT(b.dense_read_stats().direct_reads, 0u);
                } else {
                    EXPECT_EQ(b.dense_read_stats().direct_reads, 0u);
                }
                EXPECT_GT(b.dense_read_stats().reads, 0u);
                size_t n = 0;
                EXPECT_TRUE(copies_match(fx.idx, b, 0, &n));
                EXPECT_GT(n, 10u);
                EXPECT_FALSE(copies_match(fx.idx, b, 1, &n));  // negative control
                if (io.direct()) {
                    // In place: each copy has its file offset's phase.
                    const uint64_t a = io.dio_alignment();
                    for (const TensorInfo & ti : fx.idx.tensors) {
                        if (const void * c = b.dense_copy(ti.name)) {
                            EXPECT_EQ(reinterpret_cast<uintptr_t>(c) % a, ti.file_offset % a)
                                << ti.name;
                        }
                    }
                }
            }
        }
    }
}

// The progress callback sees 0 of the total before the first read, then rising counts after
// each batch, last the total, which is every byte the reads took. With a progress callback a
// batch is at most 1/kProgressSteps of the total (but two chunks per lane): the tiny model's
// dense weights, far below one 256 MiB batch, still report in many steps. Control: 4 MiB
// chunks (two per lane exceed the whole model) report once after the start.
TEST(DenseRead, ProgressCountsTheBytesReadInSmallSteps) {
    const std::string model = test::synth_model("tiny", "qwen3moe", "q8_0");
    Fixture fx;
    ASSERT_TRUE(load_model_index(model, &fx.idx).ok());
    auto calls = [&](uint64_t chunk, uint64_t * bytes_read) {
        std::vector<std::pair<uint64_t, uint64_t>> seen;
        IoLanes io;
        EXPECT_TRUE(io.open(model, 2, false, 65536).ok());
        WeightBinder b(fx.idx, nullptr, fx.lm);
        EXPECT_TRUE(b.read_dense(&io, chunk, WeightBinder::kDenseBatchBytes, true,
                                 [&](uint64_t done, uint64_t total) { seen.emplace_back(done, total); })
                        .ok());
        *bytes_read = b.dense_read_stats().bytes_read;
        return seen;
    };
    uint64_t read = 0;
    const auto many = calls(8192, &read);
    ASSERT_GE(many.size(), 2u);
    const uint64_t total = many.front().second;
    ASSERT_LT(total, WeightBinder::kDenseBatchBytes);  // one batch without the rule
    // Steps of at most max(total / 64, 2 chunks x 2 lanes), each batch ending at a request.
    const uint64_t step = std::max<uint64_t>(total / WeightBinder::kProgressSteps, 4 * 8192);
    EXPECT_GE(many.size(), std::min<uint64_t>(total / (step + 8192), WeightBinder::kProgressSteps));
    EXPECT_GE(many.size(), 20u);
    EXPECT_EQ(many.front().first, 0u);
    EXPECT_EQ(many.back().first, many.back().second);
    EXPECT_EQ(many.back().second, read);
    for (size_t i = 1; i < many.size(); ++i) {
        EXPECT_GT(many[i].first, many[i - 1].first) << i;
        EXPECT_LE(many[i].first - many[i - 1].first, step + 8192) << i;
        EXPECT_EQ(many[i].second, total) << i;
    }
    const auto one = calls(WeightBinder::kDenseChunkBytes, &read);
    ASSERT_EQ(one.size(), 2u);  // control: the start, then the one batch
    EXPECT_EQ(one[1].first, read);
}

TEST(DenseRead, ShortReadsAndEintrChangeNothing) {
    const std::string model = test::synth_model("tiny", "qwen3moe", "q8_0");
    Fixture fx;
    ASSERT_TRUE(load_model_index(model, &fx.idx).ok());
    for (const char * spec : {"short", "eintr", "short,p=0.5,seed=3"}) {
        SCOPED_TRACE(spec);
        IoFaultPlan plan;
        ASSERT_TRUE(parse_io_fault(spec, &plan).ok());
        IoLanes io;
        ASSERT_TRUE(io.open(model, 2, true, 65536).ok());
        io.set_pread_hook(&io_fault_preadv, &plan);
        WeightBinder b(fx.idx, nullptr, fx.lm);
        ASSERT_TRUE(b.read_dense(&io, 8192).ok());
        size_t n = 0;
        EXPECT_TRUE(copies_match(fx.idx, b, 0, &n));
        EXPECT_GT(plan.injected.load(), 0);  // the faults really happened
    }
}

TEST(DenseRead, EioFailsNamingFileOffsetAndErrno) {
    const std::string model = test::synth_model("tiny", "qwen3moe", "q8_0");
    Fixture fx;
    ASSERT_TRUE(load_model_index(model, &fx.idx).ok());
    IoFaultPlan plan;
    ASSERT_TRUE(parse_io_fault("eio-once:3", &plan).ok());
    IoLanes io;
    ASSERT_TRUE(io.open(model, 2, true, 65536).ok());
    io.set_pread_hook(&io_fault_preadv, &plan);
    WeightBinder b(fx.idx, nullptr, fx.lm);
    const Status st = b.read_dense(&io, 8192);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(model), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("offset"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("errno 5"), std::string::npos) << st.message();
}
