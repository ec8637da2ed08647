// hparam_rules.cpp — llama.cpp's hyperparameter rules (see hparam_rules.h).
#include "hparam_rules.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

namespace moestream::gguf {

namespace {

// A float key, if present: must be f32/f64 and finite (and > 0 / >= 0 when asked).
enum class Sign { kAny, kPositive, kNonNegative };
void float_key(const IndexContext & c, const std::string & key, Sign sign) {
    const KvValue * v = c.find_kv(key);
    if (!v) return;
    const uint64_t at = c.kv_offset(key);
    if (v->type != kF32 && v->type != kF64) {
        c.fail(at, "metadata key " + quoted(key) + " must be a float, is " +
                     gguf_type_str(v->type));
    }
    const bool bad = !std::isfinite(v->f) || (sign == Sign::kPositive && !(v->f > 0)) ||
                     (sign == Sign::kNonNegative && !(v->f >= 0));
    if (bad) {
        const char * need = sign == Sign::kPositive      ? "finite and > 0"
                            : sign == Sign::kNonNegative ? "finite and >= 0"
                                                         : "finite";
        c.fail(at, "metadata key " + quoted(key) + " = " + std::to_string(v->f) + " must be " +
                     need);
    }
}

// The first value of an integer key that may be a scalar or a per-layer array (0: absent).
int64_t first_int(IndexContext & c, const std::string & key) {
    const KvValue * v = c.find_kv(key);
    if (!v) return 0;
    if (v->type == kArray) {
        if (v->arr_i.empty()) return 0;
        return v->arr_i[0];
    }
    return c.int_key(key, false, 0, INT32_MAX);
}

}  // namespace

void HparamRules::read_params(IndexContext & c) {
    const KvValue * a = c.find_kv("general.architecture");
    if (!a) c.fail(c.kv_end, "missing metadata key 'general.architecture'");
    if (a->type != kString || a->s.empty()) {
        c.fail(c.kv_offset("general.architecture"),
             "general.architecture must be a non-empty string");
    }
    c.m.arch = a->s;
    if (const KvValue * n = c.find_kv("general.name"); n && n->type == kString) c.m.name = n->s;
    const std::string & p = c.m.arch;
    c.m.n_expert =
        c.int_key(p + ".expert_count", true, 0, 1 << 20, " (not a MoE model: no expert count)");
    if (c.m.n_expert < 2) {
        c.fail(c.kv_offset(p + ".expert_count"), "not a MoE model: " + p + ".expert_count is " +
                                                 std::to_string(c.m.n_expert) + " (need >= 2)");
    }
    c.m.n_expert_used = c.int_key(p + ".expert_used_count", true, 0, INT32_MAX,
                               " (not a MoE model: no expert_used_count)");
    c.m.n_layer = c.int_key(p + ".block_count", true, 1, kMaxLayers);
    c.m.n_embd = c.int_key(p + ".embedding_length", true, 1, INT32_MAX);
    // The trained context: the default -c and the bound of every context; 0 or none would
    // leave no context at all (a fault of the file, not of the flags).
    if (c.find_kv(p + ".context_length")) c.int_key(p + ".context_length", false, 1, INT32_MAX);
    // Expert FFN width: a scalar, or one value per layer; 0 means "not given".
    const std::string ffk = p + ".expert_feed_forward_length";
    const KvValue * ff = c.find_kv(ffk);
    if (ff && ff->type == kArray) {
        if (ff->arr_i.size() != ff->arr_len || ff->arr_len < c.m.n_layer) {
            c.fail(c.kv_offset(ffk), "metadata key " + quoted(ffk) +
                                     " must be an integer or an array of >= n_layer integers");
        }
        for (uint64_t k = 0; k < c.m.n_layer; ++k) {
            if (ff->arr_i[k] < 0 || ff->arr_i[k] > INT32_MAX) {
                c.fail(c.kv_offset(ffk), "metadata key " + quoted(ffk) + "[" + std::to_string(k) +
                                         "] = " + std::to_string(ff->arr_i[k]) +
                                         " is out of range");
            }
            n_ff_layer.push_back(uint32_t(ff->arr_i[k]));
        }
    } else {
        c.m.n_ff_exp = c.int_key(ffk, false, 0, INT32_MAX);
        n_ff_layer.assign(c.m.n_layer, c.m.n_ff_exp);
    }
    // Latent-MoE archs run the experts on a narrower width than n_embd. These keys only
    // widen what the shape check accepts, so a non-integer value is simply ignored.
    for (const char * k : {".expert_latent_length", ".moe_latent_size"}) {
        const KvValue * v = c.find_kv(p + k);
        if (v && gguf_scalar_size(v->type) != 0 && v->type != kBool && v->type != kF32 &&
            v->type != kF64 && v->i > 0 && v->i <= INT32_MAX) {
            latent_widths.push_back(v->i);
        }
    }
    if (const KvValue * tok = c.find_kv("tokenizer.ggml.tokens")) {
        if (tok->type != kArray || tok->arr_type != kString) {
            c.fail(c.kv_offset("tokenizer.ggml.tokens"),
                 "tokenizer.ggml.tokens must be an array of strings");
        }
        if (tok->arr_len > INT32_MAX) {
            c.fail(c.kv_offset("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens is too long");
        }
        c.m.n_vocab = static_cast<uint32_t>(tok->arr_len);
    }
    if (c.m.n_expert_used < 1 || c.m.n_expert_used > c.m.n_expert) {
        c.fail(c.kv_offset(p + ".expert_used_count"),
             p + ".expert_used_count " + std::to_string(c.m.n_expert_used) +
                 " is out of range [1, n_expert=" + std::to_string(c.m.n_expert) + "]");
    }
}

// ---- hyperparameters llama.cpp asserts on or divides by -----------------------------------
void HparamRules::check(IndexContext & c) const {
    const std::string p = c.m.arch + ".";
    // Scales the graph multiplies by: NaN or inf turns every logit into NaN. (Not every
    // float key: some archs store -inf on purpose, e.g. kda.gate_lower_bound.)
    for (const char * k : {"expert_weights_scale", "attention.scale", "logit_scale",
                           "residual_scale", "embedding_scale", "attn_logit_softcapping",
                           "final_logit_softcapping", "rope.scaling.attn_factor",
                           "rope.scaling.yarn_log_multiplier", "rope.freq_base_swa"})
        float_key(c, p + k, Sign::kAny);
    // The RMS-norm epsilon divides by sqrt(mean(x^2) + eps): > 0, except in architectures
    // whose llama.cpp graph normalises with attention.layer_norm_epsilon instead (the
    // RMS key is then unused, and 0 in real files).
    static const char * const kLayerNormOnly[] = {"dbrx"};
    const bool rms_unused =
        std::find_if(std::begin(kLayerNormOnly), std::end(kLayerNormOnly),
                     [&](const char * a) { return c.m.arch == a; }) != std::end(kLayerNormOnly);
    float_key(c, p + "attention.layer_norm_rms_epsilon",
              rms_unused ? Sign::kNonNegative : Sign::kPositive);
    float_key(c, p + "attention.layer_norm_epsilon", Sign::kAny);  // 0 where unused
    float_key(c, p + "rope.freq_base", Sign::kPositive);
    float_key(c, p + "rope.scaling.factor", Sign::kNonNegative);
    float_key(c, p + "rope.freq_scale", Sign::kPositive);

    // Heads: llama.cpp divides n_embd by head_count and head_count by head_count_kv.
    const int64_t n_head = first_int(c, p + "attention.head_count");
    const int64_t n_head_kv = c.find_kv(p + "attention.head_count_kv")
                                  ? first_int(c, p + "attention.head_count_kv")
                                  : n_head;
    if (n_head > 0) {
        const std::string kvk = p + "attention.head_count_kv";
        if (n_head_kv < 1 || n_head % n_head_kv != 0) {
            c.fail(c.kv_offset(c.find_kv(kvk) ? kvk : p + "attention.head_count"),
                 "metadata key " + quoted(kvk) + " = " + std::to_string(n_head_kv) +
                     " must be >= 1 and divide " + p + "attention.head_count = " +
                     std::to_string(n_head));
        }
        int64_t head_k = c.find_kv(p + "attention.key_length")
                             ? c.int_key(p + "attention.key_length", false, 1, 1 << 16)
                             : int64_t(c.m.n_embd) / n_head;
        if (head_k < 1) {
            c.fail(c.kv_offset(p + "attention.head_count"),
                 "metadata key " + quoted(p + "attention.head_count") + " = " +
                     std::to_string(n_head) + " exceeds embedding_length " +
                     std::to_string(c.m.n_embd) + " (head size 0)");
        }
        const std::string rk = p + "rope.dimension_count";
        if (c.find_kv(rk)) {
            const int64_t n_rot = c.int_key(rk, false, 0, INT32_MAX);
            // These architectures rotate the whole head (llama.cpp refuses a mismatch
            // for llama/deci/falcon and its graph assumes it for the MoE ones); the
            // others may rotate a part of it (glm4moe: half) or none (0: no rotary
            // embedding, which llama.cpp accepts).
            static const char * const kFull[] = {"llama",    "deci",     "falcon",
                                                 "qwen2moe", "qwen3moe", "olmoe"};
            const bool full = std::find_if(std::begin(kFull), std::end(kFull),
                                           [&](const char * a) { return c.m.arch == a; }) !=
                              std::end(kFull);
            if (full ? n_rot != head_k : (n_rot > head_k || n_rot % 2 != 0)) {
                c.fail(c.kv_offset(rk),
                     "metadata key " + quoted(rk) + " = " + std::to_string(n_rot) +
                         (full ? " must equal the head size " + std::to_string(head_k)
                               : " must be even and in [0, head size " +
                                     std::to_string(head_k) + "]"));
            }
        }
    }
    // llama_expert_gating_func_type: 0 (the arch's default), softmax, sigmoid,
    // softmax_weight, sqrt_softplus (deepseek4); anything else llama.cpp refuses.
    if (c.find_kv(p + "expert_gating_func")) c.int_key(p + "expert_gating_func", false, 0, 4);
    const std::string nk = p + "nextn_predict_layers";
    if (c.find_kv(nk)) {
        const int64_t nn = c.int_key(nk, false, 0, INT32_MAX);
        if (nn >= int64_t(c.m.n_layer)) {
            c.fail(c.kv_offset(nk), "metadata key " + quoted(nk) + " = " + std::to_string(nn) +
                                    " must be less than block_count " +
                                    std::to_string(c.m.n_layer));
        }
    }
    for (const char * k : {"leading_dense_block_count", "expert_shared_count"}) {
        if (c.find_kv(p + k)) c.int_key(p + k, false, 0, c.m.n_layer);
    }
}

}  // namespace moestream::gguf
