// cli.h — the moestream command line: one file per subcommand, each registering itself on
// the CLI11 app. The CLI is a thin layer: it parses flags, calls the library, prints.
// Exit codes (every subcommand): 0 ok; 64 bad flags (one line + "see --help"); 2 bad model
// file; 3 a file named on the command line cannot be read or written (prompt, text, trace,
// every output); 1 runtime failure (I/O error during generation, llama.cpp refused);
// 130 interrupted (Ctrl-C).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "moestream/moestream.h"
#include "moestream/settings.h"

namespace moestream::cli {

// A MiB in bytes, and a byte count in MiB (the unit of the summaries and the JSON figures).
constexpr uint64_t kMiB = 1ull << 20;
inline double mib(double bytes) { return bytes / double(kMiB); }

// Each add_* registers a subcommand and sets *action to run it when selected.
// The action returns the process exit code.
using Action = std::function<int()>;
void add_run_command(CLI::App & app, Action * action);
void add_inspect_command(CLI::App & app, Action * action);
void add_synth_command(CLI::App & app, Action * action);
void add_replay_command(CLI::App & app, Action * action);
void add_eval_command(CLI::App & app, Action * action);
void add_serve_command(CLI::App & app, Action * action);
void add_chat_command(CLI::App & app, Action * action);
void add_fallback_command(CLI::App & app, Action * action);

// The engine's flags: every row of the settings registry (settings.h) with a flag that this
// subcommand takes (the row's commands column, matched against sub's name), bound to its
// RunOptions field with the row's names, help, type, default and range (-m required, the
// --prefill-readahead / --no-prefill-readahead pair, --seed -1 drawn and printed). Shared by
// run, chat, eval, serve and inspect; *opt must outlive the app.
void add_engine_flags(CLI::App * sub, moestream::RunOptions * opt);

// serve's own flags: every registry row of ServeOptions (settings.h, Setting::command_member),
// bound like the engine's; *opt must outlive the app.
void add_serve_flags(CLI::App * sub, moestream::ServeOptions * opt);
// chat's own flags: every registry row of ChatOptions, bound the same way.
void add_chat_flags(CLI::App * sub, moestream::ChatOptions * opt);
// run's own flags: every registry row of RunCmdOptions, bound the same way.
void add_run_flags(CLI::App * sub, moestream::RunCmdOptions * opt);
// The sampling flags (--top-k --top-p --min-p, the penalties, --ignore-eos, -r): the registry
// rows of SamplingParams, bound into req->sampling, and -r into req->stop. Shared by run, chat
// and serve; *req must outlive the app.
void add_sampling_flags(CLI::App * sub, moestream::GenerateRequest * req);
// --chat-template / --chat-template-file of chat and serve: the registry rows of
// ChatTemplateOptions (the two exclude each other).
void add_chat_template_flags(CLI::App * sub, moestream::ChatTemplateOptions * opt);
// The own flags of eval, inspect, make-fallback, synth and replay: every registry row of
// EvalOptions / InspectOptions / FallbackOptions / SynthCommandOptions / ReplayOptions, bound
// the same way.
void add_eval_flags(CLI::App * sub, moestream::EvalOptions * opt);
void add_inspect_flags(CLI::App * sub, moestream::InspectOptions * opt);
void add_fallback_flags(CLI::App * sub, moestream::FallbackOptions * opt);
void add_synth_flags(CLI::App * sub, moestream::SynthCommandOptions * opt);
void add_replay_flags(CLI::App * sub, moestream::ReplayOptions * opt);

// The library names RunOptions fields in its messages (`RunOptions::n_ctx`, a boolean turned
// off as `RunOptions::stream = false`); this rewrites them as the flags of add_engine_flags
// (-c, --no-stream), for messages the CLI prints.
std::string flag_words(const std::string & msg);

// After parsing: engine flags that the other flags make ineffective are refused by name
// (under --no-stream, the flags of the registry's streaming rows, settings.h kStreaming).
// Returns 0 or the exit code (64).
int check_engine_flags(CLI::App * sub, const moestream::RunOptions & opt);

// -co / --color [on|off|auto] (llama.cpp's spelling; the bare flag is on): *mode is set to
// "on", "off" or "auto" (its default).
void add_color_flag(CLI::App * sub, std::string * mode);
// Whether to colour stdout under --color MODE: never when stdout is not a terminal; "off"
// never; "auto" unless NO_COLOR is set (no-color.org) or TERM=dumb; "on" always (on a terminal).
bool colour_stdout(const std::string & mode);
// The ANSI sequences --color uses: the displayed prompt (run), the user's input (chat), reset.
constexpr const char * kColourPrompt = "\033[33m";
constexpr const char * kColourInput = "\033[1;32m";
constexpr const char * kColourReset = "\033[0m";

// After parsing: --top-k / --top-p / --min-p under greedy are refused, --seed under greedy
// warned about. Returns 0 or the exit code (64).
int check_sampling_flags(CLI::App * sub, const moestream::RunOptions & opt);
// -r values: escapes processed (when escape), an empty one refused (kUsage).
Status process_reverse_prompts(bool escape, std::vector<std::string> * stop);

// Applies -v / -vv to the logger.
void apply_verbosity(int count);
// --log-disable was given (preprocess_args takes it out): errors only, whatever -v says.
bool log_disabled();

// A live progress line on stderr: "moestream: LABEL done/total UNIT | R UNIT/s | ETA S s",
// drawn only when stderr is a terminal and --log-disable was not given, redrawn when the whole
// percent done changes (or on the first update), removed by clear() or the destructor.
// Not thread-safe: one thread updates it.
class ProgressLine {
public:
    ProgressLine(std::string label, std::string unit);
    ~ProgressLine() { clear(); }
    ProgressLine(const ProgressLine &) = delete;
    ProgressLine & operator=(const ProgressLine &) = delete;
    void update(int64_t done, int64_t total);  // nothing drawn once done >= total
    void clear();                              // the line goes (if it was drawn)

private:
    std::string label_, unit_;
    bool on_;              // a terminal, no --log-disable
    bool shown_ = false;   // a line is on screen
    int last_pct_ = -1;    // the percent last drawn
    double t0_ = 0;        // steady clock at construction, seconds
};

// On a terminal (not with --log-disable) a live line of the dense weights read while
// Engine::open loads ("moestream: load 12/340 MiB | ..."), gone once they are read: sets
// opt->on_load_progress.
void show_load_progress(moestream::RunOptions * opt);

// --- chat and serve (cli_chat.cpp): the chat template given instead of the model's ---
// The template text of --chat-template / --chat-template-file (*text; "" = the model's own)
// and how to name it in messages (*from). kBadInput naming the flag and the file when a file
// cannot be read.
Status resolve_chat_template(const moestream::ChatTemplateOptions & f, std::string * text,
                             std::string * from);

// `inspect`: the model's chat template (first file of a split set) as serve would take it:
// {"present", "bytes", "renders", "name", "renderer", "thinking"} or {"renders": false, "error"}.
nlohmann::ordered_json inspect_chat_template(const std::string & path);
// Starts Python's Jinja in the background (chat_jinja.h, prestart_python) when the template
// chat or serve will load needs its start-up cross-check: the text of --chat-template /
// --chat-template-file (flag_text), else the model's own; not for moestream's chatml or a model
// without a template. Called before the model is loaded, so that Python's start overlaps it.
void prestart_template_check(const std::string & model_path, const std::string & flag_text);

// --- Shared by the subcommands (cli_common.cpp; docs/cli.md) ---
extern const char * const kSubcommands[8];
// Prints "moestream CMD: MSG" and "see `moestream CMD --help`" on stderr; returns 64.
int usage_error(const std::string & cmd, const std::string & msg);
// Before CLI11 parses args (argv without argv[0]): an unknown subcommand, llama.cpp flags
// moestream refuses (one line each) and single-dash words CLI11 would split into short flags;
// rewrites llama.cpp's -tb / -ub to their long names. Returns 0, or the exit code (64).
int preprocess_args(CLI::App & app, std::vector<std::string> * args);
// A number as a person writes it: 1, 0.5, 1e-06 (not 1.000000).
std::string fmt_num(double v);
// Validators whose message reads "0 is not in (0, 1]" / "70000 is not in 1..65535".
CLI::Validator int_range(long long lo, long long hi);
CLI::Validator real_range(double lo, double hi, bool lo_open = false);
// Compute threads by default: the physical cores this process may run on (logical CPUs when
// the topology is unknown).
int default_threads();
// llama.cpp's escapes (\n \t \r \\ \' \" \xHH ...) in place; `flag` names the source.
Status process_escapes(const std::string & flag, std::string * s);
// Output files, checked before any work: the directory exists and is writable, the path is
// no directory, no two flags name the same file, and no output is one of `inputs` (flag, path)
// by identity (device + inode, through symbolic and hard links). kBadInput (exit 3), like a
// failed write.
Status check_output_paths(const std::vector<std::pair<std::string, std::string>> & flag_paths,
                          const std::vector<std::pair<std::string, std::string>> & inputs = {});
// The model's files as inputs for check_output_paths: `path` and, when it is named as a shard
// of a split set (NAME-0000K-of-0000N.gguf), every shard of the set.
std::vector<std::pair<std::string, std::string>> model_inputs(const std::string & flag,
                                                              const std::string & path);
Status write_output_file(const std::string & flag, const std::string & path, const std::string & data);
// Prints "moestream: error: MSG" on stderr; returns st.exit_code().
int report(const Status & st);
// From now on SIGINT, SIGTERM and SIGHUP remove `paths` (temporary files of the running
// command; up to 4, each shorter than 4 KiB) and then end the process as the signal would.
void remove_on_signals(const std::vector<std::string> & paths);
// The first of `flags` given on the command line of `sub` is refused: usage_error(flag + why).
int refuse_given(CLI::App * sub, const std::vector<std::string> & flags, const std::string & why);

}  // namespace moestream::cli
