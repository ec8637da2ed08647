// run_plan.cpp — see run_plan.h.
#include "run_plan.h"

#include <nlohmann/json.hpp>

#include "moestream/cache_budget.h"
#include "moestream/settings.h"
#include "prefetch.h"
#include "residency.h"
#include "run_config.h"

namespace moestream {
namespace {

std::string mib_text(uint64_t b) {
    return std::to_string((b + (1 << 19)) >> 20) + " MiB";
}

void choose(RunPlan * p, const std::string & name, const std::string & value,
            const std::string & reason) {
    p->choices.push_back({name, value, reason});
}

}  // namespace

bool prefill_readahead_wanted(const RunOptions & opt, std::string * why) {
    why->clear();
    if (opt.prefill_readahead != -1) return opt.prefill_readahead == 1;
    const Status st = check_prefill_readahead(opt);  // on where it applies (moestream.h)
    if (!st.ok()) *why = st.message();
    return st.ok();
}

Status check_slot_cache(const RunOptions & opt, const ModelIndex & index) {
    const char * other = !opt.miss_fallback.empty() ? "RunOptions::miss_fallback"
                         : opt.cache_debug            ? "RunOptions::cache_debug"
                         : !opt.cache_recycle         ? "RunOptions::cache_recycle = false"
                         : !opt.cache_move            ? "RunOptions::cache_move = false"
                         : opt.pool_warm              ? "RunOptions::pool_warm = true"
                                                      : nullptr;
    if (other != nullptr)
        return Status::Usage(std::string("the fixed-slot cache cannot be combined with ") + other);
    for (const TensorInfo & t : index.tensors)
        if (t.name.find("_exps.bias") != std::string::npos)
            return Status::Usage("the fixed-slot cache cannot run this model: " + t.name +
                                 " is added by expert id, which the slots would rewrite");
    return Status::Ok();
}

ContextChoice resolve_context(const RunOptions & opt, const ModelIndex & index,
                              const MemoryAvailability & mem) {
    ContextChoice c;
    c.n_ctx = opt.n_ctx;
    c.n_ctx_reason = "requested";
    if (c.n_ctx == 0) c.n_ctx = model_context(index, mem, &c.n_ctx_reason);
    c.n_batch = opt.n_batch;
    c.n_batch_reason = "requested";
    if (c.n_batch == 0) {
        RunOptions o = opt;
        o.n_ctx = c.n_ctx;  // the batch's cap
        c.n_batch = choose_n_batch(o, index, mem, &c.n_batch_reason);
    }
    return c;
}

Status resolve(const RunOptions & given, const ModelIndex & index, const PlanInputs & in,
               RunPlan * out) {
    RunPlan p;
    const ContextChoice ctx = resolve_context(given, index, in.mem);
    RunOptions opt = given;  // the context and batch chosen
    opt.n_ctx = p.n_ctx = ctx.n_ctx;
    opt.n_batch = p.n_batch = ctx.n_batch;
    p.k_eff = opt.n_expert_used > 0 ? uint32_t(opt.n_expert_used) : index.n_expert_used;
    choose(&p, "n_ctx", std::to_string(opt.n_ctx),
           given.n_ctx == 0 || in.n_ctx_reason.empty() ? ctx.n_ctx_reason : in.n_ctx_reason);
    choose(&p, "n_batch", std::to_string(opt.n_batch),
           given.n_batch == 0 || in.n_batch_reason.empty() ? ctx.n_batch_reason
                                                            : in.n_batch_reason);
    p.prefill_ra_wanted = prefill_readahead_wanted(opt, &p.prefill_ra_off);

    // Prefetch asked for and a worker lane to read the tail (a route trace records its calls).
    const bool prefetch_possible = opt.prefetch && in.n_lanes > 1;
    const bool row_guess_possible = p.prefill_ra_wanted && opt.prefill_guess == "rows";
    // Besides cached experts the run needs: dense weights, compute buffers not yet touched
    // (logits and activations of one batch), one layer's routed set above the budget, and
    // when a predictor can run its int8 router copies.
    const uint64_t predictor_est =
        prefetch_possible || row_guess_possible
            ? RoutePredictor::copy_bytes_for(index.moe_layers.size(), index.n_expert, index.n_embd)
            : 0;
    p.needs_bytes = auto_needs_bytes(index, uint32_t(opt.n_batch)) + predictor_est;
    MemoryAvailability mem = in.mem;
    if (in.no_budget_clamp && opt.cache_mb > 0) {
        p.budget_clamp_skipped = true;
        mem = MemoryAvailability{};
    }
    BudgetDecision d;
    Status st = decide_cache_budget(index, opt.cache_mb, opt.force_cache, p.needs_bytes, mem,
                                    in.page_bytes, &d);
    if (!st.ok()) return st;
    p.budget_bytes = d.budget_bytes;
    p.budget_reason = d.reason;
    p.budget_clamped = d.clamped;
    choose(&p, "cache_budget", d.budget_bytes ? mib_text(d.budget_bytes) : "off", d.reason);

    // The store: the fixed-slot cache where it can run (RunOptions::slot_cache "1": or a
    // refusal), else LRU; the shared slots when the cache is off. The fixed slots' shared
    // slots for prompt batches come out of the budget: two sets (prefill read-ahead) while
    // that leaves twice the routing width of slots per layer, else one.
    if (d.budget_bytes > 0 && opt.slot_cache == "0") {
        p.store = RunPlan::Store::kLru;
        p.store_reason = "RunOptions::slot_cache = 0";
    } else if (d.budget_bytes > 0) {
        Status why = check_slot_cache(opt, index);
        if (opt.slot_cache == "1" && !why.ok())
            return Status::Usage("RunOptions::slot_cache = 1: " + why.message());
        p.slot_two_sets = p.prefill_ra_wanted &&
                          slot_cache_slots(index, d.budget_bytes, true) >= 2 * index.n_expert_used;
        const uint32_t k = slot_cache_slots(index, d.budget_bytes, p.slot_two_sets);
        if (why.ok() && k < index.n_expert_used)
            why = Status::Usage("the budget holds " + std::to_string(k) +
                                " expert slots per MoE layer besides the shared slots, fewer "
                                "than the routing width " +
                                std::to_string(index.n_expert_used));
        // RunOptions::slot_cache "1" with too few slots: make_slot_cache refuses, naming the
        // budget needed.
        if (why.ok() || opt.slot_cache == "1") {
            p.store = RunPlan::Store::kFixedSlots;
        } else {
            p.store = RunPlan::Store::kLru;
            p.store_reason = why.message();
        }
    } else {
        // What the cache off will hold besides what is allocated now: the dense weights, read
        // next, and one layer's expert slots, which the routings fill. Less than that
        // available ends in an OOM kill mid-run: refuse now, before reading anything.
        const uint64_t slots = shared_slot_set_bytes(index);
        const uint64_t hold = index.dense_bytes_total + slots;
        if (mem.available_bytes > 0 && mem.available_bytes < hold)
            return Status::Usage(
                "the memory available cannot hold the run with the cache off: the dense "
                "weights (" +
                mib_text(index.dense_bytes_total) +
                ") and one layer's expert "
                "slots (" +
                mib_text(slots) + ") need " + mib_text(hold) + ", but " +
                mib_text(mem.available_bytes) + " is available (" + mem.source +
                ") once the context is made; lower RunOptions::n_ctx or RunOptions::n_batch, "
                "or run with more memory");
        // Prefill read-ahead and prefetch with the cache off: a second set of shared slots,
        // one layer of expert memory more, when what is available holds it besides what the
        // run needs.
        if (p.prefill_ra_wanted || prefetch_possible) {
            const uint64_t set = shared_slot_set_bytes(index);
            const uint64_t avail = mem.available_bytes;
            if (avail > 0 && avail < p.needs_bytes + 2 * set) {
                p.two_slots_refused = "cache off, and a second set of expert slots (" +
                                      mib_text(set) + ") does not fit: " + mib_text(avail) +
                                      " available (" + mem.source + "), the run needs " +
                                      mib_text(p.needs_bytes) + " and the first set " +
                                      mib_text(set);
            } else {
                p.two_slot_sets = true;
            }
        }
    }
    choose(&p, "store",
           p.store == RunPlan::Store::kFixedSlots ? "fixed slots"
           : p.store == RunPlan::Store::kLru      ? "lru"
                                                  : "shared slots (cache off)",
           p.store == RunPlan::Store::kFixedSlots
               ? std::string(p.slot_two_sets ? "two sets of shared slots in the budget"
                                             : "one set of shared slots in the budget")
           : p.store == RunPlan::Store::kLru ? p.store_reason
           : p.two_slot_sets                 ? "a second set of shared slots for read-ahead"
           : !p.two_slots_refused.empty()
               ? p.two_slots_refused
               : "one set of shared slots: no read-ahead wants a second");

    // The lossy knobs that need resident experts: with the cache off every lookup misses.
    if (opt.drop_cold > 0 && d.budget_bytes == 0)
        return Status::Usage(
            "RunOptions::drop_cold needs an expert cache: with the cache off every lookup "
            "misses, so the policy would silently become an unconditional cut of weakly "
            "weighted experts (" +
            d.reason + "). Give RunOptions::cache_mb " + std::to_string(cache_rule_min_mib(index)) +
            " or more (the cache rule: " + cache_rule_text(index) +
            "), or auto with enough memory");
    if (opt.substitute > 0 && d.budget_bytes == 0)
        return Status::Usage(
            "RunOptions::substitute needs an expert cache: with the cache off "
            "no expert is resident to substitute (" +
            d.reason + ")");
    p.use_check = opt.cache_debug && d.budget_bytes > 0;

    // Overlap of down reads with gate/up compute needs a worker lane, and stays off under
    // RunOptions::cache_debug, whose check must see every slice before the layer's first matmul.
    p.overlap = opt.io_overlap && !opt.cache_debug && in.n_lanes > 1;
    choose(&p, "io_overlap",
           p.overlap ? "on, " + std::to_string(opt.overlap_stages) + " stages" : "off",
           !opt.io_overlap   ? "RunOptions::io_overlap = false"
           : opt.cache_debug ? "RunOptions::cache_debug checks every slice before the matmul"
           : in.n_lanes <= 1 ? "one read lane"
                             : "a worker lane reads while the gate/up matmuls compute");
    choose(&p, "io_staged_reads", p.overlap && opt.staged_reads ? "on" : "off",
           !p.overlap         ? "needs the overlap"
           : opt.staged_reads ? "default"
                              : "RunOptions::staged_reads = false");
    // Read-ahead needs a place to read into: the cache, or with it off the second slot set.
    const bool place = d.budget_bytes > 0 || p.two_slot_sets;
    // A route trace records every read-ahead call into the store, which replay repeats: the
    // read-ahead runs as without the trace.
    p.prefill_readahead = p.prefill_ra_wanted && place;
    p.row_guess = p.prefill_readahead && row_guess_possible;
    choose(&p, "prefill_readahead", p.prefill_readahead ? "on" : "off",
           !p.prefill_ra_wanted
               ? (opt.prefill_readahead == 0 ? "RunOptions::prefill_readahead 0" : p.prefill_ra_off)
           : !place ? p.two_slots_refused
                    : (p.row_guess ? "guesses per ubatch row" : "the whole bank"));
    p.decode_prefetch = prefetch_possible && place;
    if (opt.prefetch && !p.decode_prefetch && prefetch_possible)
        p.prefetch_off = d.reason + "; " + p.two_slots_refused;
    p.predictor = p.decode_prefetch || p.row_guess;
    // The tail goes through io_uring when the lanes read O_DIRECT and no test fault plan is
    // installed (faults are injected at the lanes); RunOptions::prefetch_uring false (A/B):
    // the worker lanes read it.
    p.want_uring = p.decode_prefetch && in.direct && !in.io_fault_planted && opt.prefetch_uring;
    choose(&p, "prefetch",
           !p.decode_prefetch ? "off"
           : p.want_uring     ? "on, io_uring"
                              : "on, lanes",
           !opt.prefetch             ? "not asked for (RunOptions::prefetch)"
           : !p.prefetch_off.empty() ? p.prefetch_off
           : !prefetch_possible      ? "needs a worker lane and no route trace"
           : p.want_uring            ? "the tail through io_uring (lanes if it cannot open)"
           : !opt.prefetch_uring     ? "RunOptions::prefetch_uring = false"
                                     : "the lanes read the tail (buffered reads or a fault plan)");
    p.lossy = lossy_options(opt, index.n_expert_used);
    choose(&p, "lossy", p.lossy ? "yes" : "no",
           p.lossy ? lossy_knobs_text(opt, index.n_expert_used) : "no lossy knob in effect");
    *out = std::move(p);
    return Status::Ok();
}

Status describe_plan(const RunOptions & given, std::string * json) {
    RunOptions opt = given;
    Status st = apply_env_overlay(&opt);
    if (st.ok()) st = check_run_options(opt);
    ModelIndex index;
    if (st.ok()) st = load_model_index(opt.model_path, &index);
    if (st.ok()) st = check_n_expert_used(opt, index);
    if (!st.ok()) return st;
    if (!opt.stream)
        return Status::Usage("a plan describes a streaming run, not RunOptions::stream = false");
    PlanInputs in;
    in.mem = memory_availability();
    in.page_bytes = system_page_bytes();
    in.n_lanes = opt.io_threads;
    in.direct = opt.odirect;
    // The context and batch as the run's resolve chooses them (resolve_context), checked as
    // the engine checks them before making the context.
    const ContextChoice ctx = resolve_context(opt, index, in.mem);
    RunOptions fits = opt;
    fits.n_ctx = ctx.n_ctx;
    fits.n_batch = ctx.n_batch;
    st = check_context_fits(fits, index);
    if (!st.ok()) return st;
    RunPlan plan;
    st = resolve(opt, index, in, &plan);
    if (!st.ok()) return st;
    nlohmann::json j = nlohmann::json::array();
    for (const PlanChoice & c : plan.choices)
        j.push_back({{"name", c.name}, {"value", c.value}, {"reason", c.reason}});
    *json = j.dump();
    return Status::Ok();
}

}  // namespace moestream
