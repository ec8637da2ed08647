// settings.h — the one registry of the engine's settings, and what is generated from it.
//
// Every RunOptions field and every environment variable the library or the CLI reads is one
// row of kSettings (settings.cpp): the field, the CLI flag(s), the environment name, the
// default, its class, one doc line, its key in the `settings` JSON, the values its flag takes
// and the commands that take it. From the rows come: the CLI's engine flags (bound, validated
// and set from the row: check_setting_text, set_setting_text) and their --help text, the
// CLI's rewriting of `RunOptions::<field>` into flags (flag_words), the lossy-knob text of
// run / chat / eval / serve, Engine::lossy(), every registry key of the `settings` JSON
// (src/engine/settings_report.h), the environment overlay (apply_env_overlay) and the settings
// tables of docs/cli.md (settings_markdown; a test fails when the doc and the registry differ).
// The flags of serve, chat, run, eval, inspect, make-fallback, synth and replay beyond the
// engine's are rows too, of ServeOptions / ChatOptions / RunCmdOptions / EvalOptions /
// InspectOptions / FallbackOptions / SynthCommandOptions / ReplayOptions, as are the chat
// template's (ChatTemplateOptions) and the sampling flags (SamplingParams,
// GenerateRequest::stop) (Setting::command_member): bound, checked, shown in --help and tabled
// the same way; a pair of flags that exclude each other is a column (Setting::excludes).
//
// Invariants: field names are unique; a row with a field has a value accessor of the field's
// type; an environment name is set by exactly one row; the env overlay parses only the values
// a row's `choices` lists (or, without choices, a value of the field's type); a row's
// `excludes` names a flag of a row that every command of the row takes.
// Thread-safety: the registry is immutable; apply_env_overlay reads the process environment
// (not safe against a concurrent setenv).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "moestream/moestream.h"
#include "moestream/status.h"
#include "moestream/synth.h"

