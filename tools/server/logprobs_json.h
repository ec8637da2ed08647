// logprobs_json.h — the OpenAI shapes of GenerateResult::logprobs for `moestream serve`
// (docs/server.md): chat's choices[].logprobs and completions' choices[].logprobs, and
// llama-server's completion_probabilities.
// Token texts are made valid UTF-8 (a token that is part of a character shows U+FFFD; its
// bytes are exact in chat's "bytes").
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "moestream/moestream.h"

namespace moestream::server {

// {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
// "bytes"}]}], "refusal": null}
nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob> & lp);

// {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}: top_logprobs
// holds the alternatives and the chosen token (up to N + 1 entries, as OpenAI's).
// *offset: byte offset of the first token in the choice's text; advanced past these tokens
// (a stream keeps it across chunks).
nlohmann::json completion_logprobs_json(const std::vector<TokenLogprob> & lp, size_t * offset);

// llama-server's /completion completion_probabilities: [{"id", "token", "bytes", "logprob",
// "top_logprobs": [{"id", "token", "bytes", "logprob"}]}], one per generated token.
nlohmann::json llama_probs_json(const std::vector<TokenLogprob> & lp);

}  // namespace moestream::server
