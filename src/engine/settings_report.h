// settings_report.h — the `settings` JSON object of every output (Engine::settings_json),
// generated from the registry (settings.h).
//
// Invariants: every registry row with a `settings` key is reported, under that key and nowhere
// else: its field's value (a range word where one stands for it: "auto"), unless the run
// resolved it to something else (the overlap one lane leaves off, the experts per token of the
// model). The rest of the object are observations of the run that are no setting (budgets,
// counters, reasons); an observation never takes a registry key.
// Thread-safety: pure.
#pragma once

#include <nlohmann/json.hpp>

#include "moestream/moestream.h"
#include "moestream/status.h"

namespace moestream {

// *out = every row's key with `resolved[key]` or else the field's value, then `observed`.
// A resolved key that is no row's, or an observed key that is a row's, is an internal error
// (the engine's report would drift from the registry).
Status settings_object(const RunOptions & opt, const nlohmann::json & resolved,
                       const nlohmann::json & observed, nlohmann::json * out);

}  // namespace moestream
