// decode_loop.cpp — the loops that drive llama_decode (engine_impl.h): generate (prefill, then
// one token per decode: sample, emit through the stop strings, feed back) and score (one
// token per decode over a given text). Both report through RunStatsAssembly (run_stats.h).
#include <algorithm>
#include <cmath>

#include "engine_impl.h"
#include "logprobs.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"
#include "stop_strings.h"

namespace moestream {
namespace {

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

}  // namespace

Status EngineImpl::decode(llama_batch batch, bool decode_phase, bool prompt_end) {
    const double t0 = now_s();
    if (streamer_) streamer_->begin_step();
    if (hook_)
        hook_->begin_graph(GraphInfo{decode_phase, uint32_t(trace_pos_), uint32_t(batch.n_tokens),
                                     prompt_end});
    trace_pos_ += batch.n_tokens;
    const double cb0 = hook_slot_.callback_s();
    const double t1 = now_s();
    int rc = llama_decode(ctx_.get(), batch);
    const double t2 = now_s();
    if (hook_) hook_->end_graph();  // no read may stay in flight past the graph
    const double t3 = now_s();
    timing_.llama_s = t2 - t1;
    timing_.callback_s = hook_slot_.callback_s() - cb0;
    timing_.edges_s = hook_ ? (t1 - t0) + (t3 - t2) : 0;  // (no hook: a few ns of other)
    timing_.wall_s = t3 - t0;
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

// The run's sampling: RunOptions' temp and seed, no penalties.
Status EngineImpl::generate(const std::string & prompt, int n_predict,
                            const std::function<bool(const std::string &)> & on_piece,
                            GenerateResult * result) {
    GenerateRequest req;
    req.prompt = prompt;
    req.n_predict = n_predict;
    req.sampling.temp = opt_.temp;
    req.sampling.seed = opt_.seed;
    req.sampling.repeat_last_n = 0;
    return generate(req, on_piece, result);
}

Status EngineImpl::check_request(const GenerateRequest & req, int * n_prompt) const {
    std::unique_ptr<Sampler> smp;
    Status st = check_settings(req, &smp);
    std::vector<llama_token> toks;
    int n_predict = req.n_predict;
    Status pst = prompt_fits(req.prompt, req, &toks, &n_predict);
    if (n_prompt) *n_prompt = int(toks.size());
    return pst.ok() ? st : pst;
}

Status EngineImpl::check_settings(const GenerateRequest & req,
                                  std::unique_ptr<Sampler> * smp) const {
    if (req.n_predict < -1)
        return Status::Usage("n_predict must be >= -1 (-1 = until the context is full)");
    for (size_t i = 0; i < req.stop.size(); ++i)
        if (req.stop[i].empty())
            return Status::Usage("stop[" + std::to_string(i) + "] must not be empty");
    if (Status st = check_logprobs(req.logprobs, llama_vocab_n_tokens(vocab())); !st.ok())
        return st;
    return Sampler::create(req.sampling, vocab(), opt_.n_ctx, smp);
}

Status EngineImpl::prompt_fits(const std::string & prompt, const GenerateRequest & req,
                               std::vector<llama_token> * toks, int * n_predict) const {
    if (prompt.size() > size_t(INT32_MAX) / 2)
        return Status::BadInput("the prompt is too long to tokenize");
    toks->clear();
    Status st = tokenize_text(vocab(), prompt, true, toks);
    if (!st.ok() || toks->empty()) {
        toks->clear();
        return Status::BadInput("the prompt tokenizes to no tokens");
    }
    const int n = int(toks->size());
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

// The generation loop. kv_tokens_ tracks which tokens' KV the context holds, in order.
Status EngineImpl::generate(const GenerateRequest & req,
                            const std::function<bool(const std::string &)> & on_piece,
                            GenerateResult * result) {
    std::unique_ptr<Sampler> smp;
    Status cst = check_settings(req, &smp);
    if (!cst.ok()) return cst;
    Sampler & sampler = *smp;
    int n_predict = req.n_predict;
    if (streamer_) {
        Status st = check_file_unchanged(index_);
        if (!st.ok()) return st;
    }
    const llama_vocab * vcb = vocab();
    std::vector<llama_token> toks;
    Status pst = prompt_fits(req.prompt, req, &toks, &n_predict);
    if (!pst.ok()) return pst;
    const int n = int(toks.size());

    llama_memory_t mem = llama_get_memory(ctx_.get());
    int reused = 0;
    if (req.reuse_prefix) {
        size_t p = 0;
        while (p < kv_tokens_.size() && p < toks.size() && kv_tokens_[p] == toks[p]) ++p;
        if (p >= toks.size()) p = toks.size() - 1;  // the last prompt token gives the logits
        if (p > 0 && llama_memory_seq_rm(mem, 0, llama_pos(p), -1)) reused = int(p);
    }
    if (reused == 0) llama_memory_clear(mem, true);
    // The prompt cache (prompt_cache.h): a stored prefix longer than what the context holds is
    // restored. Its KV, like a cold prefill's, is exact: only then is the prompt's KV stored.
    bool kv_exact = reused == 0;
    PromptCacheKey pc_key;
    PromptCacheRestore pc_restore;
    if (prompt_cache_) {
        pc_key = prompt_cache_key();
        const size_t p = prompt_cache_->lookup(pc_key, toks, opt_.n_batch);
        if (p > size_t(reused)) {
            if (prompt_cache_->restore(ctx_.get(), pc_key, toks, p, n_vocab(), &pc_restore)) {
                reused = int(p);
                kv_exact = true;
                kv_lossy_ = pc_key.lossy;
            } else {
                llama_memory_clear(mem, true);
                reused = 0;
                kv_exact = true;
            }
        }
    }
    kv_tokens_.clear();  // refilled as decodes succeed; an error leaves it empty
    kv_lossy_ = (reused > 0 && kv_lossy_) || lossy();
    RunStatsAssembly stats(stats_sources(), &stats_);
    stats_.prompt_cache_tokens = pc_restore.n_tokens;
    stats_.prompt_cache_read_bytes = pc_restore.bytes;
    stats_.prompt_cache_restore_s = pc_restore.seconds;
    stats_.prompt_cache_refused = pc_restore.refused;
    // Files of this prompt's KV, written once the generation is done.
    std::vector<PromptCache::File> pc_files;
    auto pc_capture = [&](size_t p) {
        std::string why;
        // The whole prompt's file carries its last logits: llama.cpp's state does not
        // restore them.
        const float * last = p == toks.size() ? llama_get_logits_ith(ctx_.get(), -1) : nullptr;
        PromptCache::File f = prompt_cache_->capture(ctx_.get(), pc_key, toks, p, last,
                                                     last ? size_t(n_vocab()) : 0, &why);
        if (!f.path.empty())
            pc_files.push_back(std::move(f));
        else
            MS_LOG_INFO("prompt cache: %zu-token prefix not stored: %s", p, why.c_str());
    };
    const bool pc_store = prompt_cache_ && kv_exact;
    // The longest prefix below the prompt whose rest a cold run batches alike.
    const int pc_aligned = ((n - 1) / opt_.n_batch) * opt_.n_batch;
    trace_pos_ = reused;
    {   // the penalties' window reaches back into the prompt
        const size_t tail = std::min<size_t>(toks.size(), size_t(opt_.n_ctx));
        sampler.accept_prompt(toks.data() + (toks.size() - tail), tail);
    }
    StopMatcher stops(req.stop);
    RunStats & s = stats_;
    s.n_prompt = n;
    s.n_prompt_reused = reused;
    const int n_vocab = llama_vocab_n_tokens(vcb);
    *result = GenerateResult{};
    result->lossy = kv_lossy_;

    // Prefill.
    double t0 = now_s();
    bool stop_asked = false;  // on_prefill said stop
    int prefilled = n;        // prompt tokens whose KV the context holds
    for (int i = reused; i < n; i += opt_.n_batch) {
        int m = std::min(opt_.n_batch, n - i);
        Status st = decode(llama_batch_get_one(toks.data() + i, m), false, i + m == n);
        stats.prefill_step();
        if (!st.ok()) return st;  // kv_tokens_ is empty: the next generate clears
        if (pc_store && i + m == pc_aligned) pc_capture(size_t(pc_aligned));
        if (pc_store && i + m == n) pc_capture(size_t(n));
        if (req.on_prefill && !req.on_prefill(i + m, n)) {
            stop_asked = true;
            prefilled = i + m;
            break;
        }
    }
    s.prefill_s = now_s() - t0;
    s.prefill_tok_s = s.prefill_s > 0 ? (prefilled - reused) / s.prefill_s : 0;
    if (prefilled == n) kv_tokens_.assign(toks.begin(), toks.end());  // else the next clears
    stats.decode_begins();
    if (stop_asked) {
        n_predict = 0;
        result->finish = FinishReason::kCancelled;
    }

    // Decode: sample from the last logits, emit, feed back one token at a time.
    for (int i = 0; i < n_predict; ++i) {
        const double t_step = now_s();  // the step: sampling, emitting, the decode
        // A whole prompt restored from the prompt cache: its stored last logits.
        const float * logits = i == 0 && !pc_restore.logits.empty()
                                   ? pc_restore.logits.data()
                                   : llama_get_logits_ith(ctx_.get(), -1);
        if (Status fin = check_logits_finite(logits, n_vocab, size_t(i)); !fin.ok()) return fin;
        if (streamer_) {
            // These logits came from reads of the file: a change while they were read (a hole
            // punched, a rewrite) stops here, before their token is emitted.
            Status st = check_file_unchanged(index_);
            if (!st.ok()) return st;
        }
        stats.hash_logits(logits, n_vocab);
        llama_token tok = 0;
        Status sst = sampler.sample(logits, &tok);
        if (!sst.ok()) return sst;
        if (i == n_predict - 1 || llama_vocab_is_eog(vcb, tok))
            result->final_logits.assign(logits, logits + n_vocab);
        if (llama_vocab_is_eog(vcb, tok)) {
            result->finish = FinishReason::kEos;
            break;
        }
        if (i == 0) s.ttft_s = now_s() - t_open_;
        result->tokens.push_back(tok);
        if (req.logprobs >= 0)
            result->logprobs.push_back(token_logprobs(vcb, logits, n_vocab, tok, req.logprobs));
        const double sampling_s = now_s() - t_step;
        s.n_generated++;
        char buf[256];
        int pn = llama_token_to_piece(vcb, tok, buf, sizeof buf, 0, false);
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
        const double te = now_s();
        TokenStats t = stats.step(tok, te - ts, sampling_s, te - t_step);
        if (!st.ok()) {
            kv_tokens_.clear();
            return st;
        }
        kv_tokens_.push_back(tok);
        stats.decode_step(t);
    }
    if (result->finish != FinishReason::kStop && result->finish != FinishReason::kCancelled) {
        const std::string held = stops.flush();  // no stop string completed: release it
        if (!held.empty()) {
            result->text += held;
            if (on_piece) on_piece(held);
        }
    }
    if (streamer_) streamer_->stop_preload();  // (done by the first decode, if one ran)
    stats.finish();
    write_warm_usage();
    if (tracer_) tracer_->finish();  // one trace per engine: later generates are not traced
    for (const PromptCache::File & f : pc_files) {
        uint64_t evicted = 0;
        Status wst = prompt_cache_->write(f, &evicted);
        if (!wst.ok()) {
            MS_LOG_WARN("prompt cache: %s", wst.message().c_str());
            continue;
        }
        s.prompt_cache_written_bytes += f.bytes.size();
        if (evicted) MS_LOG_INFO("prompt cache: %llu least recently used file(s) removed",
                                 (unsigned long long)evicted);
    }
    return Status::Ok();
}

Status EngineImpl::save_kv(const std::string & path, int * n_tokens, uint64_t * bytes) {
    Status st = save_state_file(ctx_.get(), prompt_cache_key(), kv_tokens_, path, bytes);
    if (st.ok() && n_tokens) *n_tokens = int(kv_tokens_.size());
    return st;
}

Status EngineImpl::restore_kv(const std::string & path, int * n_tokens, uint64_t * bytes) {
    std::vector<llama_token> toks;
    kv_tokens_.clear();
    Status st = load_state_file(ctx_.get(), prompt_cache_key(), path, &toks, bytes);
    if (!st.ok() || int(toks.size()) >= opt_.n_ctx) {
        llama_memory_clear(llama_get_memory(ctx_.get()), true);
        return st.ok() ? Status::BadInput(path + ": KV not restored: it holds more tokens than "
                                                 "the context")
                       : st;
    }
    kv_tokens_ = std::move(toks);
    kv_lossy_ = lossy();
    if (n_tokens) *n_tokens = int(kv_tokens_.size());
    return Status::Ok();
}

int EngineImpl::erase_kv() {
    const int n = int(kv_tokens_.size());
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    kv_tokens_.clear();
    return n;
}

Status EngineImpl::score(const std::vector<int32_t> & tokens, uint32_t window,
                         const std::function<Status(size_t, const float *)> & on_logits) {
    if (tokens.size() < 2) return Status::BadInput("scoring needs at least two tokens");
    const size_t held = window ? std::min<size_t>(window, tokens.size()) : tokens.size();
    if (held > size_t(opt_.n_ctx))
        return Status::Usage(std::to_string(held) + (window ? " tokens per window" : " tokens") +
                             " exceed the context (RunOptions::n_ctx " +
                             std::to_string(opt_.n_ctx) + ")");
    const int nv = n_vocab();
    for (int32_t t : tokens)
        if (t < 0 || t >= nv)
            return Status::BadInput("token id " + std::to_string(t) + " outside the vocabulary");
    if (streamer_) {
        Status st = check_file_unchanged(index_);
        if (!st.ok()) return st;
    }
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    kv_tokens_.clear();  // the context no longer holds a generation's prompt
    trace_pos_ = 0;
    RunStatsAssembly stats(stats_sources(), &stats_);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        if (window && i > 0 && i % window == 0) {
            llama_memory_clear(llama_get_memory(ctx_.get()), true);  // the cache stays warm
            trace_pos_ = 0;
        }
        llama_token tok = tokens[i];
        const double ts = now_s();
        Status st = decode(llama_batch_get_one(&tok, 1), true);
        if (!st.ok()) return st;
        const double td = now_s();
        stats_.n_generated++;
        const float * logits = llama_get_logits_ith(ctx_.get(), -1);
        st = check_logits_finite(logits, nv, i);
        if (!st.ok()) return st;
        stats.hash_logits(logits, nv);
        st = on_logits(i, logits);
        if (!st.ok()) return st;
        // The step: the decode, then the logits' work (score's sampling_s).
        const double te = now_s();
        stats.decode_step(stats.step(tokens[i + 1], td - ts, te - td, te - ts));
    }
    if (streamer_) streamer_->stop_preload();  // (done by the first decode, if one ran)
    stats.finish();
    write_warm_usage();
    if (tracer_) tracer_->finish();  // one trace per engine, as for generate()
    return Status::Ok();
}

}  // namespace moestream
