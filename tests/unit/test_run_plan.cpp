// test_run_plan.cpp — resolve() (src/engine/run_plan.h) holds every combination rule of a
// streaming run and records each choice with its reason; tested on a hand-made model index,
// without a model file or an engine. Each rule has its control: the same options without the
// condition choose the other way.
#include <gtest/gtest.h>

#include <string>

#include "run_plan.h"
#include "test_util.h"

using namespace moestream;
using namespace moestream::test;

namespace {

constexpr uint64_t kSlice = 64 << 10;

// 4 MoE layers of 32 experts (64 KiB gate, up, down slices), top-4: 24 MiB of experts.
const ModelIndex & index4() {
    static const ModelIndex idx =
        hand_made_index(std::vector<std::vector<uint64_t>>(4, {kSlice, kSlice, kSlice}), 32, 4);
    return idx;
}

// Streaming options with an explicit cache that holds every expert.
RunOptions cached() {
    RunOptions o;
    o.n_ctx = 512;
    o.n_batch = 512;
    o.cache_mb = 64;
    o.force_cache = true;
    return o;
}

// Four O_DIRECT lanes, the memory available unknown (no clamp).
PlanInputs lanes(int n = 4) {
    PlanInputs in;
    in.n_lanes = n;
    in.direct = true;
    return in;
}

RunPlan plan_of(const RunOptions & o, const PlanInputs & in = lanes()) {
    RunPlan p;
    const Status st = resolve(o, index4(), in, &p);
    EXPECT_TRUE(st.ok()) << st.message();
    return p;
}

const PlanChoice * choice(const RunPlan & p, const std::string & name) {
    for (const PlanChoice & c : p.choices)
        if (c.name == name) return &c;
    return nullptr;
}

}  // namespace

// The fixed-slot cache holds a budget where it can run; an option it cannot run with gives
// the LRU cache, and the plan says which option.
TEST(RunPlan, FixedSlotsWhereTheyCanRunElseLruNamingWhy) {
    const RunPlan slots = plan_of(cached());
    EXPECT_EQ(slots.store, RunPlan::Store::kFixedSlots);
    EXPECT_GT(slots.budget_bytes, 0u);
    ASSERT_NE(choice(slots, "store"), nullptr);
    EXPECT_EQ(choice(slots, "store")->value, "fixed slots");
    RunOptions o = cached();
    o.cache_move = false;
    const RunPlan lru = plan_of(o);
    EXPECT_EQ(lru.store, RunPlan::Store::kLru);
    EXPECT_EQ(lru.store_reason,
              "the fixed-slot cache cannot be combined with RunOptions::cache_move = false");
}

// RunOptions::slot_cache "1" refuses what the fixed slots cannot run with, by name; "0" picks
// the LRU cache (control: "auto" falls back silently to LRU, above).
TEST(RunPlan, SlotCacheOneIsRefusedByNameWhereItCannotRun) {
    RunOptions o = cached();
    o.cache_move = false;
    o.slot_cache = "1";
    RunPlan p;
    const Status st = resolve(o, index4(), lanes(), &p);
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_EQ(st.message(),
              "RunOptions::slot_cache = 1: the fixed-slot cache cannot be combined "
              "with RunOptions::cache_move = false");
    o = cached();
    o.slot_cache = "0";
    const RunPlan lru = plan_of(o);
    EXPECT_EQ(lru.store, RunPlan::Store::kLru);
    EXPECT_EQ(lru.store_reason, "RunOptions::slot_cache = 0");
}

