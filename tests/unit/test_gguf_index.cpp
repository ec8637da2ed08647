// test_gguf_index.cpp — moestream's own GGUF reader (include/moestream/gguf_index.h).
//
//  - a byte-level GGUF builder (test-only, written from the format description) makes a small
//    valid MoE model and every corrupt variant of it: the corruption matrix must give
//    !ok() / kBadModel with the path in a one-line message, never a crash;
//  - truncation at every section boundary and at seeded random offsets; seeded random byte
//    flips in the metadata (either a clean error or an index that keeps its invariants);
//  - cross-check against the reference: every size/offset/count the index reports equals what
//    gguf.h's own reader reports for the same file (builder files, gguf.h-written files, and
//    Debian's test-llama-archs models when $LLAMA_TOOL is available).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "moestream/gguf_index.h"
#include "test_util.h"

namespace fs = std::filesystem;
using moestream::test::TempDir;
using moestream::ErrorCode;
using moestream::load_model_index;
using moestream::ModelIndex;
using moestream::Projection;
using moestream::Status;

namespace {

// ---- a byte-level GGUF builder --------------------------------------------------------------

enum : uint32_t {
    T_U8 = 0,
    T_I8,
    T_U16,
    T_I16,
    T_U32,
    T_I32,
    T_F32,
    T_BOOL,
    T_STR,
    T_ARR,
    T_U64,
    T_I64,
    T_F64
};

struct Bytes {
    std::vector<uint8_t> b;
    template <typename T>
    Bytes & put(T v) {
        const auto * p = reinterpret_cast<const uint8_t *>(&v);
        b.insert(b.end(), p, p + sizeof(T));
        return *this;
    }
    Bytes & str(const std::string & s) {
        put<uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Bytes & raw(const Bytes & o) {
        b.insert(b.end(), o.b.begin(), o.b.end());
        return *this;
    }
};

struct KvSpec {
    std::string key;
    uint32_t type;
    Bytes value;  // everything after the type field
};

struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;
    int32_t type = GGML_TYPE_F32;
    std::optional<uint32_t> n_dims;  // written instead of ne.size()
    std::optional<uint64_t> offset;  // written instead of the packed offset
};

// Where each section ends, for truncation tests.
struct Layout {
    std::vector<uint64_t> boundaries;
    uint64_t data_offset = 0;
    std::vector<uint64_t> tensor_rel;  // relative offsets as written
};

uint64_t tensor_nbytes(const TensorSpec & t) {
    if (t.type < 0 || t.type >= GGML_TYPE_COUNT) return 0;
    const auto gt = ggml_type(t.type);
    if (ggml_blck_size(gt) <= 0 || ggml_type_size(gt) == 0 || t.ne.empty()) return 0;
    for (int64_t n : t.ne) {
        if (n <= 0 || n > (1 << 16)) return 0;  // corrupt shapes: no data written for them
    }
    if (t.ne[0] % ggml_blck_size(gt)) return 0;
    uint64_t n = ggml_row_size(gt, t.ne[0]);
    for (size_t d = 1; d < t.ne.size(); ++d) n *= uint64_t(t.ne[d]);
    return n;
}

struct Builder {
    char magic[4] = {'G', 'G', 'U', 'F'};
    uint32_t version = 3;
    std::optional<int64_t> n_tensors, n_kv;  // header overrides
    uint64_t layout_alignment = 32;          // padding used when laying out data
    std::vector<KvSpec> kvs;
    std::vector<TensorSpec> tensors;

    KvSpec * find(const std::string & key) {
        for (auto & k : kvs) {
            if (k.key == key) return &k;
        }
        return nullptr;
    }
    void set(const std::string & key, uint32_t type, Bytes v) {
        if (KvSpec * k = find(key)) {
            k->type = type;
            k->value = std::move(v);
        } else {
            kvs.push_back({key, type, std::move(v)});
        }
    }
    void remove(const std::string & key) {
        std::erase_if(kvs, [&](const KvSpec & k) { return k.key == key; });
    }
    void u32(const std::string & k, uint32_t v) { set(k, T_U32, Bytes().put(v)); }
    void str(const std::string & k, const std::string & v) { set(k, T_STR, Bytes().str(v)); }
    void arr_str(const std::string & k, const std::vector<std::string> & v) {
        Bytes b;
        b.put<uint32_t>(T_STR).put<uint64_t>(v.size());
        for (const auto & s : v) b.str(s);
        set(k, T_ARR, b);
    }
    void arr_i32(const std::string & k, const std::vector<int32_t> & v) {
        Bytes b;
        b.put<uint32_t>(T_I32).put<uint64_t>(v.size());
        for (int32_t x : v) b.put(x);
        set(k, T_ARR, b);
    }
    TensorSpec * tensor(const std::string & name) {
        for (auto & t : tensors) {
            if (t.name == name) return &t;
        }
        return nullptr;
    }
    void remove_tensor(const std::string & name) {
        std::erase_if(tensors, [&](const TensorSpec & t) { return t.name == name; });
    }

