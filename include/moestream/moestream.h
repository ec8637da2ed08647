// moestream.h — the public API of the moestream library.
//
// moestream runs Mixture-of-Experts GGUF models whose expert weights do not fit in RAM.
// It loads the model through llama.cpp without reading the experts, rebinds every expert
// tensor onto its own buffers, hooks the router node `ffn_moe_topk-<il>` through
// llama.cpp's eval callback, and reads exactly the routed experts' slices from the file
// (O_DIRECT, parallel lanes) before the layer's expert matmul runs. Output is byte-identical
// to running with everything resident (docs/design.md, docs/seam.md).
//
// Thread-safety: an Engine is used from one thread at a time (decode is single-stream by
// construction); it owns internal I/O lane threads. Distinct Engines are independent.
// The library never aborts or exits on input: every failure comes back as a Status.
//
// Linking: link the target `moestream_api` (CMake) into the EXECUTABLE, statically, as the
// CLI does. Streaming interposes libc's mmap family (src/model/mmap_guard.h) so llama.cpp's
// loader maps the model file without prefaulting it; the interposers only take effect when
// the static library is part of the executable itself. In a shared library, or when they
// are not linked, Engine::open with streaming fails with a message saying so rather than
// reading the whole file. The executable also needs the llama.cpp / ggml prefix at run time
// (cmake/llama-prefix.cmake: moestream_link_llama).
// Other public headers: gguf_index.h (the validated model index: inspect, eval), synth.h
// (random-weight models), route_trace.h / replay.h / route_stats.h (traces and the cache
// simulator), eval.h (quality metrics), cache_budget.h (the cache rule), log.h, sysinfo.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moestream/status.h"

