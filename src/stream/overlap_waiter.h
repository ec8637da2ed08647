// overlap_waiter.h — the graph side of the streamer's overlap (streamer.h, "Overlap"): when a
// routing leaves its down reads in flight, wait for them just before the layer's down matmul,
// late enough that they overlapped the gate/up matmuls.
//
// Where: at the node feeding the down MUL_MAT_ID, asked for by name "<kind>-<il>" with the
// kind learned by the router hook (node_learning.h); failing that (not learned yet, or it did
// not arrive), in ask mode at the down MUL_MAT_ID itself, which has not computed yet (ask
// precedes compute): the kind is learned there, or forgotten when it was known but did not
// arrive. Any other delivered node while reads are in flight waits first too (never expected).
//
// Invariants: reads are never in flight past the down matmul of their layer nor past the end
// of a graph (the hook drains the sink before end_graph). A failed wait stops the graph before
// the down matmul runs.
// Thread-safety: one RouterHook's observer: the llama_decode thread only.
#pragma once

#include <cstdint>
#include <string>

#include "node_observer.h"

namespace moestream {

class OverlapWaiter final : public NodeObserver {
public:
    struct Counters {
        uint64_t waits_at_input = 0;   // waited at the learned node feeding the down matmul
        uint64_t waits_at_matmul = 0;  // waited in ask mode at the down matmul (no overlap)
    };
    const Counters & counters() const { return c_; }

    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    Status on_node(ggml_tensor * t, RouterHook & hook) override;
    void on_loaded(const Routing & r, const Status & st, RouterHook & hook) override;
    void end_graph(RouterHook & hook) override { pending_ = false; }

private:
    Status finish(RouterHook & hook);  // waits for the reads in flight, if any

    bool pending_ = false;    // a layer's down reads are in flight
    uint32_t layer_ = 0;      // that layer
    std::string input_name_;  // the learned down input's name for it ("" = not learned)
    Counters c_;
};

}  // namespace moestream
