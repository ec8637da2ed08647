// sampler.cpp — see sampler.h. The chain follows llama.cpp's own sampler order (bias and
// penalties before the truncations, temperature just before the draw).
#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iterator>
#include <string>

#include "moestream/utf8.h"

namespace moestream {
namespace {

Status out_of_range(const char * field, const std::string & range, double got) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", got);
    return Status::Usage(std::string(field) + " must be " + range + ", got " + buf);
}

}  // namespace

Status check_grammar_limits(const std::string & g) {
    if (g.size() > kMaxGrammarBytes)
        return Status::Usage("grammar: " + std::to_string(g.size()) + " bytes, more than the " +
                             std::to_string(kMaxGrammarBytes) + " accepted");
    // GBNF's lexis, only as far as nesting goes: "literal" and [class] with backslash
    // escapes, <token> references, comments from # to the end of the line.
    int depth = 0;
    size_t line = 1, col0 = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        const char c = g[i];
        auto skip_to = [&](char close) {  // i at the opening character; leaves i at `close`
            for (++i; i < g.size() && g[i] != close; ++i) {
                if (g[i] == '\\') ++i;
                if (i < g.size() && g[i] == '\n') {
                    ++line;
                    col0 = i + 1;
                }
            }
        };
        if (c == '\n') {
            ++line;
            col0 = i + 1;
        } else if (c == '#') {
            while (i + 1 < g.size() && g[i + 1] != '\n') ++i;
        } else if (c == '"') {
            skip_to('"');
        } else if (c == '[') {
            skip_to(']');
        } else if (c == '(') {
            if (++depth > kMaxGrammarDepth)
                return Status::Usage("grammar: groups nest more than " +
                                     std::to_string(kMaxGrammarDepth) + " deep at line " +
                                     std::to_string(line) + ", column " +
                                     std::to_string(i - col0 + 1) + "; use named rules instead");
        } else if (c == ')') {
            if (depth > 0) --depth;
        }
    }
    return Status::Ok();
}

bool is_greedy(const SamplingParams & sp) {
    return sp.temp < SamplingParams::kGreedyBelow;
}

Status check_sampling(const SamplingParams & sp, int n_vocab) {
    if (!sp.grammar.empty()) {
        Status st = check_grammar_limits(sp.grammar);
        if (!st.ok()) return st;
    }
    if (!std::isfinite(sp.temp) || sp.temp < 0.0f)
        return out_of_range("temperature", "finite and >= 0", sp.temp);
    if (sp.top_k < 0) return out_of_range("top_k", ">= 0 (0 = off)", sp.top_k);
    if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f))
        return out_of_range("top_p", "in (0, 1] (1 = off)", sp.top_p);
    if (!(sp.min_p >= 0.0f && sp.min_p <= 1.0f))
        return out_of_range("min_p", "in [0, 1] (0 = off)", sp.min_p);
    if (!std::isfinite(sp.repeat_penalty) || !(sp.repeat_penalty > 0.0f))
        return out_of_range("repeat_penalty", "finite and > 0 (1 = off)", sp.repeat_penalty);
    if (sp.repeat_last_n < -1)
        return out_of_range("repeat_last_n", ">= -1 (0 = off, -1 = the context)",
                            sp.repeat_last_n);
    if (!(sp.presence_penalty >= -2.0f && sp.presence_penalty <= 2.0f))
        return out_of_range("presence_penalty", "in [-2, 2] (0 = off)", sp.presence_penalty);
    if (!(sp.frequency_penalty >= -2.0f && sp.frequency_penalty <= 2.0f))
        return out_of_range("frequency_penalty", "in [-2, 2] (0 = off)", sp.frequency_penalty);
    for (const auto & [id, bias] : sp.logit_bias) {
        if (id < 0 || id >= n_vocab)
            return Status::Usage("logit_bias: token id " + std::to_string(id) +
                                 " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) +
                                 ")");
        if (std::isnan(bias) || bias == INFINITY)
            return Status::Usage("logit_bias: the bias of token " + std::to_string(id) +
                                 " must be finite or -infinity (never produce it)");
    }
    if (sp.ignore_eos && !sp.grammar.empty())
        return Status::Usage(
            "ignore_eos cannot be combined with grammar: a grammar ends with the "
            "end-of-generation token");
    return Status::Ok();
}