namespace moestream {

struct RunOptions {
    std::string model_path;
    int n_threads = 2;    // compute threads (-t)
    int n_threads_batch = 0;  // threads for prompt batches (-tb); 0 = n_threads
    // Context length (-c). 0 = the model's training context, capped so that the KV cache
    // takes at most a quarter of the memory available at open (Engine::n_ctx() says which).
    int n_ctx = 4096;
    // Prompt tokens per llama_decode (-b). 0 = chosen at open: 512, or larger when streaming
    // and the cache cannot hold every expert, so that a long prompt reads each layer's
    // experts fewer times (docs/prefetch.md, "Prompt batch"; the settings say why).
    int n_batch = 0;
    int n_ubatch = 0;     // physical batch of llama.cpp (-ub); 0 = n_batch; capped at n_batch
    int flash_attn = -1;  // llama.cpp's flash attention (-fa): -1 auto (llama.cpp's choice), 0 off, 1 on
    float temp = 0.0f;    // 0 = greedy
    uint32_t seed = 1;    // sampling seed (temp > 0)
    bool stream = true;   // false: llama.cpp loads everything resident (--no-stream)
    // With stream = false only: true maps the file (llama.cpp load_mode MMAP, its default);
    // false reads every tensor into allocated memory at load (load_mode NONE; --no-mmap), so
    // the first decodes do not pay for the first touch of mapped pages (bench t_compute).
    bool resident_mmap = true;
    // Read lanes, the calling thread included (--io-threads). The default of 4 is the
    // measured choice under a memory cap (docs/benchmarks.md#lanes-capped).
    int io_threads = 4;
    bool odirect = true;  // O_DIRECT reads (false: buffered pread; --no-odirect)
    // Keep a layer's down-projection reads in flight while its gate/up matmuls compute (needs
    // io_threads >= 2; off under cache_debug). --no-io-overlap turns it off.
    bool io_overlap = true;
    // Residency (docs/cache.md). cache_mb: -1 = auto (default of `run`), 0 = cache off
    // (shared slots, every routed slice re-read), N = a cache of N MiB: the fixed-slot cache
    // where it can run, else the LRU cache (settings.cache_store says which, and why).
    int64_t cache_mb = -1;
    // The caller may turn drop-cold on later (set_drop_cold). Every cache store runs
    // drop-cold, so this changes nothing; kept for callers that set it.
    bool drop_cold_later = false;
    bool force_cache = false;  // allow budgets below 1.5 x the token working set (--force-cache)
    bool cache_debug = false;  // poison + residency check of every routed slice (--cache-debug)
    // Map a miss onto the pages an evicted expert left in the page pool instead of committing
    // fresh zero-filled pages (docs/cache.md, "Recycled pages"). false: --cache-no-recycle,
    // the old path, for A/B benchmarks.
    bool cache_recycle = true;
    // With recycled pages: move an evicted expert's mapping to the next miss's address
    // (mremap) instead of unmapping and mapping it again (docs/cache.md, "Moved pages").
    // false: --cache-no-move, for A/B benchmarks.
    bool cache_move = true;
    // Read the experts predicted for the next MoE layer while this one computes (docs/
    // prefetch.md; lossless). Needs the cache and io_threads >= 2; off while drop-cold is on.
    // Opt-in (--prefetch): on this machine it reads ~40 % more bytes per token for a speed-up
    // within the noise (bench `prefetch`).
    bool prefetch = false;
    // Prefill read-ahead (docs/prefetch.md, "Prefill read-ahead"; lossless): at each MoE
    // layer's routing of a multi-token ubatch, read the next MoE layer's experts that are not
    // resident while this layer computes. With the cache off it needs a second set of expert
    // slots (one layer of expert memory), made only if memory allows (said at -v otherwise).
    // Needs streaming and io_threads >= 2; excludes drop_cold and substitute.
    // -1 (default) = on where it applies, off otherwise (the settings report which); 1 = on,
    // refused (kUsage) where it cannot apply; 0 = off.
    int prefill_readahead = -1;
    // Lossy knobs (off by default; docs/lossy-knobs.md).
    int n_expert_used = 0;         // experts per token; 0 = the model's top-k (--n-expert-used)
    double drop_cold = 0;          // --drop-cold-experts F in (0, 1]; 0 = off
    bool drop_in_prefill = false;  // --drop-in-prefill
    bool drop_renorm = false;      // --drop-renorm
    double substitute = 0;         // --substitute-experts M > 0 (router-score margin); 0 = off
    // --miss-fallback FILE (docs/quality.md, "Low-bit fallback"): a decode miss whose final
    // router weight is below fallback_threshold is computed from FILE's low-bit copy.
    std::string miss_fallback;
    double fallback_threshold = 0.1;  // --fallback-threshold W in (0, 1]
    // --route-trace FILE (docs/route-trace.md): record every routing (streaming only). A trace
    // that cannot be written is turned off with a warning; generation is not affected.
    std::string route_trace;
    // --route-trace-scores: the trace also records every decode row's full router scores
    // (n_expert per MoE layer; docs/route-trace.md), so `replay --substitute-experts` can
    // decide substitutions. Needs route_trace.
    bool route_trace_scores = false;
    // --prompt-cache DIR (docs/prompt-cache.md; lossless): after a prefill, the KV of the
    // prompt (and of its longest prefix that is a multiple of n_batch) is written to DIR; a
    // later generation whose prompt starts with a stored prefix restores it and prefills only
    // the rest, byte-identical to a cold run. "" = off. DIR is made (one level) if missing.
    std::string prompt_cache;
    int64_t prompt_cache_mb = 4096;  // --prompt-cache-mb: DIR's files at most, MiB (LRU)
    // --warm-experts FILE|auto (docs/prompt-cache.md, "Warm expert set"; lossless; needs
    // streaming with an expert cache): FILE counts which experts decode routed, over runs; at
    // start its hottest experts that fit the cache are read into it in the background, and
    // after every generation it is rewritten with this run's counts added. "auto" = a file
    // per model under $XDG_CACHE_HOME/moestream/warm (else ~/.cache/...). "" = off.
    std::string warm_experts;
    // Experiments: A/B switches of benchmarks not yet settled, lossless either way. Each is
    // also set by its environment variable at open (settings.h, apply_env_overlay); the
    // registry (settings.cpp) and docs/cli.md, "Settings", say what each does.
    bool prefetch_uring = true;          // MOESTREAM_PREFETCH_NO_URING=1: false
    int overlap_stages = 3;              // MOESTREAM_OVERLAP_STAGES: 2 or 3
    bool staged_reads = true;            // MOESTREAM_STAGED_READS
    bool stage_split = true;             // MOESTREAM_STAGE_SPLIT
    std::string prefill_guess = "rows";  // MOESTREAM_PREFILL_GUESS: rows or bank
    bool pool_warm = false;              // MOESTREAM_POOL_WARM
    std::string slot_cache = "auto";     // MOESTREAM_SLOT_CACHE: auto, 1 (fixed slots), 0 (LRU)
    bool huge_pages = true;              // MOESTREAM_HUGEPAGES
    std::string slot_populate = "idle";  // MOESTREAM_SLOT_POPULATE: idle, nice or off
    // Not a setting: called by Engine::open while it reads the dense weights, with the bytes
    // read so far and their total: once with 0 before the first read, then after each batch
    // of reads (WeightBinder::kDenseBatchBytes), last with done == total. Called on the
    // thread that opens the engine, between reads (never from a signal handler). Unset: none.
    std::function<void(uint64_t done, uint64_t total)> on_load_progress;
};

// Per generated token (one llama_decode of one token).
struct TokenStats {
    int32_t token = 0;
    uint64_t cache_hits = 0;          // routed (layer, expert) already resident
    uint64_t cache_misses = 0;        // routed (layer, expert) read
    double decode_s = 0;              // wall time of the decode
    double io_s = 0;                  // time blocked on expert reads in it
    uint64_t flash_bytes_read = 0;    // bytes read from the model file (incl. alignment)
    uint64_t flash_reads = 0;         // slice reads issued
    uint64_t token_demand_bytes = 0;  // distinct expert bytes routed over all layers
    uint64_t layer_demand_bytes = 0;  // the widest layer's routed expert bytes
    uint64_t prefetch_bytes = 0;      // of flash_bytes_read: read ahead of a routing (prefetch)
    double read_max_s = 0;            // the longest single slice read waited for in it
    double stage_s = 0;  // in the residency store: commits, evictions, page mapping (not io_s)
    // The token's time breakdown (docs/metrics.md, "Time breakdown"): step_s = sampling_s +
    // compute_s + io_s + stage_s + hook_s + other_s, disjoint; decode_s is the part of step_s
    // from the decode's start to its end.
    double compute_s = 0;   // ggml running the graph, outside the router hook's callbacks
    double hook_s = 0;      // in the router hook, neither waiting for reads nor in the store
    double sampling_s = 0;  // sampling the token from the previous logits (logprobs included)
    double other_s = 0;     // the remainder: graph set-up outside llama_decode, emitting, checks
    double step_s = 0;      // the token's whole step: sampling, emitting, the decode
};

// Where steps' wall time went, summed over steps (docs/metrics.md, "Time breakdown"): the
// buckets are disjoint and add up to step_s. Prefill steps have no sampling.
struct TimeBreakdown {
    uint64_t steps = 0;  // llama_decode calls
    double step_s = 0;
    double compute_s = 0, io_s = 0, stage_s = 0, hook_s = 0, sampling_s = 0, other_s = 0;
    void add(const TokenStats & t) {  // one more step, from a token's figures
        steps += 1;
        step_s += t.step_s;
        compute_s += t.compute_s;
        io_s += t.io_s;
        stage_s += t.stage_s;
        hook_s += t.hook_s;
        sampling_s += t.sampling_s;
        other_s += t.other_s;
    }
};

struct RunStats {
    double load_s = 0;        // model load, dense weights read (dense_read_s), cache set up
    double dense_read_s = 0;  // of load_s: reading the dense weights with the lanes (streaming)
    double prefill_s = 0;
    double decode_s = 0;
    int n_prompt = 0;
    int n_generated = 0;
    double prefill_tok_s = 0;
    double decode_tok_s = 0;
    double ttft_s = 0;  // time to first token, from the start of open()
    uint64_t peak_rss_bytes = 0;
    uint64_t anon_huge_bytes = 0;   // memory on transparent huge pages at the end (AnonHugePages)
    double majflt_per_token = 0;    // major page faults during decode / generated tokens
    uint64_t flash_bytes_read = 0;  // all reads (prefill + decode)
    uint64_t flash_reads = 0;
    double io_s = 0;                   // time blocked on expert reads (prefill + decode)
    // Read latency (docs/metrics.md, "Read latency"): single expert slice reads by the lanes
    // (prefill + decode; the io_uring prefetch tail's are not timed), seconds. The median and
    // 99th percentile are bucket edges (within 19 % above the true value, never above the
    // max); the max is exact.
    uint64_t reads_timed = 0;
    double read_p50_s = 0, read_p99_s = 0, read_max_s = 0;
    double bytes_per_token = 0;        // decode bytes read / generated tokens
    TimeBreakdown prefill_time;        // the prompt's llama_decodes
    TimeBreakdown decode_time;         // the decode steps (RunStats::tokens summed)
    uint64_t token_demand_bytes = 0;   // mean over decoded tokens
    uint64_t layer_demand_bytes = 0;   // max over decoded tokens
    uint64_t expert_buffer_bytes = 0;  // shared slots: their size; cache: address space reserved
    // Cache (zero when off). Counted over the whole run (prefill + decode).
    int64_t cache_budget_bytes = 0;   // 0 = cache off
    std::string cache_budget_reason;  // why this budget (auto, explicit, ...)
    double cache_hit_pct = 0;         // hits / lookups
    double first16_hit_pct = 0;       // hits / lookups over the first 16 decode steps (0: none)
    uint64_t cache_lookups = 0, cache_hits = 0, cache_misses = 0;
    uint64_t evictions = 0;
    uint64_t rereads = 0;                 // reads of experts that had been resident before
    uint64_t cache_commit_failures = 0;   // commits the system refused (docs/reliability.md)
    uint64_t cache_budget_now_bytes = 0;  // the budget at the end (lower after a refused commit)
    uint64_t resident_expert_bytes = 0;   // at the end
    uint64_t peak_resident_expert_bytes = 0;
    bool cache_recycle_pages = false;     // pages came from the page pool (else fresh commits)
    uint64_t cache_recycled_commits = 0;  // slices mapped onto an evicted expert's pages
    uint64_t cache_moved_commits = 0;     // of those, moved with their page tables (mremap)
    uint64_t cache_deferred_commits = 0;  // slices committed while earlier reads ran (split staging)
    uint64_t cache_pool_bytes = 0;        // RAM the pool may hold at the end (in use + free)
    // Pool warm-up (docs/cache.md, "Pool warm-up"): bytes zero-filled up front, the warm-up
    // thread's wall time, the errno that stopped it (0 = none), and slices whose commit took
    // a warmed chunk.
    uint64_t cache_pool_warm_bytes = 0;
    double cache_pool_warm_s = 0;
    int cache_pool_warm_error = 0;
    uint64_t cache_warmed_commits = 0;
    uint64_t dense_bytes = 0;             // dense weights copied to RAM
    // Prefetch (docs/prefetch.md); zero when off. Over the whole run.
    bool prefetch = false;                // on for this run
    uint64_t prefetch_predictions = 0;    // next-layer routings predicted
    double prefetch_accuracy_pct = 0;     // predicted experts that the layer then routed
    uint64_t prefetch_experts = 0;        // experts read ahead (absent when predicted)
    uint64_t prefetch_used = 0;           // of those, routed while resident
    uint64_t prefetch_unused = 0;         // of those, evicted unrouted so far
    uint64_t prefetch_bytes = 0;          // bytes read ahead (part of flash_bytes_read)
    double prefetch_wait_s = 0;           // time blocked finishing read-ahead (part of io_s)
    double guess_s = 0;                   // time computing next-layer guesses (compute thread)
    // Prefill read-ahead with per-row guesses (MOESTREAM_PREFILL_GUESS=rows): layers whose
    // read-ahead was the union of the ubatch rows' guesses, rows guessed, experts in the unions.
    uint64_t prefill_guess_layers = 0;
    uint64_t prefill_guess_rows = 0;
    uint64_t prefill_guess_experts = 0;
    // --drop-cold-experts (docs/lossy-knobs.md); zero when off.
    uint64_t experts_routed = 0;  // routed slots the policy looked at
    uint64_t experts_dropped = 0;
    double weight_mass_dropped = 0;   // dropped router weight / total routed weight
    uint64_t drop_bytes_avoided = 0;  // expert bytes not read because of drops
    uint64_t drop_deferred = 0;       // routings loaded at their terminal node
    uint64_t drop_fallbacks = 0;      // learned terminal did not arrive: loaded at the matmul
    std::string drop_terminal;        // the learned terminal node of the first MoE layer
    // --substitute-experts (docs/lossy-knobs.md); zero when off.
    uint64_t experts_substituted = 0;  // routed misses replaced by a resident expert
    uint64_t subst_bytes_avoided = 0;  // expert bytes not read because of substitutions
    // --miss-fallback; zero when off. Companion reads are part of bytes_read.
    uint64_t experts_fallback = 0;       // expert computations from the low-bit copy
    uint64_t fallback_bytes_read = 0;    // companion bytes read
    uint64_t fallback_bytes_saved = 0;   // full expert bytes not read, minus the companion's
    double fallback_convert_s = 0;       // time converting low-bit slices into the bank type
    std::string logits_sha;           // FNV-1a-64 over every step's logits (hex)
    // Prompt tokens not prefilled: their KV came from the previous generation, or from a file
    // of the prompt cache (prompt_cache_tokens of them).
    int n_prompt_reused = 0;
    // --prompt-cache (docs/prompt-cache.md): prompt tokens whose KV was restored from a file,
    // the file's bytes, the time reading, checking and restoring it, why a found file was
    // ignored ("" = none), and the bytes written for this prompt (files written at the end).
    int prompt_cache_tokens = 0;
    uint64_t prompt_cache_read_bytes = 0;
    double prompt_cache_restore_s = 0;
    std::string prompt_cache_refused;
    uint64_t prompt_cache_written_bytes = 0;
    // --warm-experts (docs/prompt-cache.md): the usage file, experts listed in it at start
    // (the hottest that fit the cache), why it was not used ("" = used or missing), and the
    // experts the background reads have loaded so far (over the engine's life); of those, the
    // ones read before the first decode (the preload at open); the listed experts never made
    // resident so far (neither a warm read nor a routing read them).
    std::string warm_experts_file;
    uint64_t warm_experts_listed = 0;
    std::string warm_experts_refused;
    uint64_t warm_experts_preloaded = 0;
    uint64_t warm_experts_before_decode = 0;
    uint64_t warm_experts_not_read = 0;
    std::vector<TokenStats> tokens;   // decode steps, in order
};

// Sampling of one request (the server's per-request settings; docs/server.md describes each
// field as the API exposes it). The chain, in order: logit_bias (and ignore_eos), grammar,
// penalties, then either greedy (temp below kGreedyBelow) or top_k, top_p, min_p, temperature
// and a draw seeded with seed. Engine::generate checks every field and refuses a bad one
// with kUsage naming it.
struct SamplingParams {
    // Temperatures below this are greedy: a temperature of 1e-45 would scale the logits to
    // infinity (and the draw to NaN); below 1e-4 the draw is the argmax anyway.
    static constexpr float kGreedyBelow = 1e-4f;
    float temp = 0.0f;        // finite, >= 0; below kGreedyBelow = greedy
    uint32_t seed = 1;        // seed of the draw (temp >= kGreedyBelow)
    int top_k = 0;            // >= 0; 0 = off
    float top_p = 1.0f;       // (0, 1]; 1 = off
    float min_p = 0.0f;       // [0, 1]; 0 = off
    // Penalties over the last repeat_last_n tokens (prompt and generated): repeat divides a
    // positive logit (multiplies a negative one) by repeat_penalty; frequency subtracts
    // frequency_penalty x count; presence subtracts presence_penalty once per token seen.
    float repeat_penalty = 1.0f;     // finite, > 0; 1 = off
    int repeat_last_n = 64;          // >= -1; 0 = penalties off, -1 = the whole context
    float presence_penalty = 0.0f;   // [-2, 2]; 0 = off
    float frequency_penalty = 0.0f;  // [-2, 2]; 0 = off
    // Added to a token's logit before anything else: token id in [0, n_vocab), bias finite
    // or -infinity (the token is never produced).
    std::vector<std::pair<int32_t, float>> logit_bias;
    // GBNF grammar text (llama.cpp's grammar format, start symbol `root`); "" = none. The
    // output is constrained to it; a grammar llama.cpp cannot parse is refused (kUsage).
    std::string grammar;
    // Never end at an end-of-generation token (they are masked); not with a grammar, whose
    // end is an end-of-generation token.
    bool ignore_eos = false;
};

// One generation with explicit settings (Engine::generate(const GenerateRequest &, ...)).
struct GenerateRequest {
    std::string prompt;
    // Tokens to generate at most; -1 = until end-of-generation or the context is full.
    int n_predict = 64;
    // What a prompt + n_predict larger than the context does: false = kUsage, true = the
    // generation ends when the context is full (finish kLength).
    bool clamp_to_context = false;
    SamplingParams sampling;
    // Stop strings (none empty): generation ends when the text contains one. The stop string
    // and anything after it are not emitted; a match may span tokens. Text that could still
    // become a stop string is held back (on_piece gets it, possibly with more, once resolved).
    std::vector<std::string> stop;
    // Keep the KV cache of the previous generation and prefill only what follows the longest
    // common token prefix (the prompt's last token is always decoded again, for its logits).
    // Not bit-exact: the reused KV was computed in other batch shapes, so logits differ from a
    // fresh prefill by float rounding. false clears the cache first, like generate(prompt, ...).
    bool reuse_prefix = false;
    // Log probabilities of the generated tokens (GenerateResult::logprobs): -1 = off; N in
    // [0, n_vocab]: each token's and its N most likely alternatives'.
    int logprobs = -1;
    // Called after each prompt micro-batch (RunOptions::n_batch tokens) with the prompt tokens
    // done so far (reused ones included) and the prompt's total; returning false stops the
    // generation there (FinishReason::kCancelled, nothing generated, the partial KV dropped).
    // Called on the generating thread. Unset: none.
    std::function<bool(int done, int total)> on_prefill;
};

// Why a generation ended.
enum class FinishReason {
    kLength,     // n_predict tokens, or the context is full
    kEos,        // the model produced an end-of-generation token
    kStop,       // a stop string (GenerateResult::stop_string)
    kCancelled,  // on_piece returned false
};
const char * finish_reason_name(FinishReason r);  // "length", "eos", "stop", "cancelled"

// A token's log probability (natural log) under the model's distribution: the log softmax of
// the raw logits it was sampled from, before logit_bias, penalties, grammar, temperature and
// truncation. piece: its text, special tokens by name (may be part of a UTF-8 sequence).
struct TokenProb {
    int32_t token = 0;
    float logprob = 0.0f;
    std::string piece;
};
struct TokenLogprob {
    TokenProb chosen;            // the generated token
    std::vector<TokenProb> top;  // the most likely tokens, most likely first (ties: lower id)
};

struct GenerateResult {
    // Generated token ids: every token sampled, including those that carried a stop string
    // (the end-of-generation token is not included).
    std::vector<int32_t> tokens;
    // Their detokenized text, without a matched stop string and what followed it in its
    // token: exactly what on_piece received.
    std::string text;
    // With GenerateRequest::logprobs >= 0: one per tokens[i], added before on_piece gets
    // that token's text.
    std::vector<TokenLogprob> logprobs;
    std::vector<float> final_logits;  // logits of the last decode
    FinishReason finish = FinishReason::kLength;
    std::string stop_string;  // the stop string that ended it (finish kStop)
    // True when this output depends on lossy settings: the engine's now, or those that
    // computed KV it reused (reuse_prefix).
    bool lossy = false;
};

// One chat message. role: as the template knows it
// ("system", "user", "assistant"); content: text without NUL bytes.
struct ChatMessage {
    std::string role;
    std::string content;
};

// Loads ggml's CPU backend the way Engine::open does (GGML_BACKEND_PATH if set, else the best
// variant for this CPU among the prefix's backends) and gives the file it was loaded from (""
// when that cannot be told). `moestream --version` prints it; scripts/llama-tool loads the
// same file into the reference tools, so both run the same kernels. kRuntime: none loads.
Status cpu_backend_file(std::string * path);

// Why drop-cold cannot be turned on in an open engine (Engine::drop_cold_block).
enum class DropColdBlock {
    kNone,          // it can
    kResident,      // no streaming (RunOptions::stream = false)
    kMissFallback,  // RunOptions::miss_fallback computes the misses drop-cold would drop
    kCacheOff,      // no cache: drop-cold drops cache misses only
    kFixedSlots,    // unused: the fixed-slot cache runs drop-cold (kept for callers' switches)
};

class Engine {
public:
    virtual ~Engine() = default;