// Drop-cold drops cache misses: with the cache off it is refused, naming the cache rule.
// Control: with a cache it runs on the LRU cache.
TEST(RunPlan, DropColdWithTheCacheOffIsRefused) {
    RunOptions o = cached();
    o.cache_mb = 0;
    o.drop_cold = 0.5;
    RunPlan p;
    const Status st = resolve(o, index4(), lanes(), &p);
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_NE(st.message().find("RunOptions::drop_cold needs an expert cache"), std::string::npos)
        << st.message();
    o.cache_mb = 64;
    const RunPlan lossy = plan_of(o);
    EXPECT_EQ(lossy.store, RunPlan::Store::kFixedSlots);  // no switch to the LRU cache
    EXPECT_TRUE(lossy.lossy);
    EXPECT_EQ(choice(lossy, "lossy")->reason, "--drop-cold-experts 0.5");
    EXPECT_FALSE(plan_of(cached()).lossy);
}

// Prefetch reads its tail through io_uring with O_DIRECT lanes; through the lanes when
// RunOptions::prefetch_uring is false, the lanes are buffered or a fault plan is planted; not
// at all with a route trace.
TEST(RunPlan, PrefetchReaderFollowsTheOptionsAndTheLanes) {
    RunOptions o = cached();
    o.prefetch = true;
    const RunPlan uring = plan_of(o);
    EXPECT_TRUE(uring.decode_prefetch);
    EXPECT_TRUE(uring.want_uring);
    EXPECT_EQ(choice(uring, "prefetch")->value, "on, io_uring");
    o.prefetch_uring = false;
    EXPECT_FALSE(plan_of(o).want_uring);
    EXPECT_EQ(choice(plan_of(o), "prefetch")->reason, "RunOptions::prefetch_uring = false");
    o.prefetch_uring = true;
    PlanInputs buffered = lanes();
    buffered.direct = false;
    EXPECT_FALSE(plan_of(o, buffered).want_uring);
    PlanInputs faults = lanes();
    faults.io_fault_planted = true;
    EXPECT_FALSE(plan_of(o, faults).want_uring);
    EXPECT_FALSE(plan_of(o, lanes(1)).decode_prefetch);  // no worker lane
    o.route_trace = "/tmp/t.trace";  // a trace records the read-ahead, it switches nothing
    EXPECT_TRUE(plan_of(o).decode_prefetch);
}

// The overlap needs a worker lane and is off under --cache-debug; the staged reads need it.
TEST(RunPlan, OverlapNeedsAWorkerLaneAndNoCacheDebug) {
    EXPECT_TRUE(plan_of(cached()).overlap);
    EXPECT_EQ(choice(plan_of(cached()), "io_overlap")->value, "on, 3 stages");
    EXPECT_FALSE(plan_of(cached(), lanes(1)).overlap);
    EXPECT_EQ(choice(plan_of(cached(), lanes(1)), "io_staged_reads")->value, "off");
    RunOptions o = cached();
    o.cache_debug = true;
    EXPECT_FALSE(plan_of(o).overlap);
    EXPECT_TRUE(plan_of(o).use_check);
}

// Prefill read-ahead by default where it applies; a route trace changes nothing of it (the
// trace records the read-ahead calls), on the fixed slots and on the LRU cache.
TEST(RunPlan, PrefillReadaheadWhereItAppliesAndWhyNot) {
    const RunPlan on = plan_of(cached());
    EXPECT_TRUE(on.prefill_readahead);
    EXPECT_TRUE(on.row_guess);
    RunOptions o = cached();
    o.route_trace = "/tmp/t.trace";
    const RunPlan traced = plan_of(o);
    EXPECT_EQ(traced.store, RunPlan::Store::kFixedSlots);
    EXPECT_TRUE(traced.prefill_readahead);
    o.slot_cache = "0";
    const RunPlan lru = plan_of(o);
    EXPECT_EQ(lru.store, RunPlan::Store::kLru);
    EXPECT_TRUE(lru.prefill_readahead);
    o.prefetch = true;
    EXPECT_TRUE(plan_of(o).decode_prefetch);
    o = cached();
    o.prefill_guess = "bank";
    EXPECT_FALSE(plan_of(o).row_guess);
}

