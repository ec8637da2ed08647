// weight_binder.h — moving llama.cpp's weights off the file mapping.
//
// Dense weights are read at load (WeightBinder::read_dense): every tensor of the file that is
// not an expert tensor gets its own heap copy, filled by the I/O lanes in parallel, O_DIRECT
// straight into the copy (io_lanes.h), so dense weights end up resident in anonymous memory,
// not in the page cache.
//
// Binding happens on the first graph (llama.cpp keeps no public tensor lookup): the router
// hook hands every node's operands to WeightBinder::bind in ask mode, which runs before the
// node computes. A weight that points into the mapping is rebound: an expert tensor to the
// residency store (never read here), any other weight to its heap copy. Views of a rebound
// weight are re-pointed. After the first graph nothing points
// into the mapping: finish() checks that every expert tensor of the index was bound. (Weights
// are recognised by name and by sitting exactly at their file offset in their shard's mapping,
// never by address range alone: llama.cpp unmaps unused fragments of the mapping after load,
// and other allocations, this binder's heap copies among them, can land in those holes. Each
// weight is bound once: a weight feeding several nodes, such as token_embd, is not looked at
// again.) Tensors of unused (NextN) layers are neither read nor bound.
// Thread-safety: used from the llama_decode thread only (read_dense: from the thread that
// drives the lanes, before the first graph).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "moestream/gguf_index.h"
#include "io_lanes.h"
#include "model_loader.h"
#include "node_observer.h"
#include "residency.h"
#include "status.h"

struct ggml_tensor;

namespace moestream {

// Rebinds llama.cpp's weights off the file mapping, lazily, from the first graph. As the
// router hook's binding observer (node_observer.h) it binds the operands of every node in ask
// mode while active(); it asks for no node.
// Thread-safety: used from the llama_decode thread only (read_dense: from the thread that
// drives the lanes, before the first graph).
class WeightBinder final : public NodeObserver {
public:
    WeightBinder(const ModelIndex & index, ResidencyStore * store, const LoadedModel & lm);
    ~WeightBinder();
    WeightBinder(const WeightBinder &) = delete;
    WeightBinder & operator=(const WeightBinder &) = delete;

    // Reads every non-expert tensor of the index into its heap copy with `lanes` (requests of
    // at most chunk_bytes, split at aligned file offsets; the copy has the file offset's
    // phase modulo the lanes' alignment, so the body is read in place). Call once, before the
    // first graph. A read error is returned as the lanes report it (file, offset, errno).
    static constexpr uint64_t kDenseChunkBytes = 4ull << 20;
    // Requests are read in batches of about this many bytes (the buffered fallback drops
    // each batch from the page cache once read).
    static constexpr uint64_t kDenseBatchBytes = 256ull << 20;
    // huge_pages: copies of a huge page or more start on one and are advised for transparent
    // huge pages (huge_pages.h).
    // With a progress callback the batches are at most total / kProgressSteps bytes (at
    // least two chunks per lane).
    static constexpr uint64_t kProgressSteps = 64;
    // progress (may be empty): bytes read so far and their total, with 0 before the first
    // read and after each batch (RunOptions::on_load_progress).
    Status read_dense(IoLanes * lanes, uint64_t chunk_bytes = kDenseChunkBytes,
                      uint64_t batch_bytes = kDenseBatchBytes, bool huge_pages = true,
                      const std::function<void(uint64_t done, uint64_t total)> & progress = {});
    // The heap copy of a dense weight, or null (not read, or freed by finish()).
    const void * dense_copy(const std::string & name) const;
    double dense_read_s() const { return dense_read_s_; }  // wall time of read_dense
    // Bytes of dense copies the kernel accepted huge-page advice for (0: none, or off).
    uint64_t dense_huge_bytes() const { return dense_huge_bytes_; }
    const IoBatchStats & dense_read_stats() const { return dense_stats_; }  // its reads

    // True until finish(): the hook hands every node's operands to bind().
    bool active() const { return !finished_; }
    // `t` is an operand of a node about to compute. If it (or the weight it views) points
    // into the file mapping, rebinds it (see above) and re-points the view.
    Status bind(ggml_tensor * t);
    // After the first graph: every expert tensor must have been bound. Idempotent.
    Status finish();
    // Ask mode, while active(): binds every operand of t; a failure goes to hook.fail().
    bool on_ask(ggml_tensor * t, RouterHook & hook) override;

    uint64_t dense_bytes() const { return dense_bytes_; }    // heap copies of dense weights

private:
    bool in_map(const void * p) const;  // inside any of the model's mappings
    // Binds g if it is a weight of the file still in its mapping (*file_weight then true).
    Status bind_root(ggml_tensor * g, bool * file_weight);
    using DenseKey = std::pair<uint32_t, uint64_t>;  // (shard, file offset)
    static DenseKey dense_key(const TensorInfo & t) { return {t.shard, t.file_offset}; }

    const ModelIndex & index_;
    ResidencyStore * store_;
    std::vector<FileMapping> maps_;  // llama.cpp's mapping of each shard
    std::set<const ggml_tensor *> bound_;  // weights rebound (each once)
    std::vector<std::pair<std::string, std::pair<size_t, size_t>>> experts_;  // sorted by name
    std::vector<std::vector<bool>> expert_bound_;                             // [slot][t]
    struct DenseCopy {
        void * alloc = nullptr;    // posix_memalign'ed block (freed with std::free)
        uint8_t * data = nullptr;  // the weight's bytes: alloc + file offset mod the alignment
        uint64_t nbytes = 0;
        bool bound = false;  // a graph tensor points at it
    };
    std::map<DenseKey, DenseCopy> dense_;  // by shard and file offset
    uint64_t dense_bytes_ = 0;             // bytes of bound copies
    double dense_read_s_ = 0;
    uint64_t dense_huge_bytes_ = 0;
    IoBatchStats dense_stats_;
    size_t n_expert_bound_ = 0;
    bool finished_ = false;
};

}  // namespace moestream
