// test_replay.cpp — `moestream replay` and its cache simulator (docs/replay.md):
//  - the simulator makes the engine's LruCache decisions: driven side by side with random
//    routings (page-multiple and page-sharing slices, budgets from below one routed set to
//    everything), every slot's hit/miss and the eviction/reread/over-budget counts agree;
//  - the engine's cache and the replay share one expert ledger: the same seeded routing
//    through both gives the same decision log (every lookup, victim and committed-bytes
//    figure), and another policy or a misread page placement on the replay side does not;
//  - --validate reproduces traces recorded by `run` on synth tiny models of every arch, cache
//    off / 1 MiB / 4 MiB / huge, with --drop-cold-experts (also in prefill, also at a smaller
//    --n-expert-used), on the fixed slots (their slot ledger; one slot fewer or the LRU
//    cache of the same budget fails), with the cache off (the shared slots' ledger in shared
//    mode; replayed as an LRU cache it fails); tampering with one recorded hit makes it fail;
//  - on the default store every slot is checked, the prompt batches wider than the slots
//    included (the shared slots' ledger with their read-ahead): one slot fewer, or one wide
//    routing's miss turned into a hit, fails; a version 8 trace of them is refused by name;
//    the trace's hits and misses are the run's cache_hits / cache_misses;
//  - the shared mode keeps nothing beyond the staged layer but its read-ahead (a ledger
//    with a budget is the control);
//  - the same trace and settings give the same numbers to the last digit;
//  - Belady never loses to LRU;
//  - speed (a figure, skipped unless MOESTREAM_REPLAY_SPEED=1): routings/s on a
//    Qwen3-30B-shaped trace (48 layers x 128 experts, top-8);
//  - usage errors exit 64; --plot writes a PNG (when matplotlib is installed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "moestream/gguf_index.h"
#include "moestream/replay.h"
#include "expert_ledger.h"
#include "moestream/route_trace.h"
#include "replay_ledger.h"
#include "residency.h"
#include "route_tracer.h"
#include "test_util.h"

using nlohmann::json;
using namespace moestream;
using namespace moestream::test;

