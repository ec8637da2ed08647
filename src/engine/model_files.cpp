#include "model_files.h"

#include "weight_binder.h"

namespace moestream {

void model_files_json(const ModelIndex & index, const LoadedModel & lm, const WeightBinder * binder,
                      nlohmann::json * j) {
    std::vector<uint64_t> dense(index.shards.size(), 0);
    for (const TensorInfo & t : index.tensors)
        if (!t.unused && !index.is_expert_tensor(t.name) && t.shard < dense.size())
            dense[t.shard] += t.nbytes;
    nlohmann::json files = nlohmann::json::array();
    for (size_t i = 0; i < index.shards.size(); ++i) {
        const ShardFile & f = index.shards[i];
        nlohmann::json o;
        o["path"] = f.path;
        o["file_bytes"] = f.file_size;
        o["tensors"] = f.n_tensors;
        o["tensor_bytes"] = f.tensor_bytes;
        o["dense_bytes"] = dense[i];
        o["resident_after_load_bytes"] =
            i < lm.resident_after_load.size() ? lm.resident_after_load[i] : 0;
        files.push_back(o);
    }
    (*j)["model_files"] = files;
    (*j)["nextn_layers_unused"] = index.n_nextn_layers;
    (*j)["load_bytes_read"] = binder ? binder->dense_read_stats().bytes_read : 0;
}

}  // namespace moestream
