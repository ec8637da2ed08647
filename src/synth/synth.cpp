// synth.cpp — writes GGUF MoE models with deterministic random weights (see synth.h).
//
// How a file is made:
//  1. The model is described as a list of TensorSpecs (name, type, shape, init rule) and a
//     gguf_context holding the metadata (architecture keys, tokenizer).
//  2. general.alignment only takes effect in a gguf_context that was *read* with that key
//     (gguf_add_tensor pads with the context's alignment, which gguf_set_val_u32 does not
//     change), so the key/value block is serialized, re-read with gguf_init_from_buffer,
//     and the tensor infos are added to the re-read context.
//  3. The metadata block is written at offset 0 of a temp file next to the output; tensor
//     data is produced in fixed-size chunks (a chunk = a run of rows of one tensor) by a
//     few worker threads and written with pwrite at its offset, the last chunk of each
//     tensor carrying the zero padding up to the next aligned offset. Each chunk has its
//     own PRNG stream seeded from (seed, tensor name, chunk index), so the bytes do not
//     depend on the thread count or on scheduling.
//  4. fdatasync, re-read the metadata with gguf.h and check offsets/sizes, rename.
//
// Quantized tensors are generated as random blocks directly (random quant bytes plus fp16
// scales chosen so that the block decodes to zero-mean values with the target standard
// deviation), which is much faster than quantizing floats.
#include "moestream/synth.h"

#include "moestream/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "ggml.h"
#include "gguf.h"
#include "llama.h"