namespace {

const uint64_t kPage = uint64_t(sysconf(_SC_PAGESIZE));

std::string tmp_path(const std::string & name) {
    return models_dir() + "/rp-" + std::to_string(getpid()) + "-" + name;
}

// --- The simulator against the engine's cache ------------------------------------------

ModelIndex make_index(const std::vector<std::vector<uint64_t>> & layers, uint32_t n_expert) {
    return moestream::test::hand_made_index(layers, n_expert, 4);
}

TraceHeader header_of(const ModelIndex & idx, uint32_t k, uint64_t budget) {
    TraceHeader h;
    h.n_layer = idx.n_layer;
    h.n_expert = idx.n_expert;
    h.k_model = h.k = k;
    h.page_bytes = kPage;
    h.cache_budget_bytes = budget;
    for (const MoeLayer & L : idx.moe_layers) {
        TraceLayerShape s;
        s.layer = L.layer;
        for (const ExpertTensor & et : L.tensors) {
            s.slice_bytes.push_back(et.slice_bytes);
            s.phase_bytes.push_back(et.file_offset % kPage);  // where the cache places it
        }
        s.expert_bytes = L.expert_bytes;
        h.moe_layers.push_back(s);
    }
    return h;
}

// Drives the real LruCache with random routings (rows x k, skewed so experts recur) and
// records what it did as an in-memory trace: the streamer's distinct first-seen order, the
// cache's residency before each stage.
RouteTrace drive_real_cache(const ModelIndex & idx, uint64_t budget, uint32_t k, int graphs,
                            uint32_t seed, LedgerStats * cs, bool recycle) {
    Status st;
    CacheOptions opt;
    opt.recycle_pages = recycle;
    auto store = make_lru_cache(idx, budget, opt, {}, &st);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(store->paged_memory()->page_stats().recycle_pages, recycle);
    RouteTrace t;
    t.header = header_of(idx, k, budget);
    t.header.cache_chunks = store->paged_memory()->page_stats().recycle_pages;  // as the engine records it
    std::mt19937 rng(seed);
    std::vector<ReadRequest> reads;
    std::vector<uint8_t> seen(idx.n_expert, 0);
    for (int g = 0; g < graphs; ++g) {
        const uint32_t rows = g % 7 == 0 ? 1 + rng() % 4 : 1;
        for (uint32_t m = 0; m < idx.moe_layers.size(); ++m) {
            TraceRouting r;
            r.layer = idx.moe_layers[m].layer;
            r.moe_idx = m;
            r.n_rows = rows;
            r.k = uint16_t(k);
            r.graph = uint32_t(g);
            r.decode = rows == 1;
            r.first_slot = t.expert.size();
            std::vector<uint32_t> experts;
            for (uint32_t row = 0; row < rows; ++row) {
                std::vector<uint8_t> in_row(idx.n_expert, 0);
                for (uint32_t j = 0; j < k; ++j) {
                    uint32_t e;
                    do {  // skewed: low ids are popular
                        const double u = std::uniform_real_distribution<double>(0, 1)(rng);
                        e = uint32_t(double(idx.n_expert) * u * u) % idx.n_expert;
                    } while (in_row[e]);
                    in_row[e] = 1;
                    t.expert.push_back(int32_t(e));
                    t.weight.push_back(1.0f / float(k));
                    t.flags.push_back(store->is_resident(m, e) ? kSlotResident : 0);
                    if (!seen[e]) {
                        seen[e] = 1;
                        experts.push_back(e);
                    }
                }
            }
            for (uint32_t e : experts) seen[e] = 0;
            reads.clear();
            StageStats ss;
            EXPECT_TRUE(store->stage(m, experts, &reads, &ss).ok());
            t.routings.push_back(r);
        }
    }
    *cs = store->ledger_stats();
    return t;
}

// Expert slice sizes (per MoE layer, per projection), expert count and k of the tests that
// run the engine's cache and the replay side by side.
struct CacheShape {
    std::vector<std::vector<uint64_t>> layers;
    uint32_t n_expert, k;
};
const CacheShape kCacheShapes[] = {
    {{{kPage, kPage, kPage}, {2 * kPage, 2 * kPage, 2 * kPage}, {kPage, kPage, kPage}}, 32, 4},
    // Slices that are not page multiples: neighbours share boundary pages.
    {{{10000, 10000, 10000}, {1572, 1572, 3144}, {4096 + 100, 4096 + 100, 4096 + 100}}, 24, 3},
    {{{1000, 1000, 1000}, {1000, 1000, 1000}}, 64, 6},
};

TEST(CacheSim, MatchesTheEnginesLruCacheDecisionForDecision) {
    for (const CacheShape & sh : kCacheShapes) {
        const ModelIndex idx = make_index(sh.layers, sh.n_expert);
        uint64_t max_eb = 0;
        for (const MoeLayer & L : idx.moe_layers) max_eb = std::max(max_eb, L.expert_bytes);
        for (uint64_t budget : {max_eb, max_eb * sh.k / 2, max_eb * sh.k * 2, max_eb * sh.k * 5,
                                max_eb * sh.n_expert * 4})
        for (bool recycle : {true, false}) {
            SCOPED_TRACE("budget " + std::to_string(budget) + " slice " +
                         std::to_string(sh.layers[0][0]) + " recycle " + std::to_string(recycle));
            LedgerStats cs;
            const RouteTrace t =
                drive_real_cache(idx, budget, sh.k, 300, uint32_t(budget), &cs, recycle);
            Replayer rp(t);
            ReplayResult r;
            ValidateReport v;
            ASSERT_TRUE(rp.run(rp.recorded_setting(), &r, &v).ok());
            EXPECT_TRUE(v.ok) << v.first_mismatch;
            EXPECT_EQ(r.hits, cs.hits);
            EXPECT_EQ(r.misses, cs.misses);
            EXPECT_EQ(r.lookups, cs.lookups);
            EXPECT_EQ(r.evictions, cs.evictions);
            EXPECT_EQ(r.rereads, cs.rereads);
            EXPECT_EQ(r.over_budget_stages, cs.over_budget_stages);
            EXPECT_EQ(r.peak_committed_bytes, cs.peak_resident_bytes);
        }
    }
}

// --- One ledger, two back-ends --------------------------------------------------------

// Every decision a ledger makes, in order: lookups (hit or miss), victims, committed bytes
// after each stage.
struct DecisionLog final : LedgerObserver {
    std::vector<std::string> events;
    uint64_t evictions = 0;
    void lookup(uint32_t moe, uint32_t e, bool hit) override {
        events.push_back((hit ? "hit " : "miss ") + std::to_string(moe) + "/" + std::to_string(e));
    }
    void evicted(uint32_t moe, uint32_t e) override {
        ++evictions;
        events.push_back("evict " + std::to_string(moe) + "/" + std::to_string(e));
    }
    void stage_done(uint32_t moe, uint64_t committed) override {
        events.push_back("staged " + std::to_string(moe) + " committed " +
                         std::to_string(committed));
    }
};

// Index of the first event where the logs differ, or -1 when they are the same.
long first_difference(const DecisionLog & a, const DecisionLog & b) {
    const size_t n = std::min(a.events.size(), b.events.size());
    for (size_t i = 0; i < n; ++i)
        if (a.events[i] != b.events[i]) return long(i);
    return a.events.size() == b.events.size() ? -1 : long(n);
}

// Seeded routings, distinct per stage, skewed so that experts recur: per graph, per MoE layer.
std::vector<std::vector<uint32_t>> seeded_routing(const ModelIndex & idx, uint32_t k, int graphs,
                                                  uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<uint32_t>> out;
    for (int g = 0; g < graphs; ++g)
        for (size_t m = 0; m < idx.moe_layers.size(); ++m) {
            std::vector<uint32_t> ex;
            const uint32_t n = g % 5 == 0 ? 2 * k : k;  // now and then a prefill-sized set
            while (ex.size() < n) {
                const double u = std::uniform_real_distribution<double>(0, 1)(rng);
                const uint32_t e = uint32_t(double(idx.n_expert) * u * u) % idx.n_expert;
                if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
            }
            out.push_back(ex);
        }
    return out;
}

// The engine's LruCache (reads simulated: every requested byte written) and the replay's
// ledger (replay_ledger.h) run the same routing; their decision logs are compared entry by
// entry. Controls: another policy on the replay side (lfu) and a replay that misreads the
// page placement (every phase 0) each make the logs differ.
TEST(ExpertLedger, EngineCacheAndReplayMakeTheSameDecisions) {
    bool policy_control_differs = false, cost_control_differs = false;
    for (const CacheShape & sh : kCacheShapes) {
        const ModelIndex idx = make_index(sh.layers, sh.n_expert);
        const auto routing = seeded_routing(idx, sh.k, 200, sh.n_expert);
        uint64_t max_eb = 0;
        for (const MoeLayer & L : idx.moe_layers) max_eb = std::max(max_eb, L.expert_bytes);
        for (uint64_t budget : {max_eb, max_eb * sh.k * 2, max_eb * sh.k * 5})
            for (bool recycle : {true, false}) {
                SCOPED_TRACE("budget " + std::to_string(budget) + " slice " +
                             std::to_string(sh.layers[0][0]) + " recycle " +
                             std::to_string(recycle));
                DecisionLog engine, replay, other_policy, misplaced;
                CacheOptions opt;
                opt.recycle_pages = recycle;
                CacheTestHooks hooks;
                hooks.observer = &engine;
                Status st;
                auto store = make_lru_cache(idx, budget, opt, {}, &st, hooks);
                ASSERT_TRUE(st.ok()) << st.message();
                TraceHeader h = header_of(idx, sh.k, budget);
                h.cache_chunks = store->paged_memory()->page_stats().recycle_pages;
                auto ledger = make_replay_ledger(h, ReplayPolicy::kLru, budget);
                ledger->set_observer(&replay);
                auto lfu = make_replay_ledger(h, ReplayPolicy::kLfu, budget);
                lfu->set_observer(&other_policy);
                TraceHeader h0 = h;
                for (TraceLayerShape & L : h0.moe_layers)
                    std::fill(L.phase_bytes.begin(), L.phase_bytes.end(), 0);
                auto flat = make_replay_ledger(h0, ReplayPolicy::kLru, budget);
                flat->set_observer(&misplaced);

                std::vector<ReadRequest> reads;
                for (size_t i = 0; i < routing.size(); ++i) {
                    const uint32_t moe = uint32_t(i % idx.moe_layers.size());
                    reads.clear();
                    StageStats a, b, c, d;
                    ASSERT_TRUE(store->stage(moe, routing[i], &reads, &a).ok());
                    for (const ReadRequest & r : reads)  // what the read lanes would do
                        std::memset(r.dest, int(1 + r.file_offset % 251), r.len);
                    ASSERT_TRUE(ledger->stage(moe, routing[i], nullptr, &b).ok());
                    ASSERT_TRUE(lfu->stage(moe, routing[i], nullptr, &c).ok());
                    ASSERT_TRUE(flat->stage(moe, routing[i], nullptr, &d).ok());
                    ASSERT_EQ(a.misses * idx.moe_layers[moe].tensors.size(), reads.size());
                }
                EXPECT_EQ(first_difference(engine, replay), -1)
                    << "engine: " << engine.events[std::max(0L, first_difference(engine, replay))]
                    << ", replay: "
                    << replay.events[std::max(0L, first_difference(engine, replay))];
                EXPECT_EQ(engine.events.size(), replay.events.size());
                if (budget == max_eb) {
                    EXPECT_GT(engine.evictions, 0u);  // the comparison covers victims
                }
                policy_control_differs |= first_difference(engine, other_policy) >= 0;
                cost_control_differs |= first_difference(engine, misplaced) >= 0;
            }
    }
    EXPECT_TRUE(policy_control_differs);
    EXPECT_TRUE(cost_control_differs);
}

// The ledger of the cache off (shared mode, as make_replay_ledger builds it for budget 0):
// nothing outlives the staged layer but that layer's read-ahead. Control: the same routings
// through a ledger that keeps experts (a budget holding them all) hit.
TEST(ExpertLedger, SharedModeKeepsNothingButTheStagedLayersReadAhead) {
    const ModelIndex idx = make_index({{kPage, kPage}, {kPage, kPage}}, 8);
    const TraceHeader h = header_of(idx, 2, 0);
    auto shared = make_replay_ledger(h, ReplayPolicy::kLru, 0);
    auto keeps = make_replay_ledger(h, ReplayPolicy::kLru, 1ull << 30);
    ASSERT_TRUE(shared->shared());
    ASSERT_FALSE(keeps->shared());
    for (ExpertLedger * l : {shared.get(), keeps.get()}) {
        StageStats a, b, c;
        ASSERT_TRUE(l->stage(0, {1, 2}, nullptr, &a).ok());
        ASSERT_TRUE(l->stage(1, {1}, nullptr, &b).ok());
        ASSERT_TRUE(l->stage(0, {1, 2}, nullptr, &c).ok());
        EXPECT_EQ(a.misses, 2u);
        EXPECT_EQ(c.hits, l == shared.get() ? 0u : 2u);
        EXPECT_EQ(l->would_hit(0, 1), l != shared.get());  // staged, not kept
    }
    // Read ahead into layer 1: hits there, once; what it does not route is dropped unused.
    EXPECT_EQ(shared->prefetch(1, {3, 4}), 2u);
    EXPECT_TRUE(shared->would_hit(1, 3));  // reads outstanding
    shared->end_prefetch(true);
    StageStats d;
    ASSERT_TRUE(shared->stage(1, {3, 5}, nullptr, &d).ok());
    EXPECT_EQ(d.hits, 1u);
    EXPECT_EQ(d.misses, 1u);
    EXPECT_FALSE(shared->would_hit(1, 3));
    EXPECT_FALSE(shared->would_hit(1, 4));
    const LedgerStats ls = shared->stats();
    EXPECT_EQ(ls.prefetch_used, 1u);
    EXPECT_EQ(ls.prefetch_unused, 1u);
    EXPECT_EQ(ls.evictions, 0u);
    EXPECT_EQ(ls.rereads, 0u);
}

// Drives the cache-off shared slots (two sets: read-ahead on) as the streamer does, one decode
// token per graph: each MoE layer's stage, then a read-ahead of the next layer's guess (one
// expert of its routing and one other; every 5th call's reads fail), ended before the next
// stage; recorded through RouteTracer to `path`. Returns the store's read-ahead counters.
LedgerStats record_shared_read_ahead(const std::string & path) {
    const ModelIndex idx = make_index({{kPage, kPage}, {kPage, kPage}, {kPage, kPage}}, 16);
    const uint32_t k = 2;
    Status st;
    auto store = make_shared_slots(idx, &st, /*two_sets=*/true, /*huge_pages=*/false);
    EXPECT_TRUE(st.ok()) << st.message();
    auto tracer = RouteTracer::open(path, header_of(idx, k, 0));
    EXPECT_TRUE(tracer->active());
    std::mt19937 rng(7);
    std::vector<ReadRequest> reads;
    const size_t n_moe = idx.moe_layers.size();
    bool open = false;
    int calls = 0;
    for (uint32_t g = 0; g < 24; ++g) {
        std::vector<std::vector<int32_t>> routing(n_moe);
        for (auto & ids : routing) {
            ids = {int32_t(rng() % 16), 0};
            do ids[1] = int32_t(rng() % 16); while (ids[1] == ids[0]);
        }
        tracer->begin_graph(true, g, 1);
        for (size_t m = 0; m < n_moe; ++m) {
            tracer->routing_start(idx.moe_layers[m].layer, int(k), 1, routing[m].data());
            if (open) {  // the streamer ends the tail before the next stage
                const bool ok = ++calls % 5 != 0;
                store->end_prefetch(ok);
                tracer->on_read_ahead_end(ok);
                open = false;
            }
            const std::vector<uint32_t> experts{uint32_t(routing[m][0]), uint32_t(routing[m][1])};
            std::vector<uint8_t> resident;
            for (uint32_t e : experts) resident.push_back(store->is_resident(m, e) ? 1 : 0);
            reads.clear();
            StageStats ss;
            EXPECT_TRUE(store->stage(m, experts, &reads, &ss).ok());
            tracer->on_stage(idx.moe_layers[m].layer, experts, resident, 0);
            if (m + 1 < n_moe) {
                const std::vector<uint32_t> guess{uint32_t(routing[m + 1][0]), uint32_t(rng() % 16)};
                reads.clear();
                const size_t n = store->prefetch(m + 1, guess, &reads);
                const ResidencyStore::ReadAheadCall c = store->last_read_ahead();
                EXPECT_TRUE(c.ledger);
                tracer->on_read_ahead(idx.moe_layers[m + 1].layer, guess, *c.experts, c.shared,
                                      true);
                open = n > 0;
            }
        }
        tracer->end_graph();
    }
    tracer->finish();
    return store->ledger_stats();
}

TEST(ReplayValidate, ReproducesTheSharedSlotsReadAhead) {
    const std::string path = tmp_path("ra.trace");
    const LedgerStats ls = record_shared_read_ahead(path);
    RouteTrace t;
    const Status st = read_route_trace(path, &t);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(t.header.version, kRouteTraceVersion);
    EXPECT_EQ(t.read_aheads.size(), 24u * 2u);
    ASSERT_GT(ls.prefetch_used, 0u);
    Replayer rp(t);
    ReplayResult r;
    ValidateReport v;
    ASSERT_TRUE(rp.run(rp.recorded_setting(), &r, &v).ok());
    EXPECT_TRUE(v.ok) << v.first_mismatch;
    EXPECT_EQ(v.recorded_hits, ls.prefetch_used);  // every hit is a read-ahead one
    EXPECT_EQ(v.replay_read_ahead, ls.prefetched + ls.abandoned);
    std::remove(path.c_str());
}

TEST(ReplayValidate, FailsOnTheSharedSlotsWithoutTheReadAheadRecords) {
    const std::string path = tmp_path("ra-none.trace");
    record_shared_read_ahead(path);
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(path, &t).ok());
    t.read_aheads.clear();
    Replayer rp(t);
    ReplayResult r;
    ValidateReport v;
    ASSERT_TRUE(rp.run(rp.recorded_setting(), &r, &v).ok());
    EXPECT_FALSE(v.ok);
    EXPECT_EQ(v.replay_hits, 0u);
    std::remove(path.c_str());
}