// Every decision carries a reason (the settings print them).
TEST(RunPlan, EveryChoiceHasAReason) {
    for (const RunOptions & o : {cached(), [] {
                                     RunOptions c = cached();
                                     c.cache_mb = 0;
                                     return c;
                                 }()}) {
        const RunPlan p = plan_of(o);
        EXPECT_GE(p.choices.size(), 8u);
        for (const PlanChoice & c : p.choices) EXPECT_FALSE(c.reason.empty()) << c.name;
    }
}

namespace {

// index4 with the keys llama.cpp reads for the context: a training context of `train` tokens,
// 4 KV heads of 64 (K and V): 4 KiB of f16 KV per token over the 4 layers.
ModelIndex with_context(uint64_t train) {
    ModelIndex m = index4();
    m.arch = "qwen3moe";
    m.kv["qwen3moe.context_length"].i = int64_t(train);
    m.kv["qwen3moe.attention.head_count"].i = 4;
    m.kv["qwen3moe.attention.head_count_kv"].i = 4;
    m.kv["qwen3moe.attention.key_length"].i = 64;
    m.kv["qwen3moe.attention.value_length"].i = 64;
    return m;
}

PlanInputs with_memory(uint64_t bytes) {
    PlanInputs in = lanes();
    in.mem.available_bytes = bytes;
    in.mem.source = "test";
    return in;
}

}  // namespace

// RunOptions::n_ctx 0: resolve chooses the model's context, capped so the KV cache takes at
// most a quarter of the memory (16 MiB / 4 / 4 KiB = 1024 tokens), and says so; the plan's
// n_ctx choice is that value. Control: a requested context is kept, "requested".
TEST(RunPlan, ContextLeftZeroIsTheModelsCappedByMemory) {
    const ModelIndex m = with_context(32768);
    RunOptions o = cached();
    o.n_ctx = 0;
    o.cache_mb = 0;
    RunPlan p;
    ASSERT_TRUE(resolve(o, m, with_memory(uint64_t(16) << 20), &p).ok());
    EXPECT_EQ(p.n_ctx, 1024);
    ASSERT_NE(choice(p, "n_ctx"), nullptr);
    EXPECT_EQ(choice(p, "n_ctx")->value, "1024");
    EXPECT_NE(choice(p, "n_ctx")->reason.find("capped to 1024"), std::string::npos)
        << choice(p, "n_ctx")->reason;
    o.n_ctx = 2048;
    ASSERT_TRUE(resolve(o, m, with_memory(uint64_t(16) << 20), &p).ok());
    EXPECT_EQ(p.n_ctx, 2048);
    EXPECT_EQ(choice(p, "n_ctx")->reason, "requested");
}

// RunOptions::n_batch 0 with the cache off: resolve chooses the batch with the context it
// resolved as the cap (a model context of 1024 tokens: 1024, not choose_n_batch's 4096 for an
// unknown context). Control: a model context of 32768 lets it grow to 4096.
TEST(RunPlan, BatchLeftZeroIsCappedByTheResolvedContext) {
    RunOptions o = cached();
    o.n_ctx = 0;
    o.n_batch = 0;
    o.cache_mb = 0;
    const PlanInputs lots = with_memory(uint64_t(64) << 30);
    RunPlan p;
    ASSERT_TRUE(resolve(o, with_context(1024), lots, &p).ok());
    EXPECT_EQ(p.n_ctx, 1024);
    EXPECT_EQ(p.n_batch, 1024) << choice(p, "n_batch")->reason;
    EXPECT_EQ(choice(p, "n_batch")->value, "1024");
    ASSERT_TRUE(resolve(o, with_context(32768), lots, &p).ok());
    EXPECT_EQ(p.n_batch, 4096) << choice(p, "n_batch")->reason;
    // resolve_context is that choice, as the engine makes it before the context exists.
    const ContextChoice c = resolve_context(o, with_context(32768), lots.mem);
    EXPECT_EQ(c.n_ctx, p.n_ctx);
    EXPECT_EQ(c.n_batch, p.n_batch);
    EXPECT_EQ(c.n_batch_reason, choice(p, "n_batch")->reason);
}
