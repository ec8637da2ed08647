// streamer.h — turns each MoE layer's routing into reads: the "load" step of the design.
//
// On every routing (RouterHook -> on_routing) it takes the distinct experts over all rows of
// the ubatch (prefill routes the union of its tokens' experts), asks the ResidencyStore
// which of them need a read, and reads those slices over the I/O lanes into their canonical
// offsets before returning — i.e. before the layer's expert matmul runs.
//
// Overlap (on unless --no-io-overlap, --cache-debug or a single lane): the down projection
// is needed only by the layer's last expert matmul. So on_routing() orders the reads gate/up
// first, returns once those are done and leaves the down reads in flight on the worker lanes
// while gate/up compute; finish_pending() waits for them. The overlap waiter (overlap_waiter.h,
// a router hook observer) calls it at the node feeding the down matmul (learned from the
// graph) or, failing that, in ask mode at the down MUL_MAT_ID itself — always before that
// matmul runs. Nothing stays pending across graphs: the hook drains after every llama_decode.
//
// Three-stage overlap (set_overlap_stages(3), the engine's default, MOESTREAM_OVERLAP_STAGES;
// with the overlap on and a layer with separate gate and up tensors): the prefix is only the
// projection whose MUL_MAT_ID computes first in the graph (learned by the overlap waiter and
// handed over with set_first_projection(); until then, and for merged gate_up tensors, the two
// stages above).
// on_routing() orders the reads first projection, second projection, down; returns once the
// first projection's are done; finish_second() waits for the second's (the waiter calls it at
// the node computed just before the second matmul, learned from the graph, or in ask mode at
// that matmul), finish_pending() for the rest, as above.
//
// Split staging (set_stage_split; MOESTREAM_STAGE_SPLIT; with a worker lane, no
// --miss-fallback, and a store that supports it: the cache with recycled pages,
// docs/cache.md, "Split staging"): on_routing() stages with stage_split(), which commits
// only the first stage's slices of the misses (evictions and every decision included),
// starts the batch with the later stages held back (IoLanes' release watermark), then
// commits the second projection's slices, releases their reads, commits down's, releases the
// rest. A read is released only after every page it writes is mapped; a failed commit stops
// the batch before any unreleased read and fails the routing like a failed read.
//
// Prefetch (prefetch.h, a router hook observer; opt-in, --prefetch, with a cache): at a
// one-token routing the predictor hands over the experts predicted for the next MoE layer. on_routing()
// asks the store to commit the absent ones (within the budget, never evicting this layer's
// routed set) and appends their reads to this layer's batch as a tail: the lanes read it after
// every own read, while the layer's matmuls and the next layer's attention compute.
// finish_pending() waits for the own reads only; the next on_routing() (or drain(), at the end
// of the graph) waits for the tail, then the store keeps the experts (or releases them if a
// read failed: the routing reads them again and reports the error). So a routed expert is
// always complete before its matmul, and no read is in flight while the store stages.
// With a UringTail (uring_tail.h) the tail is not read by the lanes: finish_pending() submits
// it through io_uring once the own reads are in, and the next routing reaps it; if the ring
// refuses, the lanes read it as above.
//
// Prefill read-ahead (opt-in, set_prefill_readahead; docs/prefetch.md, "Prefill read-ahead"):
// a multi-row routing (a prompt ubatch) routes nearly every expert of every layer, so at layer
// L's routing the whole bank of the next MoE layer (never the last MoE layer, which computes
// only the ubatch's output rows) is handed to the store's prefetch() as the guess; the store skips what is resident (or, for the shared slots, reads into the other of
// its two slot sets) and the reads go as a tail exactly like a decode prefetch above, with the
// same waits and the same invariants. With per-row guesses (MOESTREAM_PREFILL_GUESS=rows) the
// predictor hands over the union of the ubatch rows' guesses for the next MoE layer
// (set_prefetch, as in decode), and that union is the guess instead of the bank.
//
// Warm set (set_warm; --warm-experts, docs/prompt-cache.md, "Warm expert set"): per MoE layer
// a list of experts, hottest first, that earlier runs routed. At a routing that hands the
// store no other speculative read (no decode prefetch, no prefill read-ahead), the next MoE
// layer (in order, wrapping) whose list is not done gets the next experts of its list that
// are not resident committed through the store's prefetch_free() (free room only: the warm
// set never evicts anything, so on a full store it stops) and read as a tail exactly like a
// decode prefetch's (same invariants): after every own read of the routing, on the worker
// lanes, while the layer computes. Never through io_uring: the tail must be stoppable. At the
// next routing (or drain()) the tail is stopped where the lanes are (IoLanes::stop_claims):
// the reads in flight finish, the unstarted ones are dropped and their experts released
// (end_prefetch_first), so the next routing's own reads wait for at most one slice per worker
// lane. How many experts a tail asks for follows what the window took: a tail read in full
// asks for half as many again next time, a stopped one for what was read (at least 1); a
// prompt-ubatch routing (long compute) asks for the layer's whole remaining list. The test
// hook warm_tail_experts fixes the count and reads every tail in full (deterministic counts).
// A list is done when it is read or the store takes no more of it. Lossless: it only
// changes what is resident. Usage (set_record_usage): per (MoE layer, expert), the decode
// (one-row) routings that routed it, for the usage file.
//
// Warm preload (start_preload; the engine starts it as soon as the store exists, before the
// dense weights are read): the warm lists read before the first routing, on a thread of the
// streamer's own, in rounds over the MoE layers (each round the next n_expert_used experts of
// every list, so the hottest of every layer come first): per layer and round one
// prefetch_free() of those absent experts (free room only, as above) read as one batch
// on the preload's lanes (set_preload_lanes: lanes of its own, so the engine's dense read
// goes on meanwhile on the streamer's; the thread is the batch's lane 0). It runs while
// nothing else uses the store (the rest of open, the prompt-cache restore, tokenization, a
// server waiting for its first request). The first begin_step() (before any graph runs)
// stops it with stop_preload(): the batch is stopped where the lanes are (IoLanes::stop_claims
// from this thread; the reads in flight finish, at most one slice per lane, the rest are
// dropped and their experts released), the thread is joined, and the warm tails above take the
// lists from where it stopped. The preload holds preload_mu_ whenever it uses the store (not
// while its lanes read); another thread reads the store's figures meanwhile only through
// with_store_quiet(); every other use of the store is on the decode thread after the join. The test
// hook warm_preload_wait makes start_preload() return only when the preload is done (no stop:
// deterministic counts); warm_preload_off turns it off (the tails only).
//
// Accounting per token (decode step): bytes and reads issued, time blocked on reads,
// token demand (distinct expert bytes routed over all layers) and layer demand (the widest
// layer's routed bytes). See docs/metrics.md.
//
// Thread-safety: driven from the llama_decode thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "moestream/gguf_index.h"
#include "io_lanes.h"
#include "residency.h"
#include "router_hook.h"

