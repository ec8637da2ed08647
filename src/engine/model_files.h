// model_files.h — the settings' account of the model's files when streaming: each file (every
// shard of a split set) with its size, the tensor bytes it holds, the dense bytes read from it
// at load and how much of llama.cpp's mapping of it was resident right after llama.cpp's load
// (pages touched or prefaulted: a file read whole at load shows its whole size here).
#pragma once

#include <nlohmann/json.hpp>

#include "model_loader.h"
#include "moestream/gguf_index.h"

namespace moestream {

class WeightBinder;

// Adds "model_files" (one object per file, shard order), "nextn_layers_unused" and
// "load_bytes_read" (bytes the lanes read at load: the dense weights) to j.
void model_files_json(const ModelIndex & index, const LoadedModel & lm, const WeightBinder * binder,
                      nlohmann::json * j);

}  // namespace moestream
