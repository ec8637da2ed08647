#include "router_hook.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "ggml.h"
#include "moestream/log.h"
#include "weight_binder.h"
#include "prefetch.h"
#include "route_tracer.h"

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
        // Hot path: every node of every decode. Only the routing nodes are wanted (and, with
        // --drop-cold-experts, the learned terminal nodes of the weight chains).
        if (std::strncmp(t->name, kTopkPrefix, kTopkPrefixLen) == 0) return true;
        auto * self = static_cast<RouterHook *>(user_data);
        if (self->binder_ && self->binder_->active()) self->ask_bind(t);
        if (self->predictor_) self->predictor_->observe(t);
        if (self->io_pending_ && self->ask_io(t)) return true;
        if (self->drop_cfg_.frac <= 0 && !self->tracing()) return false;
        return self->ask_drop(t);
    }
    return static_cast<RouterHook *>(user_data)->on_node(t);
}

bool RouterHook::ask_bind(ggml_tensor * t) {
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        Status st = binder_->bind(t->src[i]);
        if (!st.ok()) {
            if (error_.ok()) error_ = st;  // the abort callback stops the graph
            return false;
        }
    }
    return true;
}

void RouterHook::set_decode_phase(bool decode) {
    decode_phase_ = decode;
    pending_ = false;
    if (predictor_) predictor_->new_graph();
}

void RouterHook::enable_drop_cold(const DropColdConfig & cfg, uint32_t n_layer) {
    drop_cfg_ = cfg;
    drop_state_.terminal.assign(n_layer, std::string());
    drop_state_.relearns.assign(n_layer, 0);
}

void RouterHook::enable_trace(RouteTracer * tracer, uint32_t n_layer) {
    tracer_ = tracer;
    if (drop_state_.terminal.size() < n_layer) {
        drop_state_.terminal.resize(n_layer);
        drop_state_.relearns.resize(n_layer, 0);
    }
}

bool RouterHook::tracing() const {
    return tracer_ && tracer_->active();
}

std::string RouterHook::terminal_kind(uint32_t il) const {
    if (il >= drop_state_.terminal.size()) return "";
    std::string n = drop_state_.terminal[il];
    size_t dash = n.rfind('-');
    return dash == std::string::npos ? n : n.substr(0, dash);
}

