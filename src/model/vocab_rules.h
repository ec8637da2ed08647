// vocab_rules.h — the vocabulary rules llama.cpp asserts on or fails at run time:
// tokenizer.ggml.tokens valid UTF-8, no two tokens with the same text (llama.cpp asserts every
// id got its own entry), at most kMaxVocab tokens; tokenizer.ggml.token_type an int32 array
// of one of llama.cpp's token types (0..6) per token; tokenizer.ggml.model a string, and a
// SentencePiece ('llama') vocabulary with a token for every byte.
//
// The tokens are read once, while the metadata is read (read_tokens), and kept as (hash,
// offset) pairs only: a hash collision is settled by re-reading both texts from the file, so
// the memory held is 16 bytes per token. Failures are ParseError at the offending token or key.
// Thread-safety: one thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf_reader.h"
#include "index_context.h"

namespace moestream::gguf {

class VocabRules {
public:
    // tokenizer.ggml.tokens, its array header read at `at` (n strings follow at r.pos()).
    void read_tokens(GgufReader & r, uint64_t n, uint64_t at);
    // tokenizer.ggml.token_type, its array header (element type, count) read at lat - 4.
    static void read_token_types(GgufReader & r, uint32_t arr_type, uint64_t arr_len,
                                 uint64_t lat);
    // The checks over the whole vocabulary (after the metadata); r is the file read_tokens read.
    void check(IndexContext & c, const GgufReader & r) const;

private:
    // Token i's text as llama.cpp keys it (re-read from the file).
    std::string token_text(const GgufReader & r, size_t i) const;

    struct VocabEntry {
        uint64_t hash;    // FNV-1a of the text llama.cpp keys the token by
        uint64_t offset;  // offset of the token's length field
    };
    std::vector<VocabEntry> vocab_;          // tokenizer.ggml.tokens
    std::array<bool, 256> byte_hex_{};       // bytes with a "<0xXX>" token
    std::array<bool, 256> byte_single_{};    // bytes with a one-byte token
};

}  // namespace moestream::gguf
