// time_json.cpp — see time_json.h.
#include "time_json.h"

#include <cstdio>

namespace moestream::tools {

TimeBreakdown sum_token_times(const std::vector<TokenStats> & tokens) {
    TimeBreakdown d;
    for (const TokenStats & t : tokens) d.add(t);
    return d;
}

nlohmann::json time_breakdown_json(const TimeBreakdown & t, bool per_step) {
    const double n = per_step ? (t.steps ? double(t.steps) : 0) : 1;
    auto v = [n](double x) { return n > 0 ? x / n : 0.0; };
    nlohmann::json j;
    if (!per_step) j["steps"] = t.steps;
    j["step_s"] = v(t.step_s);
    j["compute_s"] = v(t.compute_s);
    j["io_s"] = v(t.io_s);
    j["stage_s"] = v(t.stage_s);
    j["hook_s"] = v(t.hook_s);
    j["sampling_s"] = v(t.sampling_s);
    j["other_s"] = v(t.other_s);
    return j;
}

std::string time_breakdown_line(const TimeBreakdown & t) {
    if (t.steps == 0) return "";
    const double ms = 1e3 / double(t.steps);
    char b[256];
    std::snprintf(b, sizeof b,
                  "time/token %.2f ms: compute %.2f, read wait %.2f, commit %.2f, hook %.2f, "
                  "sampling %.2f, other %.2f",
                  t.step_s * ms, t.compute_s * ms, t.io_s * ms, t.stage_s * ms, t.hook_s * ms,
                  t.sampling_s * ms, t.other_s * ms);
    return b;
}

}  // namespace moestream::tools
