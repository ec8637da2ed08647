// llama_completion.cpp — see llama_completion.h.
#include "llama_completion.h"

namespace moestream::server {

using nlohmann::json;

std::optional<ApiError> take_n_probs(std::string * body, int * n_probs) {
    *n_probs = 0;
    json j = json::parse(*body, nullptr, false);
    if (!j.is_object() || !j.contains("n_probs")) return std::nullopt;  // parse_request says why
    const json & n = j["n_probs"];
    if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > kMaxTopLogprobs)
        return bad_request("n_probs", "'n_probs' must be an integer in 0.." +
                                          std::to_string(kMaxTopLogprobs));
    if (j.contains("logprobs"))
        return bad_request("n_probs", "'n_probs' and 'logprobs' ask for the same: give one");
    *n_probs = n.get<int>();
    j.erase("n_probs");
    if (*n_probs > 0) j["logprobs"] = *n_probs;
    *body = j.dump();
    return std::nullopt;
}

json llama_generation_settings(const GenParams & p, int n_probs) {
    const SamplingParams & sp = p.sampling;
    json bias = json::array();  // llama-server's [[id, bias], ...]; false: never produced
    for (const auto & [id, b] : sp.logit_bias)
        bias.push_back(json::array({id, std::isfinite(b) ? float_json(b) : json(false)}));
    return json{{"seed", sp.seed},
                {"temperature", float_json(sp.temp)},
                {"top_k", sp.top_k},
                {"top_p", float_json(sp.top_p)},
                {"min_p", float_json(sp.min_p)},
                {"repeat_last_n", sp.repeat_last_n},
                {"repeat_penalty", float_json(sp.repeat_penalty)},
                {"presence_penalty", float_json(sp.presence_penalty)},
                {"frequency_penalty", float_json(sp.frequency_penalty)},
                {"stop", p.stop},
                {"max_tokens", p.max_tokens},
                {"n_predict", p.max_tokens},
                {"ignore_eos", sp.ignore_eos},
                {"stream", p.stream},
                {"logit_bias", bias},
                {"n_probs", n_probs},
                {"grammar", sp.grammar}};
}

json llama_timings(const RunStats & s) {
    const int prompt_n = s.n_prompt - s.n_prompt_reused;
    const double prompt_ms = s.prefill_s * 1e3, predicted_ms = s.decode_s * 1e3;
    const auto per = [](double a, double b) { return b > 0 ? json(a / b) : json(nullptr); };
    return json{{"cache_n", s.n_prompt_reused},
                {"prompt_n", prompt_n},
                {"prompt_ms", prompt_ms},
                {"prompt_per_token_ms", per(prompt_ms, prompt_n)},
                {"prompt_per_second", per(prompt_n, s.prefill_s)},
                {"predicted_n", s.n_generated},
                {"predicted_ms", predicted_ms},
                {"predicted_per_token_ms", per(predicted_ms, s.n_generated)},
                {"predicted_per_second", per(s.n_generated, s.decode_s)}};
}

}  // namespace moestream::server