    std::vector<uint8_t> build(Layout * lay = nullptr) const {
        Layout l;
        Bytes o;
        o.b.insert(o.b.end(), magic, magic + 4);
        l.boundaries.push_back(o.b.size());
        o.put(version);
        l.boundaries.push_back(o.b.size());
        o.put<int64_t>(n_tensors.value_or(int64_t(tensors.size())));
        l.boundaries.push_back(o.b.size());
        o.put<int64_t>(n_kv.value_or(int64_t(kvs.size())));
        l.boundaries.push_back(o.b.size());
        for (const auto & k : kvs) {
            o.str(k.key).put(k.type).raw(k.value);
            l.boundaries.push_back(o.b.size());
        }
        uint64_t next = 0;
        for (const auto & t : tensors) {
            const uint64_t rel = t.offset.value_or(next);
            l.tensor_rel.push_back(rel);
            if (!t.offset) {  // an overridden offset does not move the others
                next = rel + tensor_nbytes(t);
                next = (next + layout_alignment - 1) / layout_alignment * layout_alignment;
            }
            o.str(t.name).put<uint32_t>(t.n_dims.value_or(uint32_t(t.ne.size())));
            for (int64_t n : t.ne) o.put(n);
            o.put(t.type).put(rel);
            l.boundaries.push_back(o.b.size());
        }
        while (o.b.size() % layout_alignment) o.b.push_back(0);
        l.data_offset = o.b.size();
        l.boundaries.push_back(o.b.size());
        // Data: tensors in offset order with a deterministic byte pattern; gaps are zero.
        // Tensors with an overridden offset get no data of their own (they point wherever
        // the case wants: into another tensor, past the end...).
        uint64_t end = l.data_offset;
        for (size_t i = 0; i < tensors.size(); ++i) {
            const uint64_t nb = tensor_nbytes(tensors[i]);
            if (nb == 0 || tensors[i].offset) continue;
            end = std::max(end, l.data_offset + l.tensor_rel[i] + nb);
        }
        o.b.resize(end, 0);
        for (size_t i = 0; i < tensors.size(); ++i) {
            const uint64_t nb = tensor_nbytes(tensors[i]);
            if (nb == 0 || tensors[i].offset) continue;
            const uint64_t at = l.data_offset + l.tensor_rel[i];
            for (uint64_t j = 0; j < nb; ++j) o.b[at + j] = uint8_t(j * 31 + i * 7 + 1);
            l.boundaries.push_back(at);
            l.boundaries.push_back(at + nb);
        }
        if (lay) *lay = l;
        return o.b;
    }
};

// The reference model: qwen3moe-like, 3 layers (layer 0 dense, 1 and 2 MoE), 4 experts,
// top-2, n_embd 64, n_ff_exp 32; q8_0 experts in layer 1, f16 gate/up + q8_0 down in layer 2;
// a per-expert scale tensor; a vocab of 100 strings and one KV of every gguf type. (No array
// of arrays: the format allows one, gguf.h's reader does not; see NestedArrays.)
constexpr uint32_t kEmbd = 64, kFf = 32, kExperts = 4, kUsed = 2, kLayers = 3, kVocab = 100;

Builder moe_builder() {
    Builder b;
    b.str("general.architecture", "qwen3moe");
    b.str("general.name", "test-moe");
    b.u32("qwen3moe.block_count", kLayers);
    b.u32("qwen3moe.context_length", 256);
    b.u32("qwen3moe.embedding_length", kEmbd);
    b.u32("qwen3moe.expert_count", kExperts);
    b.u32("qwen3moe.expert_used_count", kUsed);
    b.u32("qwen3moe.expert_feed_forward_length", kFf);
    b.u32("qwen3moe.attention.head_count", 4);
    // One KV of each scalar type, an integer array, and an array of arrays.
    b.set("test.u8", T_U8, Bytes().put<uint8_t>(200));
    b.set("test.i8", T_I8, Bytes().put<int8_t>(-5));
    b.set("test.u16", T_U16, Bytes().put<uint16_t>(60000));
    b.set("test.i16", T_I16, Bytes().put<int16_t>(-30000));
    b.set("test.i32", T_I32, Bytes().put<int32_t>(-7));
    b.set("test.f32", T_F32, Bytes().put<float>(1.5f));
    b.set("test.bool", T_BOOL, Bytes().put<int8_t>(1));
    b.set("test.u64", T_U64, Bytes().put<uint64_t>(1ull << 40));
    b.set("test.i64", T_I64, Bytes().put<int64_t>(-(1ll << 40)));
    b.set("test.f64", T_F64, Bytes().put<double>(2.25));
    b.arr_i32("test.per_layer", {1, 2, 3});
    b.str("tokenizer.ggml.model", "gpt2");
    std::vector<std::string> toks;
    for (uint32_t i = 0; i < kVocab; ++i) toks.push_back("tok" + std::to_string(i));
    b.arr_str("tokenizer.ggml.tokens", toks);

    auto add = [&](const std::string & n, std::vector<int64_t> ne, int32_t type) {
        b.tensors.push_back({n, ne, type, std::nullopt, std::nullopt});
    };
    add("token_embd.weight", {kEmbd, kVocab}, GGML_TYPE_Q8_0);
    add("output_norm.weight", {kEmbd}, GGML_TYPE_F32);
    for (uint32_t il = 0; il < kLayers; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        add(p + "attn_norm.weight", {kEmbd}, GGML_TYPE_F32);
        add(p + "attn_q.weight", {kEmbd, kEmbd}, GGML_TYPE_F16);
        add(p + "ffn_norm.weight", {kEmbd}, GGML_TYPE_F32);
        if (il == 0) {
            add(p + "ffn_gate.weight", {kEmbd, 96}, GGML_TYPE_F16);
            add(p + "ffn_up.weight", {kEmbd, 96}, GGML_TYPE_F16);
            add(p + "ffn_down.weight", {96, kEmbd}, GGML_TYPE_F16);
            continue;
        }
        const int32_t gu = il == 1 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
        add(p + "ffn_gate_inp.weight", {kEmbd, kExperts}, GGML_TYPE_F32);
        add(p + "ffn_gate_exps.weight", {kEmbd, kFf, kExperts}, gu);
        add(p + "ffn_up_exps.weight", {kEmbd, kFf, kExperts}, gu);
        add(p + "ffn_down_exps.weight", {kFf, kEmbd, kExperts}, GGML_TYPE_Q8_0);
        add(p + "ffn_gate_exps.scale", {kExperts}, GGML_TYPE_F32);
    }
    return b;
}

// ---- temp files ------------------------------------------------------------------------------

void write_file(const std::string & path, const std::vector<uint8_t> & b, size_t len = SIZE_MAX) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(b.data()), std::streamsize(std::min(len, b.size())));
}

// ---- invariants and checks -------------------------------------------------------------------

// The header's contract, re-derived from the index alone.
void expect_invariants(const ModelIndex & m) {
    ASSERT_GE(m.alignment, 1u);
    ASSERT_EQ(m.alignment & (m.alignment - 1), 0u);
    uint64_t total = 0;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto & t : m.tensors) {
        ASSERT_GE(t.file_offset, m.data_offset) << t.name;
        ASSERT_EQ((t.file_offset - m.data_offset) % m.alignment, 0u) << t.name;
        ASSERT_LE(t.nbytes, m.file_size) << t.name;
        ASSERT_LE(t.file_offset, m.file_size - t.nbytes) << t.name;
        ASSERT_GT(ggml_blck_size(ggml_type(t.type)), 0);
        ASSERT_EQ(t.ne[0] % ggml_blck_size(ggml_type(t.type)), 0);
        ASSERT_EQ(t.nb[1], ggml_row_size(ggml_type(t.type), t.ne[0]));
        spans.push_back({t.file_offset, t.file_offset + t.nbytes});
        total += t.nbytes;
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) ASSERT_LE(spans[i - 1].second, spans[i].first);
    ASSERT_GE(m.n_expert, 2u);
    ASSERT_GE(m.n_expert_used, 1u);
    ASSERT_LE(m.n_expert_used, m.n_expert);
    ASSERT_FALSE(m.moe_layers.empty());
    uint64_t expert = 0, ws = 0;
    for (const auto & l : m.moe_layers) {
        ASSERT_LT(l.layer, m.n_layer);
        uint64_t per = 0;
        for (const auto & e : l.tensors) {
            const auto * t = m.find_tensor(e.name);
            ASSERT_NE(t, nullptr);
            ASSERT_TRUE(m.is_expert_tensor(e.name));
            ASSERT_EQ(e.file_offset, t->file_offset);
            ASSERT_EQ(e.ne[2], int64_t(m.n_expert));
            ASSERT_EQ(e.slice_bytes, uint64_t(e.ne[1]) * e.row_bytes);
            ASSERT_EQ(e.tensor_bytes, e.slice_bytes * m.n_expert);
            ASSERT_EQ(e.tensor_bytes, t->nbytes);
            ASSERT_LE(e.slice_offset(m.n_expert - 1) + e.slice_bytes, m.file_size);
            per += e.slice_bytes;
            expert += e.tensor_bytes;
        }
        ASSERT_EQ(per, l.expert_bytes);
        ws += per * m.n_expert_used;
    }
    ASSERT_EQ(expert, m.expert_bytes_total);
    ASSERT_EQ(total - expert, m.dense_bytes_total);
    ASSERT_EQ(ws, m.token_working_set_bytes);
}

// A load that must fail cleanly: kBadModel, path named, one line, optional substring.
void expect_bad(const std::string & path, const std::string & what, const std::string & label) {
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_FALSE(st.ok()) << label << ": loaded a corrupt file";
    EXPECT_EQ(st.code(), ErrorCode::kBadModel) << label;
    EXPECT_EQ(st.message().rfind(path + ": ", 0), 0u) << label << ": " << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << label << ": " << st.message();
    if (!what.empty()) {
        EXPECT_NE(st.message().find(what), std::string::npos)
            << label << ": expected '" << what << "' in: " << st.message();
    }
}

