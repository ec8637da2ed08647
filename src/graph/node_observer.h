// node_observer.h — what a feature implements to act on llama.cpp's graph through the router
// hook (router_hook.h): binding weights, waiting for overlapped reads, drop-cold, prefetch and
// route traces are each one NodeObserver, owning its own state and counters.
//
// The hook calls every observer in list order (the order the engine built the list in):
//   begin_graph  before each llama_decode;
//   on_ask       ask mode, for every node except routing nodes (which the hook always asks
//                for); the node is delivered when any observer returns true;
//   on_node      every delivered node, routing nodes included, before the hook reads a
//                routing (so waits and deferred loads of the previous layer come first);
//   on_select    a layer's routing, just read at its topk node, that the observer may rewrite
//                (ids and, in the graph, the selected experts) before any later node reads it;
//   on_routing   that routing, as rewritten;
//   on_load /    around each hand-over of a routing to the sink (RouteSink::on_routing), made
//   on_loaded    by the hook after on_routing or by the observer that deferred it;
//   end_graph    after each llama_decode, once the sink has drained.
// An observer may call, during an event, only these of the hook: load(), nodes(), sink() and
// fail(). A Status error returned from on_node/on_routing stops the graph (the rest of the split
// is skipped and the abort callback fires); fail() records one from on_ask.
//
// Invariants: an observer keeps nothing of a graph past its end_graph; what it defers it loads
// before the layer's first expert matmul (on_ask sees that matmul before it computes).
// Thread-safety: every event arrives on the thread running llama_decode.
#pragma once

#include <cstdint>

#include "status.h"
#include "topk_reading.h"

struct ggml_tensor;

namespace moestream {

class RouterHook;

// The graph about to run.
struct GraphInfo {
    bool decode = false;    // decode (one token) rather than prefill
    uint32_t pos0 = 0;      // position of its first token
    uint32_t n_tokens = 0;  // tokens in the batch
    bool prompt_end = false;  // prefill whose last token ends the prompt: decode follows
};

class NodeObserver {
public:
    virtual ~NodeObserver() = default;

    // A graph is about to run; nothing of the previous one may be kept.
    virtual void begin_graph(const GraphInfo & /*g*/, RouterHook & /*hook*/) {}
    // Whether the hook should learn terminal nodes for this observer now (node_learning.h).
    virtual bool wants_terminals() const { return false; }
    // Ask mode (hot path: every node of every graph). True asks for t to be delivered.
    virtual bool on_ask(ggml_tensor * /*t*/, RouterHook & /*hook*/) { return false; }
    // A delivered node, computed, before any later node runs.
    virtual Status on_node(ggml_tensor * /*t*/, RouterHook & /*hook*/) { return Status::Ok(); }
    // The routing of one layer, read from its topk node, before on_routing: an observer may
    // rewrite r.ids (and the graph's selected experts in topk the same way; it then marks
    // r.substituted) before any later node of the layer computes.
    virtual Status on_select(Routing & /*r*/, ggml_tensor * /*topk*/, RouterHook & /*hook*/) {
        return Status::Ok();
    }
    // The routing of one layer, read from its topk node. Setting *defer takes over its load:
    // the observer then calls hook.load() itself later in the layer.
    virtual Status on_routing(const Routing & /*r*/, ggml_tensor * /*topk*/,
                              RouterHook & /*hook*/, bool * /*defer*/) {
        return Status::Ok();
    }
    // r (ids as they will be read: a policy may have repointed some) goes to the sink next.
    virtual void on_load(const Routing & /*r*/, RouterHook & /*hook*/) {}
    // The sink took r; st is what it returned.
    virtual void on_loaded(const Routing & /*r*/, const Status & /*st*/, RouterHook & /*hook*/) {}
    // The graph has run and the sink has drained.
    virtual void end_graph(RouterHook & /*hook*/) {}
};

}  // namespace moestream
