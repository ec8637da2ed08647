// router_hook.cpp — RouterHook and HookSlot (see router_hook.h).
#include "router_hook.h"

#include <chrono>
#include <cstring>

#include "ggml.h"
#include "moestream/log.h"

namespace moestream {

void RouterHook::begin_graph(const GraphInfo & g) {
    for (NodeObserver * o : observers_) o->begin_graph(g, *this);
}

Status RouterHook::end_graph() {
    Status st = sink_.drain();  // the speculative reads too
    for (NodeObserver * o : observers_) o->end_graph(*this);
    fail(st);
    return st;
}

bool RouterHook::wants_terminals() const {
    for (const NodeObserver * o : observers_)
        if (o->wants_terminals()) return true;
    return false;
}

Status RouterHook::load(const Routing & r) {
    for (NodeObserver * o : observers_) o->on_load(r, *this);
    Status st = sink_.on_routing(r);
    for (NodeObserver * o : observers_) o->on_loaded(r, st, *this);
    return st;
}

bool RouterHook::on_ask(ggml_tensor * t) {
    // Hot path: every node of every decode.
    if (std::strncmp(t->name, kTopkPrefix, kTopkPrefixLen) == 0) return true;
    bool want = false;  // every observer sees every ask (a delivered node is delivered to all)
    for (NodeObserver * o : observers_) want = o->on_ask(t, *this) || want;
    if (want) return true;
    if (t->op == GGML_OP_MUL && wants_terminals()) nodes_.learn_terminal(t);  // cheap test first
    return false;
}

bool RouterHook::on_node(ggml_tensor * t) {
    if (failed()) return false;
    Status st;
    for (NodeObserver * o : observers_) {
        st = o->on_node(t, *this);
        if (!st.ok()) break;
    }
    uint32_t il = 0;
    if (st.ok() && parse_topk_name(t->name, &il)) {
        st = read_routing(t, il, n_expert_, &routing_);
        // No rows: the last layer of a ubatch without output tokens (a prompt batch split
        // into several ubatches computes only the output rows there). Nothing is routed.
        if (st.ok() && routing_.n_rows == 0) return true;
        for (NodeObserver * o : observers_) {
            if (!st.ok()) break;
            st = o->on_select(routing_, t, *this);
        }
        bool defer = false;
        for (NodeObserver * o : observers_) {
            if (!st.ok()) break;
            st = o->on_routing(routing_, t, *this, &defer);
        }
        if (st.ok() && !defer) st = load(routing_);
    }
    if (!st.ok()) {
        error_ = st;
        MS_LOG_DEBUG("routing failed, stopping the graph: %s", st.message().c_str());
        return false;  // skip the rest of the split: no expert matmul runs on this layer
    }
    return true;
}

bool HookSlot::eval_callback(ggml_tensor * t, bool ask, void * user_data) {
    auto * slot = static_cast<HookSlot *>(user_data);
    if (slot->hook_ != nullptr) {
        const auto t0 = std::chrono::steady_clock::now();
        const bool r = ask ? slot->hook_->on_ask(t) : slot->hook_->on_node(t);
        slot->callback_s_ +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return r;
    }
    uint32_t il = 0;
    if (!parse_topk_name(t->name, &il)) return false;
    if (!ask) slot->orphan_ = true;
    return ask;
}

bool HookSlot::abort_callback(void * user_data) {
    auto * slot = static_cast<HookSlot *>(user_data);
    return slot->orphan_ || (slot->hook_ != nullptr && slot->hook_->failed());
}

}  // namespace moestream