// Compares the index with gguf.h's own reader on the same (valid) file.
void cross_check_with_gguf(const std::string & path, const ModelIndex & m) {
    ggml_context * gctx = nullptr;
    gguf_init_params p = {/*no_alloc=*/true, /*ctx=*/&gctx};
    gguf_context * g = gguf_init_from_file(path.c_str(), p);
    ASSERT_NE(g, nullptr) << "gguf.h rejects " << path;
    EXPECT_EQ(gguf_get_version(g), m.version);
    EXPECT_EQ(gguf_get_alignment(g), m.alignment);
    EXPECT_EQ(gguf_get_data_offset(g), m.data_offset);
    ASSERT_EQ(gguf_get_n_tensors(g), int64_t(m.tensors.size()));
    ASSERT_EQ(gguf_get_n_kv(g), int64_t(m.kv.size()));
    for (int64_t i = 0; i < gguf_get_n_kv(g); ++i) {
        const std::string key = gguf_get_key(g, i);
        auto it = m.kv.find(key);
        ASSERT_NE(it, m.kv.end()) << key;
        const auto & v = it->second;
        const gguf_type t = gguf_get_kv_type(g, i);
        EXPECT_EQ(v.type, uint32_t(t)) << key;
        switch (t) {
            case GGUF_TYPE_UINT32:
                EXPECT_EQ(v.i, int64_t(gguf_get_val_u32(g, i))) << key;
                break;
            case GGUF_TYPE_INT32:
                EXPECT_EQ(v.i, gguf_get_val_i32(g, i)) << key;
                break;
            case GGUF_TYPE_UINT8:
                EXPECT_EQ(v.i, gguf_get_val_u8(g, i)) << key;
                break;
            case GGUF_TYPE_INT64:
                EXPECT_EQ(v.i, gguf_get_val_i64(g, i)) << key;
                break;
            case GGUF_TYPE_FLOAT32:
                EXPECT_EQ(v.f, double(gguf_get_val_f32(g, i))) << key;
                break;
            case GGUF_TYPE_STRING:
                if (!v.s.empty()) {
                    EXPECT_EQ(v.s, gguf_get_val_str(g, i)) << key;
                }
                break;
            case GGUF_TYPE_ARRAY:
                EXPECT_EQ(v.arr_type, uint32_t(gguf_get_arr_type(g, i))) << key;
                EXPECT_EQ(v.arr_len, uint64_t(gguf_get_arr_n(g, i))) << key;
                break;
            default:
                break;
        }
    }
    uint64_t expert = 0, all = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const std::string name = gguf_get_tensor_name(g, i);
        const auto & t = m.tensors[size_t(i)];  // file order is preserved
        ASSERT_EQ(t.name, name);
        EXPECT_EQ(t.type, int32_t(gguf_get_tensor_type(g, i))) << name;
        EXPECT_EQ(t.file_offset, gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i)) << name;
        EXPECT_EQ(t.nbytes, gguf_get_tensor_size(g, i)) << name;
        const ggml_tensor * gt = ggml_get_tensor(gctx, name.c_str());
        ASSERT_NE(gt, nullptr) << name;
        EXPECT_EQ(t.nbytes, ggml_nbytes(gt)) << name;
        for (int d = 0; d < 4; ++d) {
            EXPECT_EQ(t.ne[d], gt->ne[d]) << name << " dim " << d;
            EXPECT_EQ(t.nb[d], gt->nb[d]) << name << " dim " << d;
        }
        EXPECT_EQ(t.n_dims, uint32_t(ggml_n_dims(gt))) << name;
        all += ggml_nbytes(gt);
        // The expert map, derived independently from gguf.h's view of names and shapes.
        const bool is_exp =
            name.rfind("blk.", 0) == 0 &&
            (name.ends_with(".ffn_gate_exps.weight") || name.ends_with(".ffn_up_exps.weight") ||
             name.ends_with(".ffn_down_exps.weight") || name.ends_with(".ffn_gate_up_exps.weight"));
        EXPECT_EQ(is_exp, m.is_expert_tensor(name)) << name;
        if (is_exp) {
            expert += ggml_nbytes(gt);
            EXPECT_EQ(gt->ne[2], int64_t(m.n_expert)) << name;
        }
    }
    EXPECT_EQ(m.expert_bytes_total, expert);
    EXPECT_EQ(m.dense_bytes_total, all - expert);
    // Working set: k x (one expert's bytes = tensor bytes / n_expert), summed.
    EXPECT_EQ(m.token_working_set_bytes, expert / m.n_expert * m.n_expert_used);
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(m.file_size, uint64_t(st.st_size));
    EXPECT_EQ(m.mtime_ns, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
    ggml_free(gctx);
    gguf_free(g);
}

// ---- positive tests --------------------------------------------------------------------------

