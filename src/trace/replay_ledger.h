// replay_ledger.h — the expert ledger `moestream replay` runs a trace through: the engine's
// ExpertLedger (expert_ledger.h) over the simulated back-end, shaped like the recording's
// cache (the recording machine's page size, each tensor's page phase and slice bytes, whole
// chunks when the recorded cache recycled pages: TraceHeader::cache_chunks).
//
// Invariant: for a trace recorded by the engine, make_replay_ledger(h, kLru, budget) makes the
// engine cache's decisions for the same routings (tests/unit/test_replay.cpp compares them).
// Thread-safety: pure functions; the ledger they build is used from one thread.
#pragma once

#include <cstdint>
#include <memory>

#include "expert_ledger.h"
#include "moestream/replay.h"
#include "moestream/route_trace.h"

namespace moestream {

// Per MoE layer of the trace, the page placement of each projection's expert slices.
LedgerShape replay_ledger_shape(const TraceHeader & h);

// The eviction policy behind a replay policy name.
std::unique_ptr<EvictionPolicy> make_replay_policy(ReplayPolicy p);

// A ledger of `budget_bytes` over the simulated back-end; slots_per_layer > 0: in slot mode,
// the fixed-slot cache's (expert_ledger.h), lru only; else budget 0: in shared mode, the cache
// off's shared slots (make_shared_slots).
std::unique_ptr<ExpertLedger> make_replay_ledger(const TraceHeader & h, ReplayPolicy p,
                                                 uint64_t budget_bytes,
                                                 uint32_t slots_per_layer = 0);

}  // namespace moestream