namespace moestream {

class MissFallback;
class RouteTracer;
class UringTail;

struct StepCounters {
    uint64_t bytes_read = 0;
    uint64_t reads = 0;
    double io_s = 0;
    uint64_t demand_bytes = 0;        // distinct routed expert bytes, summed over layers
    uint64_t layer_demand_bytes = 0;  // max over layers
    uint64_t lookups = 0, hits = 0, misses = 0;
    uint64_t routings = 0;        // layers routed
    uint64_t prefetch_bytes = 0;  // bytes the speculative tails transferred
    double prefetch_wait_s = 0;   // time blocked finishing a tail (part of io_s)
    double stage_s = 0;           // time in the store's stage(), prefetch(), end_prefetch()
                                  // and abandon_stage() (commits, evictions, page mapping;
                                  // not part of io_s)
    double max_read_s = 0;        // the longest single read waited for (the lanes' reads; the
                                  // io_uring tail's are not timed)
};

// Test-only behaviour, off by default; the engine fills it from its environment knobs
// (src/engine/env_knobs.h), never production code.
struct StreamTestHooks {
    static constexpr int kAllExperts = -2;
    // After the reads of graph layer corrupt_layer, flip bytes of expert corrupt_expert's
    // first-projection slice whenever it is routed (kAllExperts: every routed expert of that
    // layer): the gates' negative control, proving the byte-identity comparison can fail.
    int corrupt_layer = -1;   // -1 = off
    int corrupt_expert = -1;
    // finish_second() returns without waiting (the reads stay in flight until the down wait):
    // the negative control of the three-stage overlap's second wait.
    bool skip_second_wait = false;
    // > 0: every warm tail asks for exactly this many experts and is read in full, never
    // stopped (above, "Warm set"): counts that do not depend on timing. 0 = adaptive.
    int warm_tail_experts = 0;
    // The warm preload (above, "Warm preload"): start_preload() waits until it is done
    // (deterministic: nothing is stopped), or does not start it (off).
    bool warm_preload_wait = false;
    bool warm_preload_off = false;
};

class Streamer final : public RouteSink {
public:
    Streamer(const ModelIndex & index, ResidencyStore * store, IoLanes * lanes,
             bool overlap = false);
    ~Streamer() override;  // stops the warm preload
    // Prefetch tails through io_uring (null: through the worker lanes). Not owned.
    void set_uring(UringTail * u) { uring_ = u; }
    // Prefill read-ahead: at a multi-row routing, prefetch the next MoE layer's whole bank.
    // Needs a worker lane (ignored with one) and a store that can hold it (prefetch() > 0).
    void set_prefill_readahead(bool on) { prefill_ra_ = on; }