TEST(GgufIndex, LoadsReferenceModel) {
    TempDir tmp;
    const std::string path = tmp.path("ok.gguf");
    Layout lay;
    write_file(path, moe_builder().build(&lay));
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_invariants(m);
    EXPECT_EQ(m.path, path);
    EXPECT_EQ(m.version, 3u);
    EXPECT_EQ(m.arch, "qwen3moe");
    EXPECT_EQ(m.name, "test-moe");
    EXPECT_EQ(m.n_layer, kLayers);
    EXPECT_EQ(m.n_embd, kEmbd);
    EXPECT_EQ(m.n_expert, kExperts);
    EXPECT_EQ(m.n_expert_used, kUsed);
    EXPECT_EQ(m.n_ff_exp, kFf);
    EXPECT_EQ(m.n_vocab, kVocab);
    EXPECT_EQ(m.alignment, 32u);
    EXPECT_EQ(m.data_offset, lay.data_offset);
    ASSERT_EQ(m.moe_layers.size(), 2u);
    EXPECT_EQ(m.moe_layers[0].layer, 1u);
    EXPECT_EQ(m.moe_layers[1].layer, 2u);
    // Layer 1: q8_0 rows of 64 = 2 blocks x 34 B = 68 B; gate/up slice 32 rows, down 64 rows
    // of 32 (1 block = 34 B).
    const auto & l1 = m.moe_layers[0];
    ASSERT_EQ(l1.tensors.size(), 3u);
    EXPECT_EQ(l1.tensors[0].proj, Projection::kGate);
    EXPECT_EQ(l1.tensors[1].proj, Projection::kUp);
    EXPECT_EQ(l1.tensors[2].proj, Projection::kDown);
    EXPECT_EQ(l1.tensors[0].row_bytes, 68u);
    EXPECT_EQ(l1.tensors[0].slice_bytes, 68u * kFf);
    EXPECT_EQ(l1.tensors[2].row_bytes, 34u);
    EXPECT_EQ(l1.tensors[2].slice_bytes, 34u * kEmbd);
    EXPECT_EQ(l1.expert_bytes, 68u * kFf * 2 + 34u * kEmbd);
    // Layer 2: f16 gate/up: 128 B rows.
    const auto & l2 = m.moe_layers[1];
    EXPECT_EQ(l2.tensors[0].type, GGML_TYPE_F16);
    EXPECT_EQ(l2.tensors[0].slice_bytes, 128u * kFf);
    EXPECT_EQ(l2.expert_bytes, 128u * kFf * 2 + 34u * kEmbd);
    EXPECT_EQ(m.token_working_set_bytes, kUsed * (l1.expert_bytes + l2.expert_bytes));
    EXPECT_EQ(m.expert_bytes_total, kExperts * (l1.expert_bytes + l2.expert_bytes));
    // The per-expert scale tensor stays dense.
    ASSERT_NE(m.find_tensor("blk.1.ffn_gate_exps.scale"), nullptr);
    EXPECT_FALSE(m.is_expert_tensor("blk.1.ffn_gate_exps.scale"));
    EXPECT_FALSE(m.is_expert_tensor("blk.0.ffn_gate.weight"));
    EXPECT_EQ(m.find_tensor("nope"), nullptr);
    // Metadata values of every type.
    EXPECT_EQ(m.kv.at("test.u8").i, 200);
    EXPECT_EQ(m.kv.at("test.i8").i, -5);
    EXPECT_EQ(m.kv.at("test.u16").i, 60000);
    EXPECT_EQ(m.kv.at("test.i16").i, -30000);
    EXPECT_EQ(m.kv.at("test.i32").i, -7);
    EXPECT_EQ(m.kv.at("test.f32").f, 1.5);
    EXPECT_EQ(m.kv.at("test.bool").i, 1);
    EXPECT_EQ(m.kv.at("test.u64").i, int64_t(1) << 40);
    EXPECT_EQ(m.kv.at("test.i64").i, -(int64_t(1) << 40));
    EXPECT_EQ(m.kv.at("test.f64").f, 2.25);
    EXPECT_EQ(m.kv.at("test.per_layer").arr_i, (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(m.kv.at("tokenizer.ggml.tokens").arr_len, kVocab);
    cross_check_with_gguf(path, m);
}

TEST(GgufIndex, Alignment4096AndVersion2) {
    TempDir tmp;
    Builder b = moe_builder();
    b.version = 2;
    b.layout_alignment = 4096;
    b.u32("general.alignment", 4096);
    const std::string path = tmp.path("a4096.gguf");
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_invariants(m);
    EXPECT_EQ(m.version, 2u);
    EXPECT_EQ(m.alignment, 4096u);
    EXPECT_EQ(m.data_offset % 4096, 0u);
    for (const auto & t : m.tensors) EXPECT_EQ(t.file_offset % 4096, 0u) << t.name;
    cross_check_with_gguf(path, m);
}

// Gate-less experts (up/down only, e.g. nemotron_h_moe): each expert is its up then its down
// slice; a layer with a gate and no up is still refused (the bad-file list below).
TEST(GgufIndex, GateLessUpDownExperts) {
    TempDir tmp;
    Builder b = moe_builder();
    b.remove_tensor("blk.1.ffn_gate_exps.weight");
    const std::string path = tmp.path("gateless.gguf");
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_invariants(m);
    ASSERT_EQ(m.moe_layers[0].layer, 1u);
    ASSERT_EQ(m.moe_layers[0].tensors.size(), 2u);
    EXPECT_EQ(m.moe_layers[0].tensors[0].proj, Projection::kUp);
    EXPECT_EQ(m.moe_layers[0].tensors[1].proj, Projection::kDown);
    EXPECT_EQ(m.moe_layers[0].expert_bytes,
              m.moe_layers[0].tensors[0].slice_bytes + m.moe_layers[0].tensors[1].slice_bytes);
    EXPECT_EQ(m.moe_layers[1].tensors.size(), 3u);  // layer 2 keeps its gate
    EXPECT_FALSE(m.is_expert_tensor("blk.1.ffn_gate_exps.weight"));
    cross_check_with_gguf(path, m);
}

TEST(GgufIndex, FusedGateUpAndPerLayerFfArray) {
    TempDir tmp;
    Builder b = moe_builder();
    for (int il : {1, 2}) {
        const std::string p = "blk." + std::to_string(il) + ".";
        b.remove_tensor(p + "ffn_gate_exps.weight");
        b.tensor(p + "ffn_up_exps.weight")->name = p + "ffn_gate_up_exps.weight";
        b.tensor(p + "ffn_gate_up_exps.weight")->ne = {kEmbd, 2 * kFf, kExperts};
    }
    b.arr_i32("qwen3moe.expert_feed_forward_length", {0, int32_t(kFf), int32_t(kFf)});
    const std::string path = tmp.path("fused.gguf");
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_invariants(m);
    EXPECT_EQ(m.n_ff_exp, kFf);  // uniform over the MoE layers
    ASSERT_EQ(m.moe_layers[0].tensors.size(), 2u);
    EXPECT_EQ(m.moe_layers[0].tensors[0].proj, Projection::kGateUp);
    EXPECT_EQ(m.moe_layers[0].tensors[0].slice_bytes, 68u * 2 * kFf);
    cross_check_with_gguf(path, m);

    // A per-layer value that disagrees with the shapes is caught.
    b.arr_i32("qwen3moe.expert_feed_forward_length", {0, int32_t(kFf), 48});
    write_file(path, b.build());
    expect_bad(path, "expert_feed_forward_length is 48", "per-layer n_ff mismatch");
}

// Latent MoE (experts on a width the file declares instead of n_embd): accepted only with
// the declaring key.
TEST(GgufIndex, LatentExpertWidth) {
    TempDir tmp;
    Builder b = moe_builder();
    for (int il : {1, 2}) {
        const std::string p = "blk." + std::to_string(il) + ".";
        b.tensor(p + "ffn_gate_exps.weight")->ne = {32, kFf, kExperts};
        b.tensor(p + "ffn_up_exps.weight")->ne = {32, kFf, kExperts};
        b.tensor(p + "ffn_down_exps.weight")->ne = {kFf, 32, kExperts};
    }
    const std::string path = tmp.path("latent.gguf");
    write_file(path, b.build());
    expect_bad(path, "has shape [32, 32, 4], expected [64, 32, 4]", "latent without key");
    b.str("qwen3moe.moe_latent_size", "32");  // not an integer: ignored
    write_file(path, b.build());
    expect_bad(path, "has shape", "latent key of the wrong type");
    b.u32("qwen3moe.moe_latent_size", 32);
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_invariants(m);
    EXPECT_EQ(m.moe_layers[0].tensors[0].ne[0], 32);
    cross_check_with_gguf(path, m);
}

// Arrays of arrays are valid GGUF (depth 2 accepted and skipped); deeper nesting is rejected
// (corruption matrix).
TEST(GgufIndex, NestedArrays) {
    TempDir tmp;
    Builder b = moe_builder();
    Bytes nested;
    nested.put<uint32_t>(T_ARR).put<uint64_t>(2);
    nested.put<uint32_t>(T_U16).put<uint64_t>(3).put<uint16_t>(1).put<uint16_t>(2).put<uint16_t>(3);
    nested.put<uint32_t>(T_STR).put<uint64_t>(1).str("x");
    b.set("test.nested", T_ARR, nested);
    const std::string path = tmp.path("nested.gguf");
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(m.kv.at("test.nested").arr_type, uint32_t(T_ARR));
    EXPECT_EQ(m.kv.at("test.nested").arr_len, 2u);
    EXPECT_EQ(m.n_vocab, kVocab);  // keys after the nested array were read correctly
    expect_invariants(m);
}

TEST(GgufIndex, LargeVocabAndLongStringsAreSkippedNotStored) {
    TempDir tmp;
    Builder b = moe_builder();
    std::vector<std::string> toks(200000);
    for (size_t i = 0; i < toks.size(); ++i) {  // unique, 40 bytes each
        toks[i] = std::to_string(i);
        toks[i].resize(40, 'x');
    }
    b.arr_str("tokenizer.ggml.tokens", toks);
    b.str("tokenizer.chat_template", std::string(3 << 20, 'c'));  // 3 MiB: skipped
    const std::string path = tmp.path("vocab.gguf");
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(m.n_vocab, 200000u);
    EXPECT_TRUE(m.kv.at("tokenizer.chat_template").s.empty());
    EXPECT_EQ(m.kv.at("tokenizer.chat_template").type, uint32_t(T_STR));
    cross_check_with_gguf(path, m);
}

TEST(GgufIndex, MissingFileAndDirectory) {
    TempDir tmp;
    const std::string path = tmp.path("does-not-exist.gguf");
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::kBadModel);
    EXPECT_EQ(st.message(), path + ": cannot open: No such file or directory");
    fs::create_directories(tmp.path("dir.gguf"));
    expect_bad(tmp.path("dir.gguf"), "not a regular file", "directory");
}

TEST(GgufIndex, TextFileIsNotGguf) {
    TempDir tmp;
    const std::string path = tmp.path("notes.txt");
    std::ofstream(path) << "hello, this is not a model\n";
    expect_bad(path, "not a GGUF file (bad magic 'hell', expected 'GGUF') at byte offset 0",
               "text");
    write_file(path, {});
    expect_bad(path, "truncated: needs 4 bytes at offset 0, file has 0", "empty");
}

// ---- the corruption matrix -------------------------------------------------------------------

struct Case {
    std::string label;
    std::string what;  // expected substring of the message
    std::function<void(Builder &)> mutate;
};

void set_tensor(Builder & b, const std::string & name,
                const std::function<void(TensorSpec &)> & f) {
    TensorSpec * t = b.tensor(name);
    if (!t) {
        ADD_FAILURE() << "no tensor " << name;
        return;
    }
    f(*t);
}

std::vector<Case> corruption_cases() {
    const std::string g1 = "blk.1.ffn_gate_exps.weight", u1 = "blk.1.ffn_up_exps.weight",
                      d1 = "blk.1.ffn_down_exps.weight";
    std::vector<Case> c;
    auto add = [&c](std::string l, std::string w, std::function<void(Builder &)> f) {
        c.push_back({std::move(l), std::move(w), std::move(f)});
    };
    // Header.
    add("bad magic", "not a GGUF file (bad magic 'GGUX'", [](Builder & b) { b.magic[3] = 'X'; });
    add("magic lowercase", "bad magic", [](Builder & b) { b.magic[0] = 'g'; });
    add("version 1", "version 1 is not supported", [](Builder & b) { b.version = 1; });
    add("version 0", "unsupported GGUF version 0", [](Builder & b) { b.version = 0; });
    add("version 4", "unsupported GGUF version 4", [](Builder & b) { b.version = 4; });
    add("version byte-swapped", "byte-order", [](Builder & b) { b.version = 0x03000000; });
    add("tensor count huge", "tensor count", [](Builder & b) { b.n_tensors = INT64_MAX; });
    add("tensor count 2^40", "tensor count", [](Builder & b) { b.n_tensors = 1ll << 40; });
    add("tensor count negative", "tensor count", [](Builder & b) { b.n_tensors = -1; });
    add("tensor count too high", "",
        [](Builder & b) { b.n_tensors = int64_t(b.tensors.size()) + 1; });
    add("kv count huge", "key count", [](Builder & b) { b.n_kv = INT64_MAX; });
    add("kv count negative", "key count", [](Builder & b) { b.n_kv = -5; });
    add("kv count too high", "", [](Builder & b) { b.n_kv = int64_t(b.kvs.size()) + 1; });
    // Strings and arrays.
    add("key length huge", "key length",
        [](Builder & b) { b.kvs[0].key = std::string(70000, 'k'); });
    add("string value length 2^62", "string value length",
        [](Builder & b) { b.set("general.name", T_STR, Bytes().put<uint64_t>(1ull << 62)); });
    add("string value longer than file", "truncated", [](Builder & b) {
        b.set("general.name", T_STR, Bytes().put<uint64_t>(1ull << 20).put<uint32_t>(0));
    });
    add("array count 2^62", "array length", [](Builder & b) {
        b.set("tokenizer.ggml.tokens", T_ARR,
              Bytes().put<uint32_t>(T_STR).put<uint64_t>(1ull << 62));
    });
    add("string array count beyond file", "truncated", [](Builder & b) {
        b.set("tokenizer.ggml.tokens", T_ARR,
              Bytes().put<uint32_t>(T_STR).put<uint64_t>(1ull << 29));
    });
    add("u32 array count beyond file", "truncated", [](Builder & b) {
        b.set("test.per_layer", T_ARR, Bytes().put<uint32_t>(T_U32).put<uint64_t>(1ull << 29));
    });
    add("array element string too long", "string length", [](Builder & b) {
        b.set("tokenizer.ggml.tokens", T_ARR,
              Bytes().put<uint32_t>(T_STR).put<uint64_t>(1).put<uint64_t>(1ull << 40));
    });
    add("arrays nested 3 deep", "nests arrays deeper than 2", [](Builder & b) {
        Bytes v;
        v.put<uint32_t>(T_ARR).put<uint64_t>(1);                 // array of arrays
        v.put<uint32_t>(T_ARR).put<uint64_t>(1);                 // of arrays
        v.put<uint32_t>(T_U8).put<uint64_t>(1).put<uint8_t>(1);  // of u8
        b.set("test.nested", T_ARR, v);
    });
    add("invalid kv type", "invalid value type 13",
        [](Builder & b) { b.set("test.u8", 13, Bytes().put<uint8_t>(1)); });
    add("invalid kv type huge", "invalid value type",
        [](Builder & b) { b.set("test.u8", 0xffffffffu, Bytes().put<uint8_t>(1)); });
    add("invalid array element type", "invalid array element value type", [](Builder & b) {
        b.set("test.per_layer", T_ARR, Bytes().put<uint32_t>(77).put<uint64_t>(0));
    });
    add("empty key", "is empty", [](Builder & b) { b.kvs[3].key = ""; });
    add("duplicate key", "duplicate metadata key 'general.architecture'",
        [](Builder & b) { b.kvs[1].key = "general.architecture"; });
    // Architecture keys: missing / wrong types / bad values.
    add("no architecture", "missing metadata key 'general.architecture'",
        [](Builder & b) { b.remove("general.architecture"); });
    add("architecture is u32", "general.architecture must be a non-empty string",
        [](Builder & b) { b.u32("general.architecture", 3); });
    add("expert_count is a string", "'qwen3moe.expert_count' must be an integer, is str",
        [](Builder & b) { b.str("qwen3moe.expert_count", "4"); });
    add("expert_count is f32", "must be an integer, is f32",
        [](Builder & b) { b.set("qwen3moe.expert_count", T_F32, Bytes().put<float>(4)); });
    add("block_count is bool", "must be an integer, is bool",
        [](Builder & b) { b.set("qwen3moe.block_count", T_BOOL, Bytes().put<int8_t>(1)); });
    add("expert_used_count is an array", "must be an integer, is arr", [](Builder & b) {
        b.arr_i32("qwen3moe.expert_used_count", {2, 2, 2});
    });
    add("expert_count negative", "out of range",
        [](Builder & b) { b.set("qwen3moe.expert_count", T_I32, Bytes().put<int32_t>(-4)); });
    add("expert_count u64 > 2^63", "out of range",
        [](Builder & b) { b.set("qwen3moe.expert_count", T_U64, Bytes().put<uint64_t>(~0ull)); });
    add("block_count 0", "out of range", [](Builder & b) { b.u32("qwen3moe.block_count", 0); });
    add("embedding_length missing", "missing metadata key 'qwen3moe.embedding_length'",
        [](Builder & b) { b.remove("qwen3moe.embedding_length"); });
    add("expert_count missing", "not a MoE model",
        [](Builder & b) { b.remove("qwen3moe.expert_count"); });
    add("expert_count 1", "not a MoE model",
        [](Builder & b) { b.u32("qwen3moe.expert_count", 1); });
    add("expert_used_count missing", "expert_used_count",
        [](Builder & b) { b.remove("qwen3moe.expert_used_count"); });
    add("n_expert_used > n_expert", "expert_used_count 5 is out of range [1, n_expert=4]",
        [](Builder & b) { b.u32("qwen3moe.expert_used_count", 5); });
    add("n_expert_used 0", "expert_used_count 0 is out of range",
        [](Builder & b) { b.u32("qwen3moe.expert_used_count", 0); });
    add("alignment u64", "general.alignment must be u32",
        [](Builder & b) { b.set("general.alignment", T_U64, Bytes().put<uint64_t>(32)); });
    add("alignment 0", "not a power of 2", [](Builder & b) { b.u32("general.alignment", 0); });
    add("alignment 48", "not a power of 2", [](Builder & b) { b.u32("general.alignment", 48); });
    add("alignment 2^31", "not a power of 2",
        [](Builder & b) { b.u32("general.alignment", 1u << 31); });
    // What llama.cpp / ggml would trust (and then crash on) if the index let it through.
    auto f32 = [](Builder & b, const std::string & k, float v) {
        b.set(k, T_F32, Bytes().put<float>(v));
    };
    auto vocab_with = [](Builder & b, std::vector<std::pair<int, std::string>> changes) {
        std::vector<std::string> toks;
        for (uint32_t i = 0; i < kVocab; ++i) toks.push_back("tok" + std::to_string(i));
        for (auto & [i, t] : changes) toks[size_t(i)] = t;
        b.arr_str("tokenizer.ggml.tokens", toks);
    };
    add("alignment 1", "general.alignment 1 is below 32",
        [](Builder & b) { b.u32("general.alignment", 1); });
    add("alignment 16", "general.alignment 16 is below 32",
        [](Builder & b) { b.u32("general.alignment", 16); });
    add("block_count above llama.cpp's 512",
        "'qwen3moe.block_count' = 513 is out of range [1, 512]",
        [](Builder & b) { b.u32("qwen3moe.block_count", 513); });
    add("block_count 65536", "out of range [1, 512]",
        [](Builder & b) { b.u32("qwen3moe.block_count", 65536); });
    add("key with NUL", "contains a NUL byte",
        [](Builder & b) { b.kvs[1].key = std::string("general.na\0me", 13); });
    add("tensor name with NUL", "contains a NUL byte", [](Builder & b) {
        b.tensor("output_norm.weight")->name = std::string("output_norm\0.weight", 19);
    });
    add("rms eps NaN", "'qwen3moe.attention.layer_norm_rms_epsilon' = nan must be finite and > 0",
        [=](Builder & b) { f32(b, "qwen3moe.attention.layer_norm_rms_epsilon", NAN); });
    add("rms eps negative", "layer_norm_rms_epsilon' = -0.000001 must be finite and > 0",
        [=](Builder & b) { f32(b, "qwen3moe.attention.layer_norm_rms_epsilon", -1e-6f); });
    add("rms eps 0", "must be finite and > 0",
        [=](Builder & b) { f32(b, "qwen3moe.attention.layer_norm_rms_epsilon", 0.0f); });
    add("rms eps is u32", "layer_norm_rms_epsilon' must be a float, is u32",
        [](Builder & b) { b.u32("qwen3moe.attention.layer_norm_rms_epsilon", 1); });
    add("rope freq_base 0", "'qwen3moe.rope.freq_base' = 0.000000 must be finite and > 0",
        [=](Builder & b) { f32(b, "qwen3moe.rope.freq_base", 0.0f); });
    add("rope freq_base inf", "'qwen3moe.rope.freq_base' = inf must be finite",
        [=](Builder & b) { f32(b, "qwen3moe.rope.freq_base", INFINITY); });
    add("rope scaling factor negative", "rope.scaling.factor' = -2.000000 must be finite and >= 0",
        [=](Builder & b) { f32(b, "qwen3moe.rope.scaling.factor", -2.0f); });
    add("expert_weights_scale NaN", "'qwen3moe.expert_weights_scale' = nan must be finite",
        [=](Builder & b) { f32(b, "qwen3moe.expert_weights_scale", NAN); });
    add("rope dims != head size", "'qwen3moe.rope.dimension_count' = 8 must equal the head size 16",
        [](Builder & b) { b.u32("qwen3moe.rope.dimension_count", 8); });
    add("rope dims > head size (partial-rotary arch)", "must be even and in [0, head size 16]",
        [](Builder & b) {
            b.str("general.architecture", "glm4moe");
            for (auto & k : b.kvs) {
                if (k.key.rfind("qwen3moe.", 0) == 0) k.key = "glm4moe." + k.key.substr(9);
            }
            b.u32("glm4moe.rope.dimension_count", 18);
        });
    add("head_count_kv 0", "'qwen3moe.attention.head_count_kv' = 0 must be >= 1 and divide",
        [](Builder & b) { b.u32("qwen3moe.attention.head_count_kv", 0); });
    add("head_count_kv does not divide", "head_count_kv' = 3 must be >= 1 and divide",
        [](Builder & b) { b.u32("qwen3moe.attention.head_count_kv", 3); });
    add("head_count > n_embd", "exceeds embedding_length",
        [](Builder & b) { b.u32("qwen3moe.attention.head_count", 128); });
    add("expert_gating_func 5", "'qwen3moe.expert_gating_func' = 5 is out of range [0, 4]",
        [](Builder & b) { b.u32("qwen3moe.expert_gating_func", 5); });
    add("nextn_predict_layers = block_count",
        "nextn_predict_layers' = 3 must be less than block_count 3",
        [](Builder & b) { b.u32("qwen3moe.nextn_predict_layers", 3); });
    add("nextn_predict_layers huge", "must be less than block_count",
        [](Builder & b) { b.u32("qwen3moe.nextn_predict_layers", 1u << 30); });
    add("tokenizer model is u32", "tokenizer.ggml.model must be a string, is u32",
        [](Builder & b) { b.u32("tokenizer.ggml.model", 1); });
    add("token not UTF-8 (bad lead byte)", "tokenizer.ggml.tokens[5] is not valid UTF-8 (byte 1)",
        [=](Builder & b) {
            vocab_with(b, {{5, "a\xff"}});
        });
    add("token not UTF-8 (truncated sequence)", "tokens[7] is not valid UTF-8 (truncated",
        [=](Builder & b) {
            vocab_with(b, {{7, "ab\xe2\x82"}});
        });
    add("token not UTF-8 (bad continuation)", "tokens[9] is not valid UTF-8 (byte 1)",
        [=](Builder & b) {
            vocab_with(b, {{9, "\xc3("}});
        });
    add("duplicate token", "tokenizer.ggml.tokens[42] duplicates token 3 'tok3'", [=](Builder & b) {
        vocab_with(b, {{42, "tok3"}});
    });
    add("empty token spelled like llama.cpp's placeholder",
        "tokens[8] duplicates token 4 '[EMPTY_4]'", [=](Builder & b) {
            vocab_with(b, {{4, ""}, {8, "[EMPTY_4]"}});
        });
    add("SentencePiece model on a vocabulary without byte tokens",
        "tokenizer.ggml.model is 'llama' (SentencePiece) but the vocabulary has no byte token "
        "<0x00>",
        [](Builder & b) { b.str("tokenizer.ggml.model", "llama"); });
    add("tokens not strings", "tokenizer.ggml.tokens must be an array of strings",
        [](Builder & b) { b.u32("tokenizer.ggml.tokens", 5); });
    // Tensor infos.
    add("tensor name too long", "tensor name length 64", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.name = std::string(64, 'n'); });
    });
    add("tensor name empty", "empty name", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.name = ""; });
    });
    add("duplicate tensor name", "duplicate tensor name 'output_norm.weight'", [=](Builder & b) {
        set_tensor(b, "blk.0.attn_norm.weight",
                   [](TensorSpec & t) { t.name = "output_norm.weight"; });
    });
    add("n_dims 0", "has 0 dimensions (need 1..4)", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.ne.clear(); });
    });
    add("n_dims 5", "has 5 dimensions", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.ne = {64, 1, 1, 1, 1}; });
    });
    add("n_dims 2^32-1", "dimensions", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.n_dims = 0xffffffffu; });
    });
    add("zero dim", "dimension 1 has 0 elements", [=](Builder & b) {
        set_tensor(b, "blk.0.attn_q.weight", [](TensorSpec & t) { t.ne = {64, 0}; });
    });
    add("negative dim", "has -64 elements", [=](Builder & b) {
        set_tensor(b, "blk.0.attn_q.weight", [](TensorSpec & t) { t.ne = {-64, 64}; });
    });
    add("element count overflows", "element count overflows", [=](Builder & b) {
        set_tensor(b, "blk.0.attn_q.weight", [](TensorSpec & t) { t.ne = {1ll << 32, 1ll << 32}; });
    });
    add("element count overflows (4 dims)", "element count overflows", [=](Builder & b) {
        set_tensor(b, "blk.0.attn_q.weight", [](TensorSpec & t) {
            t.ne = {1 << 16, 1 << 16, 1 << 16, 1 << 16};
        });
    });
    add("byte size overflows", "byte size overflows", [=](Builder & b) {
        // 2^62 elements fit in int64, 2^62 x 4 bytes do not fit in 64 bits.
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) {
            t.ne = {1ll << 31, 1ll << 30, 2};
        });
    });
    add("huge but representable tensor", "lies outside the file", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.ne = {1ll << 20, 1ll << 20}; });
    });
    add("type id 43 (GGML_TYPE_COUNT)", "unknown ggml type 43", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.type = GGML_TYPE_COUNT; });
    });
    add("type id -1", "unknown ggml type -1", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.type = -1; });
    });
    add("type id 4 (removed Q4_2)", "unsupported ggml type 4", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.type = 4; });
    });
    add("type id 31 (removed Q4_0_4_4)", "unsupported ggml type 31", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.type = 31; });
    });
    add("row not a multiple of the block", "not a multiple of q8_0's block size 32",
        [=](Builder & b) {
            set_tensor(b, "token_embd.weight", [](TensorSpec & t) { t.ne = {48, kVocab}; });
        });
    // Offsets.
    add("offset beyond the file", "lies outside the file", [=](Builder & b) {
        set_tensor(b, "output_norm.weight", [](TensorSpec & t) { t.offset = 1ull << 30; });
    });
    add("offset near 2^64", "lies outside the file", [=](Builder & b) {
        set_tensor(b, "output_norm.weight",
                   [](TensorSpec & t) { t.offset = ~0ull - 31; });  // aligned, overflows
    });
    add("misaligned offset", "is not a multiple of the alignment 32", [=](Builder & b) {
        set_tensor(b, "blk.2.ffn_gate_exps.scale", [](TensorSpec & t) { t.offset = 16; });
    });
    add("misaligned for general.alignment 4096", "not a multiple of the alignment 4096",
        [](Builder & b) { b.u32("general.alignment", 4096); });
    add("overlapping tensors", "overlaps tensor", [=](Builder & b) {
        set_tensor(b, "blk.2.ffn_gate_exps.scale", [](TensorSpec & t) { t.offset = 0; });
    });
    add("overlapping expert tensors", "overlaps tensor", [=](Builder & b) {
        set_tensor(b, u1, [](TensorSpec & t) { t.offset = 64; });  // inside token_embd
    });
    // The expert map.
    add("missing down_exps", "layer 1: missing blk.1.ffn_down_exps.weight",
        [=](Builder & b) { b.remove_tensor(d1); });
    add("missing up_exps", "layer 1: missing blk.1.ffn_up_exps.weight",
        [=](Builder & b) { b.remove_tensor(u1); });
    add("fused and separate gate", "both fused", [=](Builder & b) {
        b.tensors.push_back({"blk.1.ffn_gate_up_exps.weight",
                             {kEmbd, 2 * kFf, kExperts},
                             GGML_TYPE_F32,
                             std::nullopt,
                             std::nullopt});
    });
    add("no expert tensors", "not a MoE model: no blk.N", [](Builder & b) {
        std::erase_if(b.tensors, [](const TensorSpec & t) {
            return t.name.find("_exps.weight") != std::string::npos;
        });
    });
    add("up_exps n_ff differs",
        "'blk.1.ffn_up_exps.weight' has shape [64, 64, 4], expected [64, 32, 4]", [=](Builder & b) {
            set_tensor(b, u1, [](TensorSpec & t) { t.ne = {kEmbd, 64, kExperts}; });
        });
    add("gate_exps ne[2] != n_expert", "has shape [64, 32, 8]", [=](Builder & b) {
        set_tensor(b, g1, [](TensorSpec & t) { t.ne = {kEmbd, kFf, 8}; });
    });
    add("down_exps n_embd differs", "has shape [32, 32, 4], expected [32, 64, 4]",
        [=](Builder & b) {
            set_tensor(b, d1, [](TensorSpec & t) { t.ne = {kFf, 32, kExperts}; });
        });
    add("down_exps n_ff vs KV", "expert_feed_forward_length is 32", [=](Builder & b) {
        set_tensor(b, d1, [](TensorSpec & t) { t.ne = {64, kEmbd, kExperts}; });
    });
    add("expert tensor 2-d", "has shape [64, 128]", [=](Builder & b) {
        set_tensor(b, g1, [](TensorSpec & t) { t.ne = {kEmbd, kFf * kExperts}; });
    });
    add("expert tensor 4-d", "has shape [64, 32, 4, 2]", [=](Builder & b) {
        set_tensor(b, g1, [](TensorSpec & t) { t.ne = {kEmbd, kFf, kExperts, 2}; });
    });
    add("expert layer >= n_layer", "is in layer 2 but the model has 2 layers",
        [](Builder & b) { b.u32("qwen3moe.block_count", 2); });
    add("n_embd KV differs from shapes", "has shape",
        [](Builder & b) { b.u32("qwen3moe.embedding_length", 128); });
    return c;
}

