// eval.h — the quality measures behind `moestream eval` (docs/eval.md): how far a configured
// run's next-token distributions are from a lossless reference run over the same text.
//
// Per position (one single-token decode; the logits predict the text's next token):
//   nll  = -log p(next)                      for the run and for the reference
//   kl   = sum_v p_ref(v) (log p_ref(v) - log p_run(v))   KL(ref || run), nats
//   top1 = argmax p_run == argmax p_ref
// computed from raw logits with a numerically stable log-softmax in double precision.
// Summary: perplexity exp(mean nll) of each, mean KL, top-1 agreement, each with a bootstrap
// 95% interval over positions (i.i.d. resampling of positions, seeded: deterministic).
//
// Reference logits file (`--save-ref` / `--ref`), little-endian:
//   magic "MSEVREF1" (8) | u32 version 1 | u32 n_vocab | u32 n_pos | u32 window (0 = none)
//   | u64 FNV-1a-64 of the scored token ids | u64 model file size
//   | n_pos x { i32 next token, f32 logits[n_vocab] }
// The reader checks every field against the current run (vocabulary, tokens of the text,
// scoring window, model size) and reports the first mismatch with its byte offset; the library
// never aborts on a bad file.
//
// Thread-safety: plain values and functions; a RefLogitsFile is used by one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "moestream/atomic_file.h"
#include "moestream/status.h"

namespace moestream {

struct PositionMetrics {
    double nll_run = 0;  // -log p_run(next)
    double nll_ref = 0;  // -log p_ref(next)
    double kl = 0;       // KL(ref || run), nats, >= 0
    bool top1 = false;   // argmax agree
};

// Compares one position's logits (n_vocab floats each). Non-finite logits in `run` make the
// position count as a total miss (nll and kl +inf), never a crash.
PositionMetrics compare_logits(const float * ref, const float * run, int n_vocab, int32_t next);

struct Interval {
    double value = 0, lo = 0, hi = 0;
};

struct EvalSummary {
    uint64_t positions = 0;
    Interval ppl_run, ppl_ref, mean_kl, top1_pct;
};

// Bootstrap over positions (B resamples, fixed seed). Empty input -> kBadInput.
Status summarize_eval(const std::vector<PositionMetrics> & pos, int B, EvalSummary * out);

// FNV-1a-64 of token ids (identifies the scored text in a reference file).
uint64_t hash_tokens(const std::vector<int32_t> & toks);

class RefLogitsFile {
public:
    ~RefLogitsFile();
    // Writing: header now, then append() per position, then finish() (renames tmp -> path;
    // atomic_file.h: a path that is a device, FIFO or directory is refused, kUsage).
    Status create(const std::string & path, int n_vocab, uint32_t n_pos, uint32_t window,
                  uint64_t tokens_hash, uint64_t model_bytes);
    Status append(int32_t next, const float * logits);
    Status finish();
    // Reading: validates the header against what this run expects.
    Status open(const std::string & path, int n_vocab, uint32_t n_pos, uint32_t window,
                uint64_t tokens_hash, uint64_t model_bytes);
    // Next record; `next` must match the text's token at this position.
    Status read(int32_t next, std::vector<float> * logits);

private:
    Status err(const std::string & what) const;
    std::FILE * f_ = nullptr;
    std::string path_;
    AtomicFile file_;  // writing: the temporary file renamed over path_ by finish()
    int n_vocab_ = 0;
    uint32_t n_pos_ = 0, done_ = 0;
    bool writing_ = false;
};

}  // namespace moestream
