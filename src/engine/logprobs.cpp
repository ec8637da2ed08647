// logprobs.cpp — see logprobs.h. One pass for the log-sum-exp (in double, from the maximum),
// a partial sort for the top N.
#include "logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace moestream {
namespace {

std::string piece_of(const llama_vocab * vocab, llama_token t) {
    std::string buf(64, '\0');
    int n = llama_token_to_piece(vocab, t, buf.data(), int32_t(buf.size()), 0, true);
    if (n < 0) {
        buf.resize(size_t(-n));
        n = llama_token_to_piece(vocab, t, buf.data(), int32_t(buf.size()), 0, true);
    }
    buf.resize(n > 0 ? size_t(n) : 0);
    return buf;
}

}  // namespace

Status check_logprobs(int n, int n_vocab) {
    if (n < -1 || n > n_vocab)
        return Status::Usage("logprobs must be -1 (off) or a number of alternatives in [0, " +
                             std::to_string(n_vocab) + "], got " + std::to_string(n));
    return Status::Ok();
}

TokenLogprob token_logprobs(const llama_vocab * vocab, const float * logits, int n_vocab,
                            llama_token tok, int top_n) {
    const float mx = *std::max_element(logits, logits + n_vocab);
    double sum = 0;
    for (int t = 0; t < n_vocab; ++t) sum += std::exp(double(logits[t]) - double(mx));
    const double log_z = double(mx) + std::log(sum);
    auto lp = [&](llama_token t) { return float(double(logits[t]) - log_z); };

    TokenLogprob out;
    out.chosen = TokenProb{tok, lp(tok), piece_of(vocab, tok)};
    const int k = std::min(top_n, n_vocab);
    if (k <= 0) return out;
    std::vector<llama_token> ids(static_cast<size_t>(n_vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](llama_token a, llama_token b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < k; ++i) {
        const llama_token t = ids[size_t(i)];
        out.top.push_back(TokenProb{t, lp(t), piece_of(vocab, t)});
    }
    return out;
}

}  // namespace moestream
