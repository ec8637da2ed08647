// expert_ledger.h — the bookkeeping of the expert cache: which (MoE layer, expert) is absent,
// pending or resident, what the live ones cost against the budget, and which one goes when a
// commit does not fit. Pure state: it holds no expert memory. The engine's LruCache
// (residency_cache.cpp) is a ledger plus a memory back-end (reservations, page commits, the
// page pool); the fixed-slot cache (slot_cache.cpp) is a ledger in slot mode plus its slot
// memory; `moestream replay` (replay.cpp) is a ledger plus the simulated back-end (no
// LedgerBackend: every commit succeeds). Each store and its replay therefore make the same
// decisions for the same routing.
//
// Slot mode (LedgerShape::slots_per_layer K > 0; the kv-cells of llama.cpp's kv-cache split):
// every MoE layer has K slots and a live expert holds one (slot_map()). A layer only evicts its
// own experts: a miss takes a free slot, else the slot least recently stamped and not stamped
// by the stage being made (ties: the lowest slot), never a pending expert's. Every routed
// expert of a stage shares one stamp; prefetch_slots() and warm() stamp from the same clock.
// There is no byte budget: the K slots are the capacity (a stage wider than K fails; the
// fixed-slot cache sends wider routings to its shared slots and never stages them here).
//
// Shared mode (LedgerShape::shared; the cache off's shared slots, make_shared_slots): nothing
// stays resident beyond the staged layer. stage() first releases every live expert but those
// of the staged layer that prefetch() read ahead (the hits), and at its end the read-ahead
// experts it did not route; prefetch() first releases the earlier read-ahead. A live expert
// costs its slice bytes; there is no budget (the shared slots hold any routed set), so nothing
// is evicted, no stage is over budget and no miss is a reread. would_hit() is true only for a
// read-ahead expert not routed since.
//
// States per (layer, expert) id: absent; pending (committed, its reads handed out by the
// current stage() or prefetch()); resident. A stage's pending experts become resident when the
// next stage() begins (failed reads are reported through abandon_stage() before that);
// prefetched ones at end_prefetch(true).
//
// stage(moe, experts), the algorithm both back-ends share:
//  1. promote the previous stage's pending experts to resident;
//  2. stamp the routed experts with a new stage generation: stamped or pending experts are
//     never victims;
//  3. per distinct routed expert, in order: resident = a hit (the policy is told); else a miss:
//     evict (victim chosen by the EvictionPolicy) until committing it fits the budget, then
//     commit it through the back-end; a commit refused with ENOMEM/EAGAIN lets the back-end
//     free memory the ledger does not count, else evicts one more, and retries; once it
//     succeeds the budget shrinks to what is committed; with nothing left to evict the stage
//     is abandoned and fails;
//  4. a stage that ends above budget (its routed set alone is larger) is counted.
// Costs are page-granular through PageLayout (page_layout.h): the pages of the expert's slices
// that no other live expert of the same tensor covers, or, when the back-end recycles pool
// chunks (LedgerShape::whole_chunks), one whole chunk per projection.
//
// Invariants: committed_bytes() = the costs of the commits minus those of the releases, each
// computed when it happens (a page two live experts share is counted once); committed <=
// max(budget, the staged routed set) after every stage();
// every array is indexed by id and sized at construction, so stage() allocates nothing once
// the pending lists have reached their working size.
// Thread-safety: none; one thread at a time (the eval callback, or one replay).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "eviction_policy.h"
#include "page_layout.h"
#include "status.h"

