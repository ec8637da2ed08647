// expert_map.cpp — the expert map (see expert_map.h).
#include "expert_map.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace moestream::gguf {

namespace {

// One MoE layer's expert tensors (slot: the tensor index of each projection, or -1), their
// shapes checked against each other and the model's widths.
MoeLayer moe_layer(IndexContext & c, const HparamRules & h, uint32_t il,
                   const std::array<int64_t, 4> & slot) {
    const std::string blk = "blk." + std::to_string(il) + ".";
    const bool gate = slot[int(Projection::kGate)] >= 0;
    const bool up = slot[int(Projection::kUp)] >= 0;
    const bool down = slot[int(Projection::kDown)] >= 0;
    const bool fused = slot[int(Projection::kGateUp)] >= 0;
    const uint64_t at = c.tensor_at(size_t(*std::max_element(slot.begin(), slot.end())));
    if (!down)
        c.fail(at, "layer " + std::to_string(il) + ": missing " + blk + "ffn_down_exps.weight");
    if (fused && (gate || up)) {
        c.fail(at, "layer " + std::to_string(il) +
                     ": has both fused ffn_gate_up_exps and separate gate/up experts");
    }
    // Gate-less experts (up/down only, e.g. nemotron_h_moe) are a layout of their own; a
    // gate without an up is not.
    if (!fused && !up)
        c.fail(at, "layer " + std::to_string(il) + ": missing " + blk + "ffn_up_exps.weight");

    // n_ff and the input width come from down ([n_ff, n_in, n_expert]); everything else
    // must agree. n_in is n_embd, or one of the arch's declared expert latent widths.
    const TensorInfo & dt = c.m.tensors[size_t(slot[int(Projection::kDown)])];
    const int64_t n_ff = dt.ne[0];
    const uint32_t want_ff = h.n_ff_layer[il];
    if (want_ff != 0 && n_ff != int64_t(want_ff)) {
        c.fail(c.tensor_at(size_t(slot[int(Projection::kDown)])),
             "tensor " + quoted(dt.name) + " has n_ff " + std::to_string(n_ff) + " but " +
                 c.m.arch + ".expert_feed_forward_length is " + std::to_string(want_ff));
    }
    int64_t n_in = c.m.n_embd;
    if (dt.n_dims >= 2 && dt.ne[1] != n_in &&
        std::find(h.latent_widths.begin(), h.latent_widths.end(), dt.ne[1]) !=
            h.latent_widths.end()) {
        n_in = dt.ne[1];
    }
    MoeLayer layer;
    layer.layer = il;
    std::vector<Projection> order;
    if (fused)
        order = {Projection::kGateUp, Projection::kDown};
    else if (!gate)
        order = {Projection::kUp, Projection::kDown};
    else
        order = {Projection::kGate, Projection::kUp, Projection::kDown};
    for (Projection pj : order) {
        const size_t ti = size_t(slot[int(pj)]);
        const TensorInfo & t = c.m.tensors[ti];
        int64_t want[3];
        if (pj == Projection::kDown) {
            want[0] = n_ff, want[1] = n_in;
        } else {
            want[0] = n_in, want[1] = pj == Projection::kGateUp ? 2 * n_ff : n_ff;
        }
        want[2] = c.m.n_expert;
        if (t.n_dims != 3 || t.ne[0] != want[0] || t.ne[1] != want[1] || t.ne[2] != want[2]) {
            std::string got = "[";
            for (uint32_t d = 0; d < t.n_dims; ++d) {
                got += (d ? ", " : "") + std::to_string(t.ne[d]);
            }
            got += "]";
            c.fail(c.tensor_at(ti),
                 "tensor " + quoted(t.name) + " has shape " + got + ", expected [" +
                     std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " +
                     std::to_string(want[2]) + "] (n_in " + std::to_string(n_in) + ", n_ff " +
                     std::to_string(n_ff) + ", n_expert " + std::to_string(c.m.n_expert) + ")");
        }
        ExpertTensor e;
        e.name = t.name;
        e.layer = il;
        e.proj = pj;
        e.type = t.type;
        for (int d = 0; d < 3; ++d) e.ne[d] = t.ne[d];
        e.row_bytes = t.nb[1];
        e.slice_bytes = t.nb[2];
        e.file_offset = t.file_offset;
        e.tensor_bytes = t.nbytes;
        e.shard = t.shard;
        layer.expert_bytes += e.slice_bytes;  // cannot overflow: each is < file size
        layer.tensors.push_back(std::move(e));
    }
    return layer;
}

}  // namespace

