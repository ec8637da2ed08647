// cli.h — the moestream command line: one file per subcommand, each registering itself on
// the CLI11 app. The CLI is a thin layer: it parses flags, calls the library, prints.
// Exit codes: 0 ok; 64 bad flags (usage printed); 2 bad model file; 3 bad input file;
// 1 runtime failure (I/O error during generation, llama.cpp refused).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "moestream/moestream.h"

namespace moestream::cli {

// Each add_* registers a subcommand and sets *action to run it when selected.
// The action returns the process exit code.
using Action = std::function<int()>;
void add_run_command(CLI::App & app, Action * action);
void add_inspect_command(CLI::App & app, Action * action);
void add_synth_command(CLI::App & app, Action * action);
void add_replay_command(CLI::App & app, Action * action);
void add_eval_command(CLI::App & app, Action * action);
void add_serve_command(CLI::App & app, Action * action);

// The engine's flags (-t -c -b --temp --seed --no-stream --io-threads --no-odirect --cache-mb
// --force-cache --cache-debug and the lossy knobs), shared by run and serve; *opt must outlive
// the app.
void add_engine_flags(CLI::App * sub, moestream::RunOptions * opt);

// Applies -v / -vv to the logger.
void apply_verbosity(int count);

}  // namespace moestream::cli