namespace moestream {

struct StageStats {
    uint64_t lookups = 0;  // (layer, expert) routings looked up
    uint64_t hits = 0;     // already resident: no read
    uint64_t misses = 0;   // read from the file
};

// Read-ahead (streamer.h, "Prefetch"): experts read ahead of their routing.
struct ReadAheadStats {
    uint64_t prefetched = 0;        // experts committed by prefetch()
    uint64_t prefetch_used = 0;     // of those, routed while still resident (a hit)
    uint64_t prefetch_unused = 0;   // of those, released without being routed
    uint64_t prefetch_skipped = 0;  // predicted, absent, not prefetched (no room, commit refused)
};

// Counters of a ledger since construction: its decisions, read-ahead's included. Byte
// figures are page-granular (or whole chunks).
struct LedgerStats : ReadAheadStats {
    uint64_t lookups = 0;             // routed (layer, expert) looked up by stage()
    uint64_t hits = 0;                // resident already: no read
    uint64_t misses = 0;              // committed and read
    uint64_t evictions = 0;           // resident experts released to make room
    uint64_t rereads = 0;             // misses of experts that had been resident and were evicted
    uint64_t abandoned = 0;           // experts released because their reads failed
    uint64_t over_budget_stages = 0;  // stages that ended above budget (routed set > budget)
    uint64_t commit_failures = 0;     // commits the back-end refused (ENOMEM/EAGAIN)
    uint64_t budget_shrinks = 0;      // times a refused commit lowered the budget
    uint64_t resident_experts = 0;    // (layer, expert) pairs live now (pending or resident)
    uint64_t resident_expert_bytes = 0;  // bytes committed for expert data now
    uint64_t peak_resident_bytes = 0;    // max of resident_expert_bytes since construction
    uint64_t budget_bytes = 0;           // the budget now (built with; lower after a shrink)
};

// What the ledger's experts are made of: per MoE layer, the page placement of each projection
// tensor (all tensors of a layer have the same n_expert).
struct LedgerShape {
    std::vector<std::vector<PageLayout>> layers;
    uint64_t page_bytes = 4096;  // the smallest budget a shrink leaves
    // A live expert costs one whole chunk (PageLayout::chunk_pages) per projection instead of
    // its exclusive pages: the back-end recycles page pool chunks (page_pool.h).
    bool whole_chunks = false;
    // > 0: slot mode (see the top of this file), K slots per MoE layer; a live expert costs its
    // slice bytes. 0: one byte budget over every layer, victims chosen by the EvictionPolicy.
    uint32_t slots_per_layer = 0;
    // Shared mode (see the top of this file): nothing stays resident beyond the staged layer.
    // Excludes slots_per_layer > 0.
    bool shared = false;
};

// Where the memory is. Calls come from inside the ledger's stage(), prefetch(),
// abandon_stage() and end_prefetch(), with the ledger's state as described per call.
class LedgerBackend {
public:
    virtual ~LedgerBackend() = default;
    // Makes expert e of MoE layer moe hold memory; the ledger still says absent (its live
    // neighbours are as they will be). On failure nothing stays committed, *err is the errno
    // (ENOMEM/EAGAIN: the system refused; the ledger evicts and retries).
    virtual Status commit(uint32_t moe, uint32_t e, int * err) = 0;
    // Gives back expert e's memory; the ledger still says live. park: evicted by stage() or
    // prefetch(), so a commit of the same call may take the memory over.
    virtual void release(uint32_t moe, uint32_t e, bool park) = 0;
    // After a refused commit: frees memory the ledger does not count (free pool chunks).
    // True if it freed some (then the commit is retried before anything is evicted).
    virtual bool free_uncounted() { return false; }
    // The budget was lowered from `was` to `now` bytes after refused commits.
    virtual void budget_shrunk(uint64_t /*was*/, uint64_t /*now*/) {}
};

// Sees every decision (white-box tests compare the engine's cache with the replay).
class LedgerObserver {
public:
    virtual ~LedgerObserver() = default;
    virtual void lookup(uint32_t moe, uint32_t e, bool hit) = 0;  // one per distinct routed expert
    virtual void evicted(uint32_t moe, uint32_t e) = 0;           // a victim, before its release
    virtual void stage_done(uint32_t moe, uint64_t committed_bytes) = 0;  // stage() succeeded
};

class ExpertLedger {
public:
    // Every layer of `shape` needs at least one tensor, all with n_expert > 0, and the total
    // (layer, expert) count must be < 2^32 - 1 (the caller validates its model). budget > 0.
    // `backend` must outlive the ledger; nullptr = the simulated back-end of `moestream
    // replay`: no memory, every commit succeeds.
    ExpertLedger(const LedgerShape & shape, uint64_t budget_bytes,
                 std::unique_ptr<EvictionPolicy> policy, LedgerBackend * backend);
    ExpertLedger(const ExpertLedger &) = delete;
    ExpertLedger & operator=(const ExpertLedger &) = delete;

