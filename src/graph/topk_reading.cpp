// topk_reading.cpp — see topk_reading.h.
#include "topk_reading.h"

#include <cstring>
#include <string>

#include "ggml.h"

namespace moestream {

bool parse_topk_name(const char * name, uint32_t * il) {
    if (std::strncmp(name, kTopkPrefix, kTopkPrefixLen) != 0) return false;
    const char * p = name + kTopkPrefixLen;
    if (*p < '0' || *p > '9') return false;
    uint64_t v = 0;
    for (; *p >= '0' && *p <= '9'; ++p) {
        v = v * 10 + uint64_t(*p - '0');
        if (v > 1000000) return false;
    }
    if (*p != '\0') return false;  // e.g. "ffn_moe_topk-3 (view)" is not the node we want
    *il = static_cast<uint32_t>(v);
    return true;
}

Status read_routing(const ggml_tensor * t, uint32_t layer, uint32_t n_expert, Routing * out) {
    const std::string where = std::string("routing node '") + t->name + "'";
    if (t->type != GGML_TYPE_I32)
        return Status::Runtime(where + ": expected i32 ids, got " + ggml_type_name(t->type));
    if (t->data == nullptr) return Status::Runtime(where + ": ids are not in host memory");
    if (t->ne[0] <= 0 || t->ne[1] < 0 || t->ne[2] != 1 || t->ne[3] != 1 ||
        t->ne[0] > int64_t(n_expert))
        return Status::Runtime(where + ": unexpected shape [" + std::to_string(t->ne[0]) + ", " +
                               std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + "]");
    out->layer = layer;
    out->k = static_cast<int>(t->ne[0]);
    out->n_rows = static_cast<int>(t->ne[1]);
    out->ids.resize(size_t(out->k) * size_t(out->n_rows));
    out->substituted.clear();
    out->fallback.clear();
    const char * base = static_cast<const char *>(t->data);
    for (int r = 0; r < out->n_rows; ++r) {
        for (int j = 0; j < out->k; ++j) {
            int32_t id;
            std::memcpy(&id, base + size_t(r) * t->nb[1] + size_t(j) * t->nb[0], sizeof id);
            if (id < 0 || uint32_t(id) >= n_expert)
                return Status::Runtime(where + ": expert id " + std::to_string(id) + " at row " +
                                       std::to_string(r) + " slot " + std::to_string(j) +
                                       " is outside [0, " + std::to_string(n_expert) + ")");
            out->ids[size_t(r) * size_t(out->k) + size_t(j)] = id;
        }
    }
    return Status::Ok();
}

bool final_weight_strides(const ggml_tensor * t, int k, int rows, int64_t * w_slot,
                          int64_t * w_row) {
    if (t->type == GGML_TYPE_F32 && t->ne[0] == k && t->ne[1] == rows) {
        *w_slot = int64_t(t->nb[0]);
        *w_row = int64_t(t->nb[1]);
    } else if (t->type == GGML_TYPE_F32 && t->ne[0] == 1 && t->ne[1] == k && t->ne[2] == rows) {
        *w_slot = int64_t(t->nb[1]);
        *w_row = int64_t(t->nb[2]);
    } else {
        return false;
    }
    return true;
}

}  // namespace moestream