    Status on_routing(const Routing & r) override;
    bool has_pending() const override { return pending_slot_ >= 0; }
    Status finish_pending() override;
    bool has_pending_second() const override { return second_pending_ && pending_slot_ >= 0; }
    Status finish_second() override;
    void set_first_projection(int proj) override { first_proj_ = proj; }
    // 2: the prefix is gate and up (the class's default); 3: only the first projection (above).
    void set_overlap_stages(int n) { stages_ = n; }
    // Split staging (above): with a worker lane and a store that supports it.
    void set_stage_split(bool on) { split_ = on; }
    void set_prefetch(uint32_t il, const std::vector<uint32_t> & experts) override;
    // Warm set (above): lists[m] = MoE layer m's experts to read ahead, hottest first (one
    // list per MoE layer; anything else turns the warm set off).
    void set_warm(std::vector<std::vector<uint32_t>> lists);
    // Experts the warm preload and tails read (whole). Decode thread, after stop_preload().
    uint64_t warm_experts() const { return warm_experts_; }
    // Of those, read by the preload (before the first routing).
    uint64_t warm_preloaded() const { return warm_preloaded_; }
    // Experts of the warm lists never made resident so far: neither a warm read nor a
    // routing read them (the preload stopped, the tails did not reach them, no free room).
    // Decode thread, after stop_preload().
    uint64_t warm_not_read() const;
    // Warm preload (above): starts reading the warm lists on the preload thread (nothing
    // without a warm set or a worker lane, or with the test hook off; with the wait hook it
    // returns when the preload is done). Call once, before the first begin_step().
    void start_preload();
    // Stops the preload where the lanes are and joins its thread (above); idempotent. Before
    // anything else uses the store or the lanes.
    void stop_preload();
    // f() with the store quiet: while the preload runs, under the lock it holds whenever it
    // uses the store, so f may read the store's figures from another thread (the engine's
    // settings while a server waits for its first request). Not from the preload itself.
    template <class F>
    auto with_store_quiet(F && f) const {
        std::lock_guard<std::mutex> lk(preload_mu_);
        return f();
    }
    // The lanes the preload reads on (null: the streamer's own; not owned). Lanes of its own
    // let it run while the streamer's lanes read something else (the engine's dense read).
    void set_preload_lanes(IoLanes * l) { preload_lanes_ = l; }
    // Counts decode routings per (MoE layer, expert) from now on (usage()).
    void set_record_usage(bool on);
    // [moe_layer * n_expert + e]: decode routings that routed e (empty unless recording).
    const std::vector<uint32_t> & usage() const { return usage_; }
    uint64_t usage_routings() const { return usage_routings_; }  // decode routings counted
    Status drain() override;
    bool is_resident(uint32_t il, int32_t e) const override;
    uint64_t expert_bytes(uint32_t il) const override;

    // Step accounting: begin_step() zeroes the current step's counters (and completes the
    // abandon of a failed stage: no graph is running between steps).
    void begin_step() {
        stop_preload();  // (no graph may run beside the preload)
        step_ = StepCounters{};
        flush_abandon();  // (its store time counts for this step)
    }
    const StepCounters & step() const { return step_; }
    const StepCounters & total() const { return total_; }
    // Every slice read by the lanes so far, as read times (the dense read at load included:
    // take differences of snapshots).
    ReadLatencySnapshot read_latency() const { return lanes_->read_latency().snapshot(); }

    void set_test_hooks(const StreamTestHooks & h) { hooks_ = h; }

    // --miss-fallback (miss_fallback.h): low-bit experts of a routing are read from the
    // companion and converted into their slots instead of read in full. Not owned.
    void set_fallback(MissFallback * f) { fallback_ = f; }

    // --route-trace: report every stage (which staged experts were resident, bytes read).
    void set_tracer(RouteTracer * t) { tracer_ = t; }

    // Maps a graph layer index il to the MoE layer slot, -1 if the layer is dense.
    int moe_slot(uint32_t il) const { return il < layer_to_moe_.size() ? layer_to_moe_[il] : -1; }

private:
    void corrupt_for_test(int slot);
    void flush_abandon();
    void end_prefetch(bool ok);  // store_->end_prefetch, timed as stage_s (and traced)
    // store_->prefetch(m, experts, &reads_), the call traced (RouteTracer::on_read_ahead).
    size_t read_ahead(size_t m, const std::vector<uint32_t> & experts);
    void add_stage_s(double s) {
        step_.stage_s += s;
        total_.stage_s += s;
    }
    void finish_tail();  // waits for the speculative tail, then the store keeps or drops it
    // Stops the warm tail in flight where the lanes are and keeps what was read (above).
    void stop_warm_tail();
    void add_tail_io(const IoBatchStats & io);  // a finished tail's reads, into the counters
    // Appends a warm-set tail (above) after the routing of MoE layer `slot` with `rows` rows.
    void warm_tail(int slot, int rows);
    void preload_run();  // the preload thread's body
    // After a warm read of MoE layer m's `experts` ended: those now resident count as in.
    void mark_warm_in(size_t m, const std::vector<uint32_t> & experts);
    // Orders reads_[0, n) by stage (early, second, late); returns the early and second counts
    // via *n_early and *n_mid (early + second). Sets early_tensor_.
    void order_stages(const MoeLayer & L, size_t n, size_t * n_early, size_t * n_mid);
    // Whether L's reads go in three stages; then the first and second projections' tensors.
    bool three_stages(const MoeLayer & L, int * t_first, int * t_second) const;
    // The tensors (bit t) whose reads order_stages puts in the early and second stages (the
    // rest, down, is late).
    void stage_masks(const MoeLayer & L, uint64_t * early, uint64_t * mid) const;

