// env_knobs.h — every environment variable the engine reads, read once per Engine::open.
//
// Each knob is a named field; nothing else in src/ calls getenv (the logger's MOESTREAM_LOG,
// read by src/util/log.cpp before any engine exists, is the one exception). A value that
// cannot be parsed is an error naming the variable (Status kUsage), never silently ignored.
// The ggml backend is loaded once per process, with the knobs of the first engine opened.
// Thread-safety: read_env_knobs() reads the process environment (not safe against a
// concurrent setenv); the result is a plain value.
#pragma once

#include <string>

#include "io_faults.h"
#include "moestream/status.h"
#include "streamer.h"

namespace moestream {

struct EnvKnobs {
    // GGML_BACKEND_PATH: load exactly this ggml CPU backend .so (the gates pin the same one
    // for moestream and llama.cpp's tools); empty = choose from ggml_backend_dir.
    std::string ggml_backend_path;
    // MOESTREAM_GGML_BACKEND_DIR: directory of backend variants (ggml picks the best for this
    // CPU); empty = the prefix's ggml/backends0 compiled in.
    std::string ggml_backend_dir;
    // MOESTREAM_PREFETCH_NO_URING=1: prefetch tails are read by the worker lanes instead of
    // io_uring (for A/B benchmarks).
    bool prefetch_no_uring = false;
    // MOESTREAM_OVERLAP_STAGES=2|3: 2 = the read prefix a routing waits for is gate and up;
    // 3 (default) = only the projection the graph multiplies first, the second waited for
    // before its own matmul (streamer.h, "Three-stage overlap"). Lossless either way.
    int overlap_stages = 3;
    // MOESTREAM_STAGED_READS=0|1: 1 (default) = the read lanes start a later stage's reads of a
    // routing only once the earlier stages' are in (io_lanes.h, "Staged reads"). Lossless
    // either way.
    bool staged_reads = true;
    // MOESTREAM_STAGE_SPLIT=0|1: 1 (default) = a routing's reads start once the first stage's
    // slices are committed, the rest committed while they read (streamer.h, "Split staging";
    // docs/cache.md). Lossless either way.
    bool stage_split = true;
    // MOESTREAM_PREFILL_GUESS=bank|rows: what prefill read-ahead reads for the next MoE layer
    // at a multi-row routing: its whole bank, or the union of the ubatch rows' guesses
    // (prefetch.h; docs/prefetch.md, "Prefill read-ahead"). Lossless either way.
    bool prefill_guess_rows = true;
    // MOESTREAM_POOL_WARM=0|1: 1 = the expert cache's page pool zero-fills up to the
    // budget's worth of pages in a low-priority background thread from the cache's creation
    // on, and commits take those pages (docs/cache.md, "Pool warm-up"); 0 (default) = none.
    // Lossless either way.
    bool pool_warm = false;
    // MOESTREAM_SLOT_CACHE=0|1: which store holds a cache budget (docs/cache.md, "Fixed
    // slots"). Unset (kAuto): the fixed-slot cache (residency.h, make_slot_cache) where it can
    // run, else the LRU cache; 1 (kOn): the fixed-slot cache, and what it cannot run with is
    // refused; 0 (kOff): the LRU cache. Lossless either way.
    enum class SlotCacheMode { kAuto, kOn, kOff };
    SlotCacheMode slot_cache = SlotCacheMode::kAuto;
    // MOESTREAM_SLOT_WARM=0|1: with the fixed-slot cache, 1 (default) = the prompt's last
    // ubatch fills the slots from the shared slots (slot_rewriter.h, "Warm start"); 0 = decode
    // starts with empty slots (A/B benchmarks). Lossless either way.
    bool slot_warm = true;
    // MOESTREAM_HUGEPAGES=0|1: 1 (default) = the engine's own large buffers (expert slots,
    // shared slots, dense weight copies) are advised for transparent huge pages
    // (huge_pages.h); 0 = 4 KiB pages (A/B benchmarks). Lossless either way.
    bool huge_pages = true;
    // MOESTREAM_SLOT_POPULATE=idle|nice|off: how the fixed slots' pages are populated before
    // first use (residency.h, SlotOptions::populate; default idle); A/B benchmarks. Lossless
    // either way.
    SlotOptions::Populate slot_populate = SlotOptions::Populate::kIdle;
    // Tests only. MOESTREAM_DEBUG_SLOT_MISPLACE=1: with MOESTREAM_SLOT_CACHE=1 the expert
    // ids are rewritten to the wrong slots (slot_rewriter.h): the negative control of the rewrite.
    bool slot_misplace = false;
    // Tests only. MOESTREAM_DEBUG_SLOT_WARM_SKIP_COPY=1: the warm start records its experts
    // as slotted without copying them (residency.h, SlotTestHooks): its negative control.
    bool slot_warm_skip_copy = false;
    // Tests only. MOESTREAM_DEBUG_SLOT_PREFETCH_SKIP_READ=1: a prefetch into slots records its
    // experts as slotted without reading them (residency.h, SlotTestHooks): its negative control.
    bool slot_prefetch_skip_read = false;
    // Tests only. MOESTREAM_DEBUG_IO_FAULT=<plan>: I/O faults injected at the lanes
    // (io_faults.h; validated here, parsed into each engine's own plan, which counts).
    std::string io_fault;
    // Tests only. MOESTREAM_DEBUG_NO_BUDGET_CLAMP=1: an explicit RunOptions::cache_mb is not
    // clamped to the memory limit (the negative control of the clamp).
    bool no_budget_clamp = false;
    // Tests only. MOESTREAM_DEBUG_CORRUPT_EXPERT=<layer>:<expert>|<layer>:*: the gates'
    // negative control (streamer.h, StreamTestHooks).
    StreamTestHooks stream_hooks;
    // (stream_hooks.skip_second_wait: MOESTREAM_DEBUG_SKIP_SECOND_WAIT=1, tests only.)
    // Tests only. MOESTREAM_DEBUG_SUBSTITUTE_UNROUTED=1: --substitute-experts plants a bug (a
    // non-resident substitute the streamer is not told about): the negative control of the
    // --cache-debug check of the experts each matmul reads (policy_substitute.h).
    bool substitute_unrouted = false;
    // Tests only. MOESTREAM_DEBUG_FALLBACK_SKIP_CONVERT=1: --miss-fallback leaves its first
    // converted slot unwritten (miss_fallback.h): the negative control of --cache-debug.
    bool fallback_skip_convert = false;
};

// Reads every knob now: Ok, or the first variable whose value is malformed (kUsage).
Status read_env_knobs(EnvKnobs * out);

}  // namespace moestream
