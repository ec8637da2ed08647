// engine.cpp — opening an Engine (engine_impl.h): the options checked (run_config.h), the
// model loaded and bound, the stages wired (residency store, streamer, router hook and its
// observers); the settings report, the vocabulary and the chat template. The loops that drive
// llama_decode are in decode_loop.cpp, the figures in run_stats.cpp.
#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <nlohmann/json.hpp>

#include "engine_impl.h"
#include "model_files.h"
#include "ggml-backend.h"
#include "moestream/cache_budget.h"
#include "moestream/log.h"
#include "moestream/settings.h"
#include "moestream/sysinfo.h"
#include "run_config.h"
#include "run_plan.h"
#include "settings_report.h"

namespace moestream {
namespace {

// Loads ggml's CPU backend once per process: exactly knobs.ggml_backend_path when set (the
// gates pin the same one for moestream and the reference tools), else the best variant for
// this CPU from knobs.ggml_backend_dir or the prefix's ggml/backends0 (env_knobs.h).
Status init_backend(const EnvKnobs & knobs) {
    static std::once_flag once;
    static Status result;
    std::call_once(once, [&knobs] {
        log_capture_llama();
        if (!knobs.ggml_backend_path.empty()) {
            if (!ggml_backend_load(knobs.ggml_backend_path.c_str()))
                result = Status::Runtime("cannot load ggml backend " + knobs.ggml_backend_path);
        } else {
            const std::string d = !knobs.ggml_backend_dir.empty() ? knobs.ggml_backend_dir
                                                                 : MOESTREAM_GGML_BACKEND_DIR;
            if (!d.empty())
                ggml_backend_load_all_from_path(d.c_str());
            else
                ggml_backend_load_all();
        }
        if (result.ok() && ggml_backend_dev_count() == 0)
            result = Status::Runtime(
                "no ggml backend could be loaded (set GGML_BACKEND_PATH to a "
                "libggml-cpu-*.so)");
        if (result.ok()) llama_backend_init();
    });
    return result;
}

}  // namespace

Status check_file_unchanged(const ModelIndex & index) {
    for (const ShardFile & file : index.shards) {  // every file of a split set
        struct stat st;
        if (::stat(file.path.c_str(), &st) != 0)
            return Status::Runtime(file.path +
                                   ": the model file disappeared: " + std::strerror(errno));
        int64_t mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        // ctime: the kernel sets it on every write, truncate, rename and attribute change, and no
        // call can set it back (an in-place rewrite followed by `touch -r` restores only mtime).
        int64_t ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
        const bool replaced = uint64_t(st.st_dev) != file.dev || uint64_t(st.st_ino) != file.ino;
        if (uint64_t(st.st_size) != file.file_size || mtime_ns != file.mtime_ns ||
            ctime_ns != file.ctime_ns || replaced)
            return Status::Runtime(
                file.path + ": the model file changed since it was validated (size " +
                std::to_string(file.file_size) + " -> " + std::to_string(st.st_size) +
                ", mtime changed: " + (mtime_ns != file.mtime_ns ? "yes" : "no") +
                ", ctime changed: " + (ctime_ns != file.ctime_ns ? "yes" : "no") +
                ", replaced by another file: " + (replaced ? "yes" : "no") +
                "); restart to use the new file");
    }
    return Status::Ok();
}

Status tokenize_text(const llama_vocab * vocab, const std::string & text, bool parse_special,
                     std::vector<llama_token> * out) {
    out->assign(text.size() + 16, 0);
    int n = llama_tokenize(vocab, text.data(), int32_t(text.size()), out->data(),
                           int32_t(out->size()), true, parse_special);
    if (n < 0) {
        out->assign(size_t(-n), 0);
        n = llama_tokenize(vocab, text.data(), int32_t(text.size()), out->data(),
                           int32_t(out->size()), true, parse_special);
    }
    if (n < 0) return Status::BadInput("the text could not be tokenized");
    out->resize(size_t(n));
    return Status::Ok();
}

Status EngineImpl::init(const RunOptions & opt) {
    t_open_ = now_s();
    opt_ = opt;
    // The environment overlays the registry's fields (settings.h); everything below reads opt_.
    Status st = apply_env_overlay(&opt_);
    if (!st.ok()) return st;
    st = check_run_options(opt_);
    if (!st.ok()) return st;
    if (std::string why; !prefill_readahead_wanted(opt_, &why) && !why.empty())
        MS_LOG_INFO("prefill read-ahead off: %s", why.c_str());

    st = load_model_index(opt.model_path, &index_);
    if (!st.ok()) return st;
    if (!opt_.prompt_cache.empty()) {  // before the load: a bad directory is said at once
        if (opt_.prompt_cache_mb <= 0 || opt_.prompt_cache_mb > (int64_t(1) << 40))
            return Status::Usage("RunOptions::prompt_cache_mb must be in 1..2^40 MiB");
        st = PromptCache::open(opt_.prompt_cache, uint64_t(opt_.prompt_cache_mb) << 20,
                               &prompt_cache_);
        if (!st.ok()) return st;
    }
    st = read_env_knobs(&knobs_);
    if (!st.ok()) return st;
    st = init_backend(knobs_);
    if (!st.ok()) return st;
    st = check_cpu_computable(index_);  // types llama.cpp would hand ggml unchecked
    if (!st.ok()) return st;
    // The context and batch as resolve chooses them (run_plan.h, resolve_context), with the
    // memory available when the context is known: here with -c given, after the load (whose
    // weights take memory) otherwise.
    if (opt_.n_ctx != 0) {
        const ContextChoice c = resolve_context(opt_, index_, memory_availability());
        if (opt_.n_batch == 0) MS_LOG_INFO("prompt batch: %s", c.n_batch_reason.c_str());
        opt_.n_batch = c.n_batch;
        n_batch_reason_ = c.n_batch_reason;
    } else if (opt_.n_batch != 0) {
        n_batch_reason_ = "requested";
    }
    // Before llama.cpp allocates (or the OOM killer); with the context not yet known only the
    // weights are checked here, the context and batch once it is (below).
    st = check_context_fits(opt_, index_);
    if (!st.ok()) return st;
    st = check_n_expert_used(opt, index_);
    if (!st.ok()) return st;
    k_eff_ = opt.n_expert_used > 0 ? uint32_t(opt.n_expert_used) : index_.n_expert_used;

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    // RunOptions::n_expert_used: llama.cpp's kv override of <arch>.expert_used_count; the graph's
    // topk then selects k_eff experts and the reads follow.
    llama_model_kv_override kvo[2];
    std::memset(kvo, 0, sizeof kvo);
    if (k_eff_ != index_.n_expert_used) {
        std::snprintf(kvo[0].key, sizeof kvo[0].key, "%s.expert_used_count",
                      index_.arch.c_str());
        kvo[0].tag = LLAMA_KV_OVERRIDE_TYPE_INT;
        kvo[0].val_i64 = k_eff_;
        mp.kv_overrides = kvo;
    }

    if (opt.stream) {
        for (const auto & L : index_.moe_layers)
            for (const auto & t : L.tensors) max_slice_ = std::max(max_slice_, t.slice_bytes);
        st = lanes_.open(shard_paths(index_), opt.io_threads, opt.odirect, max_slice_);
        if (!st.ok()) return st;
        // Planted I/O faults (tests only; env_knobs.h): checked against the lanes now, so
        // a bad plan fails before loading; the lanes' hook goes in once the dense weights
        // are read (make_store), so faults hit the expert reads it counts.
        if (!knobs_.io_fault.empty()) {
            st = parse_io_fault(knobs_.io_fault.c_str(), &fault_plan_);
            if (st.ok()) st = check_io_fault_lanes(fault_plan_, lanes_.n_lanes());
            if (!st.ok()) return st;
            MS_LOG_WARN("MOESTREAM_DEBUG_IO_FAULT=%s: injecting I/O faults (tests only)",
                        knobs_.io_fault.c_str());
        }
        st = load_model_streaming(index_, mp, &lm_);
        model_.reset(std::exchange(lm_.model, nullptr));  // owned here from now on
        if (!st.ok()) return st;
        st = check_file_unchanged(index_);
        if (!st.ok()) return st;
    } else {
        st = load_model_resident(index_, mp, opt.resident_mmap, &lm_);
        model_.reset(std::exchange(lm_.model, nullptr));
        if (!st.ok()) return st;
        // What the load left mapped of the file (0 unmapped): the settings report
        // the observed loading, not just the option.
        for (const ShardFile & f : index_.shards)
            file_mapped_after_load_bytes_ += mapped_bytes_of_file(f.path);
    }

    if (opt_.n_ctx == 0) {
        const ContextChoice c = resolve_context(opt_, index_, memory_availability());
        opt_.n_ctx = c.n_ctx;
        n_ctx_reason_ = c.n_ctx_reason;
        opt_.n_batch = c.n_batch;
        n_batch_reason_ = c.n_batch_reason;
        if (opt.n_batch == 0) MS_LOG_INFO("prompt batch: %s", n_batch_reason_.c_str());
        st = check_context_fits(opt_, index_);
        if (!st.ok()) return st;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(opt_.n_ctx);
    cp.n_batch = uint32_t(opt_.n_batch);
    cp.n_ubatch = uint32_t(opt_.n_ubatch > 0 ? std::min(opt_.n_ubatch, opt_.n_batch) : opt_.n_batch);
    cp.n_threads = opt.n_threads;
    cp.n_threads_batch = opt.n_threads_batch > 0 ? opt.n_threads_batch : opt.n_threads;
    cp.no_perf = true;
    cp.flash_attn_type = opt.flash_attn < 0    ? LLAMA_FLASH_ATTN_TYPE_AUTO
                         : opt.flash_attn == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                               : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    if (opt.stream) {  // the router hook goes into the slot once built (make_store)
        cp.cb_eval = &HookSlot::eval_callback;
        cp.cb_eval_user_data = &hook_slot_;
        cp.abort_callback = &HookSlot::abort_callback;
        cp.abort_callback_data = &hook_slot_;
    }
    llama_errors_begin();
    ctx_.reset(llama_init_from_model(model_.get(), cp));
    const std::string ctx_why = llama_errors_end();
    if (!ctx_)
        return Status::Runtime("llama.cpp could not create a context (n_ctx " +
                               std::to_string(opt_.n_ctx) + ")" +
                               (ctx_why.empty() ? "; run with -vv for its log" : ": " + ctx_why));
    // llama.cpp caps the batch at the context: report (and budget for) what it uses.
    if (const int nb = int(llama_n_batch(ctx_.get())); nb > 0 && nb < opt_.n_batch) {
        n_batch_reason_ += "; llama.cpp caps it at n_ctx " + std::to_string(opt_.n_ctx) + ": " +
                           std::to_string(nb);
        opt_.n_batch = nb;
    }

    if (opt.stream) {
        st = make_store();  // (the warm set too, init_warm_experts)
        if (!st.ok()) return st;
    } else {
        st = init_warm_experts();  // (refused: no streaming)
        if (!st.ok()) return st;
    }

    stats_.load_s = now_s() - t_open_;
    stats_.expert_buffer_bytes =
        store_ ? store_quiet([&] { return store_->reserved_bytes(); }) : 0;
    drop_cold_block_ = !hook_                           ? DropColdBlock::kResident
                       : fallback_                      ? DropColdBlock::kMissFallback
                       : stats_.cache_budget_bytes == 0 ? DropColdBlock::kCacheOff
                                                        : DropColdBlock::kNone;
    MS_LOG_INFO("model ready in %.2f s (%s)", stats_.load_s,
                opt.stream ? "streaming" : "resident");
    return Status::Ok();
}

namespace {
std::string mib_text(uint64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; }
}  // namespace

// Prefill read-ahead's per-row guesses in the first graph (prefetch.h, preset_router): each
// MoE layer's router and ffn_norm weights from the dense copies read at load, the bytes the
// graph will use. A layer whose router is not f32 [n_embd, n_expert] gets none (no guess
// until the graph shows it).
void EngineImpl::preset_routers() {
    for (const MoeLayer & L : index_.moe_layers) {
        const std::string blk = "blk." + std::to_string(L.layer) + ".";
        const TensorInfo * w = index_.find_tensor(blk + "ffn_gate_inp.weight");
        const TensorInfo * g = index_.find_tensor(blk + "ffn_norm.weight");
        if (w == nullptr || w->type != GGML_TYPE_F32 || w->ne[0] != int64_t(index_.n_embd) ||
            w->ne[2] != 1 || w->nb[1] != uint64_t(w->ne[0]) * sizeof(float))
            continue;
        const void * wd = binder_->dense_copy(w->name);
        const void * gd = g && g->type == GGML_TYPE_F32 && g->ne[0] == w->ne[0] && g->ne[1] == 1
                              ? binder_->dense_copy(g->name)
                              : nullptr;
        if (wd == nullptr) continue;
        predictor_->preset_router(L.layer, static_cast<const float *>(wd), w->ne[0], w->ne[1],
                                  static_cast<const float *>(gd));
    }
}

// Resolves the run's plan (run_plan.h: every combination rule) and builds what it says: the
// residency store, the streamer and the router hook with its observers. Nothing here decides.
Status EngineImpl::make_store() {
    PlanInputs in;
    in.mem = memory_availability();
    in.page_bytes = system_page_bytes();
    in.n_lanes = lanes_.n_lanes();
    in.direct = lanes_.direct();
    in.io_fault_planted = fault_plan_.kind != IoFaultPlan::Kind::kNone;
    in.no_budget_clamp = knobs_.no_budget_clamp;
    in.n_ctx_reason = n_ctx_reason_;
    in.n_batch_reason = n_batch_reason_;
    Status st = resolve(opt_, index_, in, &plan_);
    if (!st.ok()) return st;
    const RunPlan & p = plan_;
    if (p.budget_clamp_skipped)
        MS_LOG_WARN("MOESTREAM_DEBUG_NO_BUDGET_CLAMP: the cache budget ignores the memory limit "
                    "(tests only)");
    if (p.budget_clamped) MS_LOG_WARN("expert cache: %s", p.budget_reason.c_str());
    if (p.store == RunPlan::Store::kLru && !p.store_reason.empty() &&
        opt_.slot_cache != "0")
        MS_LOG_INFO("expert cache: the LRU cache: %s", p.store_reason.c_str());
    const bool slot_cache = p.store == RunPlan::Store::kFixedSlots;
    if (slot_cache) {
        SlotTestHooks hooks;
        hooks.warm_skip_copy = knobs_.slot_warm_skip_copy;
        hooks.prefetch_skip_read = knobs_.slot_prefetch_skip_read;
        if (p.slot_two_sets)
            MS_LOG_INFO("read-ahead: two sets of shared expert slots in the budget (%s)",
                        mib_text(2 * shared_slot_set_bytes(index_)).c_str());
        SlotOptions so;
        so.huge_pages = opt_.huge_pages;
        so.populate = opt_.slot_populate == "nice"  ? SlotOptions::Populate::kNice
                      : opt_.slot_populate == "off" ? SlotOptions::Populate::kOff
                                                    : SlotOptions::Populate::kIdle;
        store_ = make_slot_cache(index_, p.budget_bytes, p.slot_two_sets, &st, hooks, so);
    } else if (p.store == RunPlan::Store::kLru) {
        CacheOptions copt;
        copt.recycle_pages = opt_.cache_recycle;
        copt.move_pages = opt_.cache_move;
        copt.warm_pool = opt_.pool_warm;
        CacheDebug dbg;
        dbg.poison = dbg.check_residency = opt_.cache_debug;
        CacheTestHooks lru_hooks;
        lru_hooks.warm_pool_wait = knobs_.pool_warm_wait;
        store_ = make_lru_cache(index_, p.budget_bytes, copt, dbg, &st, lru_hooks);
    } else {
        if (!p.two_slots_refused.empty())
            MS_LOG_INFO("read-ahead: off (%s)", p.two_slots_refused.c_str());
        if (p.two_slot_sets)
            MS_LOG_INFO("read-ahead: a second set of shared expert slots (%s)",
                        mib_text(shared_slot_set_bytes(index_)).c_str());
        store_ = make_shared_slots(index_, &st, p.two_slot_sets, opt_.huge_pages);
    }
    if (!st.ok()) return st;
    stats_.cache_budget_bytes = int64_t(p.budget_bytes);
    stats_.cache_budget_reason = p.budget_reason;
    MS_LOG_INFO("cache: %s -> %s", p.budget_reason.c_str(),
                p.budget_bytes ? (std::to_string(p.budget_bytes >> 20) +
                                  (slot_cache ? " MiB fixed slots" : " MiB LRU")).c_str()
                               : "off");
    DropColdConfig dc;  // off unless asked for (resolve refused it with the cache off)
    if (opt_.drop_cold > 0) {
        dc.frac = opt_.drop_cold;
        dc.in_prefill = opt_.drop_in_prefill;
        dc.renorm = opt_.drop_renorm;
    }
    if (!opt_.miss_fallback.empty()) {  // docs/quality.md, "Low-bit fallback"
        st = MissFallback::open(opt_.miss_fallback, index_, &fallback_);
        if (!st.ok()) return st;
        fallback_->plant_skip_convert(knobs_.fallback_skip_convert);
        dc.fallback_w = opt_.fallback_threshold;
        dc.fallback_ok = [this](uint32_t il, int32_t e) {
            const int slot = streamer_->moe_slot(il);
            return slot >= 0 && (!store_->is_resident(size_t(slot), uint32_t(e)) ||
                                 fallback_->lossy(size_t(slot), uint32_t(e)));
        };
    }
    drop_cold_ = std::make_unique<DropColdObserver>(dc);
    substitute_ = std::make_unique<SubstituteObserver>(opt_.substitute, knobs_.substitute_unrouted);
    if (p.use_check) {
        std::unordered_set<std::string> streamed;
        for (const MoeLayer & L : index_.moe_layers)
            for (const ExpertTensor & t : L.tensors) streamed.insert(t.name);
        use_check_ = std::make_unique<ExpertUseCheck>(std::move(streamed));
    }
    binder_ = std::make_unique<WeightBinder>(index_, store_.get(), lm_);
    overlap_ = p.overlap;
    streamer_ = std::make_unique<Streamer>(index_, store_.get(), &lanes_, overlap_);
    streamer_->set_test_hooks(knobs_.stream_hooks);
    // The warm set (--warm-experts) before the dense read: its preload (streamer.h, "Warm
    // preload") reads on lanes of its own while the dense weights are read on the engine's,
    // until the first decode step stops it.
    st = init_warm_experts();
    if (!st.ok()) return st;
    // Dense weights now, in parallel on the lanes (model_loader.h): part of load_s.
    st = binder_->read_dense(&lanes_, WeightBinder::kDenseChunkBytes,
                             WeightBinder::kDenseBatchBytes, opt_.huge_pages,
                             opt_.on_load_progress);
    if (!st.ok()) return st;
    stats_.dense_read_s = binder_->dense_read_s();
    if (fault_plan_.kind != IoFaultPlan::Kind::kNone)
        lanes_.set_pread_hook(&io_fault_preadv, &fault_plan_);
    // Overlap of down reads with gate/up compute (above) needs a worker lane, and stays off
    // under RunOptions::cache_debug, whose check must see every slice before the layer's first
    // matmul.
    streamer_->set_overlap_stages(opt_.overlap_stages);
    lanes_.set_staged(overlap_ && opt_.staged_reads);
    streamer_->set_stage_split(opt_.stage_split);
    streamer_->set_prefill_readahead(p.prefill_readahead);
    streamer_->set_fallback(fallback_.get());
    overlap_waiter_ = std::make_unique<OverlapWaiter>();
    if (!p.prefetch_off.empty())
        MS_LOG_WARN("prefetch is off for this run: %s", p.prefetch_off.c_str());
    if (p.predictor) {  // decode prefetch and prefill read-ahead's per-row guesses
        predictor_ = std::make_unique<RoutePredictor>();
        predictor_->set_enabled(opt_.drop_cold == 0 && !fallback_);
        predictor_->set_decode_guess(p.decode_prefetch);
        predictor_->set_prefill_rows(p.row_guess);
        if (p.row_guess) preset_routers();
    }
    if (p.want_uring) {  // the prefetch tail through io_uring (uring_tail.h), else the lanes
        std::string why;
        uring_ = UringTail::create(shard_paths(index_), lanes_.dio_alignment(), &why);
        if (uring_)
            streamer_->set_uring(uring_.get());
        else
            MS_LOG_INFO("prefetch: io_uring unavailable (%s); the lanes read ahead", why.c_str());
        if (!uring_) uring_fallback_ = why;
    }
    // The router hook's observers, in the order they see each event (node_observer.h):
    // the tracer reads the final weights before drop-cold rewrites them.
    std::vector<NodeObserver *> observers = {binder_.get()};
    // The fixed-slot cache's rewriter: right after the binder, which binds first (every
    // observer sees every ask, in this order).
    if (slot_cache) {
        slot_rewriter_ = std::make_unique<SlotRewriter>(index_, store_.get(), streamer_.get());
        slot_rewriter_->plant_misplace(knobs_.slot_misplace);
        observers.push_back(slot_rewriter_.get());
    }
    if (!opt_.route_trace.empty()) open_trace();  // its settings name the store built above
    if (predictor_) observers.push_back(predictor_.get());
    observers.push_back(overlap_waiter_.get());
    // The trace reads the router's scores (on_select) before the substitution rewrites the
    // order; every on_routing comes after all on_selects, so it records the routing as rewritten.
    if (trace_observer_) observers.push_back(trace_observer_.get());
    observers.push_back(substitute_.get());
    observers.push_back(drop_cold_.get());
    if (use_check_) observers.push_back(use_check_.get());  // last: after any deferred load
    uint32_t n_layer = index_.n_layer;
    for (const auto & L : index_.moe_layers) n_layer = std::max(n_layer, L.layer + 1);
    hook_ = std::make_unique<RouterHook>(index_.n_expert, n_layer, *streamer_,
                                         std::move(observers));
    hook_slot_.set(hook_.get());
    return Status::Ok();
}

// RunOptions::route_trace: the header is the model's shape and the resolved settings.
void EngineImpl::open_trace() {
    TraceHeader h;
    h.n_expert = index_.n_expert;
    h.k_model = index_.n_expert_used;
    h.k = k_eff_;
    h.n_layer = index_.n_layer;
    const PagedMemory * mem = store_->paged_memory();  // the LRU cache's pages, else 4 KiB
    const PageStats ps = mem ? mem->page_stats() : PageStats{};
    h.page_bytes = ps.page_bytes ? ps.page_bytes : 4096;
    for (const auto & L : index_.moe_layers) {
        h.n_layer = std::max(h.n_layer, L.layer + 1);
        TraceLayerShape ls;
        ls.layer = L.layer;
        for (const auto & t : L.tensors) {
            ls.slice_bytes.push_back(t.slice_bytes);
            ls.phase_bytes.push_back(t.file_offset % h.page_bytes);  // as the cache places it
        }
        ls.expert_bytes = L.expert_bytes;
        h.moe_layers.push_back(std::move(ls));
    }
    h.cache_budget_bytes = uint64_t(stats_.cache_budget_bytes);
    h.drop_cold = opt_.drop_cold;
    h.drop_in_prefill = opt_.drop_in_prefill;
    h.drop_renorm = opt_.drop_renorm;
    h.cache_chunks = ps.recycle_pages;
    h.slots_per_layer = slot_rewriter_ ? store_->slot_placement()->slot_stats().slots_per_layer : 0;
    h.slot_warm = slot_rewriter_ != nullptr;
    h.scores = opt_.route_trace_scores;
    h.substitute = opt_.substitute;
    h.settings_json = settings_json();
    tracer_ = RouteTracer::open(opt_.route_trace, h);
    trace_observer_ = std::make_unique<TraceObserver>(*tracer_);
    streamer_->set_tracer(tracer_.get());
}

Status EngineImpl::set_drop_cold(double frac) {
    if (frac == opt_.drop_cold) return Status::Ok();
    if (frac != 0 && !(frac > 0 && frac <= 1))
        return Status::Usage("drop_cold_experts must be 0 (off) or in (0, 1]");
    const DropColdBlock why = drop_cold_block();
    if (why == DropColdBlock::kResident)  // turning it off too: there is no policy to set
        return Status::Usage("drop_cold_experts needs streaming, and this engine is resident "
                             "(RunOptions::stream = false)");
    if (frac > 0 && why == DropColdBlock::kMissFallback)
        return Status::Usage("drop_cold_experts cannot be combined with RunOptions::miss_fallback");
    if (frac > 0 && why == DropColdBlock::kCacheOff)
        return Status::Usage("drop_cold_experts needs an expert cache, and the cache is off (" +
                             stats_.cache_budget_reason + "); " + cache_rule_text(index_, true));
    DropColdConfig dc;
    dc.frac = frac;
    if (frac == 0) opt_.drop_in_prefill = opt_.drop_renorm = false;
    dc.in_prefill = opt_.drop_in_prefill;
    dc.renorm = opt_.drop_renorm;
    drop_cold_->configure(dc);  // terminals are re-learned on the next graph
    if (predictor_) predictor_->set_enabled(frac == 0 && !fallback_);
    opt_.drop_cold = frac;
    return Status::Ok();
}

std::string EngineImpl::chat_template() const {
    const char * t = llama_model_chat_template(model_.get(), nullptr);
    return t ? std::string(t) : std::string();
}

StatsSources EngineImpl::stats_sources() const {
    StatsSources src;
    src.streamer = streamer_.get();
    src.store = store_.get();
    src.predictor = predictor_.get();
    src.prefetch_on = prefetch_on();
    src.binder = binder_.get();
    // Drop-cold's figures while the policy is on (set_drop_cold(0) may have turned it off
    // after a lossy generation: then they are zero).
    src.drop_cold = hook_ && opt_.drop_cold > 0 ? drop_cold_.get() : nullptr;
    src.substitute = hook_ && opt_.substitute > 0 ? substitute_.get() : nullptr;
    src.fallback = fallback_.get();
    src.hook = hook_.get();
    src.first_moe_layer = index_.moe_layers.empty() ? -1 : int(index_.moe_layers[0].layer);
    src.timing = &timing_;
    return src;
}

std::string EngineImpl::settings_json() const {
    // The registry's keys (settings_report.h): the field's value unless the run resolved it
    // to something else. Only the resolved values are written here.
    nlohmann::json r;
    r["mmap"] = opt_.stream || opt_.resident_mmap;
    r["n_ubatch"] = opt_.n_ubatch > 0 ? std::min(opt_.n_ubatch, opt_.n_batch) : opt_.n_batch;
    r["n_threads_batch"] = opt_.n_threads_batch > 0 ? opt_.n_threads_batch : opt_.n_threads;
    r["io_overlap"] = overlap_;
    r["io_overlap_stages"] = overlap_ ? opt_.overlap_stages : 0;
    r["io_staged_reads"] = overlap_ && opt_.staged_reads;
    // Which store holds the budget ("fixed slots", "lru", "off") and the fixed slots' page
    // population (MOESTREAM_SLOT_POPULATE; docs/cache.md).
    r["cache_store"] = !store_ || stats_.cache_budget_bytes == 0 ? "off"
                       : slot_rewriter_                          ? "fixed slots"
                                                                 : "lru";
    r["cache_slot_populate"] = slot_rewriter_ ? opt_.slot_populate : std::string("none");
    r["prefetch_io"] = !prefetch_on() ? "off" : uring_ ? "io_uring" : "lanes";
    r["prefill_guess"] =
        plan_.prefill_readahead && predictor_ && predictor_->prefill_rows() ? "rows" : "bank";
    r["n_expert_used"] = k_eff_;
    r["prompt_cache_mb"] = prompt_cache_ ? opt_.prompt_cache_mb : 0;
    r["warm_experts"] = warm_path_;  // the resolved file (auto: the path it chose)
    if (!fallback_) r["miss_fallback"] = "";

    // Observations of the run: no setting, so no registry row.
    nlohmann::json j;
    if (!opt_.stream) j["model_file_mapped_bytes"] = file_mapped_after_load_bytes_;
    if (opt_.stream) model_files_json(index_, lm_, binder_.get(), &j);
    j["n_ctx_reason"] = n_ctx_reason_.empty() ? "requested" : n_ctx_reason_;
    j["n_batch_reason"] = n_batch_reason_;
    j["odirect"] = opt_.stream && lanes_.direct();
    if (overlap_waiter_) {
        const auto & oc = overlap_waiter_->counters();
        j["io_overlap_waits_at_input"] = oc.waits_at_input;
        j["io_overlap_waits_at_matmul"] = oc.waits_at_matmul;
        j["io_overlap_second_waits_at_input"] = oc.second_waits_at_input;
        j["io_overlap_second_waits_at_matmul"] = oc.second_waits_at_matmul;
    }
    j["cache_mb"] = opt_.stream ? stats_.cache_budget_bytes >> 20 : 0;
    j["cache_budget_reason"] = stats_.cache_budget_reason;
    j["cache_rule"] = cache_rule_text(index_);
    j["cache_rule_min_mib"] = cache_rule_min_mib(index_);
    // The paths taken where the kernel (or an emulator) may lack a feature: the cache's
    // page size, page moves (mremap MREMAP_DONTUNMAP) still on, the read-ahead's reader.
    j["page_bytes"] = system_page_bytes();
    // The store's figures, read with the store quiet: a server reads its settings while the
    // warm preload may still fill the store (streamer.h, "Warm preload").
    bool move_used = false;
    SlotStats ss;
    uint64_t store_huge = 0;
    auto read_store = [&] {
        const PagedMemory * mem = store_ ? store_->paged_memory() : nullptr;
        move_used = mem ? mem->page_stats().move_pages : false;
        const SlotPlacement * slots = store_ ? store_->slot_placement() : nullptr;
        ss = slots ? slots->slot_stats() : SlotStats{};
        store_huge = store_ ? store_->huge_page_bytes() : 0;
    };
    store_quiet(read_store);
    j["cache_move_used"] = move_used;
    // The fixed slots: slots per MoE layer (0: not this cache), the layer routings whose
    // expert ids were rewritten to slots so far, the experts the warm start copied so far; why
    // not the fixed slots when the LRU cache holds the budget (empty otherwise).
    j["cache_slots"] = ss.slots_per_layer;
    j["cache_store_reason"] = plan_.store_reason;
    j["cache_slot_rewrites"] = slot_rewriter_ ? slot_rewriter_->rewrites() : 0;
    j["cache_slot_warm_copies"] = ss.warm_copies;
    // Transparent huge pages (MOESTREAM_HUGEPAGES; docs/design.md): the bytes of expert slots
    // and dense copies the kernel accepted the advice for.
    j["huge_page_bytes"] = store_huge + (binder_ ? binder_->dense_huge_bytes() : 0);
    j["cache_slot_warm_s"] = ss.warm_s;
    if (!uring_fallback_.empty()) j["prefetch_io_fallback"] = uring_fallback_;
    j["prefetch"] = prefetch_on();
    j["prefill_readahead"] = plan_.prefill_readahead;
    j["prefill_readahead_requested"] = opt_.prefill_readahead == 1;
    j["n_expert_used_model"] = index_.n_expert_used;
    j["lossy"] = lossy();
    j["arch"] = index_.arch;
    j["n_expert"] = index_.n_expert;
    j["use_extra_bufts"] = false;
    // The run's plan (run_plan.h): every decision with its reason, in the order resolve made it.
    nlohmann::json plan = nlohmann::json::array();
    for (const PlanChoice & c : plan_.choices)
        plan.push_back({{"name", c.name}, {"value", c.value}, {"reason", c.reason}});
    j["plan"] = plan;
    j["cache_slot_warm"] = slot_rewriter_ != nullptr;  // always, with the fixed slots
    nlohmann::json out;
    const Status st = settings_object(opt_, r, j, &out);
    if (!st.ok()) MS_LOG_ERROR("%s", st.message().c_str());  // a test catches the drift
    return out.dump();
}

PromptCacheKey EngineImpl::prompt_cache_key() const {
    PromptCacheKey k;
    k.model = prompt_cache_model_identity(index_);
    std::string backend;
    (void)cpu_backend_file(&backend);  // another kernel variant computes other bits
    char b[512];
    std::snprintf(b, sizeof b,
                  "n_ctx=%d n_batch=%d n_ubatch=%u k=%u drop_cold=%.17g drop_in_prefill=%d "
                  "drop_renorm=%d substitute=%.17g fallback_threshold=%.17g",
                  opt_.n_ctx, opt_.n_batch, unsigned(llama_n_ubatch(ctx_.get())), k_eff_,
                  opt_.drop_cold, int(opt_.drop_in_prefill), int(opt_.drop_renorm),
                  opt_.substitute, opt_.miss_fallback.empty() ? 0.0 : opt_.fallback_threshold);
    k.settings = std::string(b) + " miss_fallback=" + opt_.miss_fallback +
                 " backend=" + backend + " cpu=" + llama_print_system_info();
    k.lossy = lossy();
    return k;
}

Status EngineImpl::tokenize(const std::string & text, std::vector<int32_t> * out) const {
    if (text.size() > size_t(INT32_MAX) / 2) return Status::BadInput("text too long to tokenize");
    return tokenize_text(vocab(), text, false, out);
}

int EngineImpl::n_vocab() const { return llama_vocab_n_tokens(vocab()); }

Status EngineImpl::detokenize(const std::vector<int32_t> & tokens, std::string * out) const {
    const llama_vocab * vcb = vocab();
    const int nv = n_vocab();
    out->clear();
    char buf[256];
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= nv)
            return Status::BadInput("tokens[" + std::to_string(i) + "] = " +
                                    std::to_string(tokens[i]) +
                                    " is outside the vocabulary (0.." +
                                    std::to_string(nv - 1) + ")");
        const int n = llama_token_to_piece(vcb, tokens[i], buf, sizeof buf, 0, false);
        if (n > 0) out->append(buf, size_t(n));
    }
    return Status::Ok();
}

