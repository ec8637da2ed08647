// step_timing.h — the boundaries one llama_decode is timed at, for the time breakdown
// (docs/metrics.md, "Time breakdown"). EngineImpl::decode measures them with the steady clock
// (now_s, the clock of every other figure); RunStatsAssembly turns them, with the streamer's
// read wait (io_s) and store time (stage_s), into disjoint buckets.
#pragma once

namespace moestream {

struct StepTiming {
    double wall_s = 0;      // EngineImpl::decode, start to end
    double llama_s = 0;     // of wall_s: llama_decode itself
    double callback_s = 0;  // of llama_s: inside the router hook's eval callbacks
    double edges_s = 0;     // of wall_s: the hook and streamer between graphs (begin_step,
                            // begin_graph, end_graph and its drain)
};

}  // namespace moestream
