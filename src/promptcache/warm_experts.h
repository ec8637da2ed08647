// warm_experts.h — the warm expert set's usage file (--warm-experts FILE|auto,
// docs/prompt-cache.md, "Warm expert set"): per (MoE layer, expert) how many decode routings
// of earlier runs of the model routed it. At start the engine reads it and hands the hottest
// experts of every layer, as many as the cache holds, to the streamer, which reads them into
// the cache in the background (streamer.h, "Warm set"); at the end of every generation it
// writes the counts back with this run's added.
//
// File layout (native byte order; the magic fixes it and the format version):
//   0   "MSWARM01"
//   8   u64 file size
//   16  u32 MoE layers, u32 experts per layer
//   24  u64 FNV-1a 64 of the model's identity (prompt_cache_model_identity: every file of
//       the model with its size, mtime, ctime, device and inode)
//   32  u64 decode routings counted (over every run)
//   40  u32 counts[layers * experts], layer-major
//   end u64 FNV-1a 64 of every byte before it
//
// Invariants: a file is used only when its size, magic, checksum, shape and model identity all
// match; anything else is refused in one line (the run starts cold and the file is replaced at
// the end of the generation). Nothing but the named file (and AtomicFile's temporary file next
// to it) is ever written; `auto` names one documented place (warm_usage_auto_path).
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moestream/status.h"

namespace moestream {

struct WarmUsage {
    uint32_t n_layers = 0;         // MoE layers
    uint32_t n_expert = 0;         // experts per MoE layer
    uint64_t routings = 0;         // decode routings counted (layers x tokens), every run
    std::vector<uint32_t> counts;  // [layer * n_expert + e]: decode routings that routed e
};

// An empty usage of that shape (every count 0).
WarmUsage warm_usage_empty(uint32_t n_layers, uint32_t n_expert);

// Adds counts (same shape) and routings into *u; when a count would pass 2^31 every count is
// halved first (older runs weigh less, the order stays).
void warm_usage_add(WarmUsage * u, const std::vector<uint32_t> & counts, uint64_t routings);

// Where `--warm-experts auto` keeps the usage of the model whose first file is model_path:
// $XDG_CACHE_HOME/moestream/warm/ (else $HOME/.cache/moestream/warm/), named
// warm-<16 hex of the absolute path's FNV-1a 64>.usage. "" with *why when neither variable is
// set. Creates nothing.
std::string warm_usage_auto_path(const std::string & model_path, std::string * why);

// Makes the directories of an auto path (at most the three levels under the cache home).
Status warm_usage_make_dirs(const std::string & path);

enum class WarmRead { kMissing, kOk, kRefused };
// Reads the usage file at path for the model with that identity and shape. kMissing: no file
// (not an error: the first run). kRefused: *why says why in one phrase (foreign model,
// truncated, bit-flipped, wrong shape, not a regular file, unreadable).
WarmRead warm_usage_read(const std::string & path, const std::string & model_identity,
                         uint32_t n_layers, uint32_t n_expert, WarmUsage * out, std::string * why);

// The file's bytes (warm_usage_write writes them; tests corrupt them).
std::vector<uint8_t> warm_usage_bytes(const WarmUsage & u, const std::string & model_identity);

// Writes the file atomically (AtomicFile): the old file or the whole new one.
Status warm_usage_write(const std::string & path, const WarmUsage & u,
                        const std::string & model_identity);

// Per MoE layer, the experts routed at least once, most routed first (ties: lower id first),
// at most per_layer of them.
std::vector<std::vector<uint32_t>> warm_usage_hottest(const WarmUsage & u, uint32_t per_layer);

}  // namespace moestream