    // Validates the model file, loads it (streaming: without reading the experts) and
    // binds the expert tensors. Errors: kBadModel (file), kUsage (options: the message names
    // each field as `RunOptions::<field>`, a boolean turned off as `RunOptions::<field> = false`),
    // kRuntime.
    static Status open(const RunOptions & opt, std::unique_ptr<Engine> * out);

    // Tokenizes `prompt`, prefills, then decodes up to n_predict tokens (stops at
    // end-of-generation; n_predict -1: until the context is full). on_piece (optional) is
    // called once per generated token with the text released by it (with stop strings,
    // possibly "" while a match is pending; at the end once more with what was held back);
    // returning false stops generation (kCancelled).
    // An I/O error stops generation with kRuntime.
    virtual Status generate(const std::string & prompt, int n_predict,
                            const std::function<bool(const std::string &)> & on_piece,
                            GenerateResult * result) = 0;

    // The same with per-request sampling and optional KV prefix reuse (see GenerateRequest).
    // stats() is updated as decoding goes: on_piece may read stats().tokens for live figures.
    virtual Status generate(const GenerateRequest & req,
                            const std::function<bool(const std::string &)> & on_piece,
                            GenerateResult * result) = 0;

    // Checks req as generate would (settings, grammar, stop strings, the prompt against the
    // context) without generating; *n_prompt (optional): the prompt's length in tokens (0 if
    // it could not be tokenized). Reads only what open() loaded: safe from other threads
    // while a generate runs.
    virtual Status check_request(const GenerateRequest & req, int * n_prompt) const = 0;