    size_t n_layers() const { return layers_.size(); }
    uint32_t n_expert(uint32_t moe) const { return layers_[moe].n_expert; }
    // Pending or resident.
    bool live(uint32_t moe, uint32_t e) const { return state_[id_of(moe, e)] != kAbsent; }
    // Whether a stage() of MoE layer moe now would find expert e resident (a hit; includes an
    // expert whose prefetch reads are outstanding): live, and in shared mode read ahead by
    // prefetch() and not routed since.
    bool would_hit(uint32_t moe, uint32_t e) const {
        const uint32_t id = id_of(moe, e);
        return state_[id] != kAbsent && (!shared_ || prefetched_[id]);
    }
    bool shared() const { return shared_; }
    // Whether id may be evicted now: resident and not routed in the stage being staged.
    bool evictable(uint32_t id) const { return state_[id] == kResident && stamp_[id] != gen_; }
    uint64_t committed_bytes() const { return committed_; }
    uint64_t budget_bytes() const { return budget_; }
    // Counters, with the current residency, bytes and budget filled in.
    LedgerStats stats() const;

    // The pages [*q0, *q1) of expert e's slice of tensor t (of layer moe) that no other live
    // expert of that tensor covers: what committing or releasing e commits or frees there.
    void exclusive_pages(uint32_t moe, size_t t, uint32_t e, uint64_t * q0, uint64_t * q1) const;

    // The stage algorithm above, for the routed `experts` of MoE layer moe (ids < n_expert(moe),
    // duplicates allowed and looked up once). next_use[e]: routing index of expert e's next
    // routing (belady; nullptr otherwise). Adds the lookups, hits and misses to *stats.
    // Fails (and abandons the stage) when a commit fails for good, or while prefetch reads
    // are open.
    Status stage(uint32_t moe, const std::vector<uint32_t> & experts, const uint32_t * next_use,
                 StageStats * stats);
    // The experts committed by the last stage(), in commit order (their reads are due);
    // all of MoE layer staged_layer().
    const std::vector<uint32_t> & staged() const { return pending_; }
    uint32_t staged_layer() const { return pending_moe_; }
    // The last stage()'s reads failed: its pending experts are released, never resident.
    void abandon_stage();
    // Releases expert e of layer moe: resident, or committed by the last stage() once its
    // reads are done (call it between stages); false if it was neither.
    bool forget(uint32_t moe, uint32_t e);

    // Commits the absent ones among `experts` of MoE layer moe ahead of their routing, while
    // each fits the budget by evicting only evictable experts (never above the budget, never
    // a budget shrink). They stay pending (never victims) until end_prefetch(); stage()
    // refuses to run meanwhile. Ids out of range are skipped. Returns how many it committed.
    // may_evict false: free room only (nothing is evicted; the warm set's preload).
    size_t prefetch(uint32_t moe, const std::vector<uint32_t> & experts, bool may_evict = true);
    // The experts committed by the open prefetch(), in commit order; of layer prefetch_layer().
    const std::vector<uint32_t> & prefetching() const { return prefetch_pending_; }
    uint32_t prefetch_layer() const { return prefetch_moe_; }
    // The prefetch reads finished: ok = they all succeeded (resident), else released.
    void end_prefetch(bool ok);
    // The prefetch reads stopped early: the first n_read experts of prefetching() were read
    // (resident), the rest never were (released, and not counted as prefetched).
    void end_prefetch_first(size_t n_read);

    void set_observer(LedgerObserver * o) { observer_ = o; }

    // --- Slot mode (LedgerShape::slots_per_layer > 0). ---
    uint32_t slots_per_layer() const { return k_slots_; }
    // Per expert id of MoE layer moe (n_expert(moe) entries): its slot, -1 when absent.
    const int32_t * slot_map(uint32_t moe) const { return slot_of_.data() + layers_[moe].first_id; }
    // Commits the absent ones among `experts` of MoE layer moe into its slots ahead of their
    // routing (as prefetch(), pending until end_prefetch()): the guessed experts already
    // slotted are stamped, each absent one takes the victim slot; with may_evict false only
    // free slots are taken. warm (the warm set's preload): free slots only, the guess's
    // slotted experts are not stamped (only what is placed is). Stops at the first expert
    // without a slot. Ids out of range are skipped. Returns how many it committed
    // (prefetching()).
    size_t prefetch_slots(uint32_t moe, const std::vector<uint32_t> & experts, bool may_evict,
                          bool warm = false);
    // Makes expert e of MoE layer moe resident at once (its bytes are copied into the slot by
    // the caller, no read), stamped as the most recent: returns the slot it took, -1 when it
    // was slotted already (only stamped), -2 when no slot may be taken (or e is out of range).
    // Not while a stage's or a prefetch's reads are due.
    int32_t warm(uint32_t moe, uint32_t e);

private:
    enum : uint8_t { kAbsent = 0, kPending = 1, kResident = 2 };
    struct Layer {
        uint32_t n_expert = 0;
        uint32_t first_id = 0;     // id of expert 0
        std::vector<PageLayout> tensors;
        bool fixed_cost = false;   // every expert costs fixed_bytes (whole pages or chunks)
        uint64_t fixed_bytes = 0;
    };

