// engine.cpp — the Engine: validate, load, bind, then prefill + single-token decode with the
// router hook streaming experts in. See include/moestream/moestream.h and docs/design.md.
#include <dlfcn.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "moestream/atomic_file.h"
#include "moestream/cache_budget.h"
#include "chat_template.h"
#include "ggml-backend.h"
#include "moestream/gguf_index.h"
#include "env_knobs.h"
#include "io_faults.h"
#include "io_lanes.h"
#include "llama.h"
#include "model_files.h"
#include "moestream/log.h"
#include "weight_binder.h"
#include "moestream/moestream.h"
#include "overlap_waiter.h"
#include "policy_drop_cold.h"
#include "prefetch.h"
#include "uring_tail.h"
#include "residency.h"
#include "route_tracer.h"
#include "router_hook.h"
#include "sampler.h"
#include "stop_strings.h"
#include "streamer.h"
#include "moestream/sysinfo.h"
#include "trace_observer.h"

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

uint64_t fnv1a(uint64_t h, const void * data, size_t n) {
    const uint8_t * p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return b;
}

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

// RunOptions::n_ctx 0: the model's training context, capped so that the KV cache (f16 K and
// V for every layer and KV head) takes at most a quarter of the memory available now.
int model_context(const llama_model * model, std::string * reason) {
    const int train = std::max(16, llama_model_n_ctx_train(model));
    char arch[128] = {0}, buf[64];
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    auto meta_int = [&](const char * key, int fallback) {
        const std::string k = std::string(arch) + "." + key;
        return llama_model_meta_val_str(model, k.c_str(), buf, sizeof buf) > 0 ? std::atoi(buf)
                                                                              : fallback;
    };
    const int n_head = std::max(1, llama_model_n_head(model));
    const int head_k = meta_int("attention.key_length", llama_model_n_embd(model) / n_head);
    const int head_v = meta_int("attention.value_length", head_k);
    const uint64_t kv_per_token = uint64_t(std::max(1, llama_model_n_layer(model))) *
                                  uint64_t(std::max(1, llama_model_n_head_kv(model))) *
                                  uint64_t(head_k + head_v) * 2;
    const MemoryAvailability mem = memory_availability();
    const uint64_t cap_tokens = mem.available_bytes / 4 / std::max<uint64_t>(1, kv_per_token);
    int n = train;
    if (mem.available_bytes > 0 && cap_tokens < uint64_t(train))
        n = int(std::max<uint64_t>(512, cap_tokens) / 256 * 256);
    n = std::min(n, train);
    *reason = "the model's context " + std::to_string(train) +
              (n < train ? ", capped to " + std::to_string(n) + " so the KV cache (" +
                               std::to_string(kv_per_token >> 10) + " KiB per token) takes <= 1/4 of " +
                               std::to_string(mem.available_bytes >> 20) + " MiB available (" +
                               mem.source + ")"
                         : std::string());
    return n;
}

// An integer metadata value (the first element of a per-layer array), or `dflt`.
uint64_t kv_uint(const ModelIndex & m, const std::string & key, uint64_t dflt) {
    auto it = m.kv.find(key);
    if (it == m.kv.end()) return dflt;
    const KvValue & v = it->second;
    if (!v.arr_i.empty()) return v.arr_i[0] > 0 ? uint64_t(v.arr_i[0]) : dflt;
    return v.i > 0 ? uint64_t(v.i) : dflt;
}

std::string mib_str(unsigned __int128 b) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.0f MiB", double(b) / (1 << 20));
    return buf;
}

// Before loading: the context's KV cache and one micro-batch's attention mask, estimated from
// the model's shapes, plus the weights the run keeps in memory, must fit in the memory
// available (the cgroup limit, else MemAvailable); otherwise the kernel would OOM-kill the
// process while llama.cpp allocates them. The estimate is a lower bound of what llama.cpp
// allocates (f16 K and V for every layer, the f16 mask of n_ctx x n_ubatch; MLA models cache
// the compressed latent; a mapped file is not counted), so it refuses only what cannot fit.
Status check_context_fits(const ModelIndex & m, const RunOptions & opt) {
    const MemoryAvailability mem = memory_availability();
    if (mem.available_bytes == 0) return Status::Ok();
    const std::string p = m.arch + ".";
    const uint64_t n_head = kv_uint(m, p + "attention.head_count", 0);
    unsigned __int128 per_token = 0;  // KV bytes per context position, all layers
    // Sliding-window layers keep a smaller cache: no KV term for such models (a lower bound).
    const bool swa = m.kv.count(p + "attention.sliding_window") != 0;
    if (n_head > 0 && !swa) {
        const uint64_t n_head_kv = kv_uint(m, p + "attention.head_count_kv", n_head);
        const uint64_t head_k = kv_uint(m, p + "attention.key_length", m.n_embd / n_head);
        const uint64_t head_v = kv_uint(m, p + "attention.value_length", head_k);
        const uint64_t lora = kv_uint(m, p + "attention.kv_lora_rank", 0);
        const uint64_t nextn = kv_uint(m, p + "nextn_predict_layers", 0);
        const uint64_t layers = m.n_layer > nextn ? m.n_layer - nextn : 1;
        const uint64_t row = lora ? lora + kv_uint(m, p + "rope.dimension_count", 0)
                                  : n_head_kv * (head_k + head_v);
        per_token = (unsigned __int128)layers * row * 2;
    }
    const uint64_t n_ctx = uint64_t(opt.n_ctx);
    const uint64_t n_ubatch = std::min<uint64_t>(uint64_t(opt.n_batch), n_ctx);
    const unsigned __int128 kv = per_token * n_ctx;
    const unsigned __int128 mask = (unsigned __int128)n_ctx * n_ubatch * 2;
    // Weights held in anonymous memory: the dense ones when streaming, every tensor with
    // --no-stream --no-mmap; a mapped file (--no-stream) is page cache the kernel can reclaim.
    const unsigned __int128 weights =
        opt.stream ? m.dense_bytes_total
                   : (opt.resident_mmap ? 0 : m.dense_bytes_total + m.expert_bytes_total);
    const unsigned __int128 total = kv + mask + weights;
    if (total <= mem.available_bytes) return Status::Ok();
    return Status::Usage("-c " + std::to_string(opt.n_ctx) + " --batch " +
                         std::to_string(opt.n_batch) + " cannot fit: the KV cache (" +
                         mib_str(kv) + ") and one batch's attention mask (" + mib_str(mask) +
                         ") with " + mib_str(weights) + " of weights need at least " +
                         mib_str(total) + ", but " + mib_str(mem.available_bytes) +
                         " is available (" + mem.source + "); lower -c or --batch");
}

