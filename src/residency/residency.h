// residency.h — where expert bytes live in RAM, and which routed experts need a read.
//
// The streamer binds every expert tensor (layer, projection) to an address range owned by a
// ResidencyStore, with expert e at its canonical offset e * slice_bytes, so llama.cpp's
// MUL_MAT_ID finds routed experts where it expects them. stage() is called for a layer with
// the experts routed to it (distinct, validated ids) and returns the reads that must happen
// before the layer's expert matmul may run.
//
// SharedSlots (cache off, --cache-mb 0): one buffer per projection, sized for the largest
// layer's tensor, shared by all layers (one layer computes at a time). Every routed slice is
// re-read every time. RAM for experts = one layer's expert tensors. Its bookkeeping is an
// ExpertLedger in shared mode (expert_ledger.h: nothing stays beyond the staged layer).
//
// LruCache (--cache-mb N, residency_cache.cpp, docs/cache.md): an ExpertLedger
// (expert_ledger.h: states, costs, the stage algorithm, LRU victims) over a memory back-end.
// Every (layer, projection) has its own reserved, lazily committed address range; a routed
// expert already resident is a
// hit (no read), a miss is committed, read and kept; over budget, the least recently used
// (layer, expert) not routed in the layer being staged is evicted and its pages released.
// Committed expert memory <= max(budget, the staged layer's routed set).
// Pages come from a pool of recycled memfd chunks by default (page_pool.h): an evicted
// expert's pages are mapped under the next miss instead of freed and zero-filled again.
// A commit the system refuses (mprotect/mmap ENOMEM/EAGAIN) evicts more and retries, and the
// budget shrinks to what could be committed; only when nothing is left to evict does stage()
// fail (the request fails cleanly, nothing staged stays resident, the store stays usable).
//
// Thread-safety: called from the eval callback only (one thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "expert_ledger.h"
#include "moestream/gguf_index.h"
#include "io_lanes.h"
#include "status.h"

namespace moestream {

// The LRU cache's memory back-end (ResidencyStore::paged_memory(); docs/cache.md,
// "Metrics"): its pages and its page pool. Byte figures are page-granular: pages actually
// committed for expert data, a page shared by two experts counted once.
struct PageStats {
    uint64_t reserved_bytes = 0;         // address space reserved (not RAM)
    uint64_t page_bytes = 0;             // commit granularity (CacheTestHooks::page_bytes)
    bool page_protect = false;           // released pages are PROT_NONE (else: flat mapping)
    // Pages recycled through the page pool (page_pool.h) rather than committed fresh for
    // every miss. Then a live expert costs whole pool chunks (PageLayout::chunk_pages) and
    // the byte figures count chunks.
    bool recycle_pages = false;
    uint64_t recycled_commits = 0;  // projection slices mapped onto an earlier expert's pages
    // Of those, slices whose pages were moved (mremap) from the expert evicted for them, page
    // tables and all, instead of unmapped there and mapped (and populated) anew here.
    uint64_t moved_commits = 0;
    bool move_pages = false;        // moves in use now (off after the kernel refused one)
    // Slices mapped by commit_deferred() (split staging) while the routing's earlier reads ran.
    uint64_t deferred_commits = 0;
    uint64_t pool_bytes = 0;        // RAM the pool may hold: chunks in use + free chunks
    uint64_t pool_leaked_chunks = 0;  // kept out of use after a failed unmap or page move
};

// The page pool's warm-up (CacheOptions::warm_pool; page_pool.h): bytes planned and
// zero-filled up front, the thread's wall time (once it has ended), the errno that stopped it
// (0: none), and slices whose commit took a warmed chunk (not counted in recycled_commits).
struct PoolWarmStats {
    uint64_t planned_bytes = 0;
    uint64_t bytes = 0;
    double seconds = 0;
    int error = 0;
    uint64_t warmed_commits = 0;
};

// The fixed slots' (SlotPlacement::slot_stats(); docs/cache.md, "Fixed slots").
struct SlotStats {
    uint32_t slots_per_layer = 0;   // expert slots per MoE layer
    uint64_t warm_copies = 0;       // experts copied into slots by warm_slots() (no reads)
    double warm_s = 0;              // wall time of those copies, seconds
};

// The LRU cache's memory back-end, as its counters see it (ResidencyStore::paged_memory()).
class PagedMemory {
public:
    virtual ~PagedMemory() = default;
    virtual PageStats page_stats() const = 0;
    virtual PoolWarmStats pool_warm_stats() const = 0;
};

// How the LRU cache gets its pages (production settings; docs/cache.md).
struct CacheOptions {
    // With page protection: take the pages of a miss from the page pool (page_pool.h), where
    // evicted experts leave theirs, instead of committing fresh zero-filled anonymous pages.
    // false = `--cache-no-recycle`, for A/B benchmarks. Falls back to fresh pages when
    // memfd_create is unavailable.
    bool recycle_pages = true;
    // With recycled pages: when a miss takes the chunk of an expert evicted in the same
    // stage() and needs the same pages of it, move that mapping to the new address with
    // mremap(MREMAP_DONTUNMAP) instead of unmapping it there and mapping it (MAP_POPULATE)
    // here: the page-table entries move instead of being torn down and refilled, and there is
    // one TLB shootdown instead of two. false = `--cache-no-move`, for A/B benchmarks. Turns
    // itself off when the kernel refuses the flag (Linux < 5.13 for shared mappings).
    bool move_pages = true;
    // With recycled pages: warm the pool up front (page_pool.h, "Warm-up"). A low-priority
    // thread started with the store zero-fills up to the budget's worth of new chunks while
    // the engine reads the dense weights; commits take its completed chunks (mapped
    // populated) instead of new ones faulted in by the read lanes, and the first commit that
    // finds none ready stops it. Nothing waits for it. Lossless; opt-in, as the engine's
    // RunOptions::pool_warm (MOESTREAM_POOL_WARM=1), an experiment for A/B benchmarks. An error
    // (ENOMEM, ENOSPC) stops the warm-up, never the run.
    bool warm_pool = false;
};

// Debug knobs of the LRU cache (docs/cache.md, "Debug mode"; `--cache-debug`).
struct CacheDebug {
    // Fill freshly committed pages with 0xFF (NaN for f32/f16/bf16, NaN scales for the
    // quantized types) before their read, so an expert used without being read poisons the
    // output instead of silently computing on stale or zero bytes. Under Mapping::kAuto,
    // poison or check_residency select page protection: released pages are PROT_NONE, so a
    // stray access to a released or never-loaded expert faults.
    bool poison = false;
    // Make verify_resident() check (store state + mincore + a poison scan) instead of
    // returning Ok.
    bool check_residency = false;

