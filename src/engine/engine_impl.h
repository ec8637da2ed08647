// engine_impl.h — the Engine behind include/moestream/moestream.h, split by what each part does:
//   engine.cpp       open: validate (run_config.h), load, wire the stages, settings, vocabulary
//   decode_loop.cpp  the loops that drive llama_decode: generate (prefill, decode, sampling,
//                    stop strings, prefix reuse) and score
//   run_stats.cpp    RunStats filled from the components, alike for generate and score
// Every llama.cpp handle is owned by a llama-cpp.h pointer (llama_model_ptr, llama_context_ptr,
// llama_sampler_ptr inside Sampler).
// Thread-safety: as Engine (one thread at a time; the const vocabulary and chat methods read
// only what open() loaded).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "env_knobs.h"
#include "io_faults.h"
#include "io_lanes.h"
#include "llama-cpp.h"
#include "model_loader.h"
#include "moestream/gguf_index.h"
#include "moestream/moestream.h"
#include "moestream/settings.h"
#include "moestream/sysinfo.h"
#include "overlap_waiter.h"
#include "policy_drop_cold.h"
#include "miss_fallback.h"
#include "policy_substitute.h"
#include "prefetch.h"
#include "prompt_cache.h"
#include "warm_experts.h"
#include "residency.h"
#include "route_tracer.h"
#include "run_plan.h"
#include "router_hook.h"
#include "run_stats.h"
#include "sampler.h"
#include "slot_rewriter.h"
#include "step_timing.h"
#include "streamer.h"
#include "trace_observer.h"
#include "uring_tail.h"
#include "weight_binder.h"

namespace moestream {

// Ok while the model file is the one validated at open (size, mtime, ctime, device and inode),
// else kRuntime naming what changed.
Status check_file_unchanged(const ModelIndex & index);

// The model's tokens for `text` (llama_tokenize with the model's start token; parse_special:
// control tokens written in the text are read as such). kBadInput when llama.cpp refuses.
Status tokenize_text(const llama_vocab * vocab, const std::string & text, bool parse_special,
                     std::vector<llama_token> * out);

class EngineImpl final : public Engine {
public:
    Status init(const RunOptions & opt);  // engine.cpp

    // decode_loop.cpp
    Status generate(const std::string & prompt, int n_predict,
                    const std::function<bool(const std::string &)> & on_piece,
                    GenerateResult * result) override;
    Status generate(const GenerateRequest & req,
                    const std::function<bool(const std::string &)> & on_piece,
                    GenerateResult * result) override;
    Status check_request(const GenerateRequest & req, int * n_prompt) const override;
    Status score(const std::vector<int32_t> & tokens, uint32_t window,
                 const std::function<Status(size_t, const float *)> & on_logits) override;

    Status save_kv(const std::string & path, int * n_tokens, uint64_t * bytes) override;
    Status restore_kv(const std::string & path, int * n_tokens, uint64_t * bytes) override;
    int erase_kv() override;

    // engine.cpp
    Status set_drop_cold(double frac) override;
    DropColdBlock drop_cold_block() const override { return drop_cold_block_; }
    Status model_file_status() const override { return check_file_unchanged(index_); }
    std::string chat_template() const override;
    void special_texts(std::string * bos, std::string * eos, bool * bos_added) const override;
    int n_ctx() const override { return opt_.n_ctx; }
    const RunStats & stats() const override { return stats_; }
    bool lossy() const override { return lossy_options(opt_, index_.n_expert_used); }
    std::string settings_json() const override;
    Status tokenize(const std::string & text, std::vector<int32_t> * out) const override;
    Status detokenize(const std::vector<int32_t> & tokens, std::string * out) const override;
    int n_vocab() const override;

private:
    // engine.cpp: wiring.
    Status make_store();  // the residency store, the streamer and the router hook's observers
    void open_trace();    // RunOptions::route_trace
    RunPlan plan_;  // every decision of make_store, with its reason (run_plan.h)
    std::string n_batch_reason_;      // how RunOptions::n_batch was chosen (settings)
    bool prefetch_on() const {
        return predictor_ != nullptr && predictor_->decode_guess() && opt_.drop_cold == 0;
    }
    void preset_routers();  // engine.cpp: the predictor's routers before the first graph
    const llama_vocab * vocab() const { return llama_model_get_vocab(model_.get()); }
    StatsSources stats_sources() const;  // run_stats.h: what RunStats is read from

