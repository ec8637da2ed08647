// model_loader.h — getting a llama_model without reading the experts, and binding them.
//
// Resident (--no-stream): llama_model_load_from_file with load_mode MMAP, exactly what the
// reference tools do with `-lm mmap --no-repack` (llama.cpp prefaults the whole file).
//
// Streaming: the same llama_model_load_from_file with load_mode MMAP — llama.cpp's own loader,
// so the model is exactly the file's — but with the mmap guard armed (mmap_guard.h): the
// file is mapped without MAP_POPULATE / WILLNEED, so loading reads only metadata. All
// tensors then point into the file mapping and nothing has been read.
//
// Binding happens on the first graph (llama.cpp keeps no public tensor lookup): the router
// hook hands every node's operands to WeightBinder::bind in ask mode, which runs before the
// node computes. A weight that points into the mapping is rebound: an expert tensor to the
// residency store (never read here), any other weight to a heap copy (read once from the
// file with checked reads; dense weights end up resident in anonymous memory, not in the
// page cache). Views of a rebound weight are re-pointed. After the first graph nothing points
// into the mapping: finish() checks that every expert tensor of the index was bound. (Weights
// are recognised by name and file offset, not by address alone: llama.cpp unmaps unused
// fragments of the mapping after load, and other allocations can land in those holes.)
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
    uint8_t * map_addr = nullptr;  // streaming: llama.cpp's mapping of the file
    size_t map_len = 0;
};

// map_file: llama.cpp load_mode MMAP (prefaults the whole file); false: NONE (every tensor
// read into allocated memory).
Status load_model_resident(const ModelIndex & index, const llama_model_params & params,
                           bool map_file, LoadedModel * out);
Status load_model_streaming(const ModelIndex & index, const llama_model_params & params,
                            LoadedModel * out);
// Rebinds llama.cpp's weights off the file mapping, lazily, from the first graph.
// Thread-safety: used from the llama_decode thread only.
class WeightBinder {
public:
    WeightBinder(const ModelIndex & index, ResidencyStore * store, const LoadedModel & lm);
    ~WeightBinder();
    WeightBinder(const WeightBinder &) = delete;
    WeightBinder & operator=(const WeightBinder &) = delete;

    // True until finish(): the hook hands every node's operands to bind().
    bool active() const { return !finished_; }
    // `t` is an operand of a node about to compute. If it (or the weight it views) points
    // into the file mapping, rebinds it (see above) and re-points the view.
    Status bind(ggml_tensor * t);
    // After the first graph: every expert tensor must have been bound. Idempotent.
    Status finish();

    uint64_t dense_bytes() const { return dense_bytes_; }    // heap copies of dense weights
    size_t n_experts_bound() const { return n_expert_bound_; }

private:
    bool in_map(const void * p) const;
    Status bind_root(ggml_tensor * t);

    const ModelIndex & index_;
    ResidencyStore * store_;
    uint8_t * map_addr_;
    size_t map_len_;
    int fd_ = -1;
    std::vector<std::pair<std::string, std::pair<size_t, size_t>>> experts_;  // sorted by name
    std::vector<std::vector<bool>> expert_bound_;                             // [slot][t]
    std::vector<void *> heap_;                                                // dense copies
    uint64_t dense_bytes_ = 0;
    size_t n_expert_bound_ = 0;
    bool finished_ = false;
};

}  // namespace moestream
