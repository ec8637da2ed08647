// run_plan.h — every combination rule of a streaming run in one pure function: resolve(options,
// model index, what the machine offers) -> RunPlan; the engine then only wires what the plan
// says (engine.cpp, make_store). Each choice is recorded with its reason; `settings.plan` in
// every output is the plan printed (RunPlan::choices).
//
// Registry -> plan -> build: RunOptions (the registry's fields, settings.h, the environment
// overlaid) and the model index go in; resolve decides the cache budget, the store (fixed
// slots / LRU / shared slots), the second set of shared slots, overlap and its stages, staged
// reads, split staging, prefill read-ahead and its guess, decode prefetch and its reader, the
// observers the router hook needs, the lossy knobs in effect; or refuses, by name, a
// combination that cannot run. Nothing here allocates, reads the model or the environment.
// Thread-safety: pure; the plan is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moestream/gguf_index.h"
#include "moestream/moestream.h"
#include "moestream/status.h"
#include "moestream/sysinfo.h"

namespace moestream {

// What the machine and the already-open parts offer (inputs of resolve beside the options).
struct PlanInputs {
    MemoryAvailability mem;         // the memory available now (after the context is made)
    uint64_t page_bytes = 4096;     // the system page size
    int n_lanes = 1;                // read lanes opened (the calling thread included)
    bool direct = false;            // the lanes read with O_DIRECT
    bool io_fault_planted = false;  // a test fault plan is installed at the lanes
    bool no_budget_clamp = false;   // MOESTREAM_DEBUG_NO_BUDGET_CLAMP (tests only)
    std::string n_ctx_reason;       // how RunOptions::n_ctx was chosen ("" = requested)
    std::string n_batch_reason;     // how RunOptions::n_batch was chosen ("" = requested)
};

// One decision: what was chosen and why (settings.plan).
struct PlanChoice {
    std::string name;    // "store", "prefetch_io", ...
    std::string value;   // "fixed slots", "io_uring", ...
    std::string reason;  // one line
};

struct RunPlan {
    enum class Store { kSharedSlots, kFixedSlots, kLru };  // kSharedSlots: the cache off
    uint32_t k_eff = 0;                                    // experts per token
    int n_ctx = 0;                                         // the context length, tokens
    int n_batch = 0;                                       // prompt tokens per decode
    uint64_t needs_bytes = 0;           // what the run needs besides the cache (the budget's input)
    uint64_t budget_bytes = 0;          // the cache budget; 0 = off
    std::string budget_reason;          // decide_cache_budget's line
    bool budget_clamped = false;        // an explicit budget lowered to the memory limit
    bool budget_clamp_skipped = false;  // MOESTREAM_DEBUG_NO_BUDGET_CLAMP ignored the limit
    Store store = Store::kSharedSlots;
    std::string store_reason;         // why the LRU cache holds the budget, not fixed slots
    bool slot_two_sets = false;       // fixed slots: two sets of shared slots in the budget
    bool two_slot_sets = false;       // cache off: a second set of shared slots
    std::string two_slots_refused;    // why not, though wanted ("" = not refused)
    bool prefill_ra_wanted = false;   // RunOptions::prefill_readahead 1, or -1 where it applies
    std::string prefill_ra_off;       // why it does not apply (-1), else ""
    bool prefill_readahead = false;
    bool row_guess = false;           // prefill read-ahead guesses per ubatch row
    bool overlap = false;             // down reads overlap gate/up compute
    bool decode_prefetch = false;     // next-layer prefetch in decode
    std::string prefetch_off;         // why prefetch asked for is off ("" = not)
    bool predictor = false;           // a RoutePredictor is made (prefetch or row guesses)
    bool want_uring = false;          // the prefetch tail through io_uring (if it opens)
    bool use_check = false;           // --cache-debug's check of the experts each matmul reads
    bool lossy = false;               // a lossy knob is in effect
    std::vector<PlanChoice> choices;  // every decision with its reason, in order
};

// The context length and the prompt batch of a run, with how each was chosen: as requested,
// or for RunOptions::n_ctx 0 the model's context capped by mem (model_context), for
// RunOptions::n_batch 0 the batch for mem and that context (choose_n_batch; run_config.h).
struct ContextChoice {
    int n_ctx = 0;               // tokens
    int n_batch = 0;             // prompt tokens per decode
    std::string n_ctx_reason;    // "requested" or how it was chosen
    std::string n_batch_reason;  // "requested" or how it was chosen
};
ContextChoice resolve_context(const RunOptions & opt, const ModelIndex & index,
                              const MemoryAvailability & mem);

// The plan for these options, model and inputs: Ok, or kUsage naming the options
// (`RunOptions::<field>`) that cannot run together. The context and batch are resolve_context's
// with in.mem where opt leaves them 0 (RunPlan::n_ctx, n_batch; the plan's first two choices);
// an engine that chose them before the load passes them in opt, with in.n_*_reason.
Status resolve(const RunOptions & opt, const ModelIndex & index, const PlanInputs & in,
               RunPlan * plan);

// The prefill read-ahead part of resolve, needed before the load (the predictor estimate
// follows it): *why says why it does not apply when -1 leaves it off.
bool prefill_readahead_wanted(const RunOptions & opt, std::string * why);

// What the fixed-slot cache cannot run with, by name (Ok: it can run).
Status check_slot_cache(const RunOptions & opt, const ModelIndex & index);

}  // namespace moestream