    // How the reservations are mapped. kAuto: page-protected (PROT_NONE until committed)
    // unless vm.max_map_count could be exhausted by the worst-case number of mappings, then
    // flat (read-write, never touched until committed; release = MADV_DONTNEED only).
    enum class Mapping { kAuto, kProtect, kFlat };
    Mapping mapping = Mapping::kAuto;
};

// Test hooks of the LRU cache: nothing in production sets them.
struct CacheTestHooks {
    // Plant one bug, once, at the first stage() where it applies, so tests can show
    // verify_resident() catches it. kForgetRead: the first miss is marked resident but its
    // reads are not returned. kDropRouted: the first hit's pages are released (state left
    // saying resident). kLeaveParked: the first moved chunk's old range (the evicted
    // expert's address) is left mapped instead of reserved PROT_NONE again.
    enum class Fault { kNone, kForgetRead, kDropRouted, kLeaveParked };
    Fault fault = Fault::kNone;
    // A commit that would take committed expert memory above this many bytes fails with
    // ENOMEM, as mprotect does when the system refuses (RLIMIT_DATA, strict overcommit,
    // vm.max_map_count). 0 = off. See "Failed commits" in docs/reliability.md.
    uint64_t commit_limit_bytes = 0;
    // Sees every decision of the cache's ledger (must outlive the store).
    LedgerObserver * observer = nullptr;
    // The page size the cache commits, releases and accounts in: 0 = the system's
    // (system_page_bytes()); else a power of two that is a multiple of it. Tests set it to run
    // the page arithmetic at 16 KiB and 64 KiB pages on a 4 KiB host.
    uint64_t page_bytes = 0;
    // With CacheOptions::warm_pool: the cache's construction waits until the pool's warm-up
    // has done its whole plan (PagePool::finish_warm(false)), so the first misses take warmed
    // chunks whatever the machine's load (the warm-up's byte-identity test).
    bool warm_pool_wait = false;
};

// Split staging (docs/cache.md, "Split staging"): the LRU cache's (ResidencyStore::
// split_staging()).
class SplitStaging {
public:
    virtual ~SplitStaging() = default;
    // stage() that commits, for the misses, only the slices of the tensors in `now_mask`
    // (bit t: tensor t of the layer) and leaves the others to commit_deferred(). Evictions,
    // and every decision, happen here as in stage(); *reads gets every read of the routing
    // (their destinations are the canonical addresses), but a read of a slice left for later
    // may start only once commit_deferred() returned Ok for its tensor. *deferred: whether
    // anything was left for later (false: committed at once, as stage()).
    virtual Status stage_split(size_t moe_idx, const std::vector<uint32_t> & experts,
                               uint64_t now_mask, std::vector<ReadRequest> * reads,
                               StageStats * stats, bool * deferred) = 0;
    // Commits the slices stage_split() left for later, of the tensors in `mask`; touches no
    // page of any other tensor, nor of any slice whose read may already run. On failure the
    // caller stops the routing's reads and abandons the stage (abandon_stage).
    virtual Status commit_deferred(size_t moe_idx, uint64_t mask) = 0;
};

// Where a store placed a layer's experts when not at their canonical offsets: the fixed
// slots' (make_slot_cache; docs/cache.md, "Fixed slots"; ResidencyStore::slot_placement()).
class SlotPlacement {
public:
    virtual ~SlotPlacement() = default;
    // Slots per layer and the warm copies so far.
    virtual SlotStats slot_stats() const = 0;
    // Where the last stage() of MoE layer moe_idx placed its experts. nullptr: at their
    // canonical offsets in tensor_base(). Else, per expert id (n_expert entries), the slot
    // index the expert's slices sit at (-1: not in a slot), relative to placement_base(): the
    // graph's expert ids must be rewritten to these slots before the layer's matmuls read them.
    virtual const int32_t * slot_map(size_t moe_idx) const = 0;
    // Base address expert tensor t of MoE layer moe_idx must point at for the matmuls of the
    // last stage() of that layer: tensor_base() unless that stage used slots.
    virtual uint8_t * placement_base(size_t moe_idx, size_t t) = 0;
    // The warm start (and the entry point of any preload into the slots): fills MoE layer
    // moe_idx's slots with `recent_first` (most recent first; only the first slots-per-layer
    // count) by copying them from the shared slots where the layer's last stage() put them: a
    // wide routing (a prompt ubatch) warms the slots the next narrow routings (decode) will
    // use, without reads. Copies only while those shared slots still hold that stage's experts
    // (no later stage or prefetch has reused them); experts already slotted keep their slot
    // and become the most recent. Call after the layer's matmuls. Returns the experts copied
    // (0: nothing to do, or the shared slots were reused).
    virtual size_t warm_slots(size_t moe_idx, const std::vector<uint32_t> & recent_first) = 0;
};

// Every store: the core every caller needs; what only one store has is reached through
// split_staging() and slot_placement() (nullptr: the store has none).
class ResidencyStore {
public:
    virtual ~ResidencyStore() = default;
    // Base address that expert tensor `t` of MoE layer `moe_idx` is bound to.
    virtual uint8_t * tensor_base(size_t moe_idx, size_t t) = 0;
    // Appends the reads needed to make `experts` of MoE layer `moe_idx` resident.
    virtual Status stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                         std::vector<ReadRequest> * reads, StageStats * stats) = 0;
    // Reports that the reads of the last stage() failed: nothing staged may count as
    // resident afterwards.
    virtual void abandon_stage(size_t moe_idx) = 0;
    // Bytes of RAM the store holds for expert data now.
    virtual uint64_t resident_bytes() const = 0;
    virtual uint64_t reserved_bytes() const = 0;
    // Whether expert `e` of MoE layer `moe_idx` is resident now (a routing of it would hit;
    // includes the experts whose reads the last stage() handed out).
    virtual bool is_resident(size_t moe_idx, uint32_t e) const = 0;
    // Per expert of `experts` (distinct, as stage() gets them), whether a stage() of them now
    // would find it resident (a hit): is_resident(), but on the fixed slots, which read a
    // routing wider than the slots into the shared slots (hits: what was read ahead there).
    virtual void stage_hits(size_t moe_idx, const std::vector<uint32_t> & experts,
                            std::vector<uint8_t> * hit) const {
        hit->resize(experts.size());
        for (size_t i = 0; i < experts.size(); ++i) (*hit)[i] = is_resident(moe_idx, experts[i]);
    }
    // Speculative reads ahead of a routing (streamer.h, "Prefetch"): appends the reads that make
    // the absent ones among `experts` of MoE layer moe_idx resident, while that fits the
    // budget by evicting only experts that are neither routed in the last stage() nor being
    // prefetched now (never above the budget: a prediction is not worth it). Returns how many
    // experts it will read. Until end_prefetch() is_resident() reports them (their reads are
    // outstanding), none of them can be a victim, and stage() refuses to run. A store may
    // read nothing ahead (the shared slots of cache-off hold one layer at a time, unless
    // built with two sets).
    virtual size_t prefetch(size_t moe_idx, const std::vector<uint32_t> & experts,
                            std::vector<ReadRequest> * reads) = 0;
    // The prefetch reads finished: ok = they all succeeded (the experts become resident), else
    // they are released (a later routing reads them again and reports any error).
    virtual void end_prefetch(bool ok) = 0;
    // What the last prefetch() did to the ledger, for the route trace (route_trace.h): ledger
    // false when it did not call the ledger (nothing read ahead, nothing released); else the
    // experts it committed, in commit order, and shared = they went to the shared slots of a
    // store with fixed slots. Valid until the next prefetch() or end_prefetch().
    struct ReadAheadCall {
        bool ledger = false;
        bool shared = false;
        const std::vector<uint32_t> * experts = nullptr;
    };
    virtual ReadAheadCall last_read_ahead() const { return {}; }
    // The ledger's counters since construction (the shared slots: their read-ahead counters
    // only, the rest 0).
    virtual LedgerStats ledger_stats() const = 0;
    // Bytes of the store's memory advised for transparent huge pages (SlotOptions::huge_pages,
    // accepted by the kernel; it may still back some with 4 KiB pages): the fixed slots' and
    // the shared slots'.
    virtual uint64_t huge_page_bytes() const { return 0; }
    // The warm set's preload (streamer.h, "Warm set"): as prefetch(), but into free room only
    // (free budget, free slots of the layer; never evicting anything, never into the shared
    // slots): on a full store it reads nothing. 0: the store has no room for it.
    virtual size_t prefetch_free(size_t /*moe_idx*/, const std::vector<uint32_t> & /*experts*/,
                                 std::vector<ReadRequest> * /*reads*/) {
        return 0;
    }
    // The open prefetch's reads were stopped early (IoLanes::stop_claims): its first n_read
    // experts, in the order their reads were appended, were read in full and become resident;
    // the rest are released as never read. end_prefetch(true) when n_read covers them all.
    virtual void end_prefetch_first(size_t /*n_read*/) { end_prefetch(false); }

