// eviction_policy.h — which live expert the expert ledger (expert_ledger.h) gives up when a
// commit does not fit the budget.
//
// A policy orders the live (layer, expert) ids of one ledger; the ledger tells it every event
// (admitted, hit, released, end of a stage) and asks it for a victim, which must be an id the
// ledger calls evictable() (resident, not routed in the stage being staged). The policy keeps
// its own order only: it never decides residency, costs or the budget.
//
// lru (the engine's, and the replay's default): evict the least recently admitted or hit.
// lfu: evict the lowest routing count since the ledger was built (counts survive eviction),
// ties by least recent stage, then lowest id.
// belady: evict the expert whose next routing is farthest in the future (the caller passes the
// routing index of each routed expert's next use); the offline optimum for equal-size experts.
//
// Invariants: an id is known to the policy from admit() to remove(); victim() returns such an
// id or kNone. Per event the work is O(1) (lru) or O(log live) (lfu, belady), and nothing is
// allocated once the policy has seen its working set.
// Thread-safety: none; owned and called by one ledger.
#pragma once

#include <cstdint>
#include <memory>

namespace moestream {

class ExpertLedger;

class EvictionPolicy {
public:
    static constexpr uint32_t kNone = UINT32_MAX;
    // next_use for an expert whose next routing is unknown or never comes.
    static constexpr uint32_t kNever = UINT32_MAX;

    virtual ~EvictionPolicy() = default;
    // Forgets everything; ids are then 0 .. n_ids - 1.
    virtual void reset(uint32_t n_ids) = 0;
    // id became live (committed for a routing, or by a prefetch) in stage generation `gen`;
    // next_use: routing index of its next routing (belady only).
    virtual void admit(uint32_t id, uint64_t gen, uint32_t next_use) = 0;
    // id, live, was routed again (a hit) in stage generation `gen`.
    virtual void hit(uint32_t id, uint64_t gen, uint32_t next_use) = 0;
    // id was released (evicted or abandoned): no longer live.
    virtual void remove(uint32_t id) = 0;
    // The stage (or prefetch) that admitted or hit ids has made all its decisions.
    virtual void end_stage() {}
    // The live id to evict next among those ledger.evictable(id) allows; kNone if none.
    virtual uint32_t victim(const ExpertLedger & ledger) = 0;
};

std::unique_ptr<EvictionPolicy> make_lru_policy();
std::unique_ptr<EvictionPolicy> make_lfu_policy();
std::unique_ptr<EvictionPolicy> make_belady_policy();

}  // namespace moestream
