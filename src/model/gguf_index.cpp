// gguf_index.cpp — ModelIndex's lookups and the names of its parts (gguf_index.h). The index
// is built by load_model_index (shard_set.cpp) from GgufParser (gguf_parser.h): the byte
// format (gguf_reader.h), llama.cpp's hyperparameter rules (hparam_rules.h), the vocabulary
// rules (vocab_rules.h) and the expert map (expert_map.h); check_cpu_computable is in
// cpu_computable.cpp.
#include "moestream/gguf_index.h"

#include <iterator>
#include <string>
#include <vector>

namespace moestream {

const char * projection_name(Projection p) {
    static constexpr const char * kNames[] = {"gate", "up", "down", "gate_up"};  // by value
    const auto i = size_t(p);
    return i < std::size(kNames) ? kNames[i] : "?";
}

const TensorInfo * ModelIndex::find_tensor(const std::string & n) const {
    auto it = tensor_ids.find(n);
    return it == tensor_ids.end() ? nullptr : &tensors[it->second];
}

bool ModelIndex::is_expert_tensor(const std::string & n) const {
    return expert_tensor_names.count(n) != 0;
}

std::vector<std::string> shard_paths(const ModelIndex & m) {
    std::vector<std::string> p;
    for (const ShardFile & f : m.shards) p.push_back(f.path);
    if (p.empty()) p.push_back(m.path);
    return p;
}

}  // namespace moestream
