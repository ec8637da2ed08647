// fallback.h — `moestream make-fallback`: the companion file of --miss-fallback
// (docs/quality.md, "Low-bit fallback").
//
// make_fallback() runs llama.cpp's `llama-quantize` over the model with every expert tensor
// (ffn_{gate,up,down,gate_up}_exps) overridden to `type` (--allow-requantize, into a temporary
// file next to the output), then writes the output with only the expert tensors, the model's
// metadata and the fingerprint of the source model (moestream.fallback.* keys), which
// --miss-fallback checks before using the file. The output is written atomically; the
// temporary file is removed in every case.
#pragma once

#include <string>
#include <vector>

#include "moestream/status.h"

namespace moestream {

struct MakeFallbackOptions {
    std::string model_path;   // the model (or any shard of a split set)
    std::string out_path;     // the companion GGUF
    std::string type = "Q2_K";  // llama-quantize's type name for the expert tensors
    // The llama-quantize command: argv prefix (e.g. {"scripts/llama-tool", "llama-quantize"}).
    std::vector<std::string> quantize_cmd;
    int n_threads = 0;        // passed to llama-quantize (0: its default)
};

struct MakeFallbackResult {
    uint64_t expert_bytes_model = 0;   // expert tensor bytes in the model
    uint64_t expert_bytes_fallback = 0;  // in the companion
    std::string fingerprint;           // of the source model
    std::string types;                 // the companion's expert types, e.g. "q2_K x 48, q4_0 x 2"
};

// kBadModel for a model that does not validate, kBadInput for a file that cannot be written
// or read, kRuntime when llama-quantize fails (its exit status in the message).
// Ok when `type` is a ggml type name (case-insensitive; not a llama-quantize mix such as
// Q3_K_S) that llama-quantize writes without an importance matrix; kUsage listing them else.
Status check_fallback_type(const std::string & type);

// kUsage for a type llama-quantize cannot write without an importance matrix (or no ggml type)
// and for an output that is a file of the model itself.
Status make_fallback(const MakeFallbackOptions & opt, MakeFallbackResult * out);

// The temporary files make_fallback() of this process writes next to opt.out_path (all removed
// before it returns), for a caller that must remove them when a signal ends the process
// (the tool it runs dies with it).
std::vector<std::string> make_fallback_temp_paths(const MakeFallbackOptions & opt);

}  // namespace moestream