TEST(GgufIndex, CorruptionMatrix) {
    TempDir tmp;
    // The base model itself must load, or every case below would pass vacuously.
    {
        const std::string p = tmp.path("base.gguf");
        write_file(p, moe_builder().build());
        ModelIndex m;
        ASSERT_TRUE(load_model_index(p, &m).ok());
    }
    int n = 0;
    for (const Case & c : corruption_cases()) {
        Builder b = moe_builder();
        c.mutate(b);
        const std::string path = tmp.path("case-" + std::to_string(n++) + ".gguf");
        write_file(path, b.build());
        expect_bad(path, c.what, c.label);
    }
    EXPECT_GE(n, 80);
}

// A SentencePiece vocabulary with its 256 byte tokens passes the byte-token check (the
// positive control of the "SentencePiece model on a vocabulary without byte tokens" case).
TEST(GgufIndex, SentencePieceVocabularyWithByteTokensLoads) {
    TempDir tmp;
    Builder b = moe_builder();
    b.str("tokenizer.ggml.model", "llama");
    std::vector<std::string> toks = {"<unk>", "<s>", "</s>"};
    for (int c = 0; c < 256; ++c) {
        char t[8];
        std::snprintf(t, sizeof t, "<0x%02X>", c);
        toks.push_back(t);
    }
    b.arr_str("tokenizer.ggml.tokens", toks);
    const std::string path = tmp.path("spm.gguf");
    write_file(path, b.build());
    ModelIndex m;
    Status st = load_model_index(path, &m);
    ASSERT_TRUE(st.ok()) << st.message();
    toks.pop_back();  // no <0xFF>: refused, naming the missing byte
    b.arr_str("tokenizer.ggml.tokens", toks);
    write_file(path, b.build());
    st = load_model_index(path, &m);
    EXPECT_NE(st.message().find("no byte token <0xFF>"), std::string::npos) << st.message();
}

