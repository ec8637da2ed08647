// gguf_parser.cpp — one GGUF file's structure, then the model rules (see gguf_parser.h).
#include "gguf_parser.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "expert_map.h"
#include "ggml.h"

namespace moestream::gguf {

void GgufParser::parse_file() {
    header();
    for (int64_t i = 0; i < n_kv_; ++i) kv_pair(i);
    ctx_.kv_end = r_.pos();
    alignment();
    for (int64_t i = 0; i < n_tensors_; ++i) tensor_info(i);
    data_section();
    ctx_.shard_at.assign(ctx_.m.tensors.size(), 0);
}

void GgufParser::parse_model() {
    hparams_.read_params(ctx_);
    hparams_.check(ctx_);
    vocab_.check(ctx_, r_);
    mark_unused_layers(ctx_);
    build_expert_map(ctx_, hparams_, r_.pos());
    sum_totals(ctx_);
}

void GgufParser::add_shard(const GgufParser & other, uint32_t shard) {
    ModelIndex & m = ctx_.m;
    for (size_t i = 0; i < other.ctx_.m.tensors.size(); ++i) {
        TensorInfo t = other.ctx_.m.tensors[i];
        auto dup = m.tensor_ids.find(t.name);
        if (dup != m.tensor_ids.end()) {
            ctx_.loc_shard = shard;
            ctx_.fail(other.ctx_.offset_at[i], "tensor " + quoted(t.name) + " is also in " +
                                                   m.shards[ctx_.shard_at[dup->second]].path +
                                                   " (a tensor in two shards: shards of different sets?)");
        }
        t.shard = shard;
        m.tensor_ids.emplace(t.name, m.tensors.size());
        m.tensors.push_back(std::move(t));
        ctx_.offset_at.push_back(other.ctx_.offset_at[i]);
        ctx_.shard_at.push_back(shard);
    }
}

void GgufParser::header() {
    char magic[4];
    r_.read(magic, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) {
        std::string shown;
        for (char c : magic) {
            unsigned char u = static_cast<unsigned char>(c);
            shown += (u >= 0x20 && u < 0x7f) ? c : '?';
        }
        fail(0, "not a GGUF file (bad magic '" + shown + "', expected 'GGUF')");
    }
    uint64_t at = r_.pos();
    ctx_.m.version = r_.get<uint32_t>();
    if (ctx_.m.version == 1) fail(at, "GGUF version 1 is not supported (need 2 or 3)");
    if (ctx_.m.version != 2 && ctx_.m.version != 3) {
        fail(at, "unsupported GGUF version " + std::to_string(ctx_.m.version) +
                     " (need 2 or 3; a huge value means a byte-order mismatch)");
    }
    at = r_.pos();
    n_tensors_ = r_.get<int64_t>();
    if (n_tensors_ < 0 || n_tensors_ > kMaxTensors) {
        fail(at, "tensor count " + std::to_string(n_tensors_) + " is out of range [0, " +
                     std::to_string(kMaxTensors) + "]");
    }
    at = r_.pos();
    n_kv_ = r_.get<int64_t>();
    if (n_kv_ < 0 || n_kv_ > kMaxKv) {
        fail(at, "metadata key count " + std::to_string(n_kv_) + " is out of range [0, " +
                     std::to_string(kMaxKv) + "]");
    }
    // A KV pair takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes, a
    // tensor info 8 (name length) + 1 (name) + 4 (n_dims) + 8 (ne) + 4 (type) + 8 (offset).
    const uint64_t min_meta = uint64_t(n_kv_) * 14 + uint64_t(n_tensors_) * 33;
    if (min_meta > r_.remaining()) {
        fail(r_.pos(), "truncated: " + std::to_string(n_kv_) + " metadata keys and " +
                           std::to_string(n_tensors_) + " tensor infos need at least " +
                           std::to_string(min_meta) + " bytes at offset " +
                           std::to_string(r_.pos()) + ", file has " +
                           std::to_string(r_.size()));
    }
}

void GgufParser::kv_pair(int64_t i) {
    uint64_t at = r_.pos();
    std::string key = r_.read_string(kMaxKeyLen, "key");
    if (key.empty()) fail(at, "metadata key #" + std::to_string(i) + " is empty");
    if (key.find('\0') != std::string::npos) {
        fail(at, "metadata key #" + std::to_string(i) + " " + quoted(key) +
                     " contains a NUL byte");
    }
    if (ctx_.m.kv.count(key)) fail(at, "duplicate metadata key " + quoted(key));
    KvValue v;
    v.type = r_.read_type(key, false);
    uint64_t vat = r_.pos();
    switch (v.type) {
        case kU8:
        case kI8:
        case kU16:
        case kI16:
        case kU32:
        case kI32:
        case kI64:
            v.i = r_.read_int(v.type);
            break;
        case kU64: {
            uint64_t u = r_.get<uint64_t>();
            // Stored as int64: values above INT64_MAX are kept saturated and flagged.
            v.i = u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
            if (u > uint64_t(INT64_MAX)) ctx_.huge_u64.push_back(key);
            break;
        }
        case kBool:
            v.i = r_.get<int8_t>() != 0;
            break;
        case kF32:
            v.f = r_.get<float>();
            break;
        case kF64:
            v.f = r_.get<double>();
            break;
        case kString: {
            uint64_t n = r_.string_len(kMaxStringLen, "string value");
            if (n <= kMaxStoredStringLen && stored_ + n <= kMaxStoredBytes) {
                v.s.resize(n);
                r_.read(v.s.data(), n);
                stored_ += n;
            } else {
                r_.skip(n);  // too large to keep (e.g. a chat template); never needed
            }
            break;
        }
        case kArray: {
            v.arr_type = r_.read_type(key, true);
            uint64_t lat = r_.pos();
            v.arr_len = r_.get<uint64_t>();
            r_.check_array_len(key, v.arr_len, lat);
            const uint64_t esize = gguf_scalar_size(v.arr_type);
            const bool integer = gguf_is_int(v.arr_type);
            if (key == "tokenizer.ggml.token_type") {
                VocabRules::read_token_types(r_, v.arr_type, v.arr_len, lat);
            } else if (integer && v.arr_len <= kMaxStoredIntArray &&
                stored_ + v.arr_len * 8 <= kMaxStoredBytes) {
                r_.need(v.arr_len * esize);
                v.arr_i.reserve(v.arr_len);
                for (uint64_t k = 0; k < v.arr_len; ++k)
                    v.arr_i.push_back(r_.read_int(v.arr_type));
                stored_ += v.arr_len * 8;
            } else if (key == "tokenizer.ggml.tokens" && v.arr_type == kString) {
                vocab_.read_tokens(r_, v.arr_len, lat);
            } else {
                r_.skip_array(key, v.arr_type, v.arr_len, 1);
            }
            break;
        }
        default:
            fail(vat, "key " + quoted(key) + " has invalid value type");
    }
    stored_ += key.size();
    ctx_.m.kv_offsets[key] = at;
    ctx_.m.kv.emplace(std::move(key), std::move(v));
}

void GgufParser::alignment() {
    auto it = ctx_.m.kv.find("general.alignment");
    if (it == ctx_.m.kv.end()) {
        ctx_.m.alignment = 32;
        return;
    }
    const KvValue & v = it->second;
    uint64_t at = ctx_.kv_offset("general.alignment");
    if (v.type != kU32) {
        fail(at, std::string("general.alignment must be u32, is ") + gguf_type_str(v.type));
    }
    if (!is_pow2(uint64_t(v.i)) || uint64_t(v.i) > kMaxAlignment) {
        fail(at,
             "general.alignment " + std::to_string(v.i) + " is not a power of 2 in [32, 2^30]");
    }
    if (uint64_t(v.i) < kMinAlignment) {
        fail(at, "general.alignment " + std::to_string(v.i) + " is below " +
                     std::to_string(kMinAlignment) +
                     ", the tensor alignment ggml's CPU buffers require");
    }
    ctx_.m.alignment = uint64_t(v.i);
}

void GgufParser::tensor_info(int64_t i) {
    TensorInfo t;
    uint64_t at = r_.pos();
    t.name = r_.read_string(kMaxTensorName, "tensor name");
    if (t.name.empty()) fail(at, "tensor #" + std::to_string(i) + " has an empty name");
    if (t.name.find('\0') != std::string::npos) {
        fail(at, "tensor #" + std::to_string(i) + " name " + quoted(t.name) +
                     " contains a NUL byte");
    }
    t.info_offset = at;
    if (ctx_.m.tensor_ids.count(t.name)) fail(at, "duplicate tensor name " + quoted(t.name));
    const std::string tn = "tensor " + quoted(t.name);

    at = r_.pos();
    t.n_dims = r_.get<uint32_t>();
    if (t.n_dims < 1 || t.n_dims > kMaxDims) {
        fail(at, tn + " has " + std::to_string(t.n_dims) + " dimensions (need 1..4)");
    }
    int64_t nelem = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        at = r_.pos();
        t.ne[d] = r_.get<int64_t>();
        if (t.ne[d] <= 0) {
            fail(at, tn + " dimension " + std::to_string(d) + " has " +
                         std::to_string(t.ne[d]) + " elements (need > 0)");
        }
        if (__builtin_mul_overflow(nelem, t.ne[d], &nelem)) {
            fail(at, tn + " element count overflows (dimension " + std::to_string(d) + ")");
        }
    }