// A Qwen3-30B-shaped trace (48 MoE layers x 128 experts, top-8, Q4_K slices) with skewed,
// token-to-token correlated routing, built in memory.
RouteTrace synthetic_30b(int tokens, uint32_t seed) {
    const uint64_t slice = 884736;  // 30B Q4_K: gate, up and down slices are 216 pages each
    std::vector<std::vector<uint64_t>> layers(48, {slice, slice, slice});
    const ModelIndex idx = make_index(layers, 128);
    RouteTrace t;
    t.header = header_of(idx, 8, 4000ull << 20);
    t.header.k_model = 8;
    std::mt19937 rng(seed);
    std::vector<std::vector<uint32_t>> prev(48, std::vector<uint32_t>(8));
    for (int g = 0; g < tokens; ++g)
        for (uint32_t m = 0; m < 48; ++m) {
            TraceRouting r;
            r.layer = m;
            r.moe_idx = m;
            r.n_rows = 1;
            r.k = 8;
            r.graph = uint32_t(g);
            r.decode = 1;
            r.first_slot = t.expert.size();
            uint8_t in_row[128] = {};
            for (uint32_t j = 0; j < 8; ++j) {
                uint32_t e;
                do {
                    if (g > 0 && rng() % 3 == 0)
                        e = prev[m][rng() % 8];  // reuse from the last token
                    else {
                        const double u = std::uniform_real_distribution<double>(0, 1)(rng);
                        e = uint32_t(128.0 * u * u * u) % 128;
                    }
                } while (in_row[e]);
                in_row[e] = 1;
                prev[m][j] = e;
                t.expert.push_back(int32_t(e));
                t.weight.push_back(0.5f / float(j + 1));
                t.flags.push_back(0);
            }
            t.routings.push_back(r);
        }
    return t;
}