// Tensor types against the CPU backend: every role's type in the reference model passes, and
// each type the CPU has no kernel for in that role is refused naming the tensor and the offset
// of its tensor-info record.
TEST(GgufIndex, TypesTheCpuBackendCannotComputeAreRefused) {
    static const bool loaded = [] {
        const char * one = std::getenv("GGML_BACKEND_PATH");
        const std::string path = one && *one ? one : MOESTREAM_TEST_BACKEND;
        return ggml_backend_load(path.c_str()) != nullptr;
    }();
    ASSERT_TRUE(loaded);
    TempDir tmp;
    const std::string base = tmp.path("base.gguf");
    write_file(base, moe_builder().build());
    ModelIndex m;
    ASSERT_TRUE(load_model_index(base, &m).ok());
    Status st = moestream::check_cpu_computable(m);
    ASSERT_TRUE(st.ok()) << st.message();  // control: f32, f16, q8_0 in every role

    struct TypeCase {
        const char * tensor;
        int32_t type;
        const char * what;
    };
    const TypeCase cases[] = {
        {"blk.1.ffn_gate_exps.weight", GGML_TYPE_I8,
         "MUL_MAT_ID (experts) (no dot-product kernel)"},
        {"blk.1.ffn_down_exps.weight", GGML_TYPE_I32, "MUL_MAT_ID"},
        {"blk.2.ffn_up_exps.weight", GGML_TYPE_F64, "MUL_MAT_ID"},
        {"blk.1.ffn_gate_inp.weight", GGML_TYPE_I32, "in MUL_MAT (no dot-product kernel)"},
        {"blk.0.attn_q.weight", GGML_TYPE_I16, "in MUL_MAT"},
        {"blk.1.ffn_gate_exps.weight", GGML_TYPE_Q8_1, "MUL_MAT_ID"},
        {"output_norm.weight", GGML_TYPE_F16, "element-wise ops need f32"},
        {"blk.0.attn_norm.weight", GGML_TYPE_I32, "element-wise"},
        {"token_embd.weight", GGML_TYPE_I16, "GET_ROWS (token embedding) (no conversion to f32)"},
    };
    int n = 0;
    for (const TypeCase & c : cases) {
        SCOPED_TRACE(std::string(c.tensor) + " as " + ggml_type_name(ggml_type(c.type)));
        Builder b = moe_builder();
        b.tensor(c.tensor)->type = c.type;
        const std::string path = tmp.path("type-" + std::to_string(n++) + ".gguf");
        write_file(path, b.build());
        ModelIndex mi;
        Status ist = load_model_index(path, &mi);
        ASSERT_TRUE(ist.ok()) << ist.message();  // the index alone accepts it
        const moestream::TensorInfo * t = mi.find_tensor(c.tensor);
        ASSERT_NE(t, nullptr);
        st = moestream::check_cpu_computable(mi);
        EXPECT_EQ(st.code(), moestream::ErrorCode::kBadModel);
        const std::string want =
            "tensor '" + std::string(c.tensor) + "' has type " + ggml_type_name(ggml_type(c.type));
        EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
        EXPECT_NE(st.message().find(c.what), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("at byte offset " + std::to_string(t->info_offset)),
                  std::string::npos)
            << st.message();
    }
}