    // --- What only some stores have. ---
    // Releases resident expert e of MoE layer moe_idx now, so that its next routing reads it
    // again (--miss-fallback: its slot holds a lossy copy). Not while a stage's or prefetch's
    // reads are due. Returns whether it was resident (a store that keeps nothing: false).
    virtual bool forget(size_t /*moe_idx*/, uint32_t /*e*/) { return false; }
    // Debug check, meant to be called after the reads of stage(moe_idx, experts) completed
    // and before the layer's matmul runs: every routed expert's slices are resident. Returns
    // Ok without checking unless the store was built with CacheDebug::check_residency, so
    // the caller may call it unconditionally.
    virtual Status verify_resident(size_t /*moe_idx*/, const std::vector<uint32_t> & /*experts*/) {
        return Status::Ok();
    }
    // The LRU cache's split staging; nullptr: stage() only.
    virtual SplitStaging * split_staging() { return nullptr; }
    // The fixed slots' placement; nullptr: every expert at its canonical offset.
    virtual SlotPlacement * slot_placement() { return nullptr; }
    // The LRU cache's memory back-end (pages, page pool); nullptr: the store has none.
    virtual const PagedMemory * paged_memory() const { return nullptr; }

    // Where expert e's slice of tensor t of MoE layer moe_idx sits after the last stage().
    uint8_t * slice_addr(size_t moe_idx, size_t t, uint32_t e, uint64_t slice_bytes) {
        SlotPlacement * p = slot_placement();
        const int32_t * m = p ? p->slot_map(moe_idx) : nullptr;
        const uint64_t i = m ? uint64_t(m[e] < 0 ? 0 : m[e]) : uint64_t(e);
        return (m ? p->placement_base(moe_idx, t) : tensor_base(moe_idx, t)) + i * slice_bytes;
    }
};