    // decode_loop.cpp.
    // One llama_decode with the router hook around it (decode_phase: one token per graph).
    // prompt_end: a prefill batch ending the prompt (GraphInfo::prompt_end).
    Status decode(llama_batch batch, bool decode_phase, bool prompt_end = false);
    // Everything of req but the prompt; *smp: its sampler.
    Status check_settings(const GenerateRequest & req, std::unique_ptr<Sampler> * smp) const;
    // The prompt's tokens (special tokens parsed, as generate decodes them), checked against
    // the context; *n_predict resolved (-1 or, with clamp_to_context, too many: what the
    // context has left).
    Status prompt_fits(const std::string & prompt, const GenerateRequest & req,
                       std::vector<llama_token> * toks, int * n_predict) const;

    RunOptions opt_;
    ModelIndex index_;
    std::unique_ptr<ResidencyStore> store_;
    EnvKnobs knobs_;          // the environment knobs, read at open (env_knobs.h)
    IoFaultPlan fault_plan_;  // before lanes_: the lanes' threads may use it until joined
    IoLanes lanes_;
    IoLanes warm_lanes_;  // the warm set's preload (streamer.h, "Warm preload"), when on
    uint64_t max_slice_ = 0;  // the largest expert slice, bytes (the lanes' bounce buffers)
    std::unique_ptr<WeightBinder> binder_;
    bool bind_checked_ = false;
    std::unique_ptr<Streamer> streamer_;
    bool overlap_ = false;  // down reads overlapped with gate/up (streamer.h)
    std::unique_ptr<RoutePredictor> predictor_;  // prefetch (null: off for this engine)
    uint64_t file_mapped_after_load_bytes_ = 0;  // stream = false: model file mapped after load
    std::unique_ptr<UringTail> uring_;           // prefetch tails through io_uring (or null)
    std::string uring_fallback_;                 // why io_uring was wanted and not available
    std::unique_ptr<OverlapWaiter> overlap_waiter_;  // the hook's observers (streaming only)
    std::unique_ptr<DropColdObserver> drop_cold_;
    std::unique_ptr<SlotRewriter> slot_rewriter_;  // MOESTREAM_SLOT_CACHE=1 only
    std::unique_ptr<SubstituteObserver> substitute_;
    std::unique_ptr<MissFallback> fallback_;  // --miss-fallback (null: off)
    DropColdBlock drop_cold_block_ = DropColdBlock::kResident;  // set once, at the end of init
    std::unique_ptr<ExpertUseCheck> use_check_;  // --cache-debug with the cache on
    std::unique_ptr<RouteTracer> tracer_;  // RunOptions::route_trace
    std::unique_ptr<TraceObserver> trace_observer_;
    HookSlot hook_slot_;  // the context's callbacks: outlives ctx_ (declared after, freed first)
    std::unique_ptr<RouterHook> hook_;  // built complete once its observers exist (make_store)
    int64_t trace_pos_ = 0;               // position of the next token fed to llama_decode
    StepTiming timing_;                   // the last decode()'s boundaries (time breakdown)
    std::vector<llama_token> kv_tokens_;  // tokens whose KV the context holds (prefix reuse)
    std::unique_ptr<PromptCache> prompt_cache_;  // RunOptions::prompt_cache (null: off)
    // What the context's KV is computed with, as the prompt cache keys it (engine.cpp): the
    // model's files and every setting that changes the KV, as they are now.
    PromptCacheKey prompt_cache_key() const;
    // --warm-experts (warm_start.cpp): the usage file ("" = off) and its counts as read at
    // open; the streamer counts this engine's decode routings, added to them at every write.
    std::string warm_path_;
    WarmUsage warm_base_;
    Status init_warm_experts();  // after make_store: reads the file, hands the streamer its list
    void write_warm_usage();     // after a generation: the file with this engine's counts added
    // f() with the store quiet (Streamer::with_store_quiet: the warm preload may be filling it);
    // plain f() before the streamer exists. For reading the store's figures off the decode thread.
    template <class F>
    auto store_quiet(F && f) const {
        return streamer_ ? streamer_->with_store_quiet(f) : f();
    }
    std::string n_ctx_reason_;  // RunOptions::n_ctx 0: how the context length was chosen
    bool kv_lossy_ = false;     // the KV cache holds state computed with lossy settings
    RunStats stats_;
    double t_open_ = 0;
    uint32_t k_eff_ = 0;  // effective top-k
    // The llama.cpp handles, declared last so they are freed first: the context, then the
    // model, before the stages whose memory the model's tensors point into.
    LoadedModel lm_;  // the mapping of a streaming load (lm_.model is handed to model_)
    llama_model_ptr model_;
    llama_context_ptr ctx_;
};

}  // namespace moestream