    at = r_.pos();
    t.type = r_.get<int32_t>();
    if (t.type < 0 || t.type >= GGML_TYPE_COUNT) {
        fail(at, tn + " has unknown ggml type " + std::to_string(t.type));
    }
    const auto gt = static_cast<ggml_type>(t.type);
    const uint64_t type_size = ggml_type_size(gt);
    const int64_t blck = ggml_blck_size(gt);
    if (type_size == 0 || blck <= 0) {
        fail(at, tn + " has unsupported ggml type " + std::to_string(t.type) +
                     " (removed from ggml)");
    }
    if (t.ne[0] % blck != 0) {
        fail(at, tn + " row of " + std::to_string(t.ne[0]) + " elements is not a multiple of " +
                     ggml_type_name(gt) + "'s block size " + std::to_string(blck));
    }
    // nb[] as ggml computes them; nbytes = nb[3] * ne[3], all overflow-checked.
    t.nb[0] = type_size;
    bool of = __builtin_mul_overflow(type_size, uint64_t(t.ne[0] / blck), &t.nb[1]);
    of = of || __builtin_mul_overflow(t.nb[1], uint64_t(t.ne[1]), &t.nb[2]);
    of = of || __builtin_mul_overflow(t.nb[2], uint64_t(t.ne[2]), &t.nb[3]);
    of = of || __builtin_mul_overflow(t.nb[3], uint64_t(t.ne[3]), &t.nbytes);
    if (of) fail(at, tn + " byte size overflows");

