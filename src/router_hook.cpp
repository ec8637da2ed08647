#include "router_hook.h"

#include <cstring>
#include <string>

#include "ggml.h"
#include "log.h"

namespace moestream {

namespace {
constexpr char kTopkPrefix[] = "ffn_moe_topk-";
constexpr size_t kTopkPrefixLen = sizeof(kTopkPrefix) - 1;
}  // namespace

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
    if (t->ne[0] <= 0 || t->ne[1] <= 0 || t->ne[2] != 1 || t->ne[3] != 1 ||
        t->ne[0] > int64_t(n_expert))
        return Status::Runtime(where + ": unexpected shape [" + std::to_string(t->ne[0]) + ", " +
                               std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + "]");
    out->layer = layer;
    out->k = static_cast<int>(t->ne[0]);
    out->n_rows = static_cast<int>(t->ne[1]);
    out->ids.resize(size_t(out->k) * size_t(out->n_rows));
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

bool RouterHook::eval_callback(ggml_tensor * t, bool ask, void * user_data) {
    if (ask) {
        // Hot path: every node of every decode. Only the routing nodes are wanted.
        return std::strncmp(t->name, kTopkPrefix, kTopkPrefixLen) == 0;
    }
    return static_cast<RouterHook *>(user_data)->on_node(t);
}

bool RouterHook::abort_callback(void * user_data) {
    return static_cast<RouterHook *>(user_data)->failed();
}

bool RouterHook::on_node(ggml_tensor * t) {
    if (failed()) return false;
    uint32_t il = 0;
    if (!parse_topk_name(t->name, &il)) return true;  // a node we did not ask for
    Status st = read_routing(t, il, n_expert_, &scratch_);
    if (st.ok()) st = sink_->on_routing(scratch_);
    ++routings_;
    if (!st.ok()) {
        error_ = st;
        MS_LOG_DEBUG("routing failed, stopping the graph: %s", st.message().c_str());
        return false;  // skip the rest of the split: no expert matmul runs on this layer
    }
    return true;
}

}  // namespace moestream
