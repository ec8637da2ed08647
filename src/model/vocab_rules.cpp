// vocab_rules.cpp — the vocabulary rules (see vocab_rules.h).
#include "vocab_rules.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace moestream::gguf {

namespace {

// Well-formed UTF-8 in the structural sense llama.cpp's decoder checks (lead byte,
// continuation bytes, no truncated sequence); returns the offset of the first bad byte or
// n if none.
uint64_t utf8_bad_at(const uint8_t * s, uint64_t n, uint32_t * pending) {
    for (uint64_t i = 0; i < n; ++i) {
        const uint8_t c = s[i];
        if (*pending) {
            if ((c & 0xC0) != 0x80) return i;
            --*pending;
        } else if (c < 0x80) {
        } else if ((c & 0xE0) == 0xC0) {
            *pending = 1;
        } else if ((c & 0xF0) == 0xE0) {
            *pending = 2;
        } else if ((c & 0xF8) == 0xF0) {
            *pending = 3;
        } else {
            return i;
        }
    }
    return n;
}

uint64_t fnv(uint64_t h, const uint8_t * p, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace

void VocabRules::read_token_types(GgufReader & r, uint32_t arr_type, uint64_t arr_len,
                                  uint64_t lat) {
    // llama.cpp reads it as int32 per token and keeps a type outside its
    // LLAMA_TOKEN_TYPE_* (0..6) as is: such tokens then print nothing.
    if (arr_type != kI32)
        fail(lat - 4, "tokenizer.ggml.token_type must be an array of int32, is "
                      "of " + std::string(gguf_type_str(arr_type)));
    r.need(arr_len * gguf_scalar_size(arr_type));
    for (uint64_t k = 0; k < arr_len; ++k) {
        const uint64_t eat = r.pos();
        const int64_t t = r.read_int(arr_type);
        if (t < 0 || t > 6)
            fail(eat, "tokenizer.ggml.token_type[" + std::to_string(k) + "] = " +
                          std::to_string(t) +
                          " is not one of llama.cpp's token types (0..6)");
    }
}

// Each token must be UTF-8; keeps a hash and the offset of each for the duplicate check, and
// which bytes have a token.
void VocabRules::read_tokens(GgufReader & r, uint64_t n, uint64_t at) {
    uint64_t min_bytes;  // each token is at least its 8-byte length
    if (__builtin_mul_overflow(n, 8ull, &min_bytes)) min_bytes = UINT64_MAX;
    r.need(min_bytes);
    if (n > kMaxVocab) {
        fail(at, "tokenizer.ggml.tokens has " + std::to_string(n) +
                     " tokens, more than the maximum " + std::to_string(kMaxVocab));
    }
    vocab_.reserve(n);
    uint8_t buf[4096];
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t sat = r.pos();
        const uint64_t len = r.string_len(kMaxStringLen, "token string");
        uint64_t h = 0xcbf29ce484222325ull, left = len;
        uint32_t pending = 0;
        uint8_t first[12] = {0};
        while (left > 0) {
            const uint64_t take = std::min<uint64_t>(left, sizeof buf);
            const uint64_t base = r.pos();
            r.read(buf, take);
            if (base - sat - 8 < sizeof first)
                std::memcpy(first + (base - sat - 8), buf,
                            std::min<uint64_t>(take, sizeof first - (base - sat - 8)));
            const uint64_t bad = utf8_bad_at(buf, take, &pending);
            if (bad < take) {
                fail(base + bad, "tokenizer.ggml.tokens[" + std::to_string(i) +
                                     "] is not valid UTF-8 (byte " +
                                     std::to_string(base + bad - sat - 8) + ")");
            }
            h = fnv(h, buf, take);
            left -= take;
        }
        if (pending) {
            fail(sat + 8 + len, "tokenizer.ggml.tokens[" + std::to_string(i) +
                                    "] is not valid UTF-8 (truncated sequence at its end)");
        }
        if (len == 0) {
            // llama.cpp stores an empty token as "[EMPTY_<id>]".
            const std::string e = "[EMPTY_" + std::to_string(i) + "]";
            h = fnv(0xcbf29ce484222325ull, reinterpret_cast<const uint8_t *>(e.data()),
                    e.size());
        }
        if (len == 1) byte_single_[first[0]] = true;
        if (len == 6 && first[0] == '<' && first[1] == '0' && first[2] == 'x' &&
            first[5] == '>') {
            auto hex = [](uint8_t c) {
                return (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            };
            const int hi = hex(first[3]), lo = hex(first[4]);
            if (hi >= 0 && lo >= 0) byte_hex_[hi * 16 + lo] = true;
        }
        vocab_.push_back({h, sat});
    }
}

// Token i's text as llama.cpp keys it (re-read from the file).
std::string VocabRules::token_text(const GgufReader & r, size_t i) const {
    const uint64_t sat = vocab_[i].offset;
    uint64_t len;
    r.read_at(sat, &len, 8);
    if (len == 0) return "[EMPTY_" + std::to_string(i) + "]";
    std::string s(len, '\0');
    r.read_at(sat + 8, s.data(), len);
    return s;
}

void VocabRules::check(IndexContext & c, const GgufReader & r) const {
    const KvValue * model = c.find_kv("tokenizer.ggml.model");
    if (model && model->type != kString) {
        c.fail(c.kv_offset("tokenizer.ggml.model"), "tokenizer.ggml.model must be a string, is " +
                                                    std::string(gguf_type_str(model->type)));
    }
    // Duplicates: llama.cpp maps text -> id and asserts that every id got its own entry.
    std::vector<std::pair<uint64_t, uint32_t>> order(vocab_.size());
    for (size_t i = 0; i < vocab_.size(); ++i) order[i] = {vocab_[i].hash, uint32_t(i)};
    std::sort(order.begin(), order.end());
    for (size_t k = 1; k < order.size(); ++k) {
        if (order[k].first != order[k - 1].first) continue;
        // Equal hashes: compare the texts (and every earlier one with the same hash).
        for (size_t j = k; j-- > 0 && order[j].first == order[k].first;) {
            const std::string a = token_text(r, order[j].second);
            if (a == token_text(r, order[k].second)) {
                const uint32_t lo = std::min(order[j].second, order[k].second);
                const uint32_t hi = std::max(order[j].second, order[k].second);
                c.fail(vocab_[hi].offset, "tokenizer.ggml.tokens[" + std::to_string(hi) +
                                            "] duplicates token " + std::to_string(lo) +
                                            " " + quoted(a));
            }
        }
    }
    if (const KvValue * types = c.find_kv("tokenizer.ggml.token_type")) {
        if (types->type != kArray)
            c.fail(c.kv_offset("tokenizer.ggml.token_type"),
                 "tokenizer.ggml.token_type must be an array of int32, is " +
                     std::string(gguf_type_str(types->type)));
        if (types->arr_len != vocab_.size())
            c.fail(c.kv_offset("tokenizer.ggml.token_type"),
                 "tokenizer.ggml.token_type has " + std::to_string(types->arr_len) +
                     " entries, tokenizer.ggml.tokens " + std::to_string(vocab_.size()));
    }
    if (!model || vocab_.empty()) return;
    if (model->s == "llama") {
        // SentencePiece: a byte with no piece falls back to "<0xXX>" (or the byte itself);
        // llama.cpp's lookup of a missing byte token throws out of llama_tokenize.
        for (int b = 0; b < 256; ++b) {
            if (byte_hex_[b] || byte_single_[b]) continue;
            char want[8];
            std::snprintf(want, sizeof want, "<0x%02X>", b);
            c.fail(c.kv_offset("tokenizer.ggml.model"),
                 "tokenizer.ggml.model is 'llama' (SentencePiece) but the vocabulary has no "
                 "byte token " + std::string(want) + " (a vocabulary of another tokenizer?)");
        }
    }
}

}  // namespace moestream::gguf