Status cpu_backend_file(std::string * path) {
    path->clear();
    EnvKnobs knobs;
    Status st = read_env_knobs(&knobs);
    if (st.ok()) st = init_backend(knobs);
    if (!st.ok()) return st;
    // The file is where a function of the loaded CPU backend lives (dladdr).
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    void * fn = reg ? ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features") : nullptr;
    Dl_info info;
    if (fn && dladdr(fn, &info) != 0 && info.dli_fname) *path = info.dli_fname;
    return Status::Ok();
}

Status Engine::open(const RunOptions & opt, std::unique_ptr<Engine> * out) {
    auto e = std::make_unique<EngineImpl>();
    Status st = e->init(opt);
    if (!st.ok()) return st;
    *out = std::move(e);
    return Status::Ok();
}

void EngineImpl::special_texts(std::string * bos, std::string * eos, bool * bos_added) const {
    const llama_vocab * v = vocab();
    auto text = [v](llama_token t) {
        const char * s = t == LLAMA_TOKEN_NULL ? nullptr : llama_vocab_get_text(v, t);
        return s ? std::string(s) : std::string();
    };
    *bos = text(llama_vocab_bos(v));
    *eos = text(llama_vocab_eos(v));
    *bos_added = llama_vocab_bos(v) != LLAMA_TOKEN_NULL && llama_vocab_get_add_bos(v);
}

}  // namespace moestream