// A NaN or inf logit means the model's arithmetic broke down (bad weights or hyperparameters):
// stop instead of sampling from it.
Status check_logits_finite(const float * logits, int n_vocab, size_t step) {
    for (int v = 0; v < n_vocab; ++v) {
        if (!std::isfinite(logits[v]))
            return Status::Runtime("the model produced a non-finite logit (" +
                                   std::string(std::isnan(logits[v]) ? "NaN" : "inf") +
                                   ") for token id " + std::to_string(v) + " at step " +
                                   std::to_string(step) + "; generation stopped");
    }
    return Status::Ok();
}

class EngineImpl final : public Engine {
public:
    ~EngineImpl() override {
        sampler_.reset();  // before the model its grammar was built for
        if (ctx_) llama_free(ctx_);
        if (lm_.model) llama_model_free(lm_.model);
    }

    Status init(const RunOptions & opt) {
        t_open_ = now_s();
        opt_ = opt;
        if (opt.n_threads < 1 || opt.n_threads > 512) return Status::Usage("-t must be in 1..512");
        if (opt.n_ctx != 0 && opt.n_ctx < 16)
            return Status::Usage("-c must be >= 16 (or 0: the model's context)");
        if (opt.n_batch < 1) return Status::Usage("--batch must be >= 1");
        if (opt.n_ubatch < 0) return Status::Usage("--ubatch-size must be >= 1");
        if (opt.n_threads_batch < 0 || opt.n_threads_batch > 512)
            return Status::Usage("--threads-batch must be in 1..512");
        if (opt.io_threads < 1 || opt.io_threads > 64)
            return Status::Usage("--io-threads must be in 1..64");
        if (!(opt.temp >= 0.0f) || !std::isfinite(opt.temp))
            return Status::Usage("--temp must be >= 0");
        if (opt.drop_cold != 0 && !(opt.drop_cold > 0 && opt.drop_cold <= 1))
            return Status::Usage("--drop-cold-experts must be in (0, 1]");
        if (opt.drop_cold > 0 && !opt.stream)
            return Status::Usage(
                "--drop-cold-experts needs streaming (it drops cache misses); "
                "remove --no-stream");
        if (!opt.resident_mmap && opt.stream)
            return Status::Usage(
                "--no-mmap applies to --no-stream (streaming maps the file "
                "itself); add --no-stream");
        if (!opt.route_trace.empty() && !opt.stream)
            return Status::Usage(
                "--route-trace needs streaming (the streamer observes the "
                "routing); remove --no-stream");
        if ((opt.drop_in_prefill || opt.drop_renorm) && opt.drop_cold <= 0)
            return Status::Usage("--drop-in-prefill / --drop-renorm need --drop-cold-experts F");
        if (!opt.route_trace.empty()) {  // a device or FIFO is refused, never replaced
            Status ts = check_output_path(opt.route_trace, "--route-trace");
            if (!ts.ok()) return ts;
        }
        if (!opt.stream && (opt.cache_mb >= 0 || opt.force_cache || opt.cache_debug))
            return Status::Usage(std::string(opt.cache_mb >= 0 ? "--cache-mb"
                                             : opt.force_cache ? "--force-cache"
                                                               : "--cache-debug") +
                                 " applies to the expert cache of streaming; remove --no-stream");
        if (opt.prefetch) {
            // Each combination below would leave --prefetch silently off (prefetch_possible).
            if (!opt.stream) return Status::Usage("--prefetch needs streaming; remove --no-stream");
            if (opt.cache_mb == 0)
                return Status::Usage("--prefetch reads ahead into the expert cache, and "
                                     "--cache-mb 0 turns the cache off");
            if (opt.io_threads < 2)
                return Status::Usage("--prefetch needs a worker lane to read ahead with: "
                                     "--io-threads 2 or more");
            if (!opt.route_trace.empty())
                return Status::Usage("--prefetch and --route-trace exclude each other (a trace "
                                     "records the cache without read-ahead, so that replay "
                                     "reproduces it)");
            if (opt.drop_cold > 0)
                return Status::Usage("--prefetch and --drop-cold-experts exclude each other (the "
                                     "policy drops cache misses; a read-ahead expert is none)");
        }

        Status st = load_model_index(opt.model_path, &index_);
        if (!st.ok()) return st;
        st = read_env_knobs(&knobs_);
        if (!st.ok()) return st;
        st = init_backend(knobs_);
        if (!st.ok()) return st;
        st = check_cpu_computable(index_);  // types llama.cpp would hand ggml unchecked
        if (!st.ok()) return st;
        st = check_context_fits(index_, opt);  // before llama.cpp allocates (or the OOM killer)
        if (!st.ok()) return st;

        if (opt.n_expert_used < 0 || uint32_t(opt.n_expert_used) > index_.n_expert_used)
            return Status::Usage("--n-expert-used must be in 1.." +
                                 std::to_string(index_.n_expert_used) + " (the model's top-k)");
        k_eff_ = opt.n_expert_used > 0 ? uint32_t(opt.n_expert_used) : index_.n_expert_used;

        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = 0;
        // --n-expert-used: llama.cpp's kv override of <arch>.expert_used_count; the graph's
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
            uint64_t max_slice = 0;
            for (const auto & L : index_.moe_layers)
                for (const auto & t : L.tensors) max_slice = std::max(max_slice, t.slice_bytes);
            st = lanes_.open(shard_paths(index_), opt.io_threads, opt.odirect, max_slice);
            lanes_.set_in_place(opt.io_in_place);
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
            if (!st.ok()) return st;
            st = check_file_unchanged(index_);
            if (!st.ok()) return st;
        } else {
            st = load_model_resident(index_, mp, opt.resident_mmap, &lm_);
            if (!st.ok()) return st;
            // What the load left mapped of the file (0 with --no-mmap): the settings report
            // the observed loading, not just the option.
            for (const ShardFile & f : index_.shards)
                file_mapped_after_load_bytes_ += mapped_bytes_of_file(f.path);
        }

