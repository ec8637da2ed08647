// test_stats_run.h — run_with_stats (test_util.h) with its --stats-json text parsed, for the
// gate tests that compare a run's stats (and final logits) with a reference run's. Kept apart
// from test_util.h so that only the tests that parse JSON include nlohmann/json.hpp.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "test_util.h"

namespace moestream::test {

struct ParsedRun {
    int rc = -1;            // the CLI's exit code
    std::string err;        // its stderr
    nlohmann::json stats;   // the parsed --stats-json; null unless rc == 0
    std::string logits;     // the --dump-logits bytes; "" unless rc == 0 and with_logits
};

inline ParsedRun run_parsed(const std::string & model, const std::string & prompt, int n_predict,
                            const std::string & flags, const std::string & env = "",
                            bool with_logits = false) {
    StatsRun r = run_with_stats(model, prompt, n_predict, flags, env, with_logits);
    ParsedRun o{r.rc, r.err, nullptr, r.logits};
    if (r.rc == 0) o.stats = nlohmann::json::parse(r.stats);
    return o;
}

// The stream gates' prompt and length on the tiny synth models (final logits kept).
inline constexpr const char * kGatePrompt =
    "The expert streaming engine reads only what the router selects, token after token.";
inline constexpr int kGateTokens = 12;
inline ParsedRun run_gate(const std::string & model, const std::string & flags,
                          const std::string & env) {
    return run_parsed(model, kGatePrompt, kGateTokens, flags, env, /*with_logits=*/true);
}

// One tiny synth model of a gate test's parameter set, named arch_type in the test names.
struct ArchCase {
    std::string arch, type;
};
inline std::string arch_case_name(const ::testing::TestParamInfo<ArchCase> & i) {
    return i.param.arch + "_" + i.param.type;
}
// How GoogleTest prints the parameter (the ctest names show it): "arch type".
inline void PrintTo(const ArchCase & c, std::ostream * os) { *os << c.arch << ' ' << c.type; }

}  // namespace moestream::test