TEST(Replay, BeladyNeverLosesToLru) {
    const RouteTrace t = synthetic_30b(400, 7);
    Replayer rp(t);
    for (uint64_t mib : {0, 500, 1000, 2000, 4000, 8000, 16000}) {
        SCOPED_TRACE(mib);
        ReplaySetting s;
        s.budget_bytes = mib << 20;
        ReplayResult lru, lfu, bel;
        ASSERT_TRUE(rp.run(s, &lru).ok());
        s.policy = ReplayPolicy::kLfu;
        ASSERT_TRUE(rp.run(s, &lfu).ok());
        s.policy = ReplayPolicy::kBelady;
        ASSERT_TRUE(rp.run(s, &bel).ok());
        EXPECT_GE(bel.hits, lru.hits);
        EXPECT_GE(bel.hits, lfu.hits);
        EXPECT_EQ(bel.lookups, lru.lookups);
        if (mib >= 2000 && mib < 16000) {
            EXPECT_GT(bel.hits, lru.hits);  // room to be smarter
        }
    }
}

// A speed figure, not a gate (speed targets never gate CTest on a shared machine): skipped
// unless asked for, then it prints routings/s per policy:
//   MOESTREAM_REPLAY_SPEED=1 build/bin/test_replay --gtest_filter='*RoutingsPerSecond*'
TEST(Replay, RoutingsPerSecond) {
    if (!std::getenv("MOESTREAM_REPLAY_SPEED"))
        GTEST_SKIP() << "a speed figure, not a gate on a shared machine: set "
                        "MOESTREAM_REPLAY_SPEED=1 to print it (docs/replay.md, \"Speed\")";
    const RouteTrace t = synthetic_30b(5000, 3);  // 240,000 routings, 1.92 M slots
    Replayer rp(t);
    for (ReplayPolicy pol : {ReplayPolicy::kLru, ReplayPolicy::kBelady}) {
        ReplaySetting s;
        s.policy = pol;
        s.budget_bytes = 4000ull << 20;
        s.drop_cold = pol == ReplayPolicy::kLru ? 0.75 : 0;
        double best = 0;
        for (int rep = 0; rep < 3; ++rep) {  // best of three: the machine is shared
            ReplayResult r;
            const auto t0 = std::chrono::steady_clock::now();
            ASSERT_TRUE(rp.run(s, &r).ok());
            const double sec =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::max(best, double(t.routings.size()) / sec);
        }
        std::printf("replay %s%s: %.2f M routings/s\n", policy_name(pol),
                    s.drop_cold > 0 ? " + drop-cold" : "", best / 1e6);
    }
}