        if (opt_.n_ctx == 0) opt_.n_ctx = model_context(lm_.model, &n_ctx_reason_);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = uint32_t(opt_.n_ctx);
        cp.n_batch = uint32_t(opt.n_batch);
        cp.n_ubatch = uint32_t(opt.n_ubatch > 0 ? std::min(opt.n_ubatch, opt.n_batch) : opt.n_batch);
        cp.n_threads = opt.n_threads;
        cp.n_threads_batch = opt.n_threads_batch > 0 ? opt.n_threads_batch : opt.n_threads;
        cp.no_perf = true;
        if (opt.stream) {  // the router hook goes into the slot once built (make_store)
            cp.cb_eval = &HookSlot::eval_callback;
            cp.cb_eval_user_data = &hook_slot_;
            cp.abort_callback = &HookSlot::abort_callback;
            cp.abort_callback_data = &hook_slot_;
        }
        llama_errors_begin();
        ctx_ = llama_init_from_model(lm_.model, cp);
        const std::string ctx_why = llama_errors_end();
        if (!ctx_)
            return Status::Runtime("llama.cpp could not create a context (n_ctx " +
                                   std::to_string(opt_.n_ctx) + ")" +
                                   (ctx_why.empty() ? "; run with -vv for its log" : ": " + ctx_why));
        chat_ = choose_chat_template(llama_model_chat_template(lm_.model, nullptr));

        if (opt.stream) {
            st = make_store();
            if (!st.ok()) return st;
        }

