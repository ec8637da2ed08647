// overlap_waiter.cpp — see overlap_waiter.h.
#include "overlap_waiter.h"

#include <cstring>

#include "ggml.h"
#include "moestream/gguf_index.h"
#include "moestream/log.h"
#include "router_hook.h"

namespace moestream {
namespace {

// The projection an expert MUL_MAT_ID multiplies (by its weights' name), -1 if none.
int expert_matmul_projection(const ggml_tensor * t) {
    if (t->op != GGML_OP_MUL_MAT_ID || t->src[0] == nullptr) return -1;
    const char * w = t->src[0]->name;
    if (std::strstr(w, "ffn_down_exps")) return int(Projection::kDown);
    if (std::strstr(w, "ffn_gate_exps")) return int(Projection::kGate);
    if (std::strstr(w, "ffn_up_exps")) return int(Projection::kUp);
    return -1;
}

}  // namespace

Status OverlapWaiter::finish(RouterHook & hook) {
    second_ = false;
    if (!pending_) return Status::Ok();
    pending_ = false;
    return hook.sink().finish_pending();
}

Status OverlapWaiter::finish_second(RouterHook & hook) {
    second_ = false;
    Status st = hook.sink().finish_second();
    if (!hook.sink().has_pending()) pending_ = false;
    return st;
}

void OverlapWaiter::on_loaded(const Routing & r, const Status & st, RouterHook & hook) {
    expect_first_ = st.ok();
    pending_ = st.ok() && hook.sink().has_pending();
    second_ = pending_ && hook.sink().has_pending_second();
    if (!pending_) return;
    layer_ = r.layer;
    const std::string suffix = "-" + std::to_string(r.layer);
    const std::string & kind = hook.nodes().down_input_kind();
    input_name_ = kind.empty() ? std::string() : kind + suffix;
    const std::string & kind2 = hook.nodes().second_input_kind();
    second_name_ = !second_ || kind2.empty() ? std::string() : kind2 + suffix;
}

void OverlapWaiter::wait_at_matmul(ggml_tensor * t, const ggml_tensor * before, bool second,
                                   RouterHook & hook) {
    ++(second ? c_.second_waits_at_matmul : c_.waits_at_matmul);
    LearnedNodes & nodes = hook.nodes();
    const char * which = second ? "second expert" : "down";
    if (!(second ? nodes.second_input_kind() : nodes.down_input_kind()).empty()) {
        // Learned, yet it did not arrive before the matmul: forget it (and stop learning
        // after a few tries: the layer then simply waits here, without overlap).
        MS_LOG_DEBUG("layer %u: '%s' did not arrive before the %s matmul", layer_,
                     (second ? second_name_ : input_name_).c_str(), which);
        if (second)
            nodes.forget_second_input();
        else
            nodes.forget_down_input();
    } else if (second) {
        nodes.learn_second_input(before, layer_);
    } else {
        nodes.learn_down_input(t, layer_);
    }
    Status st = second ? finish_second(hook) : finish(hook);
    if (!st.ok()) {
        MS_LOG_DEBUG("layer %u: reads in flight failed, stopping at the %s matmul: %s", layer_,
                     which, st.message().c_str());
        hook.fail(st);  // the abort callback stops the graph
    }
}

bool OverlapWaiter::on_ask(ggml_tensor * t, RouterHook & hook) {
    const ggml_tensor * before = prev_;
    prev_ = t;
    if (!pending_ && !expect_first_) return false;
    const int proj = t->op == GGML_OP_MUL_MAT_ID ? expert_matmul_projection(t) : -1;
    const bool gate_or_up = proj == int(Projection::kGate) || proj == int(Projection::kUp);
    const bool first = expect_first_ && gate_or_up;
    if (first) {
        expect_first_ = false;
        LearnedNodes & nodes = hook.nodes();
        if (nodes.first_projection() < 0) {
            nodes.learn_first_projection(proj);
            hook.sink().set_first_projection(proj);
            MS_LOG_DEBUG("the first expert matmul of a layer multiplies %s",
                         projection_name(Projection(proj)));
        }
    }
    if (!pending_) return false;
    if (second_) {
        if (!second_name_.empty() && second_name_ == t->name) return true;
        if (gate_or_up && !first) {
            wait_at_matmul(t, before, /*second=*/true, hook);
            return false;
        }
    }
    if (!input_name_.empty() && input_name_ == t->name) return true;
    if (proj == int(Projection::kDown)) wait_at_matmul(t, before, /*second=*/false, hook);
    return false;
}

Status OverlapWaiter::on_node(ggml_tensor * t, RouterHook & hook) {
    if (!pending_) return Status::Ok();
    if (second_ && second_name_ == t->name) {
        ++c_.second_waits_at_input;
        Status st = finish_second(hook);
        if (!st.ok())
            MS_LOG_DEBUG("layer %u: reads in flight failed, stopping before the second matmul: %s",
                         layer_, st.message().c_str());
        return st;
    }
    // The router weights' GET_ROWS (delivered for the fixed-slot cache's id rewrite,
    // slot_rewriter.h) reads no expert memory: the reads stay in flight past it.
    if (t->op == GGML_OP_GET_ROWS) return Status::Ok();
    const bool at_input = input_name_ == t->name;
    if (at_input) ++c_.waits_at_input;
    Status st = finish(hook);  // otherwise never expected: the down matmul was not seen
    if (!st.ok() && at_input)
        MS_LOG_DEBUG("layer %u: reads in flight failed, stopping before the down matmul: %s",
                     layer_, st.message().c_str());
    return st;
}

}  // namespace moestream
