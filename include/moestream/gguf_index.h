// gguf_index.h — moestream's own, validating reader of a GGUF file's metadata and of the
// expert map that the streamer reads from.
//
// Why our own reader: moestream computes file offsets itself and reads them with O_DIRECT,
// so every offset and size it will ever use is derived and bounds-checked here, before
// llama.cpp sees the file (llama.cpp aborts on some corrupt files instead of failing).
//
// Invariants of a ModelIndex returned with Status::Ok():
//  - every tensor's [file_offset, file_offset + nbytes) lies inside the file, computed with
//    overflow-checked arithmetic; tensors do not overlap; offsets respect the alignment;
//  - every tensor type is one ggml knows with a row size that divides the shape;
//  - for each MoE layer, gate/up/down (or fused gate_up) expert tensors exist with
//    consistent shapes ([n_embd, n_ff_exp, n_expert] for gate/up, [n_ff_exp, n_embd,
//    n_expert] for down, [n_embd, 2*n_ff_exp, n_expert] for fused gate_up; n_embd may instead
//    be the arch's expert latent width for latent-MoE archs) and expert e's slice is
//    [file_offset + e*slice_bytes, +slice_bytes);
//  - 1 <= n_expert_used <= n_expert.
// Reading is bounded: strings and arrays are capped (see kMax* in src/model/gguf_reader.h), so a
// hostile file cannot make the reader allocate more than a few MiB.
// Thread-safety: load_model_index is reentrant; a ModelIndex is immutable after load.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moestream/status.h"

namespace moestream {

// One tensor of the file, as the tensor-info table describes it.
struct TensorInfo {
    std::string name;
    int32_t type = 0;        // ggml_type
    uint32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};   // elements per dimension
    uint64_t nb[4] = {0, 0, 0, 0};  // byte strides as ggml computes them (nb[0] = type size)
    uint64_t file_offset = 0;       // absolute byte offset of the data in its file (shard)
    uint64_t nbytes = 0;            // bytes of data
    uint64_t info_offset = 0;       // offset of its record in the tensor-info table
    uint32_t shard = 0;             // which ModelIndex::shards file holds it (0: single file)
    // In a layer llama.cpp does not build (a NextN/MTP layer): never read, bound or counted
    // in dense_bytes_total; its expert tensors are not in the expert map.
    bool unused = false;
};

enum class Projection : int { kGate = 0, kUp = 1, kDown = 2, kGateUp = 3 };
const char * projection_name(Projection p);  // "gate", "up", "down", "gate_up"

// One expert tensor of a MoE layer: [n_in, n_out, n_expert], expert-major.
struct ExpertTensor {
    std::string name;             // e.g. "blk.3.ffn_up_exps.weight"
    uint32_t layer = 0;           // il
    Projection proj = Projection::kGate;
    int32_t type = 0;             // ggml_type of the weights
    int64_t ne[3] = {0, 0, 0};    // [n_in, n_out, n_expert]
    uint64_t row_bytes = 0;       // nb[1]: bytes of one row of n_in elements
    uint64_t slice_bytes = 0;     // nb[2] = ne[1] * nb[1]: bytes of one expert
    uint64_t file_offset = 0;     // absolute file offset of expert 0's slice
    uint64_t tensor_bytes = 0;    // n_expert * slice_bytes
    uint32_t shard = 0;           // the file (ModelIndex::shards) holding the tensor
    // Expert e's slice in the file: [file_offset + e * slice_bytes, ... + slice_bytes).
    uint64_t slice_offset(uint32_t e) const { return file_offset + uint64_t(e) * slice_bytes; }
};

struct MoeLayer {
    uint32_t layer = 0;
    std::vector<ExpertTensor> tensors;  // gate, up, down (or gate_up, down; or up, down), in that order
    uint64_t expert_bytes = 0;          // bytes of ONE expert over all its projections
};

// A scalar metadata value (arrays are summarized: type and length, plus strings kept
// only for the few keys that need them).
struct KvValue {
    uint32_t type = 0;            // gguf_type
    int64_t i = 0;                // integer / bool value
    double f = 0;                 // float value
    std::string s;                // string value
    uint32_t arr_type = 0;        // for arrays: element type
    uint64_t arr_len = 0;         // for arrays: length
    // Integer arrays (per-layer hparams such as expert_feed_forward_length) are kept when
    // small (the reader's byte budget); other arrays are skipped, only type and length kept.
    std::vector<int64_t> arr_i;
};