    at = r_.pos();
    uint64_t rel = r_.get<uint64_t>();
    t.file_offset = rel;  // relative until the data section start is known
    ctx_.m.tensor_ids.emplace(t.name, ctx_.m.tensors.size());
    ctx_.m.tensors.push_back(std::move(t));
    ctx_.offset_at.push_back(at);
}

void GgufParser::data_section() {
    const uint64_t end_of_infos = r_.pos();
    uint64_t data;
    if (__builtin_add_overflow(end_of_infos, ctx_.m.alignment - 1, &data)) {
        fail(end_of_infos, "data section offset overflows");
    }
    data &= ~(ctx_.m.alignment - 1);
    ctx_.m.data_offset = data;
    if (!ctx_.m.tensors.empty() && data > r_.size()) {
        fail(end_of_infos, "truncated: data section starts at offset " + std::to_string(data) +
                               ", file has " + std::to_string(r_.size()));
    }
    for (size_t i = 0; i < ctx_.m.tensors.size(); ++i) {
        TensorInfo & t = ctx_.m.tensors[i];
        const uint64_t rel = t.file_offset;
        const std::string tn = "tensor " + quoted(t.name);
        if (rel % ctx_.m.alignment != 0) {
            ctx_.fail(ctx_.tensor_at(i), tn + " offset " + std::to_string(rel) +
                                    " is not a multiple of the alignment " +
                                    std::to_string(ctx_.m.alignment));
        }
        uint64_t abs, end;
        if (__builtin_add_overflow(data, rel, &abs) ||
            __builtin_add_overflow(abs, t.nbytes, &end) || end > r_.size()) {
            ctx_.fail(ctx_.tensor_at(i), tn + " data [" + std::to_string(data) + "+" +
                                    std::to_string(rel) + ", +" + std::to_string(t.nbytes) +
                                    " bytes) lies outside the file (size " +
                                    std::to_string(r_.size()) + ")");
        }
        t.file_offset = abs;
    }
    // No two tensors may share bytes.
    std::vector<size_t> order(ctx_.m.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return ctx_.m.tensors[a].file_offset < ctx_.m.tensors[b].file_offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
        const TensorInfo & prev = ctx_.m.tensors[order[k - 1]];
        const TensorInfo & cur = ctx_.m.tensors[order[k]];
        if (cur.file_offset < prev.file_offset + prev.nbytes) {
            ctx_.fail(ctx_.tensor_at(order[k]),
                 "tensor " + quoted(cur.name) + " data at offset " +
                     std::to_string(cur.file_offset) + " overlaps tensor " + quoted(prev.name) +
                     " [" + std::to_string(prev.file_offset) + ", " +
                     std::to_string(prev.file_offset + prev.nbytes) + ")");
        }
    }
}

}  // namespace moestream::gguf
