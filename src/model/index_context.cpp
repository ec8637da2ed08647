// index_context.cpp — the model rules' view of the index being built (see index_context.h).
#include "index_context.h"

#include <algorithm>
#include <utility>

namespace moestream::gguf {

void IndexContext::fail(uint64_t offset, std::string what) const {
    throw ParseError{offset, std::move(what), loc_shard};
}

uint64_t IndexContext::tensor_at(size_t i) {
    if (i < shard_at.size()) loc_shard = shard_at[i];
    return offset_at[i];
}

const KvValue * IndexContext::find_kv(const std::string & key) const {
    auto it = m.kv.find(key);
    return it == m.kv.end() ? nullptr : &it->second;
}

uint64_t IndexContext::kv_offset(const std::string & key) const {
    auto it = m.kv_offsets.find(key);
    return it == m.kv_offsets.end() ? 0 : it->second;
}

uint32_t IndexContext::int_key(const std::string & key, bool required, int64_t lo, int64_t hi,
                               const char * missing_hint) {
    const KvValue * v = find_kv(key);
    if (!v) {
        if (!required) return 0;
        fail(kv_end, "missing metadata key " + quoted(key) + missing_hint);
    }
    const uint64_t at = kv_offset(key);
    if (!gguf_is_int(v->type))
        fail(at, "metadata key " + quoted(key) + " must be an integer, is " +
                     gguf_type_str(v->type));
    bool huge = std::find(huge_u64.begin(), huge_u64.end(), key) != huge_u64.end();
    if (huge || v->i < lo || v->i > hi) {
        fail(at, "metadata key " + quoted(key) + " = " +
                     (huge ? std::string("a value > 2^63") : std::to_string(v->i)) +
                     " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "]");
    }
    return static_cast<uint32_t>(v->i);
}

}  // namespace moestream::gguf
