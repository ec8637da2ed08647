// route_stats.h — how a model routes, from a route trace (`moestream replay --routing-stats`,
// docs/replay.md): is the routing spread evenly over the experts, and does a token reuse the
// experts of the token before it? The second is what an LRU cache lives on; random-weight
// models have none, trained ones some.
//
// Decode-phase rows only (one row = one token of one MoE layer), in trace order. Per layer:
//   usage: how often each expert was routed; entropy H(usage) / ln(n_expert) (1 = uniform),
//     the busiest expert's share of the slots, experts never routed;
//   reuse: mean over consecutive decode rows of |experts(t) ∩ experts(t-1)| / k;
//   reuse_shuffled: the same with the layer's rows in a random order (seeded: deterministic),
//     the baseline reuse measures against; uniform random routing gives k / n_expert.
// Thread-safety: pure function of its input.
#pragma once

#include <cstdint>
#include <vector>

#include "moestream/route_trace.h"
#include "moestream/status.h"

namespace moestream {

struct LayerRoutingStats {
    uint32_t layer = 0;           // graph layer il
    uint64_t rows = 0;            // decode rows (tokens)
    double entropy_norm = 0;      // H(usage) / ln(n_expert), in [0, 1]
    double top_expert_share = 0;  // busiest expert's slots / all slots
    uint32_t unused_experts = 0;  // never routed in decode
    double reuse = 0;             // mean |E_t ∩ E_{t-1}| / k over consecutive rows
    double reuse_shuffled = 0;    // the same over a seeded permutation of the rows
};

struct RoutingStats {
    uint32_t n_expert = 0, k = 0;
    double reuse_uniform = 0;  // k / n_expert
    std::vector<LayerRoutingStats> layers;
    // Means over layers (weighted by rows).
    double entropy_norm = 0, top_expert_share = 0, reuse = 0, reuse_shuffled = 0;
};

// kBadInput when the trace has fewer than two decode rows in every layer.
Status routing_stats(const RouteTrace & trace, uint64_t seed, RoutingStats * out);

}  // namespace moestream
