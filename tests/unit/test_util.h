// test_util.h — shared helpers for the unit tests: where the test models live, making them
// with the CLI's synth (cached per build dir), running a command and capturing its output.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moestream/gguf_index.h"

namespace moestream::test {

// The prompt the lossy, fallback, trace, replay and split-model tests give the CLI on the tiny
// synth models.
inline constexpr const char * kRouterPrompt =
    "The expert streaming engine reads only what the router selects.";

struct CmdResult {
    int exit_code = -1;   // process exit code (128+signal if killed)
    std::string out;      // stdout
    std::string err;      // stderr
};

// Runs `cmd` through /bin/sh; stdout and stderr captured separately.
CmdResult run_cmd(const std::string & cmd);

// `ENV moestream run -m MODEL -p PROMPT -n N -t 1 FLAGS --stats-json TMP` (with_logits: also
// `--dump-logits TMP2`): exit code, stderr and, when it exited 0, the text of the --stats-json
// file and the dumped logits (both files removed afterwards).
struct StatsRun {
    int rc = -1;
    std::string err;
    std::string stats;
    std::string logits;  // "" unless with_logits
};
StatsRun run_with_stats(const std::string & model, const std::string & prompt, int n_predict,
                        const std::string & flags, const std::string & env = "",
                        bool with_logits = false);

// $MOESTREAM_BIN (the CLI under test) and $MOESTREAM_TEST_MODELS (a cache dir).
std::string cli_bin();
std::string models_dir();
// The source tree: $MOESTREAM_SRC, else the one this test was built from.
std::string src_dir();

// The Python interpreter of the test tools (tests/tools/*.py), shell-quoted: $MOESTREAM_PYTHON,
// else Debian's /usr/bin/python3 (a `python3` found on PATH may be a version manager's shim
// that takes 0.3 s to start; the tools need only the standard library).
std::string python_cmd();
// `python_cmd() tests/tools/gguf_mutate.py` (from $MOESTREAM_SRC), shell-quoted: append
// IN OUT OPS... (the mutator's usage).
std::string gguf_mutate_cmd();

// Path of a synth model (preset, arch, expert type, seed), generated on first use with
// `moestream synth`. Safe when several test processes ask at once (write + rename).
std::string synth_model(const std::string & preset, const std::string & arch,
                        const std::string & type, int seed = 1, int alignment = 32);

// The token ids in a llama.cpp session file (`llama-completion --prompt-cache FILE
// --prompt-cache-all` writes the prompt's ids and every generated one just before it exits):
// a channel that does not depend on the tool's stdout, whose end its asynchronous logger can
// lose on a loaded machine (docs/reliability.md). Empty when FILE is not a session file.
std::vector<int32_t> session_file_tokens(const std::string & path);

// Debian's llama.cpp tools: $LLAMA_TOOL (scripts/llama-tool of the source tree by default).
std::string llama_tool();

// Runs `[env] llama-tool llama-completion ARGS --prompt-cache F --prompt-cache-all` (F a
// temporary session file, removed) and returns its exit code, stderr and the token ids of the
// session file (the prompt's, then every generated one): the tool's greedy output without
// reading its stdout, whose end its asynchronous logger can lose at exit on a loaded machine.
struct LlamaCompletionIds {
    int exit_code = -1;
    std::string err;            // the tool's stderr (its log)
    std::vector<int32_t> ids;   // empty when no session file was written
};
LlamaCompletionIds llama_completion_ids(const std::string & args, const std::string & env = "");

// The session ids of llama-completion are exactly moestream's n_prompt prompt tokens followed
// by its generated `tokens` (stats-json "n_prompt" and "tokens"): same length, same ids.
::testing::AssertionResult same_generation(const std::vector<int32_t> & session_ids, int n_prompt,
                                           const std::vector<int32_t> & tokens);

// A hand-made model index (no file): one MoE layer per entry of `layers`, each with a gate, up
// and down projection (cycling) of the given slice sizes in bytes (type i8: any size is a valid
// shape), n_expert experts each, laid out from first_offset on; n_expert_used is the top-k.
ModelIndex hand_made_index(const std::vector<std::vector<uint64_t>> & layers, uint32_t n_expert,
                           uint32_t n_expert_used, uint64_t first_offset = 4096);

// The whole file as bytes ("" if it cannot be read).
std::string slurp(const std::string & path);
// The text of the source tree's file `rel` (docs/cli.md) between the lines `begin` and `end`
// (markers excluded; "<no markers>" when either is missing).
std::string doc_block(const std::string & rel, const std::string & begin, const std::string & end);
// Replaces the file's content with `data` (false if it cannot be written).
bool write_bytes(const std::string & path, const std::string & data);

// Shell-quotes a string.
std::string sh_quote(const std::string & s);

// RAM held by the open memfds of the page pool ("memfd:moestream-pool"), as the kernel
// counts it (st_blocks), mapped or not.
uint64_t pool_file_bytes();

// A fresh directory "/tmp/moestream-<tag>-XXXXXX", removed with everything in it when the
// object goes. Throws std::runtime_error when it cannot be made.
class TempDir {
public:
    explicit TempDir(const std::string & tag = "test");
    ~TempDir();
    TempDir(const TempDir &) = delete;
    TempDir & operator=(const TempDir &) = delete;
    std::string path(const std::string & name) const { return dir_ + "/" + name; }
    const std::string & dir() const { return dir_; }

private:
    std::string dir_;
};

}  // namespace moestream::test
