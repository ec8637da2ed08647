// time_json.h — the time breakdown (docs/metrics.md, "Time breakdown") in the shapes the tools
// print: the JSON object of `run --stats-json` and of the server's /stats, and the summary's
// "time/token" line. Shared by the CLI and the server (moestream_tools_common).
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moestream/moestream.h"

namespace moestream::tools {

// The decode steps' breakdown summed from their per-token figures (TimeBreakdown::steps =
// tokens.size()).
TimeBreakdown sum_token_times(const std::vector<TokenStats> & tokens);

// {"steps", "step_s", "compute_s", "io_s", "stage_s", "hook_s", "sampling_s", "other_s"}: the
// totals; per_step: each divided by steps (and no "steps").
nlohmann::json time_breakdown_json(const TimeBreakdown & t, bool per_step);

// "time/token T ms: compute X, read wait Y, commit Z, hook W, sampling S, other O" (means
// over the steps, milliseconds); "" without steps.
std::string time_breakdown_line(const TimeBreakdown & t);

}  // namespace moestream::tools