    // Changes --drop-cold-experts between generations (0 = off): the policy state is per
    // engine and nothing is pending between llama_decode calls, so this is safe whenever no
    // generate is running. kUsage when F is out of range, without streaming, or when the cache
    // is off (the policy drops cache misses only): the reasons drop_cold_block() names. lossy() and
    // settings_json() follow.
    virtual Status set_drop_cold(double frac) = 0;
    // What keeps set_drop_cold(F > 0) from turning drop-cold on (kNone: nothing). Fixed at
    // open; safe to call while a generate runs.
    virtual DropColdBlock drop_cold_block() const = 0;
    // The model's own chat template (GGUF tokenizer.chat_template), "" when it carries none.
    virtual std::string chat_template() const = 0;
    // The text of the model's start (BOS) and end (EOS) tokens as a chat template writes them
    // ("" if none); *bos_added: whether tokenize() and generate() put BOS before a prompt.
    virtual void special_texts(std::string * bos, std::string * eos, bool * bos_added) const = 0;
    // The context length in use (RunOptions::n_ctx, or what 0 resolved to) and why.
    virtual int n_ctx() const = 0;
    // Whether the model file is still the one validated at open: Ok, or kRuntime naming what
    // changed (size, mtime, ctime, or another file at the path). One stat; safe from any thread,
    // also while a generation runs (the server's /health reports it).
    virtual Status model_file_status() const = 0;

