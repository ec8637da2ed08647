// gguf_parser.h — GgufParser: one GGUF file's structure (header, metadata, tensor-info table,
// data section) read into a ModelIndex, then the model rules over the index: llama.cpp's
// hyperparameter rules (hparam_rules.h), the vocabulary rules (vocab_rules.h) and the expert
// map (expert_map.h). A split set's later shards are parsed the same way and their tensors
// added to the first shard's parser (add_shard) before the rules run (shard_set.cpp).
//
// Invariants after parse_file(): every tensor's [file_offset, +nbytes) lies inside the file,
// offsets respect general.alignment, no two tensors share bytes, every type is one ggml knows
// with a row size that divides the shape; kept strings and integer arrays stay within the
// reader's byte budget (kMaxStoredBytes). Failures throw ParseError (gguf_reader.h).
// Thread-safety: one thread; the reader and the index outlive the parser.
#pragma once

#include <cstdint>

#include "gguf_reader.h"
#include "hparam_rules.h"
#include "index_context.h"
#include "vocab_rules.h"

namespace moestream::gguf {

class GgufParser {
public:
    GgufParser(GgufReader & r, ModelIndex & m) : r_(r), ctx_(m) {}

    // The file's own structure: header, metadata, tensor infos, data section.
    void parse_file();
    // The model over every tensor gathered so far (this file's, and other shards' added).
    void parse_model();
    // Adds the tensors of shard `shard` (parsed with parse_file by `other`).
    void add_shard(const GgufParser & other, uint32_t shard);

private:
    // ---- sections ------------------------------------------------------------------------
    void header();
    void kv_pair(int64_t i);
    void alignment();
    void tensor_info(int64_t i);
    void data_section();

    GgufReader & r_;
    IndexContext ctx_;
    HparamRules hparams_;
    VocabRules vocab_;
    int64_t n_tensors_ = 0;
    int64_t n_kv_ = 0;
    uint64_t stored_ = 0;  // bytes of kept strings and integer arrays (kMaxStoredBytes)
};

}  // namespace moestream::gguf
