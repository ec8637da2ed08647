// request_report.h — the `moestream` object of a `moestream serve` response (docs/server.md):
// what produced it (the engine's settings, the request's own settings and chat format, whether
// it was lossy) and how it went (prompt, prefill, decode and cache figures, the finish).
// Invariants: a pure function of its arguments; it never reads the engine itself (the worker
// passes the engine's stats and settings).
// Thread-safety: may be called from any thread (the worker calls it after a generation).
#pragma once

#include "job.h"
#include "moestream/moestream.h"
#include "server_context.h"
#include "server_util.h"

namespace moestream::server {

// The moestream object of job's response: g is its generation, s and engine_settings the
// engine's stats and settings (JSON) after it; cancelled: the client left or the server stops.
json request_report(const ServerContext & ctx, const Job & job, const GenerateResult & g,
                    const RunStats & s, json engine_settings, bool cancelled);

}  // namespace moestream::server