        SamplingParams run_sampling;
        run_sampling.temp = opt.temp;
        run_sampling.seed = opt.seed;
        run_sampling.repeat_last_n = 0;  // generate(prompt, ...) samples without penalties
        st = Sampler::create(run_sampling, llama_model_get_vocab(lm_.model), opt_.n_ctx, &sampler_);
        if (!st.ok()) return st;
        stats_.load_s = now_s() - t_open_;
        stats_.expert_buffer_bytes = store_ ? store_->reserved_bytes() : 0;
        MS_LOG_INFO("model ready in %.2f s (%s)", stats_.load_s,
                    opt.stream ? "streaming" : "resident");
        return Status::Ok();
    }

    // Chooses the residency store (cache budget: docs/cache.md) and connects the streamer.
    Status make_store() {
        // Besides cached experts the run needs: dense weights (read into RAM below, once the
        // budget is chosen), compute buffers not yet touched (estimate: logits and activations of
        // one batch), one layer's routed set above the budget, and when prefetch can run the
        // predictor's int8 router copies (12 MiB on the 30B preset).
        const uint64_t predictor_est =
            prefetch_possible() ? RoutePredictor::copy_bytes_for(index_.moe_layers.size(),
                                                                 index_.n_expert, index_.n_embd)
                                : 0;
        const uint64_t needs = auto_needs_bytes(index_, uint32_t(opt_.n_batch)) + predictor_est;
        BudgetDecision d;
        MemoryAvailability mem = memory_availability();
        if (knobs_.no_budget_clamp && opt_.cache_mb > 0) {
            MS_LOG_WARN("MOESTREAM_DEBUG_NO_BUDGET_CLAMP: the cache budget ignores the memory limit "
                        "(tests only)");
            mem = MemoryAvailability{};
        }
        Status st = decide_cache_budget(index_, opt_.cache_mb, opt_.force_cache, needs, mem,
                                        system_page_bytes(), &d);
        if (!st.ok()) return st;
        if (d.clamped) MS_LOG_WARN("expert cache: %s", d.reason.c_str());
        if (d.budget_bytes > 0) {
            CacheOptions copt;
            copt.recycle_pages = opt_.cache_recycle;
            copt.move_pages = opt_.cache_move;
            CacheDebug dbg;
            dbg.poison = dbg.check_residency = opt_.cache_debug;
            store_ = make_lru_cache(index_, d.budget_bytes, copt, dbg, &st);
        } else {
            store_ = make_shared_slots(index_, &st);
        }
        if (!st.ok()) return st;
        stats_.cache_budget_bytes = int64_t(d.budget_bytes);
        stats_.cache_budget_reason = d.reason;
        MS_LOG_INFO(
            "cache: %s -> %s", d.reason.c_str(),
            d.budget_bytes ? (std::to_string(d.budget_bytes >> 20) + " MiB LRU").c_str() : "off");
        DropColdConfig dc;  // off unless asked for
        if (opt_.drop_cold > 0) {
            if (d.budget_bytes == 0)
                return Status::Usage(
                    "--drop-cold-experts needs the LRU cache: with the cache off every lookup "
                    "misses, so the policy would silently become an unconditional cut of weakly "
                    "weighted experts (" +
                    d.reason +
                    "). Give --cache-mb " + std::to_string(cache_rule_min_mib(index_)) +
                    " or more (the cache rule: " + cache_rule_text(index_) +
                    "), or auto with enough memory");
            dc.frac = opt_.drop_cold;
            dc.in_prefill = opt_.drop_in_prefill;
            dc.renorm = opt_.drop_renorm;
        }
        drop_cold_ = std::make_unique<DropColdObserver>(dc);
        binder_ = std::make_unique<WeightBinder>(index_, store_.get(), lm_);
        // Dense weights now, in parallel on the lanes (model_loader.h): part of load_s.
        st = binder_->read_dense(&lanes_);
        if (!st.ok()) return st;
        stats_.dense_read_s = binder_->dense_read_s();
        if (fault_plan_.kind != IoFaultPlan::Kind::kNone)
            lanes_.set_pread_hook(&io_fault_preadv, &fault_plan_);
        // Overlap of down reads with gate/up compute needs a worker lane, and stays off under
        // --cache-debug, whose check must see every slice before the layer's first matmul.
        overlap_ = opt_.io_overlap && !opt_.cache_debug && lanes_.n_lanes() > 1;
        streamer_ = std::make_unique<Streamer>(index_, store_.get(), &lanes_, overlap_);
        streamer_->set_test_hooks(knobs_.stream_hooks);
        overlap_waiter_ = std::make_unique<OverlapWaiter>();
        // Prefetch (docs/prefetch.md): a cache to read into and a worker lane to read with.
        // Not while drop-cold is on: the policy drops misses, and a read-ahead expert is none.
        // Not with --route-trace: a trace records what a cache without read-ahead does, so
        // that `moestream replay` reproduces it exactly (docs/route-trace.md).
        if (d.budget_bytes == 0 && opt_.prefetch)
            MS_LOG_WARN("--prefetch is off for this run: it needs the cache, and %s",
                        d.reason.c_str());
        if (d.budget_bytes > 0 && prefetch_possible()) {
            predictor_ = std::make_unique<RoutePredictor>();
            predictor_->set_enabled(opt_.drop_cold == 0);
            // The tail goes through io_uring (uring_tail.h) when the lanes read O_DIRECT and no
            // test fault plan is installed (faults are injected at the lanes).
            // knobs_.prefetch_no_uring (for A/B benchmarks): the worker lanes read the tail.
            if (lanes_.direct() && fault_plan_.kind == IoFaultPlan::Kind::kNone &&
                !knobs_.prefetch_no_uring) {
                std::string why;
                uring_ = UringTail::create(shard_paths(index_), lanes_.dio_alignment(), &why);
                if (uring_)
                    streamer_->set_uring(uring_.get());
                else
                    MS_LOG_INFO("prefetch: io_uring unavailable (%s); the lanes read ahead",
                                why.c_str());
                if (!uring_) uring_fallback_ = why;
            }
        }
        if (!opt_.route_trace.empty()) open_trace();
        // The router hook's observers, in the order they see each event (node_observer.h):
        // the tracer reads the final weights before drop-cold rewrites them.
        std::vector<NodeObserver *> observers = {binder_.get()};
        if (predictor_) observers.push_back(predictor_.get());
        observers.push_back(overlap_waiter_.get());
        if (trace_observer_) observers.push_back(trace_observer_.get());
        observers.push_back(drop_cold_.get());
        uint32_t n_layer = index_.n_layer;
        for (const auto & L : index_.moe_layers) n_layer = std::max(n_layer, L.layer + 1);
        hook_ = std::make_unique<RouterHook>(index_.n_expert, n_layer, *streamer_,
                                             std::move(observers));
        hook_slot_.set(hook_.get());
        return Status::Ok();
    }

    // --route-trace: the header is the model's shape and the resolved settings.
    void open_trace() {
        TraceHeader h;
        h.n_expert = index_.n_expert;
        h.k_model = index_.n_expert_used;
        h.k = k_eff_;
        h.n_layer = index_.n_layer;
        const CacheStats cs = store_->cache_stats();
        h.page_bytes = cs.page_bytes ? cs.page_bytes : 4096;
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
        h.cache_chunks = cs.recycle_pages;
        h.settings_json = settings_json();
        tracer_ = RouteTracer::open(opt_.route_trace, h);
        trace_observer_ = std::make_unique<TraceObserver>(*tracer_);
        streamer_->set_tracer(tracer_.get());
    }

    Status decode(llama_batch batch, bool decode_phase) {
        if (streamer_) streamer_->begin_step();
        if (hook_)
            hook_->begin_graph(GraphInfo{decode_phase, uint32_t(trace_pos_),
                                         uint32_t(batch.n_tokens)});
        trace_pos_ += batch.n_tokens;
        int rc = llama_decode(ctx_, batch);
        if (hook_) hook_->end_graph();  // no read may stay in flight past the graph
        if (hook_ && hook_->failed()) {
            Status e = hook_->error();
            hook_->clear_error();
            return Status::Runtime("generation stopped: " + e.message());
        }
        if (rc != 0) return Status::Runtime("llama_decode failed with code " + std::to_string(rc));
        if (binder_ && !bind_checked_) {
            // The first graph ran every MoE layer: every expert tensor must be bound by now.
            Status st = binder_->finish();
            if (!st.ok()) return st;
            bind_checked_ = true;
        }
        return Status::Ok();
    }

    Status generate(const std::string & prompt, int n_predict,
                    const std::function<bool(const std::string &)> & on_piece,
                    GenerateResult * result) override {
        GenerateRequest req;
        req.n_predict = n_predict;
        return generate_with(prompt, req, *sampler_, on_piece, result);
    }

    Status generate(const GenerateRequest & req,
                    const std::function<bool(const std::string &)> & on_piece,
                    GenerateResult * result) override {
        std::unique_ptr<Sampler> smp;
        Status st = check_settings(req, &smp);
        if (!st.ok()) return st;
        return generate_with(req.prompt, req, *smp, on_piece, result);
    }

    Status check_request(const GenerateRequest & req, int * n_prompt) const override {
        std::unique_ptr<Sampler> smp;
        Status st = check_settings(req, &smp);
        std::vector<llama_token> toks;
        int n_predict = req.n_predict;
        Status pst = prompt_fits(req.prompt, req, &toks, &n_predict);
        if (n_prompt) *n_prompt = int(toks.size());
        return pst.ok() ? st : pst;
    }

    // Everything of req but the prompt; *smp: its sampler.
    Status check_settings(const GenerateRequest & req, std::unique_ptr<Sampler> * smp) const {
        if (req.n_predict < -1)
            return Status::Usage("n_predict must be >= -1 (-1 = until the context is full)");
        for (size_t i = 0; i < req.stop.size(); ++i)
            if (req.stop[i].empty())
                return Status::Usage("stop[" + std::to_string(i) + "] must not be empty");
        return Sampler::create(req.sampling, llama_model_get_vocab(lm_.model), opt_.n_ctx, smp);
    }

    Status set_drop_cold(double frac) override {
        if (frac == opt_.drop_cold) return Status::Ok();
        if (frac != 0 && !(frac > 0 && frac <= 1))
            return Status::Usage("drop_cold_experts must be 0 (off) or in (0, 1]");
        if (!hook_)
            return Status::Usage("drop_cold_experts needs streaming (the server runs --no-stream)");
        if (frac > 0 && stats_.cache_budget_bytes == 0)
            return Status::Usage("drop_cold_experts needs the LRU cache, and the cache is off (" +
                                 stats_.cache_budget_reason + "); " + cache_rule_text(index_));
        DropColdConfig dc;
        dc.frac = frac;
        if (frac == 0) opt_.drop_in_prefill = opt_.drop_renorm = false;
        dc.in_prefill = opt_.drop_in_prefill;
        dc.renorm = opt_.drop_renorm;
        drop_cold_->configure(dc);  // terminals are re-learned on the next graph
        if (predictor_) predictor_->set_enabled(frac == 0);
        opt_.drop_cold = frac;
        return Status::Ok();
    }

    Status model_file_status() const override { return check_file_unchanged(index_); }

    std::string chat_template() const override {
        const char * t = llama_model_chat_template(lm_.model, nullptr);
        return t ? std::string(t) : std::string();
    }
    Status apply_chat_template(const std::vector<ChatMessage> & messages, bool add_assistant,
                               std::string * out) const override {
        return render_chat(chat_, messages, add_assistant, out);
    }
    std::string chat_template_name() const override { return chat_.usable ? chat_.name : ""; }
    int n_ctx() const override { return opt_.n_ctx; }

