// index_context.h — what the model rules (hparam_rules.h, vocab_rules.h, expert_map.h) read
// and how they fail: the ModelIndex being built, where each metadata key and tensor record is
// in its file, and one fail() that names the file an offset is in.
//
// Invariants: offset_at and shard_at have one entry per tensor of m.tensors (shard_at once
// the file's own parse is done); loc_shard is the file the next error is in (kThisFile: the
// file being read, else a shard of the set), moved by tensor_at(). Errors are ParseError
// (gguf_reader.h). Thread-safety: used by one thread (the one loading the index).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf_reader.h"
#include "moestream/gguf_index.h"

namespace moestream::gguf {

struct IndexContext {
    explicit IndexContext(ModelIndex & index) : m(index) {}

    ModelIndex & m;                      // the index being built
    uint64_t kv_end = 0;                 // offset just past the metadata section
    std::vector<uint64_t> offset_at;     // tensor i -> offset of its info record field
    std::vector<uint32_t> shard_at;      // tensor i -> its shard (0: this file)
    uint32_t loc_shard = kThisFile;      // the file the next error is in (tensor_at)
    std::vector<std::string> huge_u64;   // u64 keys whose value exceeds INT64_MAX

    // Raises a ParseError in the file of the tensor last looked up with tensor_at() (the file
    // being read until then).
    [[noreturn]] void fail(uint64_t offset, std::string what) const;
    // The offset of tensor i's info record; errors raised next name its shard.
    uint64_t tensor_at(size_t i);

    const KvValue * find_kv(const std::string & key) const;  // nullptr when absent
    uint64_t kv_offset(const std::string & key) const;       // its record's offset; 0 if absent
    // An integer-typed key in [lo, hi]; `required` false returns 0 when absent.
    uint32_t int_key(const std::string & key, bool required, int64_t lo, int64_t hi,
                     const char * missing_hint = "");
};

}  // namespace moestream::gguf
