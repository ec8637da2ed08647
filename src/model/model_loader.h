// model_loader.h — getting a llama_model without reading the experts.
//
// Resident (--no-stream): llama_model_load_from_file with load_mode MMAP, exactly what the
// reference tools do with `-lm mmap --no-repack` (llama.cpp prefaults the whole file).
//
// Streaming: the same llama_model_load_from_file with load_mode MMAP — llama.cpp's own loader,
// so the model is exactly the file's — but with the mmap guard armed (mmap_guard.h): the
// file is mapped without MAP_POPULATE / WILLNEED, so loading reads only metadata. All
// tensors then point into the file mapping and nothing has been read.
//
// After a streaming load every tensor points into the file mapping; WeightBinder
// (graph/weight_binder.h) moves them off it on the first graph.
//
// Both paths load with use_extra_bufts = false (repacking would change the in-memory
// layout that file offsets describe: load-bearing, not a tunable) and lazy mode off.
// Thread-safety: not reentrant per model; distinct models are independent.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "moestream/gguf_index.h"
#include "status.h"

struct llama_model;
struct llama_model_params;

namespace moestream {

struct LoadedModel {
    llama_model * model = nullptr;
    uint8_t * map_addr = nullptr;  // streaming: llama.cpp's mapping of the file
    size_t map_len = 0;
};

// map_file: llama.cpp load_mode MMAP (prefaults the whole file); false: NONE (every tensor
// read into allocated memory).
Status load_model_resident(const ModelIndex & index, const llama_model_params & params,
                           bool map_file, LoadedModel * out);
Status load_model_streaming(const ModelIndex & index, const llama_model_params & params,
                            LoadedModel * out);
}  // namespace moestream
