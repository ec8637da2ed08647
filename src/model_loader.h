// model_loader.h — getting a llama_model without reading the experts, and binding them.
//
// Resident (--no-stream): llama_model_load_from_file with load_mode MMAP, exactly what the
// reference tools do with `-lm mmap --no-repack` (llama.cpp prefaults the whole file).
//
// Streaming: llama_model_init_from_user(gguf metadata, callback). llama.cpp creates every
// tensor in one CPU buffer (heap, lazily committed) and asks the callback for each tensor's
// data; the callback reads dense tensors from the file (checked, buffered, page cache
// released behind it) and leaves expert tensors untouched, so their pages are never
// committed. bind_experts() then points each expert tensor's data at the residency store.
// Every tensor llama.cpp creates is checked against the validated index (name, type,
// shape, byte size) before a byte is read into it.
//
// Both paths load with use_extra_bufts = false (repacking would change the in-memory
// layout that file offsets describe: load-bearing, not a tunable) and lazy mode off.
// Thread-safety: not reentrant per model; distinct models are independent.
#pragma once

#include <string>
#include <vector>

#include "gguf_index.h"
#include "residency.h"
#include "status.h"

struct llama_model;
struct llama_model_params;
struct ggml_tensor;

namespace moestream {

struct LoadedModel {
    llama_model * model = nullptr;
    // expert_tensors[moe_slot][t] is the llama.cpp tensor of index.moe_layers[slot].tensors[t]
    // (empty on the resident path).
    std::vector<std::vector<ggml_tensor *>> expert_tensors;
    uint64_t dense_bytes_read = 0;
};

Status load_model_resident(const ModelIndex & index, const llama_model_params & params,
                           LoadedModel * out);
Status load_model_streaming(const ModelIndex & index, const llama_model_params & params,
                            LoadedModel * out);
// Points every expert tensor at store->tensor_base(slot, t); checks ggml's strides agree
// with the index (nb[2] == slice_bytes).
Status bind_experts(const ModelIndex & index, ResidencyStore * store, LoadedModel * lm);

}  // namespace moestream
