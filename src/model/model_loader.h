// model_loader.h — getting a llama_model without reading the experts.
//
// Resident (--no-stream): llama_model_load_from_file with load_mode MMAP, exactly what the
// reference tools do with `-lm mmap --no-repack` (llama.cpp prefaults the whole file).
//
// Streaming: the same llama_model_load_from_file with load_mode MMAP — llama.cpp's own loader,
// so the model is exactly the file's — but with the mmap guard armed (mmap_guard.h): the
// file (every shard of a split set) is mapped without MAP_POPULATE / WILLNEED, so loading reads
// only metadata. All
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

// llama.cpp's mapping of one file of the model (streaming).
struct FileMapping {
    uint8_t * addr = nullptr;  // null: the file was not mapped (a shard without tensor data)
    size_t len = 0;
};

struct LoadedModel {
    llama_model * model = nullptr;
    std::vector<FileMapping> maps;  // streaming: one per ModelIndex::shards entry
    // Streaming: bytes of each file's mappings resident in this process right after
    // llama.cpp's load (smaps Rss; a prefaulted file shows its whole size).
    std::vector<uint64_t> resident_after_load;
};

// map_file: llama.cpp load_mode MMAP (prefaults the whole file); false: NONE (every tensor
// read into allocated memory).
Status load_model_resident(const ModelIndex & index, const llama_model_params & params,
                           bool map_file, LoadedModel * out);
Status load_model_streaming(const ModelIndex & index, const llama_model_params & params,
                            LoadedModel * out);
}  // namespace moestream
