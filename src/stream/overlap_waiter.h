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
// Three stages (streamer.h, "Three-stage overlap"): the waiter learns which of gate/up the
// first expert MUL_MAT_ID after a routing multiplies and hands it to the sink. When a routing
// leaves the second projection's reads in flight, it waits for them at the node computed just
// before the second MUL_MAT_ID (asked for by name, the kind learned at that matmul from the
// node asked before it), or, failing that, in ask mode at the second matmul itself (no overlap
// for that layer), with the same learn/forget rule as the down input.
//
// Invariants: reads are never in flight past the matmul that reads them (second projection,
// down) nor past the end of a graph (the hook drains the sink before end_graph). A failed wait
// stops the graph before that matmul runs.
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
        uint64_t second_waits_at_input = 0;   // waited at the learned node before the 2nd matmul
        uint64_t second_waits_at_matmul = 0;  // waited in ask mode at the 2nd matmul
    };
    const Counters & counters() const { return c_; }

    bool on_ask(ggml_tensor * t, RouterHook & hook) override;
    Status on_node(ggml_tensor * t, RouterHook & hook) override;
    void on_loaded(const Routing & r, const Status & st, RouterHook & hook) override;
    void end_graph(RouterHook & hook) override {
        pending_ = second_ = expect_first_ = false;
        prev_ = nullptr;
    }

private:
    Status finish(RouterHook & hook);  // waits for the reads in flight, if any
    Status finish_second(RouterHook & hook);
    // In ask mode at the second expert matmul (second) or the down matmul t, whose wait point
    // did not arrive: learn it (from `before`, the node asked before t, or t's input) or
    // forget it, then wait there.
    void wait_at_matmul(ggml_tensor * t, const ggml_tensor * before, bool second,
                        RouterHook & hook);

    bool pending_ = false;    // a layer's down reads are in flight
    bool second_ = false;     // ... and its second projection's reads
    bool expect_first_ = false;  // the layer's first expert matmul is not asked for yet
    uint32_t layer_ = 0;      // that layer
    std::string input_name_;  // the learned down input's name for it ("" = not learned)
    std::string second_name_;  // the learned node before the second matmul ("" = not learned)
    const ggml_tensor * prev_ = nullptr;  // the node asked before the current one
    Counters c_;
};

}  // namespace moestream