    const ModelIndex & index_;
    ResidencyStore * store_;
    IoLanes * lanes_;
    std::vector<int> layer_to_moe_;
    std::vector<uint8_t> seen_;       // per expert, scratch for the distinct set
    std::vector<uint32_t> experts_;   // distinct routed experts, scratch
    std::vector<ReadRequest> reads_;  // scratch
    RouteTracer * tracer_ = nullptr;
    std::vector<uint8_t> was_resident_;  // per staged expert, scratch (tracing only)
    StepCounters step_, total_;
    int abandon_slot_ = -1;  // a failed stage to abandon once no graph can read it
    bool overlap_ = false;
    int stages_ = 2;
    bool split_ = false;           // split staging (set_stage_split)
    int first_proj_ = -1;          // learned graph order (Projection), -1 = not yet
    bool second_pending_ = false;  // the pending batch's second-stage reads are not waited for
    size_t early_tensor_ = 0;      // the tensor whose slices the prefix holds (negative control)
    // The stage whose late reads are in flight (-1: none), with what its accounting needs.
    int pending_slot_ = -1;
    uint32_t pending_layer_ = 0;
    int pending_rows_ = 0;
    uint64_t pending_demand_ = 0;
    StageStats pending_ss_;
    IoBatchStats pending_io_;
    Status pending_err_;  // the early wait's failure (the batch is already finished)
    // Prefetch: the hint for the next routing, and whether the batch in flight has a tail.
    int64_t hint_layer_ = -1;
    std::vector<uint32_t> hint_;
    bool tail_ = false;  // the lanes' batch in flight has a tail (or is one)
    UringTail * uring_ = nullptr;
    bool uring_tail_ = false;            // a tail is in flight on the ring
    std::vector<ReadRequest> pf_reads_;  // the tail when it goes through the ring (or its
                                         // fallback batch on the lanes)
    StreamTestHooks hooks_;
    bool prefill_ra_ = false;
    std::vector<uint32_t> bank_;  // 0..n_expert-1: the prefill read-ahead guess
    // Warm set: per MoE layer, the list and how far it was taken; experts handed to prefetch().
    std::vector<std::vector<uint32_t>> warm_;
    std::vector<size_t> warm_pos_;
    size_t warm_left_ = 0;  // layers whose list is not done
    uint64_t warm_experts_ = 0;
    uint64_t warm_preloaded_ = 0;
    std::vector<uint8_t> warm_in_;  // [m * n_expert + e]: a warm read or a routing read it
    // The warm preload: its thread, the stop (guarded by preload_mu_: the thread starts a
    // batch only under it, so a stop either finds the batch on the lanes or keeps it from
    // starting), its batch and its reads (merged into total_ when joined).
    std::thread preload_;
    IoLanes * preload_lanes_ = nullptr;
    mutable std::mutex preload_mu_;  // also held by the preload whenever it uses the store
    bool preload_stop_ = false;
    std::vector<ReadRequest> preload_reads_;
    std::vector<uint32_t> preload_chunk_;
    uint64_t preload_bytes_ = 0, preload_count_ = 0;
    double preload_max_read_s_ = 0;
    // The warm tail in flight (tail_ is set): its experts, the index of its first read in
    // reads_, and the reads per expert. warm_ask_: experts the next decode tail asks for.
    bool warm_open_ = false;
    size_t warm_issued_ = 0, warm_tail_at_ = 0, warm_reads_per_ = 1;
    size_t warm_tail_m_ = 0;  // its MoE layer (its experts: warm_chunk_)
    size_t warm_ask_ = 1;
    std::vector<uint32_t> warm_chunk_;  // scratch
    std::vector<uint32_t> usage_;
    uint64_t usage_routings_ = 0;
    MissFallback * fallback_ = nullptr;
    std::vector<uint8_t> fb_flags_;  // per distinct expert: from the low-bit copy (scratch)
};

}  // namespace moestream
