// fuzz_route_trace.cpp — libFuzzer target for the route-trace reader (parse_route_trace,
// include/moestream/route_trace.h). docs/reliability.md, "Fuzzing". Input: the trace file's bytes. Seeds:
// traces recorded by `moestream run --route-trace` on synth models.
//
// Checked: no crash / sanitizer report / abort; on success the parsed trace is consistent
// (every routing's slots inside the slot arrays, expert ids < n_expert, known flags only).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "moestream/log.h"
#include "moestream/route_trace.h"

using namespace moestream;

namespace {
void check(bool ok, const char * what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_route_trace: invariant violated: %s\n", what);
        std::abort();
    }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log_set_level(LogLevel::kError);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    RouteTrace t;
    Status st = parse_route_trace(data, size, "fuzz", &t);
    if (!st.ok()) {
        check(st.code() == ErrorCode::kBadInput && !st.message().empty(), "error is kBadInput");
        return 0;
    }
    check(t.expert.size() == t.weight.size() && t.expert.size() == t.flags.size(), "slot arrays agree");
    check(t.score_order.size() == t.scores.size() &&
              t.scores.size() % t.header.n_expert == 0 && (t.header.scores || t.scores.empty()),
          "score arrays agree");
    for (const TraceRouting & r : t.routings) {
        check(r.moe_idx < t.header.moe_layers.size(), "moe_idx in range");
        const uint64_t n = uint64_t(r.n_rows) * r.k;
        check(r.first_slot <= t.expert.size() && n <= t.expert.size() - r.first_slot, "slots in range");
        check(r.score_rows == 0 || (r.score_rows == r.n_rows && r.decode), "score rows");
        const uint64_t score_rows = t.scores.size() / t.header.n_expert;
        check(r.first_score_row <= score_rows && r.score_rows <= score_rows - r.first_score_row,
              "score rows in range");
        for (uint64_t i = r.first_score_row * t.header.n_expert;
             i < (r.first_score_row + r.score_rows) * t.header.n_expert; ++i)
            check(t.score_order[i] < t.header.n_expert, "router order ids < n_expert");
        for (uint64_t i = r.first_slot; i < r.first_slot + n; ++i) {
            check(t.expert[i] >= 0 && uint32_t(t.expert[i]) < t.header.n_expert, "expert id < n_expert");
            check((t.flags[i] & ~kSlotKnownFlags) == 0, "known flags only");
        }
    }
    return 0;
}