private:
    // The prompt's tokens (with the model's start token and special tokens parsed, as
    // generate decodes them), checked against the context; *n_predict resolved (-1 or, with
    // clamp_to_context, too many: what the context has left).
    Status prompt_fits(const std::string & prompt, const GenerateRequest & req,
                       std::vector<llama_token> * toks, int * n_predict) const {
        const llama_vocab * vocab = llama_model_get_vocab(lm_.model);
        if (prompt.size() > size_t(INT32_MAX) / 2)
            return Status::BadInput("the prompt is too long to tokenize");
        toks->resize(prompt.size() + 16);
        int n = llama_tokenize(vocab, prompt.data(), int32_t(prompt.size()), toks->data(),
                               int32_t(toks->size()), true, true);
        if (n < 0) {
            toks->resize(size_t(-n));
            n = llama_tokenize(vocab, prompt.data(), int32_t(prompt.size()), toks->data(),
                               int32_t(toks->size()), true, true);
        }
        if (n <= 0) return Status::BadInput("the prompt tokenizes to no tokens");
        toks->resize(size_t(n));
        if (n >= opt_.n_ctx)
            return Status::BadInput("the prompt (" + std::to_string(n) +
                                    " tokens) does not fit the context (" +
                                    std::to_string(opt_.n_ctx) + " tokens)");
        if (*n_predict < 0 || (req.clamp_to_context && n + *n_predict > opt_.n_ctx))
            *n_predict = opt_.n_ctx - n;  // until the context is full
        if (n + *n_predict > opt_.n_ctx)
            return Status::Usage("the prompt (" + std::to_string(n) + " tokens) + n_predict " +
                                 std::to_string(*n_predict) + " exceed the context (" +
                                 std::to_string(opt_.n_ctx) + " tokens)");
        return Status::Ok();
    }

    // The generation loop. sampler: what draws (reset here). req: n_predict, clamp_to_context,
    // stop and reuse_prefix (see GenerateRequest; its prompt and sampling are not read: the
    // prompt is `prompt`). kv_tokens_ tracks which tokens' KV the context holds, in order.
    Status generate_with(const std::string & prompt, const GenerateRequest & req,
                         Sampler & sampler,
                         const std::function<bool(const std::string &)> & on_piece,
                         GenerateResult * result) {
        int n_predict = req.n_predict;
        const bool reuse_prefix = req.reuse_prefix;
        if (n_predict < -1) return Status::Usage("-n must be >= 0");
        if (streamer_) {
            Status st = check_file_unchanged(index_);
            if (!st.ok()) return st;
        }
        const llama_vocab * vocab = llama_model_get_vocab(lm_.model);
        std::vector<llama_token> toks;
        Status pst = prompt_fits(prompt, req, &toks, &n_predict);
        if (!pst.ok()) return pst;
        const int n = int(toks.size());

        llama_memory_t mem = llama_get_memory(ctx_);
        int reused = 0;
        if (reuse_prefix) {
            size_t p = 0;
            while (p < kv_tokens_.size() && p < toks.size() && kv_tokens_[p] == toks[p]) ++p;
            if (p >= toks.size()) p = toks.size() - 1;  // the last prompt token gives the logits
            if (p > 0 && llama_memory_seq_rm(mem, 0, llama_pos(p), -1)) reused = int(p);
        }
        if (reused == 0) llama_memory_clear(mem, true);
        kv_tokens_.clear();  // refilled as decodes succeed; an error leaves it empty
        kv_lossy_ = (reused > 0 && kv_lossy_) || lossy();
        // Drop-cold counts since it was enabled: this generation reports its own share.
        const DropCounters dc0 = drop_cold_ ? drop_cold_->counters() : DropCounters{};
        const uint64_t deferred0 = drop_cold_ ? drop_cold_->deferred() : 0;
        const uint64_t fallbacks0 = drop_cold_ ? drop_cold_->fallbacks() : 0;
        trace_pos_ = reused;
        sampler.reset();
        {   // the penalties' window reaches back into the prompt
            const size_t tail = std::min<size_t>(toks.size(), size_t(opt_.n_ctx));
            sampler.accept_prompt(toks.data() + (toks.size() - tail), tail);
        }
        StopMatcher stops(req.stop);
        RunStats & s = stats_;
        s.tokens.clear();
        s.n_prompt = n;
        s.n_prompt_reused = reused;
        s.n_generated = 0;
        const int n_vocab = llama_vocab_n_tokens(vocab);
        uint64_t logit_hash = 0xcbf29ce484222325ull;
        *result = GenerateResult{};
        result->lossy = kv_lossy_;

        // Prefill.
        double t0 = now_s();
        uint64_t prefill_bytes = 0, prefill_reads = 0;
        double prefill_io = 0;
        for (int i = reused; i < n; i += opt_.n_batch) {
            int m = std::min(opt_.n_batch, n - i);
            Status st = decode(llama_batch_get_one(toks.data() + i, m), false);
            if (streamer_) {
                prefill_bytes += streamer_->step().bytes_read;
                prefill_reads += streamer_->step().reads;
                prefill_io += streamer_->step().io_s;
            }
            if (!st.ok()) return st;  // kv_tokens_ is empty: the next generate clears
        }
        s.prefill_s = now_s() - t0;
        s.prefill_tok_s = s.prefill_s > 0 ? (n - reused) / s.prefill_s : 0;
        kv_tokens_.assign(toks.begin(), toks.end());

        // Decode: sample from the last logits, emit, feed back one token at a time.
        const uint64_t majflt0 = major_faults();
        double decode_s = 0;
        uint64_t dec_bytes = 0, dec_reads = 0, demand_sum = 0, layer_demand_max = 0;
        double dec_io = 0;
        for (int i = 0; i < n_predict; ++i) {
            const float * logits = llama_get_logits_ith(ctx_, -1);
            if (Status fin = check_logits_finite(logits, n_vocab, size_t(i)); !fin.ok()) return fin;
            logit_hash = fnv1a(logit_hash, logits, sizeof(float) * size_t(n_vocab));
            llama_token tok = 0;
            Status sst = sampler.sample(ctx_, -1, &tok);
            if (!sst.ok()) return sst;
            if (i == n_predict - 1 || llama_vocab_is_eog(vocab, tok))
                result->final_logits.assign(logits, logits + n_vocab);
            if (llama_vocab_is_eog(vocab, tok)) {
                result->finish = FinishReason::kEos;
                break;
            }
            if (i == 0) s.ttft_s = now_s() - t_open_;
            result->tokens.push_back(tok);
            s.n_generated++;
            char buf[256];
            int pn = llama_token_to_piece(vocab, tok, buf, sizeof buf, 0, false);
            const std::string piece = stops.push(pn > 0 ? std::string(buf, size_t(pn)) : "");
            result->text += piece;
            if (on_piece && !on_piece(piece)) {
                result->finish = FinishReason::kCancelled;
                break;
            }
            if (stops.stopped()) {
                result->finish = FinishReason::kStop;
                result->stop_string = stops.matched();
                break;
            }
            if (i == n_predict - 1) break;
            if (streamer_) {
                // One stat per token: a file truncated, rewritten or replaced mid-generation
                // stops it here, before the next reads (docs/reliability.md).
                Status st = check_file_unchanged(index_);
                if (!st.ok()) return st;
            }

            double ts = now_s();
            Status st = decode(llama_batch_get_one(&tok, 1), true);
            TokenStats t = step_stats(tok, now_s() - ts);
            if (!st.ok()) {
                kv_tokens_.clear();
                return st;
            }
            kv_tokens_.push_back(tok);
            decode_s += t.decode_s;
            dec_bytes += t.flash_bytes_read;
            dec_reads += t.flash_reads;
            dec_io += t.io_s;
            demand_sum += t.token_demand_bytes;
            layer_demand_max = std::max(layer_demand_max, t.layer_demand_bytes);
            s.tokens.push_back(t);
        }
        if (result->finish != FinishReason::kStop && result->finish != FinishReason::kCancelled) {
            const std::string held = stops.flush();  // no stop string completed: release it
            if (!held.empty()) {
                result->text += held;
                if (on_piece) on_piece(held);
            }
        }
        const size_t steps = s.tokens.size();
        s.decode_s = decode_s;
        s.decode_tok_s = decode_s > 0 ? double(steps) / decode_s : 0;
        s.majflt_per_token = steps ? double(major_faults() - majflt0) / double(steps) : 0;
        s.flash_bytes_read = prefill_bytes + dec_bytes;
        s.flash_reads = prefill_reads + dec_reads;
        s.io_s = prefill_io + dec_io;
        s.bytes_per_token = steps ? double(dec_bytes) / double(steps) : 0;
        s.token_demand_bytes = steps ? demand_sum / steps : 0;
        s.layer_demand_bytes = layer_demand_max;
        s.peak_rss_bytes = peak_rss_bytes();
        s.logits_sha = hex64(logit_hash);
        if (store_) {
            const CacheStats cs = store_->cache_stats();
            fill_lookup_totals(&s);
            s.evictions = cs.evictions;
            s.rereads = cs.rereads;
            s.cache_commit_failures = cs.commit_failures;
            s.cache_budget_now_bytes = cs.budget_bytes;
            s.resident_expert_bytes = store_->resident_bytes();
            s.peak_resident_expert_bytes =
                std::max(cs.peak_resident_bytes, s.resident_expert_bytes);
            s.cache_recycle_pages = cs.recycle_pages;
            s.cache_recycled_commits = cs.recycled_commits;
            s.cache_moved_commits = cs.moved_commits;
            s.cache_pool_bytes = cs.pool_bytes;
        }
        fill_prefetch(&s);
        if (binder_) s.dense_bytes = binder_->dense_bytes();
        if (tracer_) tracer_->finish();  // one trace per engine: later generates are not traced
        if (hook_ && opt_.drop_cold > 0) {
            // This generation's share.
            const DropCounters & dc = drop_cold_->counters();
            s.experts_routed = dc.routed - dc0.routed;
            s.experts_dropped = dc.dropped - dc0.dropped;
            const double wt = dc.weight_total - dc0.weight_total;
            s.weight_mass_dropped = wt > 0 ? (dc.weight_dropped - dc0.weight_dropped) / wt : 0;
            s.drop_bytes_avoided = dc.bytes_avoided - dc0.bytes_avoided;
            s.drop_deferred = drop_cold_->deferred() - deferred0;
            s.drop_fallbacks = drop_cold_->fallbacks() - fallbacks0;
            s.drop_terminal = index_.moe_layers.empty()
                                  ? ""
                                  : hook_->nodes().terminal_kind(index_.moe_layers[0].layer);
        } else {  // off (set_drop_cold(0) may have turned it off after a lossy generation)
            s.experts_routed = s.experts_dropped = s.drop_bytes_avoided = 0;
            s.drop_deferred = s.drop_fallbacks = 0;
            s.weight_mass_dropped = 0;
            s.drop_terminal.clear();
        }
        return Status::Ok();
    }

