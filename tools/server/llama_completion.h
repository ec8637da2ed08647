// llama_completion.h — llama-server's native /completion shapes for `moestream serve`
// (docs/server.md): the n_probs field of a request, and the generation_settings and timings
// of a reply (completion_probabilities: logprobs_json.h), with the field names and nesting llama-server uses.
// Only what moestream has is reported: llama-server's fields for samplers moestream lacks
// (dry, xtc, mirostat, ...) are absent, never filled with made-up values.
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "api.h"
#include "moestream/moestream.h"

namespace moestream::server {

// A /completion body as the /v1/completions request it is: `n_probs` N (0..kMaxTopLogprobs)
// becomes `logprobs` N (N > 0) and is returned in *n_probs (0 when absent). A wrong
// n_probs, or n_probs beside logprobs, is a 400 naming it. *body is rewritten only when
// n_probs is present.
std::optional<ApiError> take_n_probs(std::string * body, int * n_probs);

// generation_settings: the request's settings under llama-server's names.
nlohmann::json llama_generation_settings(const GenParams & p, int n_probs);

// timings: {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
// "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"} from a
// request's stats (cache_n: prompt tokens reused from the previous request's KV).
nlohmann::json llama_timings(const RunStats & s);

}  // namespace moestream::server