bool parse_layer(const std::string & name, uint32_t * layer) {
    if (name.compare(0, 4, "blk.") != 0) return false;
    size_t i = 4;
    uint64_t n = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - 4 < 9) {
        n = n * 10 + uint64_t(name[i] - '0');
        ++i;
    }
    if (i == 4 || i >= name.size() || name[i] != '.') return false;
    if (name[4] == '0' && i - 4 > 1) return false;
    *layer = uint32_t(n);
    return true;
}

bool parse_expert_name(const std::string & name, uint32_t * layer, Projection * proj) {
    uint32_t il;
    if (!parse_layer(name, &il)) return false;
    const std::string rest = name.substr(name.find('.', 4) + 1);
    if (rest == "ffn_gate_exps.weight")
        *proj = Projection::kGate;
    else if (rest == "ffn_up_exps.weight")
        *proj = Projection::kUp;
    else if (rest == "ffn_down_exps.weight")
        *proj = Projection::kDown;
    else if (rest == "ffn_gate_up_exps.weight")
        *proj = Projection::kGateUp;
    else
        return false;
    *layer = il;
    return true;
}

void mark_unused_layers(IndexContext & c) {
    const std::string nk = c.m.arch + ".nextn_predict_layers";
    if (!c.find_kv(nk)) return;
    c.m.n_nextn_layers = c.int_key(nk, false, 0, INT32_MAX);
    if (c.m.n_nextn_layers == 0) return;
    const uint32_t first = c.m.n_layer - c.m.n_nextn_layers;
    for (TensorInfo & t : c.m.tensors) {
        uint32_t il;
        if (parse_layer(t.name, &il) && il >= first && il < c.m.n_layer) {
            t.unused = true;
            c.m.unused_bytes_total += t.nbytes;  // cannot overflow: tensors do not overlap
        }
    }
}

void build_expert_map(IndexContext & c, const HparamRules & h, uint64_t end_offset) {
    // Per layer: index of each projection's tensor (or -1).
    std::map<uint32_t, std::array<int64_t, 4>> layers;
    for (size_t i = 0; i < c.m.tensors.size(); ++i) {
        uint32_t il;
        Projection pj;
        if (c.m.tensors[i].unused) continue;
        if (!parse_expert_name(c.m.tensors[i].name, &il, &pj)) continue;
        const uint64_t at = c.tensor_at(i);
        if (il >= c.m.n_layer) {
            c.fail(at, "expert tensor " + quoted(c.m.tensors[i].name) + " is in layer " +
                         std::to_string(il) + " but the model has " +
                         std::to_string(c.m.n_layer) + " layers");
        }
        auto & slot =
            layers.try_emplace(il, std::array<int64_t, 4>{-1, -1, -1, -1}).first->second;
        slot[int(pj)] = int64_t(i);
    }
    c.loc_shard = kThisFile;
    if (layers.empty()) {
        c.fail(end_offset, "not a MoE model: no blk.N.ffn_{gate,up,down}_exps.weight tensors");
    }
    for (const auto & [il, slot] : layers) c.m.moe_layers.push_back(moe_layer(c, h, il, slot));
    if (c.m.n_ff_exp == 0) {
        // Per-layer (or absent) width: report it when every MoE layer's KV value agrees.
        uint32_t v = h.n_ff_layer[c.m.moe_layers.front().layer];
        for (const MoeLayer & l : c.m.moe_layers) {
            if (h.n_ff_layer[l.layer] != v) v = 0;
        }
        c.m.n_ff_exp = v;
    }
    for (const MoeLayer & l : c.m.moe_layers) {
        for (const ExpertTensor & e : l.tensors) c.m.expert_tensor_names.insert(e.name);
    }
}

void sum_totals(IndexContext & c) {
    uint64_t ws = 0;
    for (const MoeLayer & l : c.m.moe_layers) {
        for (const ExpertTensor & e : l.tensors) c.m.expert_bytes_total += e.tensor_bytes;
        uint64_t per;
        if (__builtin_mul_overflow(l.expert_bytes, uint64_t(c.m.n_expert_used), &per) ||
            __builtin_add_overflow(ws, per, &ws)) {
            c.fail(0, "working set size overflows");
        }
    }
    c.m.token_working_set_bytes = ws;
    // Tensors do not overlap and lie inside the file, so these sums cannot overflow.
    uint64_t all = 0;
    for (const TensorInfo & t : c.m.tensors)
        if (!t.unused) all += t.nbytes;
    c.m.dense_bytes_total = all - c.m.expert_bytes_total;
}

}  // namespace moestream::gguf
