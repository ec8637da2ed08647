// logprobs.h — the log probabilities of a generated token (GenerateRequest::logprobs): log
// softmax of the raw logits the token was sampled from, and the most likely alternatives.
// Thread-safety: pure functions.
#pragma once

#include "llama.h"
#include "moestream/moestream.h"

namespace moestream {

// kUsage unless n is -1 (off) or in [0, n_vocab].
Status check_logprobs(int n, int n_vocab);

// `tok` and the top_n most likely tokens of `logits` (n_vocab of them, all finite), most
// likely first, ties by lower id; pieces rendered with special tokens by name.
TokenLogprob token_logprobs(const llama_vocab * vocab, const float * logits, int n_vocab,
                           llama_token tok, int top_n);

}  // namespace moestream