// --- Traces recorded by the engine ----------------------------------------------------

std::string record(const std::string & model, const std::string & flags, const std::string & name) {
    const std::string path = tmp_path(name);
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p " +
                          sh_quote(kRouterPrompt) + " -n 32 -t 1 " + flags + " --route-trace " +
                          sh_quote(path));
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
    return path;
}

TEST(ReplayValidate, ReproducesRecordedTraces) {
    const char * flag_sets[] = {
        "--cache-mb 0",
        "--cache-mb 1 --force-cache",
        "--cache-mb 4 --force-cache",
        "--cache-mb 1000000",
        "--cache-mb 4 --force-cache --drop-cold-experts 1.0",
        "--cache-mb 2 --force-cache --drop-cold-experts 0.7 --drop-in-prefill",
        "--cache-mb 4 --force-cache --n-expert-used 2 --drop-cold-experts 1.0",
        // The fixed slots (12 MiB: fewer slots than experts), with drop-cold in prefill.
        "--cache-mb 12 --force-cache --drop-cold-experts 0.7 --drop-in-prefill",
    };
    for (const char * arch : {"qwen3moe", "olmoe", "glm4moe"}) {
        const std::string model = synth_model("tiny", arch, "q8_0");
        for (const char * flags : flag_sets) {
            SCOPED_TRACE(std::string(arch) + " " + flags);
            const std::string path = record(model, flags, "v.trace");
            CmdResult v =
                run_cmd(sh_quote(cli_bin()) + " replay " + sh_quote(path) + " --validate");
            EXPECT_EQ(v.exit_code, 0) << v.err;
            EXPECT_NE(v.err.find(": OK"), std::string::npos) << v.err;
            std::remove(path.c_str());
        }
    }
}

// --route-trace on the default store records the fixed slots' own decisions (the store is not
// switched; prefill read-ahead stays on, into the shared slots) and the replay's slot ledger
// reproduces them; the control: the same trace replayed with one slot fewer per layer, or as
// the LRU cache of the same budget, does not.
TEST(ReplayValidate, ReproducesTheFixedSlotsAndNotAnotherStore) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string path = record(model, "--cache-mb 12 --force-cache", "slots.trace");
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(path, &t).ok());
    const json set = json::parse(t.header.settings_json);
    EXPECT_EQ(set["cache_store"], "fixed slots");
    EXPECT_TRUE(set["prefill_readahead"].get<bool>());
    EXPECT_TRUE(set["cache_slot_warm"].get<bool>());
    ASSERT_GT(t.header.slots_per_layer, 0u);
    ASSERT_LT(t.header.slots_per_layer, t.header.n_expert);  // so slots are evicted
    Replayer rp(t);
    ReplayResult r;
    ValidateReport v;
    ASSERT_TRUE(rp.run(rp.recorded_setting(), &r, &v).ok());
    EXPECT_TRUE(v.ok) << v.first_mismatch;
    EXPECT_GT(v.slots_checked, 0u);
    EXPECT_GT(v.replay_hits, 0u);
    EXPECT_GT(r.evictions, 0u);
    ReplaySetting fewer = rp.recorded_setting();
    fewer.slots_per_layer -= 1;
    ASSERT_TRUE(rp.run(fewer, &r, &v).ok());
    EXPECT_FALSE(v.ok);
    ReplaySetting lru = rp.recorded_setting();
    lru.slots_per_layer = 0;
    ASSERT_TRUE(rp.run(lru, &r, &v).ok());
    EXPECT_FALSE(v.ok);
    std::remove(path.c_str());
}