public:
    const RunStats & stats() const override { return stats_; }
    bool lossy() const override { return k_eff_ != index_.n_expert_used || opt_.drop_cold > 0; }

    std::string settings_json() const override {
        nlohmann::json j;
        j["model"] = opt_.model_path;
        j["stream"] = opt_.stream;
        j["mmap"] = opt_.stream || opt_.resident_mmap;
        if (!opt_.stream) j["model_file_mapped_bytes"] = file_mapped_after_load_bytes_;
        if (opt_.stream) model_files_json(index_, lm_, binder_.get(), &j);
        j["n_threads"] = opt_.n_threads;
        j["n_ctx"] = opt_.n_ctx;
        j["n_ctx_reason"] = n_ctx_reason_.empty() ? "-c" : n_ctx_reason_;
        j["n_ubatch"] = opt_.n_ubatch > 0 ? std::min(opt_.n_ubatch, opt_.n_batch) : opt_.n_batch;
        j["n_threads_batch"] = opt_.n_threads_batch > 0 ? opt_.n_threads_batch : opt_.n_threads;
        j["n_batch"] = opt_.n_batch;
        j["temp"] = opt_.temp;
        j["seed"] = opt_.seed;
        j["io_threads"] = opt_.io_threads;
        j["odirect_requested"] = opt_.odirect;
        j["odirect"] = opt_.stream && lanes_.direct();
        j["io_overlap"] = overlap_;
        j["io_in_place"] = opt_.io_in_place;
        if (overlap_waiter_) {
            const auto & oc = overlap_waiter_->counters();
            j["io_overlap_waits_at_input"] = oc.waits_at_input;
            j["io_overlap_waits_at_matmul"] = oc.waits_at_matmul;
        }
        j["cache_mb"] = opt_.stream ? stats_.cache_budget_bytes >> 20 : 0;
        j["cache_mb_requested"] =
            opt_.cache_mb < 0 ? nlohmann::json("auto") : nlohmann::json(opt_.cache_mb);
        j["cache_budget_reason"] = stats_.cache_budget_reason;
        j["cache_rule"] = cache_rule_text(index_);
        j["cache_rule_min_mib"] = cache_rule_min_mib(index_);
        j["cache_debug"] = opt_.cache_debug;
        j["cache_recycle"] = opt_.cache_recycle;
        j["cache_move"] = opt_.cache_move;
        // The paths taken where the kernel (or an emulator) may lack a feature: the cache's
        // page size, page moves (mremap MREMAP_DONTUNMAP) still on, the read-ahead's reader.
        j["page_bytes"] = system_page_bytes();
        j["cache_move_used"] = store_ ? store_->cache_stats().move_pages : false;
        j["prefetch_io"] = !prefetch_on() ? "off" : uring_ ? "io_uring" : "lanes";
        if (!uring_fallback_.empty()) j["prefetch_io_fallback"] = uring_fallback_;
        j["prefetch"] = prefetch_on();
        j["prefetch_requested"] = opt_.prefetch;
        j["n_expert_used"] = k_eff_;
        j["n_expert_used_model"] = index_.n_expert_used;
        j["lossy"] = lossy();
        j["drop_cold_experts"] = opt_.drop_cold;
        j["drop_in_prefill"] = opt_.drop_in_prefill;
        j["drop_renorm"] = opt_.drop_renorm;
        j["arch"] = index_.arch;
        j["n_expert"] = index_.n_expert;
        j["use_extra_bufts"] = false;
        return j.dump();
    }

    Status tokenize(const std::string & text, std::vector<int32_t> * out) const override {
        const llama_vocab * vocab = llama_model_get_vocab(lm_.model);
        if (text.size() > size_t(INT32_MAX) / 2)
            return Status::BadInput("text too long to tokenize");
        out->assign(text.size() + 16, 0);
        int n = llama_tokenize(vocab, text.data(), int32_t(text.size()), out->data(),
                               int32_t(out->size()), true, false);
        if (n < 0) {
            out->assign(size_t(-n), 0);
            n = llama_tokenize(vocab, text.data(), int32_t(text.size()), out->data(),
                               int32_t(out->size()), true, false);
        }
        if (n < 0) return Status::BadInput("the text could not be tokenized");
        out->resize(size_t(n));
        return Status::Ok();
    }

    int n_vocab() const override { return llama_vocab_n_tokens(llama_model_get_vocab(lm_.model)); }

    Status detokenize(const std::vector<int32_t> & tokens, std::string * out) const override {
        const llama_vocab * vocab = llama_model_get_vocab(lm_.model);
        const int nv = n_vocab();
        out->clear();
        char buf[256];
        for (size_t i = 0; i < tokens.size(); ++i) {
            if (tokens[i] < 0 || tokens[i] >= nv)
                return Status::BadInput("tokens[" + std::to_string(i) + "] = " +
                                        std::to_string(tokens[i]) +
                                        " is outside the vocabulary (0.." +
                                        std::to_string(nv - 1) + ")");
            const int n = llama_token_to_piece(vocab, tokens[i], buf, sizeof buf, 0, false);
            if (n > 0) out->append(buf, size_t(n));
        }
        return Status::Ok();
    }

    Status score(const std::vector<int32_t> & tokens, uint32_t window,
                 const std::function<Status(size_t, const float *)> & on_logits) override {
        if (tokens.size() < 2) return Status::BadInput("scoring needs at least two tokens");
        const size_t held = window ? std::min<size_t>(window, tokens.size()) : tokens.size();
        if (held > size_t(opt_.n_ctx))
            return Status::Usage(std::to_string(held) +
                                 (window ? " tokens per window" : " tokens") +
                                 " exceed the context (-c " + std::to_string(opt_.n_ctx) + ")");
        const int nv = n_vocab();
        for (int32_t t : tokens)
            if (t < 0 || t >= nv)
                return Status::BadInput("token id " + std::to_string(t) +
                                        " outside the vocabulary");
        if (streamer_) {
            Status st = check_file_unchanged(index_);
            if (!st.ok()) return st;
        }
        llama_memory_clear(llama_get_memory(ctx_), true);
        trace_pos_ = 0;
        RunStats & s = stats_;
        s.tokens.clear();
        s.n_prompt = 0;
        s.n_generated = 0;
        double decode_s = 0;
        uint64_t bytes = 0;
        for (size_t i = 0; i + 1 < tokens.size(); ++i) {
            if (window && i > 0 && i % window == 0) {
                llama_memory_clear(llama_get_memory(ctx_), true);  // the cache stays warm
                trace_pos_ = 0;
            }
            llama_token tok = tokens[i];
            const double ts = now_s();
            Status st = decode(llama_batch_get_one(&tok, 1), true);
            if (!st.ok()) return st;
            TokenStats t = step_stats(tokens[i + 1], now_s() - ts);
            decode_s += t.decode_s;
            bytes += t.flash_bytes_read;
            s.tokens.push_back(t);
            s.n_generated++;
            const float * logits = llama_get_logits_ith(ctx_, -1);
            st = check_logits_finite(logits, nv, i);
            if (!st.ok()) return st;
            st = on_logits(i, logits);
            if (!st.ok()) return st;
        }
        s.decode_s = decode_s;
        s.decode_tok_s = decode_s > 0 ? double(s.tokens.size()) / decode_s : 0;
        s.bytes_per_token = double(bytes) / double(s.tokens.size());
        s.peak_rss_bytes = peak_rss_bytes();
        if (streamer_) fill_lookup_totals(&s);
        fill_prefetch(&s);
        if (tracer_) tracer_->finish();  // one trace per engine, as for generate()
        return Status::Ok();
    }

