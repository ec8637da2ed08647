// env_knobs.h — the environment variables that set no RunOptions field (the backend path and
// the tests' negative controls), read once per Engine::open.
//
// The variables that set RunOptions fields are the registry's overlay (settings.h,
// apply_env_overlay); every variable is a row of that registry (docs/cli.md, "Settings").
// Besides these two, nothing in src/ calls getenv (the logger's MOESTREAM_LOG, read by
// src/util/log.cpp before any engine exists, is the one exception). A value that
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
    // Tests only. MOESTREAM_DEBUG_SLOT_MISPLACE=1: with the fixed-slot cache the expert
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
    // Tests only. MOESTREAM_DEBUG_POOL_WARM_WAIT=1: the LRU cache waits for the page pool's
    // whole warm-up before the first commit (residency.h, CacheTestHooks::warm_pool_wait).
    bool pool_warm_wait = false;
    // Tests only. MOESTREAM_DEBUG_CORRUPT_EXPERT=<layer>:<expert>|<layer>:*: the gates'
    // negative control (streamer.h, StreamTestHooks).
    StreamTestHooks stream_hooks;
    // (stream_hooks.skip_second_wait: MOESTREAM_DEBUG_SKIP_SECOND_WAIT=1, tests only.)
    // (stream_hooks.warm_tail_experts: MOESTREAM_DEBUG_WARM_TAIL=N, tests only: every warm
    // tail is N experts, read in full.)
    // (stream_hooks.warm_preload_wait / _off: MOESTREAM_DEBUG_WARM_PRELOAD=wait|off, tests
    // only: the warm preload at open is waited for in full, or not started.)
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
