// run_config.h — RunOptions checked before anything is loaded, and the context length chosen.
//
// Errors are kUsage in the library's own words: they name the RunOptions field as
// `RunOptions::<field>` (a boolean turned off as `RunOptions::<field> = false`) and say what
// is wrong. Front ends that expose the fields under other names rewrite these names where they
// print the message (the CLI maps them to its flags: tools/cli, flag_words).
// Thread-safety: pure functions of their arguments (check_context_fits also reads the memory
// available now).
#pragma once

#include <string>

#include "moestream/gguf_index.h"
#include "moestream/moestream.h"
#include "moestream/sysinfo.h"

namespace moestream {

// Every rule that needs no model: ranges, options that need streaming or exclude each other,
// the route trace's path. Ok or the first problem.
Status check_run_options(const RunOptions & opt);

// Whether prefill read-ahead can apply to these options (streaming, a worker lane, no route
// trace, drop-cold or substitution): Ok, or why not (kUsage, naming the options). With
// RunOptions::prefill_readahead 1 check_run_options refuses the latter; with -1 it is off.
Status check_prefill_readahead(const RunOptions & opt);

// The rules that need the model's shapes: n_expert_used against the model's top-k, and the
// context's KV cache, one batch's attention mask and the weights the run keeps in memory
// against the memory available (before llama.cpp allocates them; otherwise the kernel would
// OOM-kill the process). The memory figure is a lower bound of what llama.cpp allocates, so
// only what cannot fit is refused. With opt.n_ctx 0 (not resolved yet) only the weights are
// checked; the engine checks again once the context is known.
Status check_n_expert_used(const RunOptions & opt, const ModelIndex & m);
Status check_context_fits(const RunOptions & opt, const ModelIndex & m);

// RunOptions::n_batch 0: the prompt batch (and so llama.cpp's ubatch, unless n_ubatch says
// otherwise). A prompt of P tokens reads each layer's experts ceil(P / ubatch) times when
// the cache cannot hold them all, and the compute buffers grow with the batch. So: 512 when
// not streaming, when the memory available is unknown, or when every expert fits in the cache
// (RunOptions::cache_mb N, or auto with the memory available); otherwise the largest power of
// two up to min(4096, n_ctx) whose compute estimate (auto_needs_bytes) exceeds 512's by at
// most an eighth of the memory available. *reason says which and why.
int choose_n_batch(const RunOptions & opt, const ModelIndex & m, const MemoryAvailability & mem,
                   std::string * reason);

// RunOptions::n_ctx 0: the model's training context (<arch>.context_length, as llama.cpp
// reads it), capped so that the KV cache (f16 K and V for every layer and KV head, from the
// same keys llama.cpp reads) takes at most a quarter of mem. *reason says how it was chosen.
int model_context(const ModelIndex & m, const MemoryAvailability & mem, std::string * reason);

}  // namespace moestream
