// prompt_cache.h — the persisted prompt KV (--prompt-cache DIR, docs/prompt-cache.md): after a
// prefill, the llama.cpp context's state (KV cache and the last logits, llama_state_get_data)
// is written to DIR, one file per token prefix; a later generation whose prompt starts with a
// stored prefix restores it and prefills only the rest.
//
// Invariants:
//  - Exactness: a file is only written from a state a cold prefill computed (the caller's
//    duty), at a prefix whose continuation a cold run batches the same way: a multiple of the
//    prompt batch (the rest is prefilled in the same batches as a cold run), or the whole
//    prompt, whose file also holds the logits of its last token (llama.cpp's state does not
//    bring them back: the caller samples the first token from them). Restoring it and
//    continuing is then byte-identical to the cold run (tokens and logits).
//  - A file is found only under the name its key gives (a hash of the model's identity, every
//    setting that changes the KV, and the exact token prefix), and restored only when its
//    checksum (over header and payload), format, model identity, settings, lossiness and
//    tokens all match: anything else is reported in one line (warning) and ignored.
//  - Lossy KV is never restored into a lossless run.
//  - Only files inside DIR named prompt-<16 hex>.kv (and AtomicFile's temporary files next
//    to them) are ever written or removed. The directory is bounded: after a write the
//    least recently used files (mtime; a restore touches its file) are removed until the
//    total is within the budget; a state larger than the budget is not written.
// Thread-safety: one owner (the engine, one generation at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moestream/gguf_index.h"
#include "moestream/status.h"

struct llama_context;

namespace moestream {

// What computed a state: the model's files and the settings that change the KV.
struct PromptCacheKey {
    std::string model;     // every file of the model: path, size, mtime, ctime, device, inode
    std::string settings;  // n_ctx, batch sizes, top-k, lossy knobs, the CPU backend ...
    bool lossy = false;    // the settings are lossy (the file is marked so)
};

// The model part of a key from the validated index (every shard).
std::string prompt_cache_model_identity(const ModelIndex & index);

// What a restore did (RunStats prompt_cache_*).
struct PromptCacheRestore {
    int n_tokens = 0;       // prefix tokens restored (0: none)
    uint64_t bytes = 0;     // bytes read from the file
    double seconds = 0;     // reading, checking and handing the state to llama.cpp
    std::string refused;    // the one-line reason a found file was ignored ("" if none)
    std::vector<float> logits;  // the whole prompt's last logits (empty for a shorter prefix)
};

class PromptCache {
public:
    // dir: created (one level) when missing; must be a writable directory.
    // budget_bytes > 0: what DIR's cache files may take together.
    static Status open(const std::string & dir, uint64_t budget_bytes,
                       std::unique_ptr<PromptCache> * out);

    // The file that holds exactly tokens[0, n) under key (inside the directory).
    std::string file_path(const PromptCacheKey & key, const int32_t * tokens, size_t n) const;

    // The longest stored usable prefix of the prompt `tokens` (n of them): the whole prompt or
    // a multiple of n_batch below it, whose file exists. 0: none.
    size_t lookup(const PromptCacheKey & key, const std::vector<int32_t> & tokens,
                  int n_batch) const;

    // Restores tokens[0, n) into ctx (a context of the model the key names, n_vocab tokens).
    // False, with out->refused saying why, when the file is not usable (it is then removed);
    // ctx's state is then undefined (the caller clears it).
    bool restore(llama_context * ctx, const PromptCacheKey & key,
                 const std::vector<int32_t> & tokens, size_t n, int n_vocab,
                 PromptCacheRestore * out);

    // A file's name and bytes, built in memory.
    struct File {
        std::string path;
        std::vector<uint8_t> bytes;
    };
    // The context's state now, as the file of tokens[0, n): captured in memory (the caller
    // writes it with write() once the generation is done, so the first token does not wait
    // for the disk). Empty path: the state exceeds the budget, a file for it exists already,
    // or llama.cpp gave no state (*why says which; may be null).
    // logits: n_logits floats kept with it (the whole prompt's last logits; else none).
    File capture(llama_context * ctx, const PromptCacheKey & key,
                 const std::vector<int32_t> & tokens, size_t n, const float * logits,
                 size_t n_logits, std::string * why) const;
    // Writes a captured file atomically under its name, then removes the least recently used
    // files beyond the budget (*evicted: how many). kRuntime on a failed write (the caller
    // warns; the generation is not affected).
    Status write(const File & file, uint64_t * evicted);

    const std::string & dir() const { return dir_; }
    uint64_t budget_bytes() const { return budget_; }

private:
    std::string dir_;
    uint64_t budget_ = 0;
};

// A file at a path the caller chose (serve's /slots/{id}?action=save|restore), in the same
// checked format: the context's whole KV for `tokens` (what it holds), written atomically.
// load_state_file checks it like a cache file (checksum, model, settings, lossiness; kBadInput
// naming the file and why) and hands back the tokens it holds.
Status save_state_file(llama_context * ctx, const PromptCacheKey & key,
                       const std::vector<int32_t> & tokens, const std::string & path,
                       uint64_t * bytes);
Status load_state_file(llama_context * ctx, const PromptCacheKey & key, const std::string & path,
                       std::vector<int32_t> * tokens, uint64_t * bytes);

}  // namespace moestream