namespace moestream {
namespace {

// ---------------------------------------------------------------------------------------
// Presets, architectures, types.

struct Preset {
    const char * name;
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t n_expert;
    uint32_t n_expert_used;
    uint32_t n_ff_exp;     // per-expert FFN width (also the shared expert's, for glm4moe)
    uint32_t n_ff;         // dense FFN width (glm4moe's leading dense layers)
    uint32_t n_vocab;      // 256 byte tokens + specials + padding
    uint32_t n_ctx;        // <arch>.context_length
    ggml_type dense_type;  // attention / dense FFN / shared expert / output matrices
    ggml_type embd_type;   // token_embd (must support get_rows)
};

const Preset kPresets[] = {
    // name            L   embd  H  Hkv  hd   X   k   ff_exp ff    vocab   ctx
    {"tiny", 4, 256, 4, 2, 64, 32, 4, 256, 512, 259, 512, GGML_TYPE_F32, GGML_TYPE_F32},
    {"mid", 16, 2048, 16, 4, 128, 64, 8, 768, 6144, 32768, 4096, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
    {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 128, 8, 768, 6144, 151936, 40960, GGML_TYPE_Q8_0,
     GGML_TYPE_Q8_0},
};

enum class Arch { kQwen3Moe, kOlmoe, kGlm4Moe };

struct ArchInfo {
    const char * name;
    Arch arch;
};

const ArchInfo kArchs[] = {
    {"qwen3moe", Arch::kQwen3Moe},
    {"olmoe", Arch::kOlmoe},
    {"glm4moe", Arch::kGlm4Moe},
};

struct TypeInfo {
    const char * name;
    ggml_type type;
    llama_ftype ftype;
};

const TypeInfo kTypes[] = {
    {"f32", GGML_TYPE_F32, LLAMA_FTYPE_ALL_F32},
    {"f16", GGML_TYPE_F16, LLAMA_FTYPE_MOSTLY_F16},
    {"q8_0", GGML_TYPE_Q8_0, LLAMA_FTYPE_MOSTLY_Q8_0},
    {"q4_k", GGML_TYPE_Q4_K, LLAMA_FTYPE_MOSTLY_Q4_K_M},
};

// glm4moe: number of leading dense (non-MoE) layers, as in GLM-4.5-Air.
constexpr uint32_t kGlmLeadingDense = 1;
constexpr uint32_t kGlmSharedExperts = 1;

// Token ids of the vocabulary: 0..255 are the byte-level tokens.
// 256..258 are the control tokens <|endoftext|> (bos, eos, pad), <|im_start|>, <|im_end|>;
// the rest, up to the preset's vocabulary size, are "[PAD<id>]" filler tokens.
constexpr uint32_t kTokEndOfText = 256;
constexpr uint32_t kFirstPadToken = 259;

// ---------------------------------------------------------------------------------------
// Deterministic randomness.

uint64_t splitmix64(uint64_t & x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string & s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ULL;
    }
    return h;
}

// xoshiro256** (public-domain algorithm by Blackman and Vigna), seeded with splitmix64.
class Rng {
public:
    explicit Rng(uint64_t seed) {
        for (auto & v : s_) v = splitmix64(seed);
    }
    uint64_t next() {
        const uint64_t r = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }
    // Uniform in [-1, 1).
    float sym() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) * (1.0f / 8388608.0f); }
    void fill(uint8_t * p, size_t n) {
        while (n >= 8) {
            uint64_t v = next();
            std::memcpy(p, &v, 8);
            p += 8;
            n -= 8;
        }
        if (n) {
            uint64_t v = next();
            std::memcpy(p, &v, n);
        }
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

// ---------------------------------------------------------------------------------------
// The model description.

enum class Init {
    kWeight,  // zero-mean, standard deviation `scale`
    kNorm,    // 1 +- 5 % (RMSNorm weights)
    kSmall,   // zero-mean, uniform in [-scale, scale] (biases)
};

struct TensorSpec {
    std::string name;
    ggml_type type = GGML_TYPE_F32;
    int n_dims = 1;
    int64_t ne[4] = {1, 1, 1, 1};
    Init init = Init::kWeight;
    float scale = 1.0f;
    // Rows [zero_row_begin, zero_row_end) are all zero (the output rows of control
    // tokens, so that greedy decoding never picks them).
    int64_t zero_row_begin = 0;
    int64_t zero_row_end = 0;
    // Filled in once the tensor infos are laid out.
    uint64_t file_offset = 0;
    uint64_t nbytes = 0;
    uint64_t padded_bytes = 0;
};

struct Model {
    const Preset * preset = nullptr;
    Arch arch = Arch::kQwen3Moe;
    const char * arch_name = nullptr;
    const TypeInfo * type = nullptr;
    float attn_out_gain = 0;  // SynthOptions::attn_out_gain (synth_model sets it)
    uint32_t nextn_layers = 0;  // SynthOptions::nextn_layers (glm4moe)
    std::vector<TensorSpec> tensors;
};

TensorSpec make(const std::string & name, ggml_type type, std::initializer_list<int64_t> ne,
                Init init, float scale) {
    TensorSpec t;
    t.name = name;
    t.type = type;
    t.n_dims = int(ne.size());
    int i = 0;
    for (int64_t v : ne) t.ne[i++] = v;
    t.init = init;
    t.scale = scale;
    return t;
}

struct AttnShape {
    uint32_t n_head, n_head_kv, head_dim;
};

// llama.cpp's OLMoE has no grouped-query attention (its q/k norms span all heads) and needs
// n_head * head_dim == n_embd: it keeps the preset's head_dim with n_embd / head_dim heads.
AttnShape attn_shape(const Model & m) {
    const Preset & p = *m.preset;
    if (m.arch == Arch::kOlmoe) {
        const uint32_t h = p.n_embd / p.head_dim;
        return {h, h, p.head_dim};
    }
    return {p.n_head, p.n_head_kv, p.head_dim};
}

std::string blk(uint32_t il, const char * what) {
    return "blk." + std::to_string(il) + "." + what;
}

void build_tensors(Model & m) {
    const Preset & p = *m.preset;
    const int64_t E = p.n_embd, V = p.n_vocab, X = p.n_expert, F = p.n_ff_exp;
    const AttnShape a = attn_shape(m);
    const int64_t D = a.head_dim, Q = int64_t(a.n_head) * D, KV = int64_t(a.n_head_kv) * D;
    const ggml_type dt = p.dense_type, et = m.type->type, f32 = GGML_TYPE_F32;
    const float inv_e = 1.0f / std::sqrt(float(E));
    auto & T = m.tensors;

    T.push_back(make("token_embd.weight", p.embd_type, {E, V}, Init::kWeight, 1.0f));
    T.push_back(make("output_norm.weight", f32, {E}, Init::kNorm, 0));
    TensorSpec out = make("output.weight", dt, {E, V}, Init::kWeight, 2.0f * inv_e);
    out.zero_row_begin = kTokEndOfText;
    out.zero_row_end = kFirstPadToken;
    T.push_back(out);

    for (uint32_t il = 0; il < p.n_layer + m.nextn_layers; ++il) {
        if (il >= p.n_layer) {
            // A NextN (multi-token prediction) layer, as llama.cpp's glm4moe loader names its
            // tensors: a whole MoE block (below) plus the projection of [embedding, hidden] and
            // its norms. llama.cpp loads it but does not build it into the graph.
            T.push_back(make(blk(il, "nextn.eh_proj.weight"), dt, {2 * E, E}, Init::kWeight,
                             1.0f / std::sqrt(float(2 * E))));
            T.push_back(make(blk(il, "nextn.enorm.weight"), f32, {E}, Init::kNorm, 0));
            T.push_back(make(blk(il, "nextn.hnorm.weight"), f32, {E}, Init::kNorm, 0));
            T.push_back(make(blk(il, "nextn.shared_head_norm.weight"), f32, {E}, Init::kNorm, 0));
        }
        T.push_back(make(blk(il, "attn_norm.weight"), f32, {E}, Init::kNorm, 0));
        T.push_back(make(blk(il, "attn_q.weight"), dt, {E, Q}, Init::kWeight, inv_e));
        T.push_back(make(blk(il, "attn_k.weight"), dt, {E, KV}, Init::kWeight, inv_e));
        T.push_back(make(blk(il, "attn_v.weight"), dt, {E, KV}, Init::kWeight, inv_e));
        // Random attention is nearly uniform, so its output is much the same vector at
        // every position; at full gain that shared component builds up over the layers
        // (token states grow alike, routing concentrates on a few experts). The default
        // gain 0.3 (SynthOptions::attn_out_gain) keeps the mean cosine between token states
        // below ~0.2 at 48 layers and routing spread.
        T.push_back(make(blk(il, "attn_output.weight"), dt, {Q, E}, Init::kWeight,
                         m.attn_out_gain / std::sqrt(float(Q))));
        switch (m.arch) {
            case Arch::kQwen3Moe:
                T.push_back(make(blk(il, "attn_q_norm.weight"), f32, {D}, Init::kNorm, 0));
                T.push_back(make(blk(il, "attn_k_norm.weight"), f32, {D}, Init::kNorm, 0));
                break;
            case Arch::kOlmoe:
                T.push_back(make(blk(il, "attn_q_norm.weight"), f32, {Q}, Init::kNorm, 0));
                T.push_back(make(blk(il, "attn_k_norm.weight"), f32, {KV}, Init::kNorm, 0));
                break;
            case Arch::kGlm4Moe:
                T.push_back(make(blk(il, "attn_q.bias"), f32, {Q}, Init::kSmall, 0.05f));
                T.push_back(make(blk(il, "attn_k.bias"), f32, {KV}, Init::kSmall, 0.05f));
                T.push_back(make(blk(il, "attn_v.bias"), f32, {KV}, Init::kSmall, 0.05f));
                break;
        }
        const bool dense = m.arch == Arch::kGlm4Moe && il < kGlmLeadingDense;
        const char * ffn_norm =
            m.arch == Arch::kGlm4Moe ? "post_attention_norm.weight" : "ffn_norm.weight";
        T.push_back(make(blk(il, ffn_norm), f32, {E}, Init::kNorm, 0));
        if (dense) {
            const int64_t FF = p.n_ff;
            T.push_back(make(blk(il, "ffn_gate.weight"), dt, {E, FF}, Init::kWeight, inv_e));
            T.push_back(make(blk(il, "ffn_up.weight"), dt, {E, FF}, Init::kWeight, inv_e));
            T.push_back(make(blk(il, "ffn_down.weight"), dt, {FF, E}, Init::kWeight,
                             1.0f / std::sqrt(float(FF))));
            continue;
        }
        // Router: logits with a standard deviation of ~2 spread the top-k over all experts.
        T.push_back(make(blk(il, "ffn_gate_inp.weight"), f32, {E, X}, Init::kWeight, 2 * inv_e));
        if (m.arch == Arch::kGlm4Moe) {
            T.push_back(make(blk(il, "exp_probs_b.bias"), f32, {X}, Init::kSmall, 0.02f));
        }
        T.push_back(make(blk(il, "ffn_gate_exps.weight"), et, {E, F, X}, Init::kWeight, inv_e));
        T.push_back(make(blk(il, "ffn_up_exps.weight"), et, {E, F, X}, Init::kWeight, inv_e));
        T.push_back(make(blk(il, "ffn_down_exps.weight"), et, {F, E, X}, Init::kWeight,
                         1.0f / std::sqrt(float(F))));
        if (m.arch == Arch::kGlm4Moe) {
            const int64_t FS = int64_t(p.n_ff_exp) * kGlmSharedExperts;
            T.push_back(make(blk(il, "ffn_gate_shexp.weight"), dt, {E, FS}, Init::kWeight, inv_e));
            T.push_back(make(blk(il, "ffn_up_shexp.weight"), dt, {E, FS}, Init::kWeight, inv_e));
            T.push_back(make(blk(il, "ffn_down_shexp.weight"), dt, {FS, E}, Init::kWeight,
                             1.0f / std::sqrt(float(FS))));
        }
    }
}

// GPT-2 byte-level BPE maps every byte to a printable code point: printable Latin-1 bytes
// map to themselves, the others to 256, 257, ... in byte order.
std::vector<std::string> byte_level_tokens() {
    auto printable = [](int b) {
        return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    };
    std::vector<std::string> out(256);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
        const uint32_t cp = printable(b) ? uint32_t(b) : uint32_t(256 + extra++);
        std::string s;
        if (cp < 0x80) {
            s += char(cp);
        } else {  // all code points here are < 0x800: two UTF-8 bytes
            s += char(0xC0 | (cp >> 6));
            s += char(0x80 | (cp & 0x3F));
        }
        out[b] = s;
    }
    return out;
}

std::string key(const Model & m, const char * suffix) {
    return std::string(m.arch_name) + "." + suffix;
}

// Key/value metadata (everything but the tensor infos).
void set_metadata(const Model & m, uint32_t alignment, gguf_context * g) {
    const Preset & p = *m.preset;
    gguf_set_val_str(g, "general.architecture", m.arch_name);
    gguf_set_val_str(g, "general.type", "model");
    std::string name =
        std::string("moestream-synth ") + p.name + " " + m.arch_name + " " + m.type->name;
    if (m.attn_out_gain != SynthOptions().attn_out_gain) {
        char gain[32];
        std::snprintf(gain, sizeof gain, " attn-gain %g", double(m.attn_out_gain));
        name += gain;  // the default's name (and bytes) stay as they were
    }
    gguf_set_val_str(g, "general.name", name.c_str());
    gguf_set_val_u32(g, "general.alignment", alignment);
    gguf_set_val_u32(g, "general.file_type", uint32_t(m.type->ftype));
    gguf_set_val_u32(g, "general.quantization_version", GGML_QNT_VERSION);

    gguf_set_val_u32(g, key(m, "context_length").c_str(), p.n_ctx);
    gguf_set_val_u32(g, key(m, "block_count").c_str(), p.n_layer + m.nextn_layers);
    gguf_set_val_u32(g, key(m, "embedding_length").c_str(), p.n_embd);
    // OLMoE sizes its experts with feed_forward_length (it has no dense FFN).
    gguf_set_val_u32(g, key(m, "feed_forward_length").c_str(),
                     m.arch == Arch::kOlmoe ? p.n_ff_exp : p.n_ff);
    const AttnShape a = attn_shape(m);
    gguf_set_val_u32(g, key(m, "attention.head_count").c_str(), a.n_head);
    gguf_set_val_u32(g, key(m, "attention.head_count_kv").c_str(), a.n_head_kv);
    gguf_set_val_u32(g, key(m, "attention.key_length").c_str(), a.head_dim);
    gguf_set_val_u32(g, key(m, "attention.value_length").c_str(), a.head_dim);
    gguf_set_val_f32(g, key(m, "attention.layer_norm_rms_epsilon").c_str(),
                     m.arch == Arch::kOlmoe ? 1e-5f : 1e-6f);
    gguf_set_val_f32(g, key(m, "rope.freq_base").c_str(),
                     m.arch == Arch::kOlmoe ? 10000.0f : 1000000.0f);
    const uint32_t n_rot = m.arch == Arch::kGlm4Moe ? a.head_dim / 2 : a.head_dim;
    gguf_set_val_u32(g, key(m, "rope.dimension_count").c_str(), n_rot);
    gguf_set_val_u32(g, key(m, "expert_count").c_str(), p.n_expert);
    gguf_set_val_u32(g, key(m, "expert_used_count").c_str(), p.n_expert_used);
    gguf_set_val_u32(g, key(m, "expert_feed_forward_length").c_str(), p.n_ff_exp);
    if (m.arch == Arch::kGlm4Moe) {
        gguf_set_val_u32(g, key(m, "leading_dense_block_count").c_str(), kGlmLeadingDense);
        gguf_set_val_u32(g, key(m, "expert_shared_count").c_str(), kGlmSharedExperts);
        gguf_set_val_f32(g, key(m, "expert_weights_scale").c_str(), 1.0f);
        gguf_set_val_bool(g, key(m, "expert_weights_norm").c_str(), true);
        gguf_set_val_u32(g, key(m, "expert_gating_func").c_str(), 2);  // sigmoid
        gguf_set_val_u32(g, key(m, "nextn_predict_layers").c_str(), m.nextn_layers);
    }

    // Tokenizer: GPT-2 byte-level BPE without merges, three control tokens, padding.
    std::vector<std::string> tokens = byte_level_tokens();
    std::vector<int32_t> types(256, LLAMA_TOKEN_TYPE_NORMAL);
    for (const char * s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        tokens.emplace_back(s);
        types.push_back(LLAMA_TOKEN_TYPE_CONTROL);
    }
    char buf[32];
    for (uint32_t i = kFirstPadToken; i < p.n_vocab; ++i) {
        std::snprintf(buf, sizeof buf, "[PAD%u]", i);
        tokens.emplace_back(buf);
        types.push_back(LLAMA_TOKEN_TYPE_NORMAL);
    }
    std::vector<const char *> ptrs;
    ptrs.reserve(tokens.size());
    for (const auto & t : tokens) ptrs.push_back(t.c_str());
    gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_set_val_str(g, "tokenizer.ggml.pre", "default");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    gguf_set_arr_str(g, "tokenizer.ggml.merges", nullptr, 0);
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", kTokEndOfText);
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", kTokEndOfText);
    gguf_set_val_u32(g, "tokenizer.ggml.padding_token_id", kTokEndOfText);
    gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", false);
}

// ---------------------------------------------------------------------------------------
// Tensor data generation.

// Standard deviation of a uniform random int8 / 4-bit quant.
constexpr float kStdInt8 = 73.9f;    // sqrt((256^2 - 1) / 12)
constexpr float kStdNibble = 4.61f;  // sqrt((16^2 - 1) / 12)
constexpr float kSqrt3 = 1.7320508f;

float elem_value(const TensorSpec & t, Rng & r) {
    switch (t.init) {
        case Init::kWeight:
            return r.sym() * t.scale * kSqrt3;
        case Init::kNorm:
            return 1.0f + 0.05f * r.sym();
        case Init::kSmall:
            return t.scale * r.sym();
    }
    return 0;
}

// Q8_0: fp16 d + 32 int8 quants; value = d * q.
void gen_q8_0(const TensorSpec & t, Rng & r, uint8_t * out, size_t n_blocks) {
    constexpr size_t kBlock = 2 + 32;
    for (size_t b = 0; b < n_blocks; ++b) {
        uint8_t * blk = out + b * kBlock;
        const float d = t.scale / kStdInt8 * (1.0f + 0.2f * r.sym());
        const ggml_fp16_t h = ggml_fp32_to_fp16(d);
        std::memcpy(blk, &h, 2);
        r.fill(blk + 2, 32);
    }
}

// Q4_K: fp16 d, fp16 dmin, 12 bytes of packed 6-bit (scale, min) pairs for 8 sub-blocks of
// 32 values, 128 bytes of 4-bit quants; value = d * sc_j * q - dmin * m_j. The mins are
// chosen so that each sub-block is zero-mean (q is uniform in 0..15, mean 7.5).
void gen_q4_k(const TensorSpec & t, Rng & r, uint8_t * out, size_t n_blocks) {
    constexpr size_t kBlock = 2 + 2 + 12 + 128;
    for (size_t b = 0; b < n_blocks; ++b) {
        uint8_t * blk = out + b * kBlock;
        // Mean sub-block scale is 32: d * 32 * kStdNibble = the target std.
        const ggml_fp16_t hd = ggml_fp32_to_fp16(t.scale / (32.0f * kStdNibble));
        const ggml_fp16_t hm = ggml_fp32_to_fp16(5.0f * ggml_fp16_to_fp32(hd));
        const float d = ggml_fp16_to_fp32(hd), dmin = ggml_fp16_to_fp32(hm);
        uint8_t sc[8], mn[8];
        const uint64_t bits = r.next();
        for (int j = 0; j < 8; ++j) {
            sc[j] = uint8_t(24 + ((bits >> (5 * j)) & 15));  // 24..39
            long m = dmin > 0 ? std::lround(sc[j] * 7.5f * d / dmin) : 0;
            mn[j] = uint8_t(std::clamp(m, 0L, 63L));
        }
        uint8_t * s = blk + 4;
        for (int j = 0; j < 4; ++j) {
            s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
            s[j + 4] = uint8_t((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
            s[j + 8] = uint8_t((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
        }
        std::memcpy(blk, &hd, 2);
        std::memcpy(blk + 2, &hm, 2);
        r.fill(blk + 16, 128);
    }
}

// Fills rows [row0, row0 + n_rows) of tensor t into out (row-major, ggml layout).
void gen_rows(const TensorSpec & t, Rng & r, int64_t row0, int64_t n_rows, uint8_t * out,
              std::vector<float> & scratch) {
    const int64_t ne0 = t.ne[0];
    const size_t row_bytes = ggml_row_size(t.type, ne0);
    switch (t.type) {
        case GGML_TYPE_F32: {
            float * f = reinterpret_cast<float *>(out);
            for (int64_t i = 0; i < n_rows * ne0; ++i) f[i] = elem_value(t, r);
            break;
        }
        case GGML_TYPE_F16: {
            scratch.resize(size_t(ne0));
            for (int64_t row = 0; row < n_rows; ++row) {
                for (int64_t i = 0; i < ne0; ++i) scratch[size_t(i)] = elem_value(t, r);
                ggml_fp32_to_fp16_row(scratch.data(),
                                      reinterpret_cast<ggml_fp16_t *>(out + row * row_bytes), ne0);
            }
            break;
        }
        case GGML_TYPE_Q8_0:
            gen_q8_0(t, r, out, size_t(n_rows * ne0 / 32));
            break;
        case GGML_TYPE_Q4_K:
            gen_q4_k(t, r, out, size_t(n_rows * ne0 / 256));
            break;
        default:
            break;  // excluded by validation
    }
    const int64_t z0 = std::max(row0, t.zero_row_begin);
    const int64_t z1 = std::min(row0 + n_rows, t.zero_row_end);
    if (z0 < z1) std::memset(out + (z0 - row0) * row_bytes, 0, size_t(z1 - z0) * row_bytes);
}

// A unit of work: rows [row0, row0 + n_rows) of one tensor.
struct Chunk {
    uint32_t tensor;
    uint32_t index;  // chunk index within the tensor (part of the PRNG seed)
    int64_t row0;
    int64_t n_rows;
};

constexpr size_t kChunkBytes = size_t(4) << 20;

std::vector<Chunk> plan_chunks(const std::vector<TensorSpec> & tensors) {
    std::vector<Chunk> chunks;
    for (uint32_t ti = 0; ti < tensors.size(); ++ti) {
        const TensorSpec & t = tensors[ti];
        const int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
        const size_t row_bytes = ggml_row_size(t.type, t.ne[0]);
        const int64_t per = std::max<int64_t>(1, int64_t(kChunkBytes / row_bytes));
        uint32_t idx = 0;
        for (int64_t r0 = 0; r0 < rows; r0 += per) {
            chunks.push_back({ti, idx++, r0, std::min(per, rows - r0)});
        }
    }
    return chunks;
}

// ---------------------------------------------------------------------------------------
// File writing.

std::string errno_str(int e) {
    return std::strerror(e);
}

bool pwrite_all(int fd, const uint8_t * p, size_t n, uint64_t off, int * err) {
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, n, off_t(off));
        if (w < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            return false;
        }
        if (w == 0) {
            *err = ENOSPC;
            return false;
        }
        p += w;
        n -= size_t(w);
        off += uint64_t(w);
    }
    return true;
}

const Preset * find_preset(const std::string & n) {
    for (const auto & p : kPresets)
        if (n == p.name) return &p;
    return nullptr;
}
const ArchInfo * find_arch(const std::string & n) {
    for (const auto & a : kArchs)
        if (n == a.name) return &a;
    return nullptr;
}
const TypeInfo * find_type(const std::string & n) {
    for (const auto & t : kTypes)
        if (n == t.name) return &t;
    return nullptr;
}

struct GgufFree {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufFree>;
struct GgmlFree {
    void operator()(ggml_context * c) const { ggml_free(c); }
};
using GgmlPtr = std::unique_ptr<ggml_context, GgmlFree>;

// Builds the metadata: key/values, then (in a context re-read so that general.alignment
// governs the offsets) the tensor infos. Fills the specs' offsets and sizes.
Status build_gguf(Model & m, uint32_t alignment, GgufPtr * out) {
    GgufPtr kv(gguf_init_empty());
    set_metadata(m, alignment, kv.get());
    std::vector<uint8_t> kv_bytes(gguf_get_meta_size(kv.get()));
    gguf_get_meta_data(kv.get(), kv_bytes.data());
    gguf_init_params ip = {/*no_alloc=*/true, /*ctx=*/nullptr};
    GgufPtr g(gguf_init_from_buffer(kv_bytes.data(), kv_bytes.size(), ip));
    if (!g) return Status::Runtime("synth: gguf could not re-read its own metadata");
    if (gguf_get_alignment(g.get()) != alignment) {
        return Status::Runtime("synth: gguf ignored general.alignment=" +
                               std::to_string(alignment));
    }

    ggml_init_params gp = {/*mem_size=*/ggml_tensor_overhead() * (m.tensors.size() + 1),
                           /*mem_buffer=*/nullptr, /*no_alloc=*/true};
    GgmlPtr ctx(ggml_init(gp));
    if (!ctx) return Status::Runtime("synth: ggml_init failed");
    for (const TensorSpec & t : m.tensors) {
        ggml_tensor * x = ggml_new_tensor(ctx.get(), t.type, t.n_dims, t.ne);
        ggml_set_name(x, t.name.c_str());
        gguf_add_tensor(g.get(), x);
    }
    const uint64_t data_offset = gguf_get_meta_size(g.get());
    for (size_t i = 0; i < m.tensors.size(); ++i) {
        TensorSpec & t = m.tensors[i];
        t.file_offset = data_offset + gguf_get_tensor_offset(g.get(), int64_t(i));
        t.nbytes = gguf_get_tensor_size(g.get(), int64_t(i));
        t.padded_bytes = (t.nbytes + alignment - 1) / alignment * alignment;
    }
    *out = std::move(g);
    return Status::Ok();
}

// Re-reads the written file's metadata and checks it against the plan.
Status verify_file(const std::string & path, const std::string & shown, const Model & m,
                   uint32_t alignment, uint64_t file_bytes) {
    gguf_init_params ip = {/*no_alloc=*/true, /*ctx=*/nullptr};
    GgufPtr g(gguf_init_from_file(path.c_str(), ip));
    if (!g) return Status::Runtime(shown + ": written file does not parse as GGUF");
    const uint64_t data_offset = gguf_get_data_offset(g.get());
    if (gguf_get_alignment(g.get()) != alignment || data_offset % alignment != 0) {
        return Status::Runtime(shown + ": written file has wrong alignment");
    }
    if (gguf_get_n_tensors(g.get()) != int64_t(m.tensors.size())) {
        return Status::Runtime(shown + ": written file has the wrong tensor count");
    }
    for (size_t i = 0; i < m.tensors.size(); ++i) {
        const uint64_t off = gguf_get_tensor_offset(g.get(), int64_t(i));
        if (off % alignment != 0 || data_offset + off != m.tensors[i].file_offset) {
            return Status::Runtime(shown + ": tensor '" + m.tensors[i].name +
                                   "' is not at its planned aligned offset");
        }
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || uint64_t(st.st_size) != file_bytes) {
        return Status::Runtime(shown + ": written file has the wrong size");
    }
    return Status::Ok();
}

class Progress {
public:
    Progress(bool on, uint64_t total) : on_(on), total_(total), tty_(isatty(2) == 1) {
        t0_ = std::chrono::steady_clock::now();
    }
    void update(uint64_t done, bool final = false) {
        if (!on_) return;
        const auto now = std::chrono::steady_clock::now();
        const double secs = std::chrono::duration<double>(now - t0_).count();
        const int pct = total_ ? int(done * 100 / total_) : 100;
        if (!final) {
            if (tty_ && secs - last_ < 0.25) return;
            if (!tty_ && pct < last_pct_ + 10) return;
        }
        last_ = secs;
        last_pct_ = pct;
        constexpr int kWidth = 30;
        char bar[kWidth + 1];
        const int fill = pct * kWidth / 100;
        for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
        bar[kWidth] = 0;
        const double mb = double(done) / 1e6;
        std::fprintf(stderr, "%ssynth [%s] %3d%% %9.1f / %.1f MB  %7.1f MB/s%s", tty_ ? "\r" : "",
                     bar, pct, mb, double(total_) / 1e6, secs > 0 ? mb / secs : 0.0,
                     (final || !tty_) ? "\n" : "");
        std::fflush(stderr);
    }

private:
    bool on_;
    uint64_t total_;
    bool tty_;
    std::chrono::steady_clock::time_point t0_;
    double last_ = -1;
    int last_pct_ = -100;
};

// Deletes the temp file unless released.

}  // namespace

std::vector<std::string> synth_presets() {
    std::vector<std::string> v;
    for (const auto & p : kPresets) v.emplace_back(p.name);
    return v;
}
std::vector<std::string> synth_archs() {
    std::vector<std::string> v;
    for (const auto & a : kArchs) v.emplace_back(a.name);
    return v;
}
std::vector<std::string> synth_types() {
    std::vector<std::string> v;
    for (const auto & t : kTypes) v.emplace_back(t.name);
    return v;
}

std::string synth_temp_path(const SynthOptions & opt) {
    return opt.out_path + ".tmp." + std::to_string(::getpid());
}

Status synth_model(const SynthOptions & opt, SynthResult * result) {
    const auto t0 = std::chrono::steady_clock::now();
    Model m;
    m.preset = find_preset(opt.preset);
    if (!m.preset) return Status::Usage("synth: --preset: unknown preset '" + opt.preset + "'");
    const ArchInfo * ai = find_arch(opt.arch);
    if (!ai) return Status::Usage("synth: --arch: unknown architecture '" + opt.arch + "'");
    m.arch = ai->arch;
    m.arch_name = ai->name;
    m.type = find_type(opt.expert_type);
    if (!m.type) return Status::Usage("synth: --type: unknown type '" + opt.expert_type + "'");
    const uint32_t align = opt.alignment;
    if (align < 32 || align > (1u << 21) || (align & (align - 1)) != 0) {
        return Status::Usage("synth: --alignment: " + std::to_string(align) +
                             " is not a power of two in [32, 2097152]");
    }
    if (opt.out_path.empty() && !opt.dry_run) return Status::Usage("synth: -o: no output file given");
    if (m.type->type == GGML_TYPE_Q4_K &&
        (m.preset->n_embd % 256 != 0 || m.preset->n_ff_exp % 256 != 0)) {
        return Status::Usage("synth: --type q4_k needs rows that are multiples of 256");
    }

    if (!(opt.attn_out_gain > 0.0f && opt.attn_out_gain <= 4.0f)) {
        return Status::Usage("synth: --attn-gain: " + std::to_string(opt.attn_out_gain) +
                             " is not in (0, 4]");
    }

    if (opt.nextn_layers > 0 && m.arch != Arch::kGlm4Moe)
        return Status::Usage("synth: --nextn-layers: only --arch glm4moe has NextN layers");
    if (opt.nextn_layers > 4)
        return Status::Usage("synth: --nextn-layers: " + std::to_string(opt.nextn_layers) +
                             " is not in [0, 4]");
    m.attn_out_gain = opt.attn_out_gain;
    m.nextn_layers = opt.nextn_layers;
    build_tensors(m);
    GgufPtr g;
    Status st = build_gguf(m, align, &g);
    if (!st.ok()) return st;
    std::vector<uint8_t> meta(gguf_get_meta_size(g.get()));
    gguf_get_meta_data(g.get(), meta.data());
    const TensorSpec & last = m.tensors.back();
    const uint64_t file_bytes = last.file_offset + last.padded_bytes;
    if (result) {
        *result = SynthResult();
        result->file_bytes = file_bytes;
        result->n_tensors = m.tensors.size();
        result->data_offset = meta.size();
        for (const TensorSpec & t : m.tensors) {
            if (t.name.find("_exps.") != std::string::npos) result->expert_bytes += t.nbytes;
        }
    }
    if (opt.dry_run) return Status::Ok();

    // Temp file next to the output, renamed at the end.
    // (AtomicFile: an -o that is a device, FIFO or directory is refused, never renamed over.)
    AtomicFile out;
    const std::string & shown = opt.out_path;
    st = out.create(opt.out_path, "synth: -o");
    if (!st.ok()) {
        if (st.code() == ErrorCode::kUsage) return st;
        return Status::BadInput("synth: cannot write '" + shown + "': " +
                               errno_str(out.create_errno()));
    }
    struct {
        const std::string & path;
        int fd;
    } tmp{out.temp_path(), out.fd()};

    // Reserve the whole file up front: a full disk fails here, at once, and the extents
    // are allocated in one go. Filesystems without fallocate just skip this.
    if (::fallocate(tmp.fd, 0, 0, off_t(file_bytes)) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS) {
        const int e = errno;
        return Status::BadInput("synth: cannot write '" + shown + "' (" +
                               std::to_string(file_bytes) + " bytes): " + errno_str(e));
    }
    int err = 0;
    if (!pwrite_all(tmp.fd, meta.data(), meta.size(), 0, &err)) {
        return Status::BadInput("synth: cannot write '" + shown + "': " + errno_str(err));
    }

    const std::vector<Chunk> chunks = plan_chunks(m.tensors);
    const unsigned n_threads =
        opt.threads ? opt.threads : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    const uint64_t seed_mix = [&] {
        uint64_t s = opt.seed ^ 0x6d6f6573747265ULL;  // "moestre"
        return splitmix64(s);
    }();
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> done{meta.size()};
    std::atomic<bool> failed{false};
    std::mutex err_mu;
    std::string err_msg;
    Progress progress(opt.progress || file_bytes > (uint64_t(1) << 30), file_bytes);

    auto worker = [&] {
        std::vector<uint8_t> buf;
        std::vector<float> scratch;
        for (;;) {
            const size_t ci = next.fetch_add(1);
            if (ci >= chunks.size() || failed.load()) return;
            const Chunk & c = chunks[ci];
            const TensorSpec & t = m.tensors[c.tensor];
            const size_t row_bytes = ggml_row_size(t.type, t.ne[0]);
            const uint64_t off = uint64_t(c.row0) * row_bytes;
            size_t n = size_t(c.n_rows) * row_bytes;
            const bool last_chunk = off + n == t.nbytes;
            const size_t pad = last_chunk ? size_t(t.padded_bytes - t.nbytes) : 0;
            buf.resize(n + pad);
            uint64_t s = seed_mix ^ fnv1a(t.name);
            s = splitmix64(s) ^ (uint64_t(c.index) * 0xd1342543de82ef95ULL);
            Rng rng(s);
            gen_rows(t, rng, c.row0, c.n_rows, buf.data(), scratch);
            if (pad) std::memset(buf.data() + n, 0, pad);
            n += pad;
            int e = 0;
            if (!pwrite_all(tmp.fd, buf.data(), n, t.file_offset + off, &e)) {
                std::lock_guard<std::mutex> lk(err_mu);
                if (!failed.exchange(true)) {
                    err_msg = "synth: cannot write '" + shown + "': " + errno_str(e);
                }
                return;
            }
            done.fetch_add(n);
        }
    };
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < n_threads; ++i) threads.emplace_back(worker);
    while (next.load() < chunks.size() && !failed.load()) {
        progress.update(done.load());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (auto & th : threads) th.join();
    if (failed.load()) return Status::BadInput(err_msg);  // only a write fails there

    if (::fdatasync(tmp.fd) != 0 || ::close(tmp.fd) != 0) {
        const int e = errno;
        out.fd_closed();
        return Status::BadInput("synth: cannot write '" + shown + "': " + errno_str(e));
    }
    out.fd_closed();
    progress.update(done.load(), /*final=*/true);

    st = verify_file(tmp.path, shown, m, align, file_bytes);
    if (!st.ok()) return st;
    st = out.commit();  // rename over -o (re-checked: never over a special file)
    if (!st.ok()) return st;
    if (result) {
        result->seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return Status::Ok();
}

}  // namespace moestream