// --route-trace with the cache off records the shared slots' own ledger (shared mode: every
// routed expert read) and the replay's shared-mode ledger reproduces it; the control: the
// same trace replayed as an LRU cache that holds every expert does not.
TEST(ReplayValidate, ReproducesTheSharedSlotsAndNotAnotherStore) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string path = record(model, "--cache-mb 0", "shared.trace");
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(path, &t).ok());
    EXPECT_EQ(json::parse(t.header.settings_json)["cache_store"], "off");
    ASSERT_EQ(t.header.cache_budget_bytes, 0u);
    ASSERT_EQ(t.header.slots_per_layer, 0u);
    Replayer rp(t);
    ReplayResult r;
    ValidateReport v;
    ASSERT_TRUE(rp.run(rp.recorded_setting(), &r, &v).ok());
    EXPECT_TRUE(v.ok) << v.first_mismatch;
    EXPECT_GT(v.slots_checked, 0u);
    EXPECT_GT(v.replay_misses, 0u);
    ReplaySetting lru = rp.recorded_setting();
    lru.budget_bytes = 1ull << 30;
    ASSERT_TRUE(rp.run(lru, &r, &v).ok());
    EXPECT_FALSE(v.ok);
    EXPECT_GT(v.replay_hits, 0u);
    std::remove(path.c_str());
}

// The default store (fixed slots) with decode --prefetch and prefill read-ahead, traced (one
// recording shared by the tests below, made once per test process) and not (on demand). The
// prompt is one batch whose routings are wider than the slots (read into the shared slots);
// 20 MiB leaves fewer slots than experts and two sets of shared slots (prefill read-ahead
// reads the next layer's whole bank into the other set; with one set it reads nothing).
const char * kReadAheadFlags = "--io-threads 2 --cache-mb 20 --force-cache --prefetch";
struct ReadAheadRuns {
    StatsRun traced;
    RouteTrace trace;  // its trace, read back (the file is removed)
    Status read;
};
std::string read_ahead_model() { return synth_model("tiny", "qwen3moe", "q8_0"); }
const ReadAheadRuns & read_ahead_runs() {
    static const ReadAheadRuns runs = [] {
        ReadAheadRuns r;
        const std::string path = tmp_path("ra-engine.trace");
        r.traced = run_with_stats(read_ahead_model(), kRouterPrompt, 32,
                                  std::string(kReadAheadFlags) + " --route-trace " + sh_quote(path));
        r.read = read_route_trace(path, &r.trace);
        std::remove(path.c_str());
        return r;
    }();
    return runs;
}
// The recording of read_ahead_runs() (a copy to tamper with).
RouteTrace read_ahead_trace() {
    const ReadAheadRuns & r = read_ahead_runs();
    EXPECT_EQ(r.traced.rc, 0) << r.traced.err;
    EXPECT_TRUE(r.read.ok()) << r.read.message();
    return r.trace;
}
// --validate of t under the recorded setting, with one slot per layer fewer than recorded.
ValidateReport validate_recorded(const RouteTrace & t, uint32_t fewer_slots = 0) {
    Replayer rp(t);
    ReplaySetting s = rp.recorded_setting();
    s.slots_per_layer -= fewer_slots;
    ReplayResult r;
    ValidateReport v;
    const Status st = rp.run(s, &r, &v);
    EXPECT_TRUE(st.ok()) << st.message();
    return v;
}
// Distinct experts of routing i (its slots at the trace's k).
size_t distinct_experts(const RouteTrace & t, size_t i) {
    const TraceRouting & r = t.routings[i];
    std::vector<uint8_t> seen(t.header.n_expert, 0);
    size_t n = 0;
    for (uint64_t s = r.first_slot; s < r.first_slot + uint64_t(r.n_rows) * r.k; ++s)
        if (!seen[uint32_t(t.expert[s])]) {
            seen[uint32_t(t.expert[s])] = 1;
            ++n;
        }
    return n;
}

// Tracing switches nothing: the same tokens, the same reads, read-ahead on in both.
TEST(RouteTraceRun, TracedRunReadsAndGeneratesAsTheUntracedRun) {
    const ReadAheadRuns & r = read_ahead_runs();
    const StatsRun plain = run_with_stats(read_ahead_model(), kRouterPrompt, 32, kReadAheadFlags);
    ASSERT_EQ(plain.rc, 0) << plain.err;
    ASSERT_EQ(r.traced.rc, 0) << r.traced.err;
    const json a = json::parse(plain.stats), b = json::parse(r.traced.stats);
    EXPECT_EQ(a["tokens"], b["tokens"]);
    EXPECT_GT(a["prefetch_experts"].get<uint64_t>(), 0u);
    for (const char * key : {"flash_bytes_read", "flash_reads", "cache_hits", "cache_misses",
                             "prefetch_experts", "prefetch_used"})
        EXPECT_EQ(a[key], b[key]) << key;
    EXPECT_EQ(a["settings"]["prefill_readahead"], b["settings"]["prefill_readahead"]);
    EXPECT_EQ(b["settings"]["cache_store"], "fixed slots");
}

// validate reproduces the traced run, read-ahead hits included; the controls: the same trace
// without its read-ahead records, or with one slot fewer per layer, does not.
TEST(ReplayValidate, ReproducesTheDefaultStoresReadAheadAndNotWithoutIt) {
    RouteTrace t = read_ahead_trace();
    ASSERT_FALSE(t.read_aheads.empty());
    ASSERT_GT(t.header.slots_per_layer, 1u);
    const ValidateReport v = validate_recorded(t);
    EXPECT_TRUE(v.ok) << v.first_mismatch;
    EXPECT_GT(v.replay_read_ahead, 0u);
    EXPECT_FALSE(validate_recorded(t, /*fewer_slots=*/1).ok);
    t.read_aheads.clear();
    EXPECT_FALSE(validate_recorded(t).ok);
}