// Rejecting a file costs little memory, whatever sizes it claims (counts of 2^40 and
// INT64_MAX, huge string lengths, huge shapes): each case is loaded in a forked child whose
// peak RSS (wait4's ru_maxrss) is compared with a child that loads nothing.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
TEST(GgufIndex, DISABLED_RejectingUsesLittleMemory) {}  // RSS includes the shadow memory
#else
TEST(GgufIndex, RejectingUsesLittleMemory) {
    TempDir tmp;
    auto child_peak_kib = [](const std::string & path) -> long {
        const pid_t pid = fork();
        if (pid == 0) {
            if (!path.empty()) {
                ModelIndex m;
                (void)load_model_index(path, &m);
            }
            _exit(0);
        }
        int status = 0;
        struct rusage ru = {};
        if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return -1;
        return ru.ru_maxrss;
    };
    const long base = child_peak_kib("");
    ASSERT_GT(base, 0);
    long worst = 0;
    std::string worst_label;
    int n = 0;
    for (const Case & c : corruption_cases()) {
        Builder b = moe_builder();
        c.mutate(b);
        const std::string path = tmp.path("mem-" + std::to_string(n++) + ".gguf");
        write_file(path, b.build());
        const long peak = child_peak_kib(path);
        ASSERT_GT(peak, 0) << c.label << ": the child crashed";
        if (peak - base > worst) {
            worst = peak - base;
            worst_label = c.label;
        }
    }
    std::printf("%d corrupt files rejected; most memory over the baseline: %ld KiB (%s)\n", n,
                worst, worst_label.c_str());
    EXPECT_LT(worst, 16 * 1024) << worst_label;
}
#endif