Status Sampler::create(const SamplingParams & sp, const llama_vocab * vocab, int n_ctx,
                       std::unique_ptr<Sampler> * out) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    Status st = check_sampling(sp, n_vocab);
    if (!st.ok()) return st;
    std::unique_ptr<Sampler> s(new Sampler());
    s->n_vocab_ = n_vocab;
    s->chain_.reset(llama_sampler_chain_init(llama_sampler_chain_default_params()));
    if (!s->chain_) return Status::Runtime("llama.cpp could not create a sampler chain");
    llama_sampler * chain = s->chain_.get();
    // Each init's result is added at once: the chain owns (and frees) what it holds.
    auto add = [&](llama_sampler * smp, const char * what) {
        if (!smp) return Status::Runtime(std::string("llama.cpp could not create the ") + what +
                                         " sampler");
        llama_sampler_chain_add(chain, smp);
        return Status::Ok();
    };

    std::vector<llama_logit_bias> bias;
    for (const auto & [id, b] : sp.logit_bias) bias.push_back({id, b});
    if (sp.ignore_eos)
        for (llama_token t = 0; t < n_vocab; ++t)
            if (llama_vocab_is_eog(vocab, t)) bias.push_back({t, -INFINITY});
    if (!bias.empty()) {
        st = add(llama_sampler_init_logit_bias(n_vocab, int32_t(bias.size()), bias.data()),
                 "logit_bias");
        if (!st.ok()) return st;
    }
    if (!sp.grammar.empty()) {
        llama_sampler * g = nullptr;
        try {
            g = llama_sampler_init_grammar(vocab, sp.grammar.c_str(), "root");
        } catch (const std::exception & e) {
            return Status::Usage(std::string("grammar: llama.cpp cannot use it: ") + e.what());
        }
        // llama.cpp returns null for text it cannot parse (the reason goes to its log).
        if (!g)
            return Status::Usage(
                "grammar: llama.cpp cannot parse it as GBNF with a `root` rule (its parser's "
                "message is in the log)");
        llama_sampler_chain_add(chain, g);
        s->pieces_.resize(size_t(n_vocab));
        for (llama_token t = 0; t < n_vocab; ++t) {
            char buf[256];
            const int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, false);
            // Longer than 256 bytes: the engine emits nothing for it either.
            if (n > 0) s->pieces_[size_t(t)].assign(buf, size_t(n));
        }
    }
    const bool penalties = sp.repeat_last_n != 0 &&
                           (sp.repeat_penalty != 1.0f || sp.presence_penalty != 0.0f ||
                            sp.frequency_penalty != 0.0f);
    if (penalties) {
        // The window is a ring buffer of last_n tokens: never wider than the context.
        const int32_t last_n = sp.repeat_last_n < 0 ? n_ctx : std::min(sp.repeat_last_n, n_ctx);
        s->penalties_ = llama_sampler_init_penalties(n_vocab, last_n, sp.repeat_penalty,
                                                     sp.frequency_penalty, sp.presence_penalty);
        st = add(s->penalties_, "penalties");
        if (!st.ok()) return st;
    }
    if (is_greedy(sp)) {
        st = add(llama_sampler_init_greedy(), "greedy");
    } else {
        if (sp.top_k > 0) st = add(llama_sampler_init_top_k(sp.top_k), "top_k");
        if (st.ok() && sp.top_p < 1.0f) st = add(llama_sampler_init_top_p(sp.top_p, 1), "top_p");
        if (st.ok() && sp.min_p > 0.0f) st = add(llama_sampler_init_min_p(sp.min_p, 1), "min_p");
        if (st.ok()) st = add(llama_sampler_init_temp(sp.temp), "temperature");
        if (st.ok()) st = add(llama_sampler_init_dist(sp.seed), "dist");
    }
    if (!st.ok()) return st;
    *out = std::move(s);
    return Status::Ok();
}

void Sampler::reset() {
    llama_sampler_reset(chain_.get());
    utf8_tail_.clear();
}

void Sampler::accept_prompt(const llama_token * tokens, size_t n) {
    if (!penalties_) return;
    for (size_t i = 0; i < n; ++i) llama_sampler_accept(penalties_, tokens[i]);
}

Status Sampler::sample(llama_context * ctx, int32_t idx, llama_token * out) {
    // llama_sampler_sample's steps, with a check between apply and accept: a token that the
    // samplers excluded (logit -inf) must not reach the grammar's accept, which aborts.
    const float * logits = llama_get_logits_ith(ctx, idx);
    if (!logits) return Status::Runtime("llama.cpp returned no logits to sample from");
    return sample(logits, out);
}

Status Sampler::sample(const float * logits, llama_token * out) {
    cur_.resize(size_t(n_vocab_));
    for (int t = 0; t < n_vocab_; ++t) cur_[size_t(t)] = llama_token_data{t, logits[t], 0.0f};
    if (!pieces_.empty())  // a grammar: only tokens that keep the output valid UTF-8
        for (int t = 0; t < n_vocab_; ++t) {
            const std::string & piece = pieces_[size_t(t)];
            if (!piece.empty() && utf8_valid_upto(utf8_tail_ + piece) < 0)
                cur_[size_t(t)].logit = -INFINITY;
        }
    llama_token_data_array arr{cur_.data(), cur_.size(), -1, false};
    try {
        llama_sampler_apply(chain_.get(), &arr);
        // -inf: excluded by logit_bias or the grammar (a NaN from the model itself is drawn
        // as before: the corrupt-expert gates rely on seeing its effect in the output).
        if (arr.selected < 0 || size_t(arr.selected) >= arr.size ||
            arr.data[arr.selected].logit == -INFINITY)
            return Status::BadInput(
                "sampling: no token is allowed here (the grammar and logit_bias exclude every "
                "token)");
        *out = arr.data[arr.selected].id;
        llama_sampler_accept(chain_.get(), *out);
        if (!pieces_.empty()) {
            utf8_tail_ += pieces_[size_t(*out)];
            utf8_tail_.erase(0, size_t(utf8_valid_upto(utf8_tail_)));
        }
    } catch (const std::exception & e) {
        return Status::Runtime(std::string("sampling: llama.cpp refused: ") + e.what());
    }
    return Status::Ok();
}

}  // namespace moestream

namespace moestream {

const char * finish_reason_name(FinishReason r) {
    static constexpr const char * kNames[] = {"length", "eos", "stop", "cancelled"};  // by value
    const auto i = size_t(r);
    return i < std::size(kNames) ? kNames[i] : "length";
}

}  // namespace moestream