// The trace's hits and misses are the engine's, prompt batches included: a routing wider than
// the slots flags what the shared slots held (prefill read-ahead's experts), not the slots.
TEST(RouteTraceRun, DefaultStoresTraceCountsTheRunsHitsAndMisses) {
    const RouteTrace t = read_ahead_trace();
    const json stats = json::parse(read_ahead_runs().traced.stats);
    uint64_t hits = 0, misses = 0, wide_hits = 0;
    std::vector<uint8_t> seen(t.header.n_expert, 0);
    for (size_t i = 0; i < t.routings.size(); ++i) {
        const TraceRouting & r = t.routings[i];
        const bool wide = distinct_experts(t, i) > t.header.slots_per_layer;
        for (uint64_t s = r.first_slot; s < r.first_slot + uint64_t(r.n_rows) * r.k; ++s) {
            const uint32_t e = uint32_t(t.expert[s]);
            if (seen[e]) continue;
            seen[e] = 1;
            const bool hit = t.flags[s] & kSlotResident;
            ++(hit ? hits : misses);
            wide_hits += wide && hit;
        }
        for (uint64_t s = r.first_slot; s < r.first_slot + uint64_t(r.n_rows) * r.k; ++s)
            seen[uint32_t(t.expert[s])] = 0;
    }
    EXPECT_GT(wide_hits, 0u);  // prefill read-ahead's hits in the shared slots are recorded
    EXPECT_EQ(hits, stats["cache_hits"].get<uint64_t>());
    EXPECT_EQ(misses, stats["cache_misses"].get<uint64_t>());
}

// Every slot is checked, the prompt batches' (routings wider than the slots, replayed on the
// shared slots' ledger) included; the control: one slot fewer per layer mismatches.
TEST(ReplayValidate, ChecksTheDefaultStoresPromptBatchesWiderThanTheSlots) {
    const RouteTrace t = read_ahead_trace();
    ASSERT_GT(t.header.slots_per_layer, 1u);
    size_t wide = 0;
    for (size_t i = 0; i < t.routings.size(); ++i)
        wide += distinct_experts(t, i) > t.header.slots_per_layer;
    ASSERT_GT(wide, 0u);
    size_t into_shared = 0;  // prefill read-ahead's calls into the shared slots
    for (const TraceReadAhead & a : t.read_aheads)
        into_shared += (a.flags & kReadAheadShared) && a.committed > 0;
    ASSERT_GT(into_shared, 0u);
    const ValidateReport v = validate_recorded(t);
    EXPECT_TRUE(v.ok) << v.first_mismatch;
    EXPECT_EQ(v.mismatches, 0u);
    EXPECT_EQ(v.slots_checked, t.expert.size());
    EXPECT_FALSE(validate_recorded(t, /*fewer_slots=*/1).ok);
}

// A wide routing's recorded miss turned into a hit is found, at that routing and slot.
TEST(ReplayValidate, FailsWhenAWideRoutingsRecordedMissIsTamperedWith) {
    RouteTrace t = read_ahead_trace();
    size_t victim = t.routings.size();
    uint64_t slot = 0;
    for (size_t i = 0; i < t.routings.size() && victim == t.routings.size(); ++i) {
        const TraceRouting & r = t.routings[i];
        if (distinct_experts(t, i) <= t.header.slots_per_layer) continue;
        for (uint64_t s = r.first_slot; s < r.first_slot + uint64_t(r.n_rows) * r.k; ++s)
            if (t.flags[s] == 0) {
                victim = i;
                slot = s;
                break;
            }
    }
    ASSERT_LT(victim, t.routings.size());
    t.flags[slot] = kSlotResident;
    const ValidateReport v = validate_recorded(t);
    EXPECT_FALSE(v.ok);
    EXPECT_NE(v.first_mismatch.find("routing #" + std::to_string(victim) + " at offset " +
                                    std::to_string(t.routings[victim].offset)),
              std::string::npos)
        << v.first_mismatch;
    EXPECT_NE(v.first_mismatch.find("recorded hit, replay miss"), std::string::npos)
        << v.first_mismatch;
}

// Format version 8 flagged a wide routing's experts by their slots: --validate refuses such a
// trace by name (the same trace as version 9 validates: the test above).
TEST(ReplayValidate, RefusesAVersion8FixedSlotTraceWithRoutingsWiderThanTheSlots) {
    RouteTrace t = read_ahead_trace();
    t.header.version = 8;
    Replayer rp(t);
    ReplayResult res;
    ValidateReport v;
    const Status st = rp.run(rp.recorded_setting(), &res, &v);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("version 8"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("needs version 9"), std::string::npos) << st.message();
    EXPECT_TRUE(rp.run(rp.recorded_setting(), &res).ok());  // a replay without --validate runs
}

TEST(ReplayValidate, FailsWhenOneRecordedHitIsTamperedWith) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string path = record(model, "--cache-mb 4 --force-cache", "tamper.trace");
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(path, &t).ok());
    // Flip the first decode miss to a hit.
    size_t victim = 0;
    uint64_t at = 0;
    for (size_t i = 0; i < t.routings.size() && !at; ++i) {
        const TraceRouting & r = t.routings[i];
        if (!r.decode) continue;
        for (uint32_t j = 0; j < r.k; ++j)
            if (t.flags[r.first_slot + j] == 0) {
                victim = i;
                at = r.offset + 28 + 8 * j + 3;
                break;
            }
    }
    ASSERT_GT(at, 0u);
    std::string data = slurp(path);
    data[size_t(at)] = char(kSlotResident);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
    CmdResult v = run_cmd(sh_quote(cli_bin()) + " replay " + sh_quote(path) + " --validate");
    EXPECT_EQ(v.exit_code, 1) << v.err;
    EXPECT_NE(v.err.find("routing #" + std::to_string(victim) + " at offset " +
                         std::to_string(t.routings[victim].offset)),
              std::string::npos)
        << v.err;
    EXPECT_NE(v.err.find("recorded hit, replay miss"), std::string::npos) << v.err;
    std::remove(path.c_str());
}