namespace moestream {

// What a setting is for (docs/cli.md, "Settings").
enum class SettingClass {
    kProduction,  // a setting users choose
    kExperiment,  // an A/B switch kept for a benchmark not yet settled; lossless either way
    kLossy,       // opt-in: changes the output vs the all-resident model (docs/lossy-knobs.md)
    kTestOnly,    // negative controls and fault injection of the tests; nothing else sets it
};
const char * setting_class_name(
    SettingClass c);  // "production", "experiment", "lossy", "test-only"

// A typed accessor of one RunOptions field (std::monostate: no field, an environment-only row).
using SettingField = std::variant<std::monostate, int RunOptions::*, int64_t RunOptions::*,
                                  uint32_t RunOptions::*, bool RunOptions::*, float RunOptions::*,
                                  double RunOptions::*, std::string RunOptions::*>;

// The flags of `moestream serve` beyond the engine's (RunOptions): plain values, each a
// registry row (Setting::command_member), that the CLI copies into the server's configuration.
// The defaults are the flags' defaults.
struct ServeOptions {
    std::string host = "127.0.0.1";  // --host: the address to listen on
    int port = 8080;                 // --port: TCP port; 0 = any free port
    std::string api_key;             // --api-key ("" = none)
    std::string api_key_file;        // --api-key-file: the key's file ("" = none)
    int n_predict = -1;              // -n: a request's default max_tokens; -1 = no limit
    std::string cors;                // --cors: the web origin allowed ("" = no CORS headers)
    int queue = 8;                   // --queue: requests that may wait behind the running one
    int64_t max_body = 1 << 20;      // --max-body: the largest request body, bytes
    std::string slot_save_path;      // --slot-save-path: DIR of slot files ("" = none)
    std::string alias;               // --alias: the model's name in the API ("" = the file's)
    bool no_webui = false;           // --no-webui: no web page
    bool lossless = false;           // --lossless: without the app's lossy defaults
};

// The flags of `moestream chat` beyond the engine's and the sampling's: plain values, each a
// registry row (Setting::command_member). The defaults are the flags' defaults.
struct ChatOptions {
    std::string system_prompt;       // --system-prompt, taken as is ("" = none)
    std::string system_prompt_file;  // --system-prompt-file ("" = none)
    int n_predict = -1;              // -n: tokens per reply at most; -1 = no limit
    bool escape = true;              // -e,--escape / --no-escape
    bool cache_prompt = true;        // --cache-prompt / --no-cache-prompt
    std::string reasoning = "auto";  // --reasoning: on | off | auto
    std::string reasoning_effort;    // --reasoning-effort ("" = the template's default)
    bool show_reasoning = true;      // --show-reasoning / --hide-reasoning
    std::string grammar;             // --grammar: GBNF text ("" = none)
    std::string grammar_file;        // --grammar-file ("" = none)
    bool verbose_prompt = false;     // --verbose-prompt
};

// The flags of `moestream run` beyond the engine's and the sampling's: plain values, each a
// registry row (Setting::command_member). The defaults are the flags' defaults.
struct RunCmdOptions {
    std::string prompt = "Once upon a time";  // -p: completed as is (no chat template)
    std::string prompt_file;    // -f: the prompt's file; "-" = stdin ("" = none: -p)
    int n_predict = 64;         // -n: tokens to generate; -1 = until the context is full
    bool escape = true;         // -e,--escape / --no-escape: escapes in -p and -r
    bool display_prompt = false;  // --display-prompt / --no-display-prompt
    std::string stats_json;     // --stats-json: FILE of the run's figures ("" = none)
    std::string stats_csv;      // --stats-csv: FILE of one row per decoded token ("" = none)
    std::string dump_logits;    // --dump-logits: FILE of the last logits ("" = none)
};

// --chat-template / --chat-template-file of chat and serve: the template used instead of the
// model's. The defaults are the flags' defaults (the model's own template).
struct ChatTemplateOptions {
    std::string value;  // --chat-template: the name chatml, a file, or Jinja text ("" = none)
    std::string file;   // --chat-template-file: FILE of Jinja text ("" = none)
};
// The sampling flags of run, chat and serve beyond the engine's --temp / --seed are rows of
// the library's SamplingParams (moestream.h), and -r of GenerateRequest::stop.
// The flags of `moestream eval` beyond the engine's: plain values, each a registry row
// (Setting::command_member). The defaults are the flags' defaults.
struct EvalOptions {
    std::string text_file;  // -f,--file: the text to score (required)
    int max_tokens = 512;   // --max-tokens: tokens of the text scored at most
    int window = 0;         // --window: tokens per context (0 = the whole text in one)
    std::string save_ref;   // --save-ref: keep the reference logits in this file ("" = none)
    std::string ref;        // --ref: reuse the reference logits of this file ("" = compute)
    int bootstrap = 1000;   // --bootstrap: resamples of the 95% intervals
    bool json = false;      // --json: one JSON object instead of text
};

// The flags of `moestream inspect` beyond the engine's (which only shape --plan).
struct InspectOptions {
    bool json = false;  // --json: machine-readable output
    bool plan = false;  // --plan: print the plan a run would get instead of the model
};

// The flags of `moestream make-fallback`: plain values, each a registry row; the CLI copies
// them into MakeFallbackOptions (fallback.h). The defaults are the flags' defaults.
struct FallbackOptions {
    std::string model_path;     // -m,--model (required)
    std::string out_path;       // -o,--output: the companion GGUF (required)
    std::string type = "Q2_K";  // --type: llama-quantize's type of the expert copies
    int n_threads = 0;          // -t,--threads: llama-quantize threads (0 = its default)
    std::string quantize_tool;  // --quantize-tool: the command ("" = the prefix's, else PATH)
};

// The flags of `moestream synth`: the library's SynthOptions (synth.h; its defaults are the
// flags') and what only the CLI does. Each a registry row.
struct SynthCommandOptions : SynthOptions {
    bool force = false;  // --force: overwrite an existing output file
};

// The flags of `moestream replay`: plain values, each a registry row. Lists are the flags'
// comma-separated text (the command splits and checks them). The defaults are the flags'.
struct ReplayOptions {
    std::string trace;           // the route trace file (positional, required)
    std::string budgets;         // --budgets: MiB list ("" = the recorded budget)
    std::string policies = "lru";  // --policy: eviction policies, comma-separated
    std::string drops;           // --drop-cold: fractions ("" = the recorded one)
    bool drop_in_prefill = false;  // --drop-in-prefill
    std::string ks;              // --n-expert-used: experts per token list ("" = the trace's)
    std::string substitute;      // --substitute-experts: margins list ("" = none)
    std::string fallback;        // --miss-fallback: the companion FILE ("" = none)
    double fallback_w = 0;       // --fallback-threshold (0 = not given)
    bool json = false;           // --json
    std::string plot;            // --plot: the PNG to write ("" = none)
    bool validate = false;       // --validate
    bool routing_stats = false;  // --routing-stats
    int warm_split = -1;         // --warm-split: decode tokens the warm set learns from (-1 = off)
    int warm_measure = 64;       // --warm-measure: decode tokens measured after the split
};

// A typed accessor of one field of a command's own options (std::monostate: none).
using CommandField =
    std::variant<std::monostate, int ServeOptions::*, int64_t ServeOptions::*,
                 bool ServeOptions::*, std::string ServeOptions::*, int ChatOptions::*,
                 bool ChatOptions::*, std::string ChatOptions::*, int RunCmdOptions::*,
                 bool RunCmdOptions::*, std::string RunCmdOptions::*,
                 std::string ChatTemplateOptions::*, int SamplingParams::*,
                 float SamplingParams::*, bool SamplingParams::*,
                 std::vector<std::string> GenerateRequest::*, int EvalOptions::*,
                 bool EvalOptions::*, std::string EvalOptions::*, bool InspectOptions::*,
                 int FallbackOptions::*, std::string FallbackOptions::*,
                 std::string SynthCommandOptions::*, uint64_t SynthCommandOptions::*,
                 uint32_t SynthCommandOptions::*, bool SynthCommandOptions::*,
                 float SynthCommandOptions::*, int ReplayOptions::*, bool ReplayOptions::*,
                 double ReplayOptions::*, std::string ReplayOptions::*>;

// The class and value type of a member pointer (Setting::member, Setting::command_member).
template <class M>
struct MemberOf;
template <class C, class V>
struct MemberOf<V C::*> {
    using Class = C;
    using Value = V;
};

// How the CLI binds and checks a row's flag (Setting::traits, or-ed).
enum SettingTrait : unsigned {
    kRequired = 1u << 0,   // every command that takes the flag requires it (-m)
    kStreaming = 1u << 1,  // applies to the streaming loader only: refused under --no-stream
    kExistingDir = 1u << 2,  // the value names a directory that exists (--slot-save-path)
};

struct Setting {
    const char * field;    // RunOptions member ("" = none: read from the environment only)
    SettingField member;   // the same member, typed
    const char * flags;    // CLI11 names ("-c,--ctx-size"; "" = none). A bool whose flag
                           // clears it names the flag that does (--no-stream)
    const char * env;      // environment variable ("" = none)
    const char * choices;  // the values env (and the field) may take, '|'-separated ("" = any
                           // value of the field's type)
    bool env_inverted;     // a 0|1 variable that sets the bool field to its negation
    const char * dflt;     // the default as the user sees it
    SettingClass cls;
    const char * doc;  // one line: what it does (the --help text of its flag)
    const char * key;  // its key in the `settings` JSON ("" = not reported)
    // The values its flag takes, '|'-separated alternatives: an interval "lo..hi" (inclusive;
    // "(lo..hi": the low end excluded), one number with what it means ("0: the model's"), or a
    // word standing for a value ("auto=-1"; the word is also how `settings` reports the value).
    // A string field: the name of its value in --help ("FILE", "DIR"). "" = any value of the
    // field's type. The CLI binds the flag, validates and sets the field from this column.
    const char * range = "";
    // The commands whose flag this is, '|'-separated ("run", "serve|chat"); "" = every command
    // with the engine's flags (run, chat, eval, serve, inspect --plan).
    const char * commands = "";
    unsigned traits = 0;  // SettingTrait bits: how the CLI binds and checks the flag
    // A negation pair: the flag that sets the field's "off" (a bool: false; a number: the
    // range's word `off`) while `flags` sets "on" (true; the word `on`); the two exclude each
    // other ("" = no pair).
    const char * off_flags = "";
    const char * off_doc = "";  // the --help text of off_flags
    // A value of the flag that stands for one drawn when it is read (--seed's -1: a random
    // seed): returns the value drawn as the field's text and sets *note to what it is ("random
    // seed 123"); "" when `text` is no such value. nullptr = the row has none.
    std::string (*draw)(const std::string & text, std::string * note) = nullptr;
    // A row of a command's own options instead of RunOptions (field "", member none): the
    // member and its name ("ServeOptions::port"); bound, checked and set like a field's row.
    CommandField command_member = {};
    const char * command_field = "";
    // The long flag of another row that this flag cannot be given with ("--system-prompt" for
    // --system-prompt-file; serve's --lossless: "--drop-cold-experts"): the CLI refuses the two
    // together on every command that takes both ("" = none).
    const char * excludes = "";
    // The flag a message names for this field: its short name (-c), else its first long name
    // ("" = none).
    std::string flag() const;
    // Whether `command` takes this row's flag (the commands column).
    bool for_command(std::string_view command) const;
};

// Whether the row's field (its RunOptions member or its command member) is of type V.
template <class V>
bool setting_holds(const Setting & s) {
    auto is = [](auto m) {
        if constexpr (std::is_same_v<decltype(m), std::monostate>)
            return false;
        else
            return std::is_same_v<typename MemberOf<decltype(m)>::Value, V>;
    };
    return std::visit(is, s.member) || std::visit(is, s.command_member);
}

// Every row, in the order docs/cli.md lists them.
const std::vector<Setting> & settings_registry();
// The row of a RunOptions field (nullptr: none).
const Setting * find_setting(std::string_view field);
// The row one of whose flag names (or off_flags names) is `flag` ("--color"; nullptr: none): the rows of flags a
// command binds itself (serve's --lossless, run and chat's --color) give it their help text.
const Setting * find_flag_setting(std::string_view flag);
// The --help text of a field's flag: its doc line and, for experiments and test-only rows,
// what class it is in. The field must have a row (else "").
std::string setting_help(std::string_view field);

// A flag's value checked against its row's range and the field's type: "" when it may be set,
// else one line naming the value and what it may be ("8 is not in 16..4194304 (or 0: the
// model's)", "'x' is not a whole number").
std::string check_setting_text(const Setting & s, const std::string & text);
// Sets the row's field from a flag's value that check_setting_text accepted (a word: the value
// it stands for). False (the field unchanged) for a value it would refuse.
// A row's draw (--seed -1) is made here: *note (when given) says what was drawn ("random seed
// 123"; "" when nothing was).
bool set_setting_text(const Setting & s, const std::string & text, RunOptions * opt,
                      std::string * note = nullptr);
// The same for a row of a command's own options (Setting::command_member).
bool set_setting_text(const Setting & s, const std::string & text, ServeOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, ChatOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, RunCmdOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, ChatTemplateOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, SamplingParams * opt);
// GenerateRequest::stop (-r): each value is added to the list.
bool set_setting_text(const Setting & s, const std::string & text, GenerateRequest * opt);
bool set_setting_text(const Setting & s, const std::string & text, EvalOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, InspectOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, FallbackOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, SynthCommandOptions * opt);
bool set_setting_text(const Setting & s, const std::string & text, ReplayOptions * opt);
// The value a bool row's flag sets: the opposite of the field's default (--prefetch sets true,
// --no-stream and --cache-no-move set false; a command row's: of its options' default).
bool setting_flag_value(const Setting & s);
// The field's value as a flag value: a range word where one stands for it ("auto"), else the
// number or text ("" for a row without a field).
std::string setting_value_text(const Setting & s, const RunOptions & opt);
std::string setting_value_text(const Setting & s, const ServeOptions & opt);
std::string setting_value_text(const Setting & s, const ChatOptions & opt);
std::string setting_value_text(const Setting & s, const RunCmdOptions & opt);
std::string setting_value_text(const Setting & s, const ChatTemplateOptions & opt);
std::string setting_value_text(const Setting & s, const SamplingParams & opt);
std::string setting_value_text(const Setting & s, const GenerateRequest & opt);  // -r: ' '-joined
std::string setting_value_text(const Setting & s, const EvalOptions & opt);
std::string setting_value_text(const Setting & s, const InspectOptions & opt);
std::string setting_value_text(const Setting & s, const FallbackOptions & opt);
std::string setting_value_text(const Setting & s, const SynthCommandOptions & opt);
std::string setting_value_text(const Setting & s, const ReplayOptions & opt);
// The numbers the range admits, for --help ("16..4194304|0", "(0, 1]"; "" = any, or only
// words).
std::string setting_range_text(const Setting & s);
// What the flag's value is, for --help: "INT", "FLOAT", the words and the kind of number
// ("auto|INT", "on|off|auto"), a string's name of its value ("FILE") or "TEXT"; "" for a bool.
std::string setting_type_name(const Setting & s);

// The environment overlay: every row with an environment name that is set in the process
// environment sets its field. A malformed value is kUsage naming the variable and the values
// it may take. Rows without a field (test-only variables, the backend path) are read where they
// are used (env_knobs.h).
Status apply_env_overlay(RunOptions * opt);
// The fields with `choices` hold one of them (an embedding program sets fields, so they are
// checked like any option): Ok, or kUsage naming `RunOptions::<field>` and its values.
Status check_setting_choices(const RunOptions & opt);

// The lossy knobs in effect, as flags with their values ("--drop-cold-experts 0.5
// --drop-renorm"; "" when none is). model_top_k: the model's top-k (n_expert_used equal to it
// is lossless); 0 when unknown (then any n_expert_used > 0 is listed).
std::string lossy_knobs_text(const RunOptions & opt, uint32_t model_top_k);
// True when an opt-in lossy knob changes the output (lossy_knobs_text is not empty).
bool lossy_options(const RunOptions & opt, uint32_t model_top_k);
// The options with every lossy knob at its default (eval's reference run).
RunOptions without_lossy_knobs(RunOptions opt);

// The library's `RunOptions::<field>` in a message rewritten as the CLI writes it: the field's
// flag (`RunOptions::stream = false` -> `--no-stream`), or for a field set only from the
// environment, the variable (`RunOptions::slot_cache = 1` -> `MOESTREAM_SLOT_CACHE=1`).
// A field without either keeps the library's name.
std::string option_words(const std::string & msg);

// The settings tables of docs/cli.md (one per class, Markdown), exactly as the doc has them
// between its `<!-- settings:begin -->` and `<!-- settings:end -->` markers.
std::string settings_markdown();

// The plan a run with these options would get on this machine now (inspect --plan), without
// loading the model into llama.cpp: the model's index read and validated, the environment
// overlaid, the options checked, the context and batch chosen, then the rules of the engine's
// resolve with the memory available now, io_threads lanes and O_DIRECT as asked for. *json:
// the array `settings.plan` of a run has ({name, value, reason} per choice). A run's own plan
// may differ where the machine does (memory once the context is made, O_DIRECT refused by the
// file system). Errors as Engine::open's for the same options.
Status describe_plan(const RunOptions & opt, std::string * json);

}  // namespace moestream
