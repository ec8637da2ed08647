// sampler.h — the one place the engine builds llama.cpp sampler chains: validation of
// SamplingParams in the API's words, the chain (logit bias, grammar, penalties, then greedy or
// top-k / top-p / min-p / temperature / draw), and a sample step that cannot abort the process.
//
// Invariants: a Sampler exists only for parameters that passed check_sampling and a grammar
// llama.cpp parsed; with a grammar, the output is valid UTF-8; sample() never hands back a token every sampler had excluded (it returns
// an error instead, without accepting anything, so llama.cpp's grammar never sees it).
// Thread-safety: one thread at a time per Sampler (like the llama_context it samples from).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "llama-cpp.h"
#include "moestream/moestream.h"

namespace moestream {

// The limits on grammar text, checked before llama.cpp parses it: its parser and matcher
// recurse once per nesting level (a group, or an alternative made into a rule), so a deep
// grammar would overflow the stack of the thread that parses it.
constexpr size_t kMaxGrammarBytes = size_t(1) << 20;  // the text, in bytes
constexpr int kMaxGrammarDepth = 256;                 // nested ( ) groups (like JSON's 256)
// kUsage "grammar: ..." naming the line and column where `gbnf` passes a limit above; Ok
// otherwise (whether llama.cpp can parse it is checked when the sampler is built).
Status check_grammar_limits(const std::string & gbnf);

// Checks every field of `sp` (kUsage naming the field and the allowed range). n_vocab bounds
// the logit_bias token ids.
Status check_sampling(const SamplingParams & sp, int n_vocab);

// True when sp draws greedily (temp below SamplingParams::kGreedyBelow).
bool is_greedy(const SamplingParams & sp);

class Sampler {
public:
    // Checks `sp` and builds its chain for `vocab`; n_ctx bounds the penalties' window
    // (repeat_last_n -1 = n_ctx). A grammar llama.cpp cannot parse: kUsage.
    static Status create(const SamplingParams & sp, const llama_vocab * vocab, int n_ctx,
                         std::unique_ptr<Sampler> * out);

    // Forgets every accepted token (a new generation); the grammar starts over.
    void reset();
    // Shows prompt tokens to the penalties (not to the grammar, which constrains the output
    // only): the repeat window covers the prompt, as the penalties' contract says.
    void accept_prompt(const llama_token * tokens, size_t n);
    // Samples the next token from the logits of output `idx` of ctx's last decode and accepts
    // it. kBadInput when no token is left (a grammar and logit_bias excluded them all);
    // kRuntime when llama.cpp refuses (its message).
    Status sample(llama_context * ctx, int32_t idx, llama_token * out);
    // The same from given logits (n_vocab of them: the prompt cache's stored last logits).
    Status sample(const float * logits, llama_token * out);

private:
    Sampler() = default;
    llama_sampler_ptr chain_;
    llama_sampler * penalties_ = nullptr;  // in chain_ (owned by it), or null
    int n_vocab_ = 0;
    std::vector<llama_token_data> cur_;  // candidates, reused between steps
    // With a grammar: every token's text, and the unfinished UTF-8 sequence the output ends
    // with. llama.cpp's grammar decodes UTF-8 leniently (overlong forms, lead bytes above F4),
    // so tokens that would make the output invalid UTF-8 are excluded before the draw.
    std::vector<std::string> pieces_;
    std::string utf8_tail_;
};

}  // namespace moestream