// Cache off: shared per-projection slots, re-read on every routing. two_sets: a second set
// (one more layer of expert memory) for prefill read-ahead: MoE layer m is bound to set m % 2,
// and prefetch() reads whole experts of a layer into its set ahead of its routing.
// huge_pages: advise the slots for transparent huge pages (SlotOptions::huge_pages).
std::unique_ptr<ResidencyStore> make_shared_slots(const ModelIndex & index, Status * st,
                                                  bool two_sets = false, bool huge_pages = true);
// Bytes of one set of make_shared_slots' slots (every projection of the largest layer).
uint64_t shared_slot_set_bytes(const ModelIndex & index);
// The ledger shape of the shared slots (shared mode, expert_ledger.h); replay_ledger.h builds
// the same one from a cache-off trace's header.
LedgerShape shared_ledger_shape(const ModelIndex & index);

// Fixed slots (the default store of a cache budget where it can run; docs/cache.md): every
// MoE layer gets the same number of expert slots K, allocated and populated once (in the
// background where the kernel can), never remapped. A routing of at most K distinct experts
// is staged into the layer's slots (LRU within the layer: hits keep their slot, misses are
// read into the least recently used slot not routed now) and slot_map() tells the graph which
// slot holds which expert; a wider routing (a prompt ubatch) goes to shared slots at
// canonical offsets, as with the cache off (two sets when two_sets: prefill read-ahead, whose
// prefetch() reads into the other set; when every expert has a slot, into free slots). A
// prefetch() of one token's guess (at most n_expert_used experts: decode's --prefetch) is
// read into the layer's slots, evicting its least recently used ones.
// Invariant: the slots and the shared slots together take at most budget_bytes. Fails
// (Status) when K would be below the routing width n_expert_used or memory cannot be had.
// The slots per MoE layer make_slot_cache would give `budget_bytes`, with one or two sets of
// shared slots taken from it (0 when they do not fit); it refuses fewer than
// index.n_expert_used.
uint32_t slot_cache_slots(const ModelIndex & index, uint64_t budget_bytes, bool two_sets);
// The ledger shape of the fixed-slot cache with `slots_per_layer` slots (slot mode,
// expert_ledger.h); replay_ledger.h builds the same one from a trace's header.
LedgerShape slot_ledger_shape(const ModelIndex & index, uint32_t slots_per_layer);
// How the fixed-slot cache gets its memory (production settings; docs/cache.md).
struct SlotOptions {
    // Map the slots and the shared slots 2 MiB-aligned and advise them for transparent huge
    // pages (huge_pages.h). Lossless; false = MOESTREAM_HUGEPAGES=0, for A/B benchmarks.
    bool huge_pages = true;
    // How the slots' pages get their page-table entries before first use (docs/cache.md,
    // "Fixed slots"): a background thread under SCHED_IDLE, running only on otherwise idle
    // cores (kIdle, the default), or at nice +10 (kNice); kOff = not at all: reads and copies
    // fault the pages in. MOESTREAM_SLOT_POPULATE=idle|nice|off, for A/B benchmarks.
    // Lossless either way.
    enum class Populate { kNice, kIdle, kOff };
    Populate populate = Populate::kIdle;
    // The mode's name in MOESTREAM_SLOT_POPULATE and settings.cache_slot_populate.
    static constexpr const char * name(Populate p) {
        return p == Populate::kIdle ? "idle" : p == Populate::kOff ? "off" : "nice";
    }
};
// Test hooks of the fixed-slot cache: nothing in production sets them.
struct SlotTestHooks {
    // warm_slots() records its experts as slotted but copies nothing (the slots keep what
    // they held): the negative control of the warm copy.
    bool warm_skip_copy = false;
    // prefetch() into slots records its experts as slotted but reads nothing (the slots keep
    // what they held): the negative control of reading ahead into slots.
    bool prefetch_skip_read = false;
};
std::unique_ptr<ResidencyStore> make_slot_cache(const ModelIndex & index, uint64_t budget_bytes,
                                                bool two_sets, Status * st,
                                                const SlotTestHooks & test = {},
                                                const SlotOptions & opt = {});

// LRU cache with a budget of `budget_bytes` of committed expert memory (> 0). Reserves
// address space for every expert tensor (no RAM). `index` must outlive the store.
std::unique_ptr<ResidencyStore> make_lru_cache(const ModelIndex & index, uint64_t budget_bytes,
                                               const CacheOptions & opt, const CacheDebug & dbg,
                                               Status * st, const CacheTestHooks & test = {});

}  // namespace moestream