private:
    // Cache lookups, hits and misses over the whole run so far (streaming only).
    void fill_lookup_totals(RunStats * s) const {
        const StepCounters & tot = streamer_->total();
        s->cache_lookups = tot.lookups;
        s->cache_hits = tot.hits;
        s->cache_misses = tot.misses;
        s->cache_hit_pct = tot.lookups ? 100.0 * double(tot.hits) / double(tot.lookups) : 0;
    }

    void fill_prefetch(RunStats * s) const {
        s->prefetch = prefetch_on();
        if (!predictor_ || !streamer_ || !store_) return;
        const PredictCounters & pc = predictor_->counters();
        s->prefetch_predictions = pc.predictions;
        s->prefetch_accuracy_pct = pc.scored ? 100.0 * double(pc.right) / double(pc.scored) : 0;
        const CacheStats cs = store_->cache_stats();
        s->prefetch_experts = cs.prefetched;
        s->prefetch_used = cs.prefetch_used;
        s->prefetch_unused = cs.prefetch_unused;
        s->prefetch_bytes = streamer_->total().prefetch_bytes;
        s->prefetch_wait_s = streamer_->total().prefetch_wait_s;
    }
    bool prefetch_on() const { return predictor_ != nullptr && opt_.drop_cold == 0; }
    // --prefetch asked for, a worker lane to read the tail and no --route-trace (make_store:
    // it also needs the cache). The budget's estimate and the predictor follow the same rule.
    bool prefetch_possible() const {
        return opt_.prefetch && lanes_.n_lanes() > 1 && opt_.route_trace.empty();
    }

    // The per-token figures of the decode step that just ran (streaming counters, if any).
    TokenStats step_stats(int32_t token, double decode_s) const {
        TokenStats t;
        t.token = token;
        t.decode_s = decode_s;
        if (streamer_) {
            const StepCounters & c = streamer_->step();
            t.io_s = c.io_s;
            t.flash_bytes_read = c.bytes_read;
            t.flash_reads = c.reads;
            t.token_demand_bytes = c.demand_bytes;
            t.layer_demand_bytes = c.layer_demand_bytes;
            t.prefetch_bytes = c.prefetch_bytes;
            t.stage_s = c.stage_s;
            t.cache_hits = c.hits;
            t.cache_misses = c.misses;
        }
        return t;
    }

    RunOptions opt_;
    ModelIndex index_;
    LoadedModel lm_;
    std::unique_ptr<ResidencyStore> store_;
    EnvKnobs knobs_;  // the environment knobs, read at open (env_knobs.h)
    IoFaultPlan fault_plan_;  // before lanes_: the lanes' threads may use it until joined
    IoLanes lanes_;
    std::unique_ptr<WeightBinder> binder_;
    bool bind_checked_ = false;
    std::unique_ptr<Streamer> streamer_;
    bool overlap_ = false;  // down reads overlapped with gate/up (streamer.h)
    std::unique_ptr<RoutePredictor> predictor_;  // prefetch (null: off for this engine)
    uint64_t file_mapped_after_load_bytes_ = 0;  // --no-stream: model file mapped after load
    std::unique_ptr<UringTail> uring_;           // prefetch tails through io_uring (or null)
    std::string uring_fallback_;                 // why io_uring was wanted and not available
    std::unique_ptr<OverlapWaiter> overlap_waiter_;  // the hook's observers (streaming only)
    std::unique_ptr<DropColdObserver> drop_cold_;
    std::unique_ptr<RouteTracer> tracer_;  // --route-trace
    std::unique_ptr<TraceObserver> trace_observer_;
    HookSlot hook_slot_;  // the context's callbacks: outlives ctx_ (freed first, in the destructor)
    std::unique_ptr<RouterHook> hook_;  // built complete once its observers exist (make_store)
    int64_t trace_pos_ = 0;                // position of the next token fed to llama_decode
    std::vector<llama_token> kv_tokens_;   // tokens whose KV the context holds (prefix reuse)
    llama_context * ctx_ = nullptr;
    std::unique_ptr<Sampler> sampler_;  // generate(prompt, ...): RunOptions' temp and seed
    ChatTemplate chat_;                 // apply_chat_template
    std::string n_ctx_reason_;  // RunOptions::n_ctx 0: how the context length was chosen
    bool kv_lossy_ = false;     // the KV cache holds state computed with lossy settings
    RunStats stats_;
    double t_open_ = 0;
    uint32_t k_eff_ = 0;  // effective top-k
};

}  // namespace

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

}  // namespace moestream
