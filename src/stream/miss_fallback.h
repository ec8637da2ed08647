// miss_fallback.h — the opt-in lossy policy --miss-fallback FILE (docs/quality.md,
// "Low-bit fallback"): a cache miss the router weighted below a threshold is computed from a
// low-bit copy of the expert (a companion GGUF made by `moestream make-fallback`) instead of
// reading the full one.
//
// Stock ggml computes a layer's experts with ONE MUL_MAT_ID over one tensor of one type, so
// the low-bit slice cannot be used in place: it is read from the companion file and converted
// on arrival into the expert's canonical slot of the bank, in the bank's type (dequantized
// with ggml's to_float, re-quantized with ggml_quantize_chunk). The slot then holds a lossy
// copy:
//  - the streamer stages the expert as usual (the store commits its slot), but its full
//    reads are replaced by the companion read and the conversion (take_reads / run);
//  - with the LRU cache the converted expert stays resident and is remembered as lossy: a
//    later low-weight routing of it is a hit on the lossy copy, a later routing that needs
//    the full copy makes the store forget it first (before_stage), so the full slices are
//    read again; any full read of an expert clears its lossy mark.
//
// The companion is validated like the main file (load_model_index: every slice in bounds,
// known types) and against the model: every expert tensor of the model exists in it with
// the same shape and a type that dequantizes, the model's bank types re-quantize without an
// importance matrix, and the fingerprint of the source model it was made from (key
// moestream.fallback.source_fingerprint, written by make-fallback) equals this model's. Its
// own data is bound to it by a hash per expert slice (kFallbackSliceHashKey), checked as the
// slice is read, with the slice's weights checked finite.
//
// Thread-safety: driven from the llama_decode thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io_lanes.h"
#include "moestream/gguf_index.h"
#include "residency.h"
#include "topk_reading.h"
#include "status.h"

namespace moestream {

// KV keys of a companion file.
inline constexpr char kFallbackFingerprintKey[] = "moestream.fallback.source_fingerprint";
inline constexpr char kFallbackSourceSizeKey[] = "moestream.fallback.source_bytes";
inline constexpr char kFallbackSourceNameKey[] = "moestream.fallback.source_file";
inline constexpr char kFallbackTypeKey[] = "moestream.fallback.type";
// u64 array: the FNV-1a hash of every expert slice of the companion's own data, in the order
// MoE layer, expert tensor (the model's order), expert. Written by make-fallback, checked as
// each slice is read, so the companion's identity covers its data, not only its source's.
inline constexpr char kFallbackSliceHashKey[] = "moestream.fallback.slice_fnv1a";

// The 64-bit FNV-1a hash of n bytes (kFallbackSliceHashKey's entries).
uint64_t fallback_slice_hash(const void * data, size_t n);

// The fingerprint of a model: a 64-bit FNV-1a hash (16 hex digits) over its expert tensors'
// names, types and shapes, its total file size and the first and last 4 KiB of its first and
// last expert tensors' data (read from the files). kBadInput if those bytes cannot be read.
Status model_fingerprint(const ModelIndex & m, std::string * out);

struct FallbackCounters {
    uint64_t fallbacks = 0;      // expert computations served from the low-bit copy
    uint64_t lossy_hits = 0;     // of those: hits on a lossy copy already resident
    uint64_t bytes_read = 0;     // companion bytes read
    uint64_t bytes_saved = 0;    // full bytes not read minus companion bytes read
    uint64_t forgotten = 0;      // lossy copies forgotten for a full read
    double convert_s = 0;        // time converting (dequantize + re-quantize)
    double read_s = 0;           // time reading the companion
};

class MissFallback {
public:
    // Opens and validates `path` against the model `main`. Errors are kBadModel naming the
    // file and what mismatched.
    static Status open(const std::string & path, const ModelIndex & main,
                       std::unique_ptr<MissFallback> * out);
    ~MissFallback();

    const std::string & path() const { return path_; }
    const std::string & type_name() const { return type_name_; }
    // Bytes of one expert of MoE layer slot in the companion.
    uint64_t expert_bytes(size_t slot) const { return lo_expert_bytes_[slot]; }
    // Whether expert e of MoE layer slot is resident as a lossy copy.
    bool lossy(size_t slot, uint32_t e) const { return lossy_[slot][e] != 0; }

    // Streamer, per routing: fb[i] = 1 where every slot routing experts[i] in r is marked
    // r.fallback (all zero when r.fallback is empty).
    static void flags(const Routing & r, const std::vector<uint32_t> & experts,
                      std::vector<uint8_t> * fb);
    // Streamer, per routing: `fb[i]` = 1 where experts[i] is to be computed from the low-bit
    // copy. Experts routed at full precision whose slot holds a lossy copy are forgotten by
    // the store (so stage() reads them).
    void before_stage(size_t slot, const std::vector<uint32_t> & experts,
                      const std::vector<uint8_t> & fb, ResidencyStore * store);
    // After stage(): the reads of the low-bit experts leave *reads and become jobs of run();
    // a remaining full read clears that expert's lossy mark.
    void take_reads(size_t slot, const std::vector<uint32_t> & experts,
                    const std::vector<uint8_t> & fb, ResidencyStore * store,
                    std::vector<ReadRequest> * reads);
    // Reads the jobs' low-bit slices and converts them into their slots. With the cache,
    // the experts are then lossy copies (mark = the store keeps them).
    Status run(size_t slot, bool mark);

    const FallbackCounters & counters() const { return c_; }

    // Tests only: the negative control of the cache-debug check: skip the conversion of
    // the first job, so its slot keeps the bytes it was committed with.
    void plant_skip_convert(bool on) { plant_skip_ = on; }

private:
    MissFallback() = default;
    struct Job {
        uint32_t e;
        size_t t;
        void * dest;
    };
    Status convert(size_t slot, const Job & j);

    std::string path_;
    std::string type_name_;
    int fd_ = -1;
    ModelIndex lo_;                   // the companion's index
    const ModelIndex * main_ = nullptr;
    std::vector<std::vector<const ExpertTensor *>> lo_tensors_;  // [slot][t]
    std::vector<uint64_t> slice_hash_;  // kFallbackSliceHashKey: [slot][t][e], flattened
    std::vector<size_t> hash_base_;     // [slot]: index of the slot's first hash
    std::vector<uint64_t> lo_expert_bytes_;
    std::vector<std::vector<uint8_t>> lossy_;  // [slot][e]
    std::vector<Job> jobs_;
    std::vector<uint8_t> scratch_;
    std::vector<float> floats_;
    FallbackCounters c_;
    bool plant_skip_ = false;
};

}  // namespace moestream