// One file of the model: the file itself, or one shard of a split set (llama.cpp's gguf-split
// layout: NAME-00001-of-0000N.gguf ..., keys split.no / split.count / split.tensors.count; the
// first shard holds the model's metadata, every shard a part of the tensors).
struct ShardFile {
    std::string path;
    uint64_t file_size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    uint64_t dev = 0, ino = 0;
    uint64_t data_offset = 0;      // start of its tensor data section
    uint32_t n_tensors = 0;        // tensors whose data it holds
    uint64_t tensor_bytes = 0;     // their bytes
};

struct ModelIndex {
    // The file llama.cpp opens: the model file, or the first shard of a split set (whichever
    // shard load_model_index was given). path .. data_offset describe that file.
    std::string path;
    uint64_t file_size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;          // inode change time: any write moves it, `touch -r` cannot
    uint64_t dev = 0, ino = 0;     // identity of the validated file (replacement detection)
    uint32_t version = 0;          // GGUF version (2 or 3)
    uint64_t alignment = 32;       // general.alignment
    uint64_t data_offset = 0;      // start of the tensor data section

    std::string arch;              // general.architecture
    std::string name;              // general.name, if present
    uint32_t n_layer = 0;          // <arch>.block_count
    uint32_t n_embd = 0;           // <arch>.embedding_length
    uint32_t n_expert = 0;         // <arch>.expert_count
    uint32_t n_expert_used = 0;    // <arch>.expert_used_count
    uint32_t n_ff_exp = 0;         // <arch>.expert_feed_forward_length (0 if absent/0; for a
                                   // per-layer array, the value when all MoE layers agree)
    uint32_t n_vocab = 0;          // length of tokenizer.ggml.tokens (0 if absent)

    std::map<std::string, KvValue> kv;
    std::map<std::string, uint64_t> kv_offsets;  // key -> byte offset of its record
    std::vector<TensorInfo> tensors;     // in file order
    std::vector<MoeLayer> moe_layers;    // ascending layer index

    // Every file of the model, shard order (one entry for a single file); shards[0] is `path`.
    std::vector<ShardFile> shards;
    uint64_t set_bytes = 0;              // sum of the shards' file sizes

    // Layers llama.cpp does not build: the last <arch>.nextn_predict_layers layers (NextN /
    // MTP prediction heads kept by the converter). Their tensors are flagged `unused`.
    uint32_t n_nextn_layers = 0;
    uint64_t unused_bytes_total = 0;     // bytes of the unused tensors

    uint64_t expert_bytes_total = 0;     // all expert tensors (of the expert map)
    uint64_t dense_bytes_total = 0;      // every other tensor that llama.cpp uses
    // One token's routed working set: sum over MoE layers of n_expert_used * expert_bytes.
    uint64_t token_working_set_bytes = 0;

    // Lookup tables filled by load_model_index.
    std::map<std::string, size_t> tensor_ids;        // tensor name -> index in `tensors`
    std::set<std::string> expert_tensor_names;       // names of the expert-map tensors

    const TensorInfo * find_tensor(const std::string & name) const;
    bool is_expert_tensor(const std::string & name) const;  // part of the expert map
};

// Reads and validates `path`. On error the Status (ErrorCode::kBadModel) names the file,
// what is wrong and the byte offset where it was found.
// A shard of a split set (split.count > 1; any shard may be given) loads the whole set: every
// shard's metadata is read and validated (nothing of the tensor data), and the index covers all
// of them. Refused, naming the shard file: a missing shard, a shard whose split.no, split.count
// or split.tensors.count disagree with the set, a tensor in two shards, a total tensor count
// other than split.tensors.count, a name that is not llama.cpp's NAME-0000K-of-0000N.gguf.
Status load_model_index(const std::string & path, ModelIndex * out);

// The paths of the model's files, shard order (one for a single file).
std::vector<std::string> shard_paths(const ModelIndex & m);

// Checks a validated index against the ggml CPU backend loaded in this process (call after
// loading the backends, before llama.cpp sees the file): general.alignment against the CPU
// buffer alignment, and every tensor's type in the op its role feeds — the token embedding in
// GET_ROWS (and MUL_MAT when the output is tied), expert tensors in MUL_MAT_ID, other
// matrices in MUL_MAT, 1-D tensors (norms, biases) element-wise with f32 activations. The
// device's supports_op is asked on a probe node of that op; the CPU kernels' type traits then
// decide (a dot product and an activation conversion must exist), since ggml's CPU
// supports_op accepts every type. Error: kBadModel naming the tensor and the offset of its
// tensor-info record; kRuntime when no CPU backend is loaded.
Status check_cpu_computable(const ModelIndex & m);

}  // namespace moestream
