// node_learning.cpp — see node_learning.h.
#include "node_learning.h"

#include <cstdlib>
#include <cstring>

#include "ggml.h"
#include "moestream/log.h"

namespace moestream {
namespace {

constexpr char kWeightedPrefix[] = "ffn_moe_weighted-";

bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

}  // namespace

void LearnedNodes::learn_terminal(const ggml_tensor * weighted) {
    if (weighted->op != GGML_OP_MUL ||
        std::strncmp(weighted->name, kWeightedPrefix, sizeof kWeightedPrefix - 1) != 0)
        return;
    const char * p = weighted->name + sizeof kWeightedPrefix - 1;
    if (*p < '0' || *p > '9') return;
    const uint32_t il = uint32_t(std::strtoul(p, nullptr, 10));
    if (il >= terminal_.size() || !terminal_[il].empty()) return;
    if (relearns_[il] >= kMaxRelearns) return;
    // The weights operand has ne[0] == 1 ([1, k, rows]); follow it through views to its op.
    const ggml_tensor * w = nullptr;
    for (int i = 0; i < 2; ++i)
        if (weighted->src[i] && weighted->src[i]->ne[0] == 1) w = weighted->src[i];
    while (w && is_view_op(w->op) && w->src[0]) w = w->src[0];
    if (!w || w->type != GGML_TYPE_F32 || w->name[0] == '\0') return;
    terminal_[il] = w->name;
    MS_LOG_DEBUG("layer %u: weight chain ends at '%s' (%s)", il, w->name, ggml_op_name(w->op));
}

const std::string & LearnedNodes::terminal(uint32_t il) const {
    static const std::string kNone;
    return il < terminal_.size() ? terminal_[il] : kNone;
}

void LearnedNodes::forget_terminal(uint32_t il) {
    if (il >= terminal_.size()) return;
    terminal_[il].clear();
    ++relearns_[il];
}

void LearnedNodes::reset_terminals() {
    terminal_.assign(terminal_.size(), std::string());
    relearns_.assign(relearns_.size(), 0);
}

std::string LearnedNodes::terminal_kind(uint32_t il) const {
    const std::string & n = terminal(il);
    const size_t dash = n.rfind('-');
    return dash == std::string::npos ? n : n.substr(0, dash);
}

bool LearnedNodes::kind_of(const char * name, uint32_t il, std::string * kind) {
    const std::string in = name;
    const std::string suffix = "-" + std::to_string(il);
    if (in.size() <= suffix.size() ||
        in.compare(in.size() - suffix.size(), suffix.size(), suffix) != 0)
        return false;
    *kind = in.substr(0, in.size() - suffix.size());
    return true;
}

void LearnedNodes::learn_down_input(const ggml_tensor * down_matmul, uint32_t il) {
    if (down_relearns_ >= kMaxRelearns || down_matmul->src[1] == nullptr) return;
    // The node feeding the matmul, named "<kind>-<il>".
    if (kind_of(down_matmul->src[1]->name, il, &down_kind_))
        MS_LOG_DEBUG("down matmul input: '%s' (%s)", down_matmul->src[1]->name,
                     ggml_op_name(down_matmul->src[1]->op));
}

void LearnedNodes::learn_second_input(const ggml_tensor * before, uint32_t il) {
    if (second_relearns_ >= kMaxRelearns || before == nullptr) return;
    if (kind_of(before->name, il, &second_kind_))
        MS_LOG_DEBUG("second expert matmul follows: '%s' (%s)", before->name,
                     ggml_op_name(before->op));
}

}  // namespace moestream