namespace {
constexpr char kWeightedPrefix[] = "ffn_moe_weighted-";
constexpr int kMaxRelearns = 3;  // then the layer stays lossless (loads at the topk)

bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

// Byte strides of final weights shaped [k, rows] or [1, k, rows]; false for any other shape.
bool weight_strides(const ggml_tensor * t, int k, int rows, int64_t * w_slot, int64_t * w_row) {
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
}  // namespace

bool RouterHook::ask_drop(ggml_tensor * t) {
    if (tracing()) {
        const int64_t w = tracer_->waiting_layer();
        if (w >= 0 && size_t(w) < drop_state_.terminal.size() &&
            !drop_state_.terminal[size_t(w)].empty() && drop_state_.terminal[size_t(w)] == t->name)
            return true;
    }
    if (pending_) {
        const std::string & term = drop_state_.terminal[pending_routing_.layer];
        if (term == t->name) return true;
        if (t->op == GGML_OP_MUL_MAT_ID) {
            // The learned terminal did not arrive before the expert matmul: load now, lossless
            // for this layer, and re-learn. (The matmul has not run: ask precedes compute.)
            ++drop_state_.fallbacks;
            ++drop_state_.relearns[pending_routing_.layer];
            MS_LOG_INFO(
                "layer %u: terminal node '%s' did not arrive; loading at the matmul and "
                "re-learning",
                pending_routing_.layer, term.c_str());
            drop_state_.terminal[pending_routing_.layer].clear();
            Status st = load_pending_unchanged();
            if (!st.ok() && error_.ok()) error_ = st;
            return false;
        }
    }
    if (t->op == GGML_OP_MUL &&
        std::strncmp(t->name, kWeightedPrefix, sizeof kWeightedPrefix - 1) == 0)
        learn_terminal(t);
    return false;
}

void RouterHook::learn_terminal(const ggml_tensor * weighted) {
    uint32_t il = 0;
    const char * p = weighted->name + sizeof kWeightedPrefix - 1;
    if (*p < '0' || *p > '9') return;
    il = uint32_t(std::strtoul(p, nullptr, 10));
    if (il >= drop_state_.terminal.size() || !drop_state_.terminal[il].empty()) return;
    if (drop_state_.relearns[il] >= kMaxRelearns) return;
    // The weights operand has ne[0] == 1 ([1, k, rows]); follow it through views to its op.
    const ggml_tensor * w = nullptr;
    for (int i = 0; i < 2; ++i)
        if (weighted->src[i] && weighted->src[i]->ne[0] == 1) w = weighted->src[i];
    while (w && is_view_op(w->op) && w->src[0]) w = w->src[0];
    if (!w || w->type != GGML_TYPE_F32 || w->name[0] == '\0') return;
    drop_state_.terminal[il] = w->name;
    MS_LOG_DEBUG("layer %u: weight chain ends at '%s' (%s)", il, w->name, ggml_op_name(w->op));
}

// Loads the pending routing as routed (no drops).
Status RouterHook::load_pending_unchanged() {
    pending_ = false;
    return route_to_sink(pending_routing_);
}

Status RouterHook::load_pending_at_terminal(ggml_tensor * t) {
    pending_ = false;
    Routing & r = pending_routing_;
    ggml_tensor * topk = pending_topk_;
    // Weights are [k, rows] or [1, k, rows].
    int64_t w_slot = 0, w_row = 0;
    if (!weight_strides(t, r.k, r.n_rows, &w_slot, &w_row)) {
        MS_LOG_INFO("layer %u: '%s' does not look like the final weights; re-learning", r.layer,
                    t->name);
        drop_state_.terminal[r.layer].clear();
        ++drop_state_.relearns[r.layer];
        return route_to_sink(r);
    }
    if (w_slot % 4 != 0 || w_row % 4 != 0 || topk->nb[0] % 4 != 0 || topk->nb[1] % 4 != 0)
        return Status::Runtime(std::string("unaligned weights or ids at '") + t->name + "'");
    ++drop_state_.deferred;
    const uint64_t eb = sink_->expert_bytes(r.layer);
    const uint64_t dropped_before = drop_.dropped;
    const bool trace = tracing() && tracer_->waiting_layer() == int64_t(r.layer);
    for (int row = 0; row < r.n_rows; ++row) {
        auto * ids = reinterpret_cast<int32_t *>(static_cast<char *>(topk->data) +
                                                 size_t(row) * topk->nb[1]);
        auto * w =
            reinterpret_cast<float *>(static_cast<char *>(t->data) + size_t(row) * size_t(w_row));
        if (trace)  // the weights before the policy touches them
            for (int j = 0; j < r.k; ++j)
                tracer_->set_weight(row, j, w[size_t(j) * size_t(w_slot / 4)]);
        drop_cold_row(
            r.k, ids, int64_t(topk->nb[0] / 4), w, w_slot / 4, r.k, drop_cfg_,
            [&](int32_t e) { return sink_->is_resident(r.layer, e); }, &drop_);
        for (int j = 0; j < r.k; ++j) {
            int32_t & id = r.ids[size_t(row) * size_t(r.k) + size_t(j)];
            const int32_t now = ids[size_t(j) * (topk->nb[0] / 4)];
            if (trace && now != id) tracer_->mark_dropped(row, j);  // repointed = dropped
            id = now;
        }
    }
    if (trace) tracer_->done_weights();
    drop_.bytes_avoided += (drop_.dropped - dropped_before) * eb;
    return route_to_sink(r);
}

// The tracer asked for this layer's terminal node: record its final weights (loading already
// happened at the topk; nothing here changes the graph's data).
void RouterHook::trace_weights(const ggml_tensor * t) {
    const int64_t L = tracer_->waiting_layer();
    if (L < 0 || size_t(L) >= drop_state_.terminal.size() ||
        drop_state_.terminal[size_t(L)] != t->name)
        return;
    const int k = scratch_.k, rows = scratch_.n_rows;
    int64_t w_slot = 0, w_row = 0;
    if (scratch_.layer != uint32_t(L) || !weight_strides(t, k, rows, &w_slot, &w_row) ||
        w_slot % 4 != 0 || w_row % 4 != 0 || t->data == nullptr)
        return;  // weights stay NaN
    for (int row = 0; row < rows; ++row) {
        const auto * w = reinterpret_cast<const float *>(static_cast<const char *>(t->data) +
                                                         size_t(row) * size_t(w_row));
        for (int j = 0; j < k; ++j) tracer_->set_weight(row, j, w[size_t(j) * size_t(w_slot / 4)]);
    }
    tracer_->done_weights();
}

bool RouterHook::abort_callback(void * user_data) {
    return static_cast<RouterHook *>(user_data)->failed();
}

Status RouterHook::route_to_sink(const Routing & r) {
    Status st = sink_->on_routing(r);
    io_pending_ = st.ok() && sink_->has_pending();
    if (io_pending_) {
        io_il_ = r.layer;
        pre_down_name_ =
            pre_down_kind_.empty() ? std::string() : pre_down_kind_ + "-" + std::to_string(r.layer);
    }
    return st;
}

Status RouterHook::finish_io() {
    if (!io_pending_) return Status::Ok();
    io_pending_ = false;
    return sink_->finish_pending();
}

Status RouterHook::end_graph() {
    Status st = finish_io();
    if (sink_) {
        Status d = sink_->drain();  // the speculative reads too
        if (st.ok()) st = d;
    }
    if (!st.ok() && error_.ok()) error_ = st;
    return st;
}

// Ask mode while a layer's down reads are in flight: ask for the learned node feeding the down
// matmul; at the down MUL_MAT_ID itself (its range has not computed yet: ask precedes
// compute) wait for the reads right here and learn the feeding node for the next layers.
bool RouterHook::ask_io(ggml_tensor * t) {
    if (!pre_down_name_.empty() && pre_down_name_ == t->name) return true;
    if (t->op != GGML_OP_MUL_MAT_ID || t->src[0] == nullptr ||
        std::strstr(t->src[0]->name, "ffn_down_exps") == nullptr)
        return false;
    ++overlap_.waits_at_matmul;
    if (!pre_down_kind_.empty()) {
        // Learned, yet it did not arrive before the matmul: forget it (and stop learning
        // after a few tries: the layer then simply waits here, without overlap).
        MS_LOG_DEBUG("layer %u: '%s' did not arrive before the down matmul", io_il_,
                     pre_down_name_.c_str());
        pre_down_kind_.clear();
        ++overlap_.relearns;
    } else if (overlap_.relearns < kMaxRelearns && t->src[1] != nullptr) {
        // The node feeding the matmul, named "<kind>-<il>".
        const std::string in = t->src[1]->name;
        const std::string suffix = "-" + std::to_string(io_il_);
        if (in.size() > suffix.size() &&
            in.compare(in.size() - suffix.size(), suffix.size(), suffix) == 0) {
            pre_down_kind_ = in.substr(0, in.size() - suffix.size());
            MS_LOG_DEBUG("down matmul input: '%s' (%s)", in.c_str(), ggml_op_name(t->src[1]->op));
        }
    }
    Status st = finish_io();
    if (!st.ok()) {
        MS_LOG_DEBUG("layer %u: reads in flight failed, stopping at the down matmul: %s", io_il_,
                     st.message().c_str());
        if (error_.ok()) error_ = st;  // the abort callback stops the graph
    }
    return false;
}

bool RouterHook::on_node(ggml_tensor * t) {
    if (failed()) return false;
    if (sink_ == nullptr) {
        error_ = Status::Runtime("internal: routing before the streamer was attached");
        return false;
    }
    uint32_t il = 0;
    Status st;
    if (io_pending_ && pre_down_name_ == t->name) {
        ++overlap_.waits_at_input;
        st = finish_io();
        if (!st.ok()) {
            MS_LOG_DEBUG("layer %u: reads in flight failed, stopping before the down matmul: %s",
                         io_il_, st.message().c_str());
            error_ = st;
            return false;  // skip the rest of the split: the down matmul must not run
        }
        return true;
    }
    if (io_pending_) {  // never expected: the previous layer's down matmul was not seen
        st = finish_io();
        if (!st.ok()) {
            error_ = st;
            return false;
        }
    }
    if (!parse_topk_name(t->name, &il)) {
        if (!pending_ || drop_state_.terminal[pending_routing_.layer] != t->name) {
            if (tracing()) trace_weights(t);
            return true;  // a node we did not ask for (or only the tracer did)
        }
        st = load_pending_at_terminal(t);
    } else {
        if (pending_) {
            // The previous layer's terminal never came and no matmul of it was seen either.
            st = load_pending_unchanged();
            if (!st.ok()) {
                error_ = st;
                return false;
            }
        }
        st = read_routing(t, il, n_expert_, &scratch_);
        ++routings_;
        if (st.ok() && predictor_ && scratch_.n_rows == 1)
            predictor_->score(il, scratch_.ids.data(), scratch_.k);
        if (st.ok() && tracing())
            tracer_->routing_start(il, scratch_.k, scratch_.n_rows, scratch_.ids.data());
        if (st.ok()) {
            if (policy_applies() && il < drop_state_.terminal.size() &&
                !drop_state_.terminal[il].empty()) {
                // Defer the load to the terminal node of this layer's weight chain.
                pending_ = true;
                pending_topk_ = t;
                std::swap(pending_routing_, scratch_);
                return true;
            }
            uint32_t next_il = 0;
            if (predictor_ && decode_phase_ && scratch_.n_rows == 1 &&
                predictor_->predict(il, scratch_.k, &next_il, &hint_))
                sink_->set_prefetch(next_il, hint_);
            st = route_to_sink(scratch_);
        }
    }
    if (!st.ok()) {
        error_ = st;
        MS_LOG_DEBUG("routing failed, stopping the graph: %s", st.message().c_str());
        return false;  // skip the rest of the split: no expert matmul runs on this layer
    }
    return true;
}

}  // namespace moestream