    uint32_t id_of(uint32_t moe, uint32_t e) const { return layers_[moe].first_id + e; }
    // Bytes committing expert e (absent) would add, or releasing it (live) would free.
    uint64_t cost(uint32_t moe, uint32_t e) const {
        const Layer & L = layers_[moe];
        return L.fixed_cost ? L.fixed_bytes : exclusive_bytes(moe, e);
    }
    // The bytes of the pages of e that no other live expert covers, over all its tensors.
    uint64_t exclusive_bytes(uint32_t moe, uint32_t e) const;
    // Marks absent expert e of layer moe pending, charged `bytes`.
    void admit(uint32_t moe, uint32_t e, uint64_t bytes);
    // Releases live expert e through the back-end and marks it absent.
    void release(uint32_t moe, uint32_t e, bool park);
    // Evicts the policy's victim; false if there is none.
    bool evict_one();
    // Commits absent expert e of the staged layer, evicting and shrinking the budget as the
    // stage algorithm says.
    Status commit_miss(uint32_t moe, uint32_t e);
    // Shared mode: releases every live expert of MoE layers pending_moe_ and prefetch_moe_ (the
    // only ones that can have any) but those of layer keep_moe read ahead and not routed since
    // (keep_moe -1: none kept).
    void shared_release(int64_t keep_moe);

    std::vector<Layer> layers_;
    std::unique_ptr<EvictionPolicy> policy_;
    LedgerBackend * backend_;  // nullptr: simulated
    LedgerObserver * observer_ = nullptr;
    uint64_t budget_;     // lowered when the back-end refuses a commit
    bool shared_ = false; // shared mode (LedgerShape::shared)
    uint64_t page_bytes_;
    uint32_t n_ids_ = 0;
    std::vector<uint8_t> state_;      // kAbsent / kPending / kResident
    std::vector<uint8_t> ever_;       // was resident once (a later miss is a reread)
    std::vector<uint8_t> prefetched_; // committed by prefetch, not routed since
    std::vector<uint32_t> id_layer_;  // MoE layer of an id
    std::vector<uint64_t> stamp_;     // stage generation that last routed the id
    std::vector<uint64_t> done_;      // stage generation that last looked the id up
    uint64_t gen_ = 0;
    uint64_t committed_ = 0;
    uint64_t live_ = 0;
    std::vector<uint32_t> pending_;   // experts of layer pending_moe_ committed by the last stage
    uint32_t pending_moe_ = 0;
    std::vector<uint32_t> prefetch_pending_;  // experts of layer prefetch_moe_, reads outstanding
    uint32_t prefetch_moe_ = 0;
    LedgerStats stats_;

    // Slot mode: the slot of each id (-1 absent), per layer and slot its expert (-1 free) and
    // stamp (slot_clock_ when last routed, prefetched or warmed; 0 free).
    uint32_t k_slots_ = 0;
    std::vector<int32_t> slot_of_;
    std::vector<int32_t> occupant_;     // [moe * k_slots_ + s]
    std::vector<uint64_t> slot_stamp_;  // [moe * k_slots_ + s]
    uint64_t slot_clock_ = 0;
    // The victim slot of layer moe for a commit stamped `now`: a free slot, else the least
    // recently stamped one not stamped `now` whose expert is not pending, the lowest expert id
    // among equal stamps (never the slot order: which expert goes must not depend on where
    // experts sit); -1 if none.
    int32_t slot_victim(uint32_t moe, uint64_t now) const;
    // Expert e of layer moe takes slot s (its occupant evicted first), stamped now, charged.
    void slot_place(uint32_t moe, uint32_t e, int32_t s, uint64_t now);
    // Slot mode's commit of a miss of the stage stamped `now`: the victim slot, its occupant
    // evicted; fails (and abandons the stage) when every slot is routed now or pending.
    Status commit_slot(uint32_t moe, uint32_t e, uint64_t now);
};

}  // namespace moestream
