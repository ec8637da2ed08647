// synth.h — writes GGUF MoE models with deterministic random weights and real shapes,
// for tests and benchmarks (no model weights can be downloaded where moestream is built).
//
// Invariants: the same SynthOptions give the same file bytes (seeded PRNG per tensor,
// independent of thread count); the file loads in llama.cpp 0.7.0; weights have realistic
// scale (finite activations, non-constant logits, routing spread over all experts).
// Large files are streamed to disk (metadata first, then tensor data in file order), never
// held in memory whole. Thread-safety: synth_model is reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moestream/status.h"

namespace moestream {

struct SynthOptions {
    std::string preset = "tiny";       // tiny | mid | qwen3-30b-a3b
    std::string arch = "qwen3moe";     // qwen3moe | olmoe | <one sigmoid-gated arch>
    std::string expert_type = "q8_0";  // f32 | f16 | q8_0 | q4_k
    uint64_t seed = 1;
    uint32_t alignment = 32;  // general.alignment (32 default, or 4096)
    std::string out_path;
    bool progress = false;  // progress bar + MB/s on stderr
    unsigned threads = 0;   // generator threads (0 = min(cores, 4)); no effect on bytes
    bool dry_run = false;   // plan only: fill SynthResult, write nothing
    // Gain of every attention output projection, times 1/sqrt(fan_in). The default 0.3 keeps
    // token states apart over 48 layers, so routing has no more locality than chance (hit
    // rate ~ budget / expert bytes). 1.0 is the plain 1/sqrt(fan_in) init: the near-uniform
    // random attention adds much the same vector at every position, token states grow alike,
    // greedy output repeats and routing repeats with it (a cache gets many hits). Range
    // (0, 4]; the same weights otherwise.
    float attn_out_gain = 0.3f;
    // glm4moe only: NextN (multi-token prediction) layers appended after the preset's layers
    // (block_count grows by this, <arch>.nextn_predict_layers says it), as GLM-4.5's converter
    // keeps them; llama.cpp loads them without running them. 0..4.
    uint32_t nextn_layers = 0;
};

struct SynthResult {
    uint64_t file_bytes = 0;
    double seconds = 0;
    uint64_t n_tensors = 0;
    uint64_t expert_bytes = 0;  // all ffn_{gate,up,down}_exps tensors
    uint64_t data_offset = 0;   // start of the tensor data section
};

std::vector<std::string> synth_presets();
std::vector<std::string> synth_archs();
std::vector<std::string> synth_types();

// Writes the model. The data goes to synth_temp_path(opt) first, renamed to opt.out_path
// at the end; on error the temp file is removed. Errors: kUsage (bad options), kRuntime
// (I/O: the message names opt.out_path).
Status synth_model(const SynthOptions & opt, SynthResult * result);

// The temp file synth_model writes in this process ("<out_path>.tmp.<pid>"): a CLI that
// is interrupted by a signal can unlink it.
std::string synth_temp_path(const SynthOptions & opt);

}  // namespace moestream