TEST(ReplayCli, SameTraceAndSettingsGiveTheSameNumbers) {
    const std::string model = synth_model("tiny", "olmoe", "q8_0");
    const std::string path = record(model, "--cache-mb 4 --force-cache", "det.trace");
    const std::string cmd = sh_quote(cli_bin()) + " replay " + sh_quote(path) +
                            " --budgets 0,1,2.5,4,8,64 --policy lru,lfu,belady --drop-cold 0,0.5,1 "
                            "--n-expert-used 4,3,2 --json";
    CmdResult a = run_cmd(cmd), b = run_cmd(cmd);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    json ja = json::parse(a.out), jb = json::parse(b.out);
    EXPECT_EQ(ja["results"].dump(), jb["results"].dump());  // "timing" differs, the numbers may not
    EXPECT_EQ(ja["results"].size(), 3u * 6u * 3u * 3u);
    // The recorded setting's row reproduces the run; the lossless rows discard nothing.
    for (const json & r : ja["results"]) {
        if (!r["lossy"].get<bool>()) {
            EXPECT_EQ(r["weight_mass_discarded"].get<double>(), 0.0);
            EXPECT_EQ(r["reads_avoided"].get<double>(), 0.0);
        } else {
            EXPECT_GT(r["weight_mass_discarded"].get<double>(), 0.0) << r.dump();
        }
    }
    // Belady never loses to LRU on a recorded trace either (same budget, lossless).
    for (const json & x : ja["results"])
        for (const json & y : ja["results"])
            if (x["policy"] == "belady" && y["policy"] == "lru" &&
                x["budget_bytes"] == y["budget_bytes"] && !x["lossy"].get<bool>() &&
                !y["lossy"].get<bool>()) {
                EXPECT_GE(x["hits"].get<uint64_t>(), y["hits"].get<uint64_t>()) << x["budget_mib"];
            }
    std::remove(path.c_str());
}

TEST(ReplayCli, UsageErrorsAndPlot) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string path = record(model, "--cache-mb 4 --force-cache", "cli.trace");
    const std::string bin = sh_quote(cli_bin()) + " replay " + sh_quote(path);
    EXPECT_EQ(run_cmd(bin + " --n-expert-used 9").exit_code, 64);
    EXPECT_EQ(run_cmd(bin + " --policy fifo").exit_code, 64);
    EXPECT_EQ(run_cmd(bin + " --drop-cold 1.5").exit_code, 64);
    EXPECT_EQ(run_cmd(bin + " --budgets x").exit_code, 64);
    CmdResult txt = run_cmd(bin + " --budgets 1,4");
    EXPECT_EQ(txt.exit_code, 0) << txt.err;
    EXPECT_NE(txt.out.find("reads_avoided"), std::string::npos) << txt.out;
    EXPECT_NE(txt.err.find("M routings/s"), std::string::npos) << txt.err;

    if (run_cmd("/usr/bin/python3 -c 'import matplotlib'").exit_code != 0) {
        std::remove(path.c_str());
        GTEST_SKIP() << "python3-matplotlib not installed: --plot not tested";
    }
    const std::string png = tmp_path("plot.png");
    CmdResult p =
        run_cmd(bin + " --budgets 0,1,2,4,8 --policy lru,belady --drop-cold 0,0.5,1 --plot " +
                sh_quote(png));
    EXPECT_EQ(p.exit_code, 0) << p.err;
    const std::string img = slurp(png);
    ASSERT_GT(img.size(), 1000u);
    EXPECT_EQ(img.substr(1, 3), "PNG");
    std::remove(png.c_str());
    std::remove(path.c_str());
}

// --- The warm-start estimate (estimate_warm_start, replay --warm-split) ---

TEST(Replay, WarmStartRaisesTheHitRateOfTheFirstTokensAfterTheSplit) {
    const RouteTrace t = synthetic_30b(128, 7);
    ReplaySetting s;
    s.budget_bytes = 4000ull << 20;
    WarmEstimate w;
    ASSERT_TRUE(estimate_warm_start(t, s, 64, 16, &w).ok());
    EXPECT_EQ(w.tokens, 16u);
    EXPECT_EQ(w.lookups, 16u * 48 * 8);
    EXPECT_GT(w.experts_preloaded, 0u);
    EXPECT_LE(w.bytes_preloaded, s.budget_bytes / 10 * 9);
    EXPECT_GT(w.warm_hits, w.cold_hits);
    EXPECT_GT(w.warm_hit_pct, w.cold_hit_pct);
}

// The control: the first part routes only experts 64..127 and the rest only 0..63, so what
// is preloaded is never routed after the split: no hit is gained.
TEST(Replay, WarmStartLearnedFromOtherExpertsGainsNothing) {
    RouteTrace t = synthetic_30b(128, 7);
    for (const TraceRouting & r : t.routings)
        for (uint64_t j = 0; j < uint64_t(r.n_rows) * r.k; ++j) {
            int32_t & e = t.expert[r.first_slot + j];
            e = r.graph < 64 ? 64 + e % 64 : e % 64;
        }
    ReplaySetting s;
    s.budget_bytes = 4000ull << 20;
    WarmEstimate w;
    ASSERT_TRUE(estimate_warm_start(t, s, 64, 16, &w).ok());
    EXPECT_GT(w.experts_preloaded, 0u);
    EXPECT_EQ(w.warm_hits, w.cold_hits);
}

TEST(Replay, WarmStartRefusesLossySettingsAndASplitPastTheTrace) {
    const RouteTrace t = synthetic_30b(8, 7);
    ReplaySetting s;
    s.budget_bytes = 4000ull << 20;
    WarmEstimate w;
    EXPECT_EQ(estimate_warm_start(t, s, 8, 16, &w).code(), ErrorCode::kUsage);
    s.drop_cold = 0.5;
    EXPECT_EQ(estimate_warm_start(t, s, 4, 4, &w).code(), ErrorCode::kUsage);
    s.drop_cold = 0;
    EXPECT_TRUE(estimate_warm_start(t, s, 4, 4, &w).ok()) << "control";
}

}  // namespace
