// overlap_waiter.cpp — see overlap_waiter.h.
#include "overlap_waiter.h"

#include <cstring>

#include "ggml.h"
#include "moestream/log.h"
#include "router_hook.h"

namespace moestream {

Status OverlapWaiter::finish(RouterHook & hook) {
    if (!pending_) return Status::Ok();
    pending_ = false;
    return hook.sink().finish_pending();
}

void OverlapWaiter::on_loaded(const Routing & r, const Status & st, RouterHook & hook) {
    pending_ = st.ok() && hook.sink().has_pending();
    if (!pending_) return;
    layer_ = r.layer;
    const std::string & kind = hook.nodes().down_input_kind();
    input_name_ = kind.empty() ? std::string() : kind + "-" + std::to_string(r.layer);
}

bool OverlapWaiter::on_ask(ggml_tensor * t, RouterHook & hook) {
    if (!pending_) return false;
    if (!input_name_.empty() && input_name_ == t->name) return true;
    if (t->op != GGML_OP_MUL_MAT_ID || t->src[0] == nullptr ||
        std::strstr(t->src[0]->name, "ffn_down_exps") == nullptr)
        return false;
    ++c_.waits_at_matmul;
    LearnedNodes & nodes = hook.nodes();
    if (!nodes.down_input_kind().empty()) {
        // Learned, yet it did not arrive before the matmul: forget it (and stop learning
        // after a few tries: the layer then simply waits here, without overlap).
        MS_LOG_DEBUG("layer %u: '%s' did not arrive before the down matmul", layer_,
                     input_name_.c_str());
        nodes.forget_down_input();
    } else {
        nodes.learn_down_input(t, layer_);
    }
    Status st = finish(hook);
    if (!st.ok()) {
        MS_LOG_DEBUG("layer %u: reads in flight failed, stopping at the down matmul: %s", layer_,
                     st.message().c_str());
        hook.fail(st);  // the abort callback stops the graph
    }
    return false;
}

Status OverlapWaiter::on_node(ggml_tensor * t, RouterHook & hook) {
    if (!pending_) return Status::Ok();
    const bool at_input = input_name_ == t->name;
    if (at_input) ++c_.waits_at_input;
    Status st = finish(hook);  // otherwise never expected: the down matmul was not seen
    if (!st.ok() && at_input)
        MS_LOG_DEBUG("layer %u: reads in flight failed, stopping before the down matmul: %s",
                     layer_, st.message().c_str());
    return st;
}

}  // namespace moestream