TEST(GgufIndex, TruncationAtEveryBoundaryAndRandomOffsets) {
    TempDir tmp;
    Layout lay;
    const std::vector<uint8_t> full = moe_builder().build(&lay);
    const std::string path = tmp.path("trunc.gguf");
    std::vector<uint64_t> cuts;
    for (uint64_t b : lay.boundaries) {
        for (int64_t d : {-1, 0, 1}) {
            const int64_t c = int64_t(b) + d;
            if (c >= 0 && uint64_t(c) < full.size()) cuts.push_back(uint64_t(c));
        }
    }
    std::mt19937_64 rng(20240601);
    for (int i = 0; i < 300; ++i) cuts.push_back(rng() % full.size());
    for (uint64_t cut : cuts) {
        write_file(path, full, cut);
        const std::string label = "truncated at " + std::to_string(cut);
        // Inside the metadata the reader must say so; inside the data the tensor that no
        // longer fits is named instead.
        expect_bad(path, cut < lay.data_offset ? "truncated" : "", label);
        if (HasFailure()) break;
    }
    write_file(path, full);
    ModelIndex m;
    EXPECT_TRUE(load_model_index(path, &m).ok());
}

TEST(GgufIndex, RandomByteFlipsNeverCrash) {
    TempDir tmp;
    Layout lay;
    const std::vector<uint8_t> full = moe_builder().build(&lay);
    const std::string path = tmp.path("flip.gguf");
    std::mt19937_64 rng(7);
    int ok = 0, bad = 0;
    for (int i = 0; i < 1500; ++i) {
        std::vector<uint8_t> b = full;
        const int flips = 1 + int(rng() % 4);
        for (int f = 0; f < flips; ++f) {
            // Mostly the metadata (where parsing happens), sometimes anywhere.
            const uint64_t at = (rng() % 4) ? rng() % lay.data_offset : rng() % b.size();
            b[at] ^= uint8_t(1u << (rng() % 8));
            if (rng() % 8 == 0) b[at] = uint8_t(rng());
        }
        write_file(path, b);
        ModelIndex m;
        Status st = load_model_index(path, &m);
        if (st.ok()) {
            ++ok;
            expect_invariants(m);
        } else {
            ++bad;
            ASSERT_EQ(st.code(), ErrorCode::kBadModel) << st.message();
            ASSERT_EQ(st.message().rfind(path + ": ", 0), 0u) << st.message();
            ASSERT_EQ(st.message().find('\n'), std::string::npos) << st.message();
        }
        if (HasFailure()) break;
    }
    EXPECT_GT(bad, 100);  // the fuzz actually exercised error paths
    EXPECT_GT(ok, 10);    // and flips in data/names that keep the file valid
}

// ---- cross-checks with files written by gguf.h and by Debian's test-llama-archs --------------

// Writes a MoE model through gguf.h's own writer (tensor data from a ggml context).
void write_with_gguf_h(const std::string & path, ggml_type expert_type, bool fused) {
    ggml_init_params ip = {/*mem_size=*/64u << 20, /*mem_buffer=*/nullptr, /*no_alloc=*/false};
    ggml_context * ctx = ggml_init(ip);
    gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "olmoe");
    gguf_set_val_u32(g, "olmoe.block_count", 2);
    gguf_set_val_u32(g, "olmoe.embedding_length", 256);
    gguf_set_val_u32(g, "olmoe.expert_count", 8);
    gguf_set_val_u32(g, "olmoe.expert_used_count", 3);
    std::vector<std::string> toks;
    for (int i = 0; i < 300; ++i) toks.push_back("t" + std::to_string(i));
    std::vector<const char *> tp;
    for (auto & s : toks) tp.push_back(s.c_str());
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", tp.data(), tp.size());
    auto add = [&](const std::string & name, std::vector<int64_t> ne, ggml_type t) {
        ggml_tensor * x = ggml_new_tensor(ctx, t, int(ne.size()), ne.data());
        ggml_set_name(x, name.c_str());
        std::memset(x->data, 0x11, ggml_nbytes(x));
        gguf_add_tensor(g, x);
    };
    add("token_embd.weight", {256, 300}, GGML_TYPE_F16);
    for (int il = 0; il < 2; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        add(p + "attn_norm.weight", {256}, GGML_TYPE_F32);
        add(p + "ffn_gate_inp.weight", {256, 8}, GGML_TYPE_F32);
        if (fused) {
            add(p + "ffn_gate_up_exps.weight", {256, 2 * 96, 8}, expert_type);
        } else {
            add(p + "ffn_gate_exps.weight", {256, 96, 8}, expert_type);
            add(p + "ffn_up_exps.weight", {256, 96, 8}, expert_type);
        }
        add(p + "ffn_down_exps.weight", {96, 256, 8}, GGML_TYPE_Q8_0);
    }
    ASSERT_TRUE(gguf_write_to_file(g, path.c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
}

TEST(GgufIndex, CrossCheckFilesWrittenByGgufH) {
    TempDir tmp;
    struct V {
        ggml_type t;
        bool fused;
    };
    for (V v : {V{GGML_TYPE_Q4_K, false}, V{GGML_TYPE_Q8_0, true}, V{GGML_TYPE_F16, false}}) {
        const std::string path = tmp.path(std::string("gguf-h-") + ggml_type_name(v.t) + ".gguf");
        write_with_gguf_h(path, v.t, v.fused);
        ModelIndex m;
        Status st = load_model_index(path, &m);
        ASSERT_TRUE(st.ok()) << st.message();
        expect_invariants(m);
        EXPECT_EQ(m.n_expert, 8u);
        EXPECT_EQ(m.n_expert_used, 3u);
        EXPECT_EQ(m.n_ff_exp, 0u);  // absent in these files
        EXPECT_EQ(m.n_vocab, 300u);
        EXPECT_EQ(m.moe_layers.size(), 2u);
        EXPECT_EQ(m.moe_layers[0].tensors[0].type, v.t);
        EXPECT_EQ(m.moe_layers[0].tensors[0].row_bytes, ggml_row_size(v.t, 256));
        cross_check_with_gguf(path, m);
    }
}

// Debian's test-llama-archs writes tiny random models of real architectures (experts in f32,
// fused and unfused, latent MoE, per-layer n_ff). Skipped when the tool is not available.
TEST(GgufIndex, CrossCheckTestLlamaArchsModels) {
    const char * tool = std::getenv("LLAMA_TOOL");
    if (!tool || !fs::exists(tool)) GTEST_SKIP() << "LLAMA_TOOL not set";
    const std::string dir = moestream::test::models_dir() + "/llama-archs-s1";
    const std::string re = "^(qwen3moe|olmoe|deepseek2|gpt-oss|qwen35moe|kimi-k3|maion-coder)$";
    if (!fs::exists(dir + "/maion-coder-moe.gguf")) {
        const std::string tmpdir = dir + ".tmp." + std::to_string(getpid());
        fs::create_directories(tmpdir);
        auto r = moestream::test::run_cmd(moestream::test::sh_quote(tool) +
                                          " test-llama-archs -a " + moestream::test::sh_quote(re) +
                                          " -s 1 -o " + moestream::test::sh_quote(tmpdir));
        if (r.exit_code != 0) GTEST_SKIP() << "test-llama-archs failed: " << r.err;
        std::error_code ec;
        fs::rename(tmpdir, dir, ec);  // another process may have won: fine
        if (ec) fs::remove_all(tmpdir);
    }
    int n = 0;
    for (const char * arch :
         {"qwen3moe", "olmoe", "deepseek2", "gpt-oss", "qwen35moe", "kimi-k3", "maion-coder"}) {
        const std::string path = dir + "/" + arch + "-moe.gguf";
        if (!fs::exists(path)) continue;
        SCOPED_TRACE(path);
        ModelIndex m;
        Status st = load_model_index(path, &m);
        ASSERT_TRUE(st.ok()) << st.message();
        EXPECT_EQ(m.arch, arch);
        expect_invariants(m);
        cross_check_with_gguf(path, m);
        ++n;
    }
    EXPECT_GE(n, 5);
}

}  // namespace