    // --- The context's KV as a file (serve's /slots/{id}?action=save|restore) ---
    // Writes the KV the context holds (the last generation's prompt and generated tokens) to
    // `path` atomically, in the prompt cache's checked format (docs/prompt-cache.md);
    // *n_tokens: the tokens it holds, *bytes: the file's size. kRuntime when it cannot.
    virtual Status save_kv(const std::string & path, int * n_tokens, uint64_t * bytes) = 0;
    // Restores a file save_kv wrote, checked like a prompt cache file (checksum, model files,
    // the settings that change the KV, lossiness): kBadInput naming the file and why, the
    // context then empty. A following generate with reuse_prefix continues from it.
    virtual Status restore_kv(const std::string & path, int * n_tokens, uint64_t * bytes) = 0;
    // Empties the context's KV; returns the tokens it held.
    virtual int erase_kv() = 0;

    virtual const RunStats & stats() const = 0;
    // True when an opt-in lossy knob changes the output vs the all-resident model.
    virtual bool lossy() const = 0;
    virtual std::string settings_json() const = 0;  // resolved configuration, JSON object

    // --- Scoring a text (moestream eval, docs/eval.md) ---
    // The model's tokens for `text`, with the model's start token when it uses one.
    // tokenize, detokenize, n_vocab, n_ctx and the chat template methods read only what open()
    // loaded: they may be called from other threads while a generate runs.
    virtual Status tokenize(const std::string & text, std::vector<int32_t> * out) const = 0;
    // The text of `tokens` (ids in [0, n_vocab); kBadInput naming one outside).
    virtual Status detokenize(const std::vector<int32_t> & tokens, std::string * out) const = 0;
    virtual int n_vocab() const = 0;
    // Decodes `tokens` one at a time from an empty context (single-token decodes: the way
    // streaming runs, with the decode-phase policies) and hands the logits after each token to
    // on_logits(i, logits): they predict tokens[i + 1], for i = 0 .. size - 2. window > 0
    // empties the context (not the expert cache) before tokens 0, window, 2 x window, ...:
    // no prediction then sees more than `window` tokens, as when a model is scored within
    // its training context; 0 = one context for the whole text (-c must hold it; with a
    // window, -c must hold the window). A non-ok Status from on_logits stops and is returned.
    // stats() then describes these decodes.
    virtual Status score(const std::vector<int32_t> & tokens, uint32_t window,
                         const std::function<Status(size_t, const float *)> & on_logits) = 0;
};

}  // namespace moestream
