// settings.cpp — the registry of settings (include/moestream/settings.h) and what is generated
// from it. Adding a setting: one row here, the field in RunOptions, the feature, its test.
#include "moestream/settings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <cmath>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "moestream/log.h"
#include "settings_report.h"

namespace moestream {
namespace {

using C = SettingClass;
using R = RunOptions;
using S = ServeOptions;
using H = ChatOptions;
using Ev = EvalOptions;
using In = InspectOptions;
using Fb = FallbackOptions;
using Sy = SynthCommandOptions;
using Rp = ReplayOptions;
using P = SamplingParams;
using G = GenerateRequest;
using U = RunCmdOptions;
using T = ChatTemplateOptions;

// --seed -1: a random seed (Setting::draw).
std::string draw_seed(const std::string & text, std::string * note) {
    if (text != "-1") return "";
    const std::string v = std::to_string(std::random_device{}());
    *note = "random seed " + v;
    return v;
}

// One row per setting. Order: as docs/cli.md lists them (by class, then as here).
const std::vector<Setting> kSettings = {
    // --- production ---
    {"model_path", &R::model_path, "-m,--model", "", "", false, "(required)", C::kProduction,
     "GGUF model file (or any shard of a split set)", "model", "FILE", "", kRequired},
    {"n_threads", &R::n_threads, "-t,--threads", "", "", false,
     "the physical cores this process may use", C::kProduction,
     "compute threads (default: the physical cores this process may use)", "n_threads", "1..512"},
    {"n_threads_batch", &R::n_threads_batch, "--threads-batch", "", "", false, "0", C::kProduction,
     "threads for prompt batches (-tb; 0 = as -t)", "n_threads_batch", "0..512"},
    {"flash_attn", &R::flash_attn, "--flash-attn", "", "", false, "auto", C::kProduction,
     "llama.cpp's flash attention (-fa): on, off or auto (llama.cpp's choice)", "flash_attn", "on=1|off=0|auto=-1"},
    {"n_ctx", &R::n_ctx, "-c,--ctx-size", "", "", false, "0", C::kProduction,
     "context length; 0 = the model's training context, capped so the KV cache takes at most "
     "1/4 of the memory available",
     "n_ctx", "16..4194304|0: the model's"},
    {"n_batch", &R::n_batch, "-b,--batch-size,--batch", "", "", false, "0", C::kProduction,
     "prompt tokens per decode (0 = chosen for the memory: 512, or more when streaming and the "
     "cache cannot hold every expert; -v says why)",
     "n_batch", "0..65536"},
    {"n_ubatch", &R::n_ubatch, "--ubatch-size", "", "", false, "0", C::kProduction,
     "llama.cpp's physical batch (-ub; 0 = as -b; at most -b)", "n_ubatch", "0..65536"},
    {"temp", &R::temp, "--temp", "", "", false, "0", C::kProduction,
     "sampling temperature; 0 = greedy", "temp", "0..100"},
    {"seed", &R::seed, "-s,--seed", "", "", false, "1", C::kProduction,
     "sampling seed; -1 = random (printed)", "seed", "0..4294967295|-1: random", "", 0, "", "",
     draw_seed},
    {"stream", &R::stream, "--no-stream", "", "", false, "streaming", C::kProduction,
     "llama.cpp's own loading, everything resident (the reference)", "stream"},
    {"resident_mmap", &R::resident_mmap, "--no-mmap", "", "", false, "map the file", C::kProduction,
     "with --no-stream: read every tensor into memory at load instead of mapping the file (no "
     "first-touch cost in the first decodes)",
     "mmap"},
    {"io_threads", &R::io_threads, "--io-threads", "", "", false, "4", C::kProduction,
     "parallel read lanes (calling thread included)", "io_threads", "1..64", "", kStreaming},
    {"odirect", &R::odirect, "--no-odirect", "", "", false, "O_DIRECT", C::kProduction,
     "buffered reads instead of O_DIRECT", "odirect_requested", "", "", kStreaming},
    {"io_overlap", &R::io_overlap, "--no-io-overlap", "", "", false, "overlap", C::kProduction,
     "wait for every read of a layer before its first expert matmul (default: the "
     "down-projection reads overlap the gate/up matmuls)",
     "io_overlap", "", "", kStreaming},
    {"cache_mb", &R::cache_mb, "--cache-mb", "", "", false, "auto", C::kProduction,
     "expert cache budget in MiB: auto, 0 = off, N", "cache_mb_requested", "0..1099511627776|auto=-1",
     "", kStreaming},
    {"force_cache", &R::force_cache, "--force-cache", "", "", false, "off", C::kProduction,
     "allow a --cache-mb below 1.5 x the model's per-token working set (moestream inspect: "
     "cache rule)",
     "", "", "", kStreaming},
    {"drop_cold_later", &R::drop_cold_later, "", "", "", false, "false", C::kProduction,
     "library only: the caller may turn drop-cold on later (set_drop_cold); every cache store "
     "runs it, so this changes nothing (kept for callers that set it)",
     ""},
    {"prefetch", &R::prefetch, "--prefetch", "", "", false, "off", C::kProduction,
     "read the experts predicted for the next layer while this layer computes (lossless; needs "
     "2+ io threads, and with --cache-mb 0 a second set of expert slots if memory allows; reads "
     "more bytes; docs/prefetch.md)",
     "prefetch_requested", "", "", kStreaming},
    {"prefill_readahead", &R::prefill_readahead, "--prefill-readahead", "", "", false,
     "where it applies", C::kProduction,
     "in prefill, read the next layer's experts guessed for the ubatch's rows while this layer "
     "computes (lossless; on by default where it applies: streaming, 2+ io threads, no "
     "--drop-cold-experts / --substitute-experts; given, it is refused where it cannot apply; with --cache-mb 0 a second set of expert slots if memory allows; "
     "docs/prefetch.md)",
     "prefill_readahead_option", "on=1|off=0|where it applies=-1", "", kStreaming,
     "--no-prefill-readahead", "no prefill read-ahead (reads only what each prompt ubatch routes)"},
    {"route_trace", &R::route_trace, "--route-trace", "", "", false, "none", C::kProduction,
     "record every routing to FILE (docs/route-trace.md; `moestream replay` reads it)", "", "FILE", "run|eval",
     kStreaming},
    {"route_trace_scores", &R::route_trace_scores, "--route-trace-scores", "", "", false, "off",
     C::kProduction,
     "also record each decode row's full router scores in the trace (n_expert per layer; for "
     "`replay --substitute-experts`)",
     "", "", "run|eval"},
    {"prompt_cache", &R::prompt_cache, "--prompt-cache", "", "", false, "off", C::kProduction,
     "keep the prompt's KV in DIR (made if missing) and restore the longest stored prefix of a "
     "later prompt instead of prefilling it (lossless: byte-identical to a cold run; "
     "docs/prompt-cache.md)",
     "prompt_cache", "DIR"},
    {"prompt_cache_mb", &R::prompt_cache_mb, "--prompt-cache-mb", "", "", false, "4096",
     C::kProduction,
     "what --prompt-cache's files may take on disk, MiB (least recently used removed first)",
     "prompt_cache_mb", "1..1099511627776"},
    {"warm_experts", &R::warm_experts, "--warm-experts", "", "", false, "off", C::kProduction,
     "count which experts decode routes in FILE (or `auto`: a file per model under "
     "$XDG_CACHE_HOME/moestream/warm, else ~/.cache/moestream/warm) and, at start, read its "
     "hottest experts that fit the cache into it in the background (lossless; "
     "docs/prompt-cache.md)",
     "warm_experts", "FILE|auto"},
    {"",
     {},
     "-co,--color",
     "",
     "on|off|auto",
     false,
     "auto",
     C::kProduction,
     "run and chat: colour the displayed prompt (run --display-prompt) and the typed input "
     "(chat) apart from the generated text; auto = on a terminal unless NO_COLOR is set, the "
     "bare flag = on; a pipe is never coloured",
     "",
     "",
     "run|chat"},
    // --- serve's own flags (ServeOptions; the CLI copies them into the server's configuration) ---
    {.field = "", .member = {}, .flags = "--host", .env = "", .choices = "", .env_inverted = false,
     .dflt = "127.0.0.1", .cls = C::kProduction,
     .doc = "address to listen on (default 127.0.0.1: this machine only)",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::host, .command_field = "ServeOptions::host"},
    {.field = "", .member = {}, .flags = "--port", .env = "", .choices = "", .env_inverted = false,
     .dflt = "8080", .cls = C::kProduction,
     .doc = "TCP port; 0 = any free port (printed)",
     .key = "", .range = "0..65535", .commands = "serve", .traits = 0,
     .command_member = &S::port, .command_field = "ServeOptions::port"},
    {.field = "", .member = {}, .flags = "--api-key", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "require 'Authorization: Bearer KEY' on /v1/* and /stats (or set MOESTREAM_API_KEY)",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::api_key, .command_field = "ServeOptions::api_key"},
    {.field = "", .member = {}, .flags = "-n,--n-predict", .env = "", .choices = "", .env_inverted = false,
     .dflt = "-1", .cls = C::kProduction,
     .doc = "default max_tokens of a request; -1 (default) = until the end of generation or the context is full",
     .key = "", .range = "-1..4194304", .commands = "serve", .traits = 0,
     .command_member = &S::n_predict, .command_field = "ServeOptions::n_predict"},
    {.field = "", .member = {}, .flags = "--cors", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "allow this web origin (e.g. http://localhost:3000) to call the API from a browser (CORS)",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::cors, .command_field = "ServeOptions::cors"},
    {.field = "", .member = {}, .flags = "--queue", .env = "", .choices = "", .env_inverted = false,
     .dflt = "8", .cls = C::kProduction,
     .doc = "requests that may wait behind the running one",
     .key = "", .range = "0..1024", .commands = "serve", .traits = 0,
     .command_member = &S::queue, .command_field = "ServeOptions::queue"},
    {.field = "", .member = {}, .flags = "--max-body", .env = "", .choices = "", .env_inverted = false,
     .dflt = "1048576", .cls = C::kProduction,
     .doc = "largest request body in bytes (413 above)",
     .key = "", .range = "1024..1073741824", .commands = "serve", .traits = 0,
     .command_member = &S::max_body, .command_field = "ServeOptions::max_body"},
    {.field = "", .member = {}, .flags = "--slot-save-path", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "directory of POST /slots/0?action=save|restore files (llama-server's slot save/restore: the KV the context holds; docs/server.md)",
     .key = "", .range = "DIR", .commands = "serve", .traits = kExistingDir,
     .command_member = &S::slot_save_path, .command_field = "ServeOptions::slot_save_path"},
    {.field = "", .member = {}, .flags = "--api-key-file", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "read the API key from the first line of this file (not shown by `ps`)",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::api_key_file, .command_field = "ServeOptions::api_key_file",
     .excludes = "--api-key"},
    {.field = "", .member = {}, .flags = "--alias", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the file's name", .cls = C::kProduction,
     .doc = "the model's name in the API (/v1/models, `model` of replies; default: the file's name)",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::alias, .command_field = "ServeOptions::alias"},
    {.field = "", .member = {}, .flags = "--no-webui", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the web page", .cls = C::kProduction,
     .doc = "serve the API only: no web page (GET / is a 404)",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::no_webui, .command_field = "ServeOptions::no_webui"},
    {.field = "", .member = {}, .flags = "--lossless", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the app's lossy defaults", .cls = C::kProduction,
     .doc = "start without the app's lossy defaults",
     .key = "", .range = "", .commands = "serve", .traits = 0,
     .command_member = &S::lossless, .command_field = "ServeOptions::lossless",
     .excludes = "--drop-cold-experts"},
    // --- chat's own flags (ChatOptions) ---
    {.field = "", .member = {}, .flags = "--system-prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "system prompt (-sys), taken as is",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::system_prompt, .command_field = "ChatOptions::system_prompt"},
    {.field = "", .member = {}, .flags = "--system-prompt-file", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "read the system prompt from a file (-sysf)",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::system_prompt_file, .command_field = "ChatOptions::system_prompt_file",
     .excludes = "--system-prompt"},
    {.field = "", .member = {}, .flags = "-n,--n-predict", .env = "", .choices = "", .env_inverted = false,
     .dflt = "-1", .cls = C::kProduction,
     .doc = "tokens per reply at most; -1 = until end-of-generation or the context is full",
     .key = "", .range = "-1..16777216", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::n_predict, .command_field = "ChatOptions::n_predict"},
    {.field = "", .member = {}, .flags = "-e,--escape", .env = "", .choices = "", .env_inverted = false,
     .dflt = "on", .cls = C::kProduction,
     .doc = "process escapes in each turn and -r (\\n \\t \\\\ \\xHH ...; the default)",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "--no-escape",
     .off_doc = "take turns and -r literally", .command_member = &H::escape, .command_field = "ChatOptions::escape"},
    {.field = "", .member = {}, .flags = "--cache-prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "on", .cls = C::kProduction,
     .doc = "reuse the previous turn's KV cache: prefill only the new tokens (the default)",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "--no-cache-prompt",
     .off_doc = "prefill the whole conversation every turn", .command_member = &H::cache_prompt, .command_field = "ChatOptions::cache_prompt"},
    {.field = "", .member = {}, .flags = "--reasoning", .env = "", .choices = "on|off|auto", .env_inverted = false,
     .dflt = "auto", .cls = C::kProduction,
     .doc = "thinking (-rea): on, off or auto (the template's default); off on a template that cannot turn it off, and on for one without thinking, are refused",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::reasoning, .command_field = "ChatOptions::reasoning"},
    {.field = "", .member = {}, .flags = "--reasoning-effort", .env = "", .choices = "low|medium|high", .env_inverted = false,
     .dflt = "the template's", .cls = C::kProduction,
     .doc = "the harmony (gpt-oss) template's reasoning level: low, medium (its default) or high; refused for other templates",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::reasoning_effort, .command_field = "ChatOptions::reasoning_effort"},
    {.field = "", .member = {}, .flags = "--show-reasoning", .env = "", .choices = "", .env_inverted = false,
     .dflt = "on", .cls = C::kProduction,
     .doc = "show a reply's reasoning apart from its answer: dimmed on a terminal, else on stderr as lines prefixed 'thinking: ' (the default)",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "--hide-reasoning",
     .off_doc = "show only the answer (the reasoning is still generated)", .command_member = &H::show_reasoning, .command_field = "ChatOptions::show_reasoning"},
    {.field = "", .member = {}, .flags = "--grammar", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "constrain every reply to this GBNF grammar (llama.cpp's format)",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::grammar, .command_field = "ChatOptions::grammar"},
    {.field = "", .member = {}, .flags = "--grammar-file", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "read the --grammar from a file",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::grammar_file, .command_field = "ChatOptions::grammar_file",
     .excludes = "--grammar"},
    {.field = "", .member = {}, .flags = "--verbose-prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print each turn's rendered prompt on stderr before its reply",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::verbose_prompt, .command_field = "ChatOptions::verbose_prompt"},
    // --- the sampling flags of run, chat and serve (SamplingParams; -r: GenerateRequest) ---
    {.field = "", .member = {}, .flags = "--top-k", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "with --temp > 0: keep the K likeliest tokens; 0 = off",
     .key = "", .range = "0..1048576", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::top_k, .command_field = "SamplingParams::top_k"},
    {.field = "", .member = {}, .flags = "--top-p", .env = "", .choices = "", .env_inverted = false,
     .dflt = "1", .cls = C::kProduction,
     .doc = "with --temp > 0: nucleus sampling; 1 = off",
     .key = "", .range = "(0..1", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::top_p, .command_field = "SamplingParams::top_p"},
    {.field = "", .member = {}, .flags = "--min-p", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "with --temp > 0: drop tokens below P x the likeliest's probability; 0 = off",
     .key = "", .range = "0..1", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::min_p, .command_field = "SamplingParams::min_p"},
    {.field = "", .member = {}, .flags = "--repeat-penalty", .env = "", .choices = "", .env_inverted = false,
     .dflt = "1", .cls = C::kProduction,
     .doc = "divide the logits of recent tokens by this (greedy too); 1 = off",
     .key = "", .range = "(0..100", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::repeat_penalty, .command_field = "SamplingParams::repeat_penalty"},
    {.field = "", .member = {}, .flags = "--repeat-last-n", .env = "", .choices = "", .env_inverted = false,
     .dflt = "64", .cls = C::kProduction,
     .doc = "tokens (prompt included) the penalties look back on; 0 = off, -1 = the context",
     .key = "", .range = "-1..4194304", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::repeat_last_n, .command_field = "SamplingParams::repeat_last_n"},
    {.field = "", .member = {}, .flags = "--presence-penalty", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "subtract this once from every recent token's logit; 0 = off",
     .key = "", .range = "-2..2", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::presence_penalty, .command_field = "SamplingParams::presence_penalty"},
    {.field = "", .member = {}, .flags = "--frequency-penalty", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "subtract this x its count from every recent token's logit; 0 = off",
     .key = "", .range = "-2..2", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::frequency_penalty, .command_field = "SamplingParams::frequency_penalty"},
    {.field = "", .member = {}, .flags = "--ignore-eos", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "never stop at an end-of-generation token",
     .key = "", .range = "", .commands = "run|chat|serve", .traits = 0,
     .command_member = &P::ignore_eos, .command_field = "SamplingParams::ignore_eos"},
    {.field = "", .member = {}, .flags = "-r,--reverse-prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "stop when the text contains this (not printed); repeatable",
     .key = "", .range = "", .commands = "run|chat|serve", .traits = 0,
     .command_member = &G::stop, .command_field = "GenerateRequest::stop"},
    // --- run's own flags (RunCmdOptions) ---
    {.field = "", .member = {}, .flags = "-p,--prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "Once upon a time", .cls = C::kProduction,
     .doc = "prompt text, completed as is (no chat template)",
     .key = "", .range = "", .commands = "run", .traits = 0,
     .command_member = &U::prompt, .command_field = "RunCmdOptions::prompt"},
    {.field = "", .member = {}, .flags = "-f,--file", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "read the prompt from a file; - = stdin",
     .key = "", .range = "", .commands = "run", .traits = 0,
     .command_member = &U::prompt_file, .command_field = "RunCmdOptions::prompt_file",
     .excludes = "--prompt"},
    {.field = "", .member = {}, .flags = "-n,--n-predict", .env = "", .choices = "", .env_inverted = false,
     .dflt = "64", .cls = C::kProduction,
     .doc = "tokens to generate; -1 = until the context is full",
     .key = "", .range = "-1..16777216", .commands = "run", .traits = 0,
     .command_member = &U::n_predict, .command_field = "RunCmdOptions::n_predict"},
    {.field = "", .member = {}, .flags = "-e,--escape", .env = "", .choices = "", .env_inverted = false,
     .dflt = "on", .cls = C::kProduction,
     .doc = "process escapes in -p (\\n \\t \\\\ \\xHH ...; the default)",
     .key = "", .range = "", .commands = "run", .traits = 0, .off_flags = "--no-escape",
     .off_doc = "take -p literally", .command_member = &U::escape,
     .command_field = "RunCmdOptions::escape"},
    {.field = "", .member = {}, .flags = "--display-prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print the prompt before the generated text",
     .key = "", .range = "", .commands = "run", .traits = 0, .off_flags = "--no-display-prompt",
     .off_doc = "print only the generated text (the default)", .command_member = &U::display_prompt,
     .command_field = "RunCmdOptions::display_prompt"},
    {.field = "", .member = {}, .flags = "--stats-json", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "write the run's figures as one JSON object",
     .key = "", .range = "", .commands = "run", .traits = 0,
     .command_member = &U::stats_json, .command_field = "RunCmdOptions::stats_json"},
    {.field = "", .member = {}, .flags = "--stats-csv", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "write one row per decoded token",
     .key = "", .range = "", .commands = "run", .traits = 0,
     .command_member = &U::stats_csv, .command_field = "RunCmdOptions::stats_csv"},
    {.field = "", .member = {}, .flags = "--dump-logits", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "write the last step's logits (raw float32)",
     .key = "", .range = "", .commands = "run", .traits = 0,
     .command_member = &U::dump_logits, .command_field = "RunCmdOptions::dump_logits"},
    // --- the chat template of chat and serve (ChatTemplateOptions) ---
    {.field = "", .member = {}, .flags = "--chat-template", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the model's", .cls = C::kProduction,
     .doc = "use this chat template instead of the model's: the name chatml, a file, or the Jinja "
            "text itself",
     .key = "", .range = "", .commands = "chat|serve", .traits = 0,
     .command_member = &T::value, .command_field = "ChatTemplateOptions::value"},
    {.field = "", .member = {}, .flags = "--chat-template-file", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "read the chat template (Jinja) from a file instead of the model's",
     .key = "", .range = "", .commands = "chat|serve", .traits = 0,
     .command_member = &T::file, .command_field = "ChatTemplateOptions::file",
     .excludes = "--chat-template"},
    {"",
     {},
     "",
     "GGML_BACKEND_PATH",
     "",
     false,
     "unset",
     C::kProduction,
     "load exactly this ggml CPU backend .so (the gates pin the same one for moestream and "
     "llama.cpp's tools)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_GGML_BACKEND_DIR",
     "",
     false,
     "the prefix's backends",
     C::kProduction,
     "where ggml picks a backend variant for this CPU",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_LOG",
     "",
     false,
     "warn",
     C::kProduction,
     "the log level before any flag is read (error, warn, info, debug)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_API_KEY",
     "",
     false,
     "unset",
     C::kProduction,
     "`serve`: the API key requests must carry (as --api-key)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_PYTHON",
     "",
     false,
     "/usr/bin/python3, else python3 on PATH",
     C::kProduction,
     "`replay --plot`: the Python (with matplotlib) that draws the plot; the tests' Python too",
     ""},
    // --- lossy ---
    {"n_expert_used", &R::n_expert_used, "--n-expert-used", "", "", false, "the model's top-k",
     C::kLossy, "experts per token, 1..the model's top-k (0 = the model's)", "n_expert_used", "1..65536"},
    {"drop_cold", &R::drop_cold, "--drop-cold-experts", "", "", false, "0", C::kLossy,
     "skip a routed expert that is a cache miss with final weight < F/k (F in (0, 1]; 0 = off)",
     "drop_cold_experts", "(0..1"},
    {"drop_in_prefill", &R::drop_in_prefill, "--drop-in-prefill", "", "", false, "off", C::kLossy,
     "also drop during prefill", "drop_in_prefill"},
    {"drop_renorm", &R::drop_renorm, "--drop-renorm", "", "", false, "off", C::kLossy,
     "renormalize the remaining weights after a drop", "drop_renorm"},
    {"substitute", &R::substitute, "--substitute-experts", "", "", false, "0", C::kLossy,
     "compute a routed cache miss (never the top expert) with the best resident unselected "
     "expert whose router probability is less than M below it (M in [0, 1]; 0 = off)",
     "substitute_experts", "0..1"},
    {"miss_fallback", &R::miss_fallback, "--miss-fallback", "", "", false, "none", C::kLossy,
     "compute a decode cache miss whose final router weight is below --fallback-threshold from "
     "the low-bit copy in FILE (made by `moestream make-fallback`)",
     "miss_fallback", "FILE"},
    {"fallback_threshold", &R::fallback_threshold, "--fallback-threshold", "", "", false, "0.1",
     C::kLossy, "final router weight below which --miss-fallback applies (W in (0, 1])",
     "fallback_threshold", "(0..1"},
    // --- experiments ---
    {"cache_recycle", &R::cache_recycle, "--cache-no-recycle", "", "", false, "recycle",
     C::kExperiment,
     "commit fresh zero-filled pages for every cache miss and free them on eviction (default: "
     "reuse the evicted expert's pages). Settled for recycled pages (cache-recycle benchmark: "
     "fresh pages decode at 0.81x / 0.80x at 4000 / 6000 MiB); kept because fresh pages are the "
     "path taken where memfd_create is missing (docs/arm64.md) and this reproduces it on any "
     "host for its tests",
     "cache_recycle", "", "", kStreaming},
    {"cache_move", &R::cache_move, "--cache-no-move", "", "", false, "move", C::kExperiment,
     "unmap an evicted expert's recycled pages and map them afresh for the next miss (default: "
     "move the mapping with mremap). Not settled (cache-move benchmark): moving decodes at "
     "1.07x [0.98, 1.16] / 0.92x [0.83, 1.03] / 1.03x [0.96, 1.09] of unmapping at 4000 / 6000 "
     "MiB / auto; kept because unmapping is the path taken where mremap(MREMAP_DONTUNMAP) is "
     "missing (docs/arm64.md) and this reproduces it on any host for its tests",
     "cache_move", "", "", kStreaming},
    {"prefetch_uring", &R::prefetch_uring, "", "MOESTREAM_PREFETCH_NO_URING", "0|1", true, "0",
     C::kExperiment,
     "1: --prefetch tails are read by the worker lanes instead of io_uring. Not settled: no "
     "published benchmark compares the two for prefetch tails (decode-knobs measures demand "
     "reads only: io_uring at 0.99x-1.00x of the lanes); kept because the lanes are the path "
     "taken where the kernel refuses a ring or reads are buffered, and this reproduces it on "
     "any host",
     "prefetch_io"},
    {"overlap_stages", &R::overlap_stages, "", "MOESTREAM_OVERLAP_STAGES", "2|3", false, "3",
     C::kExperiment,
     "which expert reads a layer waits for before its first expert matmul: 2 gate and up; 3 "
     "only the projection the graph multiplies first, the second waited for before its own "
     "matmul (docs/design.md). Off with the overlap. Not settled (decode-split benchmark): "
     "three stages decode at 1.02x [0.92, 1.14] / 1.01x [0.91, 1.12] / 0.99x [0.94, 1.06] / "
     "0.97x [0.91, 1.04] of two at 2000 / 4000 / 6000 MiB / auto; kept because the overlap "
     "and split-staging tests run the two-stage wait with it",
     "io_overlap_stages"},
    {"staged_reads", &R::staged_reads, "", "MOESTREAM_STAGED_READS", "0|1", false, "1",
     C::kExperiment,
     "1: the read lanes start a stage's reads only once the earlier stages' reads are in. Not "
     "settled (decode-split benchmark): staged reads decode at 1.00x [0.88, 1.13] / 1.02x "
     "[0.91, 1.13] / 0.99x [0.92, 1.05] / 1.00x [0.93, 1.07] of unstaged at 2000 / 4000 / "
     "6000 MiB / auto; kept because the overlap tests run byte-identity cases both ways",
     "io_staged_reads"},
    {"stage_split", &R::stage_split, "", "MOESTREAM_STAGE_SPLIT", "0|1", false, "1", C::kExperiment,
     "1: a routing's reads start once the first stage's slices are committed, the rest "
     "committed while they read (docs/cache.md, \"Split staging\"). Not settled "
     "(engine-defaults benchmark): split staging decodes at 1.02x [0.91, 1.13] / 1.02x [0.95, "
     "1.11] / 1.01x [0.94, 1.08] / 0.95x [0.88, 1.04] of none at 2000 / 4000 / 6000 MiB / "
     "auto; kept because the split-staging and server tests use 0 as their control (no slice "
     "deferred)",
     "io_stage_split"},
    {"prefill_guess", &R::prefill_guess, "", "MOESTREAM_PREFILL_GUESS", "rows|bank", false, "rows",
     C::kExperiment,
     "what prefill read-ahead reads for the next MoE layer: the union of the ubatch rows' "
     "guesses, or the layer's whole bank (docs/prefetch.md). Not settled: no published "
     "benchmark compares the two (prefill-readahead measures rows against no read-ahead); "
     "kept because the prefill tests check both guesses byte-identical and compare their reads",
     "prefill_guess"},
    {"pool_warm", &R::pool_warm, "", "MOESTREAM_POOL_WARM", "0|1", false, "0", C::kExperiment,
     "1: the LRU cache's page pool zero-fills up to the budget's worth of pages in a "
     "low-priority thread from the cache's creation on (docs/cache.md, \"Pool warm-up\"). Not "
     "settled (engine-defaults benchmark): warm-up decodes at 0.98x [0.93, 1.04] of none at "
     "auto after a 1000-token prompt; kept because the memory-limit and cache tests check its "
     "pages and counters under a cap with it",
     "cache_pool_warm"},
    {"slot_cache", &R::slot_cache, "", "MOESTREAM_SLOT_CACHE", "auto|0|1", false, "auto",
     C::kExperiment,
     "which store holds a cache budget: auto, the fixed-slot cache where it can run, else the "
     "LRU cache; 0 the LRU cache; 1 the fixed-slot cache, refused by name where it cannot run "
     "(docs/cache.md). Settled for the fixed slots (slot-default benchmark: 1.04x-1.06x of the "
     "LRU cache at 2000 / 4000 / 6000 MiB / auto, 1.07x [1.02, 1.11] at 2000 MiB after a "
     "1000-token prompt); kept because the LRU cache is the store taken where the fixed slots "
     "cannot run, and the tests reach it with 0",
     "cache_store"},
    {"huge_pages", &R::huge_pages, "", "MOESTREAM_HUGEPAGES", "0|1", false, "1", C::kExperiment,
     "1: the engine's own large buffers (expert slots, shared slots, dense weight copies) are "
     "advised for transparent huge pages; 0: 4 KiB pages. Not settled (huge-pages benchmark): "
     "decode 1.18x with the cache off and 1.02-1.10x at 2000-6000 MiB, but 0.95x [0.80, 1.13] "
     "at the default budget and a slower dense read under a memory cap; kept because 4 KiB "
     "pages may yet win at the default budget",
     "huge_pages"},
    {"slot_populate", &R::slot_populate, "", "MOESTREAM_SLOT_POPULATE", "idle|nice|off", false,
     "idle", C::kExperiment,
     "how the fixed slots' pages are populated before first use: a SCHED_IDLE thread, a nice "
     "+10 thread, or not at all (docs/cache.md, \"Fixed slots\"). Settled against off "
     "(slot-populate benchmark: no population decodes at 0.84x-0.95x of nice +10); idle "
     "against nice not settled (0.92x-0.98x, every interval reaching 1.00) but idle loads in "
     "2.3 s against 4.6-6.7 s at 6000 MiB; kept because the huge-page tests check each mode",
     "cache_slot_populate"},
    // --- test-only ---
    {"cache_debug", &R::cache_debug, "--cache-debug", "", "", false, "off", C::kTestOnly,
     "poison released/fresh cache pages and check every routed slice is resident", "cache_debug",
     "", "", kStreaming},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_CORRUPT_EXPERT",
     "",
     false,
     "unset",
     C::kTestOnly,
     "`<layer>:<expert>` or `<layer>:*`: corrupt those expert slices after each read (the gates' "
     "negative control)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_IO_FAULT",
     "",
     false,
     "unset",
     C::kTestOnly,
     "inject I/O faults at the read lanes (src/io/io_faults.h)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_NO_BUDGET_CLAMP",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "an explicit --cache-mb is not clamped to the memory limit",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_SKIP_SECOND_WAIT",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "do not wait for the second projection's reads",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_POOL_WARM_WAIT",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "the LRU cache waits for the whole page-pool warm-up before its first commit",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_WARM_TAIL",
     "N",
     false,
     "",
     C::kTestOnly,
     "every warm-set tail is N experts, read in full (never stopped)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_WARM_PRELOAD",
     "wait|off",
     false,
     "",
     C::kTestOnly,
     "the warm set's preload at open: waited for in full (never stopped), or not started",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_SUBSTITUTE_UNROUTED",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "--substitute-experts substitutes a non-resident expert",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_FALLBACK_SKIP_CONVERT",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "--miss-fallback leaves its first converted slot unwritten",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_SLOT_MISPLACE",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "the fixed-slot cache rewrites expert ids to the wrong slots",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_SLOT_WARM_SKIP_COPY",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "the slots' warm start records its experts without copying them",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_SLOT_PREFETCH_SKIP_READ",
     "0|1",
     false,
     "0",
     C::kTestOnly,
     "a prefetch into slots records its experts without reading them",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_TOKEN_DELAY_MS",
     "",
     false,
     "0",
     C::kTestOnly,
     "`serve`: sleep this long after each token (the queue tests)",
     ""},
    {"",
     {},
     "",
     "MOESTREAM_DEBUG_PREFILL_HOLD",
     "",
     false,
     "unset",
     C::kTestOnly,
     "`serve`: a prompt stays in prefill while this file exists (the browser test)",
     ""},
    // --- eval's own flags (EvalOptions) ---
    {.field = "", .member = {}, .flags = "-f,--file", .env = "", .choices = "", .env_inverted = false,
     .dflt = "(required)", .cls = C::kProduction,
     .doc = "text to score",
     .key = "", .range = "FILE", .commands = "eval", .traits = kRequired,
     .command_member = &Ev::text_file, .command_field = "EvalOptions::text_file"},
    {.field = "", .member = {}, .flags = "--max-tokens", .env = "", .choices = "", .env_inverted = false,
     .dflt = "512", .cls = C::kProduction,
     .doc = "score at most N tokens of the text",
     .key = "", .range = "2..1048576", .commands = "eval", .traits = 0,
     .command_member = &Ev::max_tokens, .command_field = "EvalOptions::max_tokens"},
    {.field = "", .member = {}, .flags = "--window", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "empty the context every N tokens (the expert cache stays): score within the model's training context; 0 = the whole text in one context",
     .key = "", .range = "0..1048576", .commands = "eval", .traits = 0,
     .command_member = &Ev::window, .command_field = "EvalOptions::window"},
    {.field = "", .member = {}, .flags = "--save-ref", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "keep the reference logits in FILE",
     .key = "", .range = "FILE", .commands = "eval", .traits = 0,
     .command_member = &Ev::save_ref, .command_field = "EvalOptions::save_ref"},
    {.field = "", .member = {}, .flags = "--ref", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "reuse reference logits from FILE (--save-ref)",
     .key = "", .range = "FILE", .commands = "eval", .traits = 0,
     .command_member = &Ev::ref, .command_field = "EvalOptions::ref"},
    {.field = "", .member = {}, .flags = "--bootstrap", .env = "", .choices = "", .env_inverted = false,
     .dflt = "1000", .cls = C::kProduction,
     .doc = "bootstrap resamples",
     .key = "", .range = "100..1000000", .commands = "eval", .traits = 0,
     .command_member = &Ev::bootstrap, .command_field = "EvalOptions::bootstrap"},
    {.field = "", .member = {}, .flags = "--json", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print one JSON object",
     .key = "", .range = "", .commands = "eval", .traits = 0,
     .command_member = &Ev::json, .command_field = "EvalOptions::json"},
    // --- inspect's own flags (InspectOptions) ---
    {.field = "", .member = {}, .flags = "--json", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "machine-readable output (exact byte counts)",
     .key = "", .range = "", .commands = "inspect", .traits = 0,
     .command_member = &In::json, .command_field = "InspectOptions::json"},
    {.field = "", .member = {}, .flags = "--plan", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print the plan `run` would get with the engine flags given here, on this machine now: each choice (store, budget, overlap, read-ahead, prefetch, lossy) and why (as --stats-json settings.plan)",
     .key = "", .range = "", .commands = "inspect", .traits = 0,
     .command_member = &In::plan, .command_field = "InspectOptions::plan"},
    // --- make-fallback's flags (FallbackOptions) ---
    {.field = "", .member = {}, .flags = "-m,--model", .env = "", .choices = "", .env_inverted = false,
     .dflt = "(required)", .cls = C::kProduction,
     .doc = "GGUF model file (or any shard of a split set)",
     .key = "", .range = "FILE", .commands = "make-fallback", .traits = kRequired,
     .command_member = &Fb::model_path, .command_field = "FallbackOptions::model_path"},
    {.field = "", .member = {}, .flags = "-o,--output", .env = "", .choices = "", .env_inverted = false,
     .dflt = "(required)", .cls = C::kProduction,
     .doc = "the companion GGUF to write",
     .key = "", .range = "FILE", .commands = "make-fallback", .traits = kRequired,
     .command_member = &Fb::out_path, .command_field = "FallbackOptions::out_path"},
    {.field = "", .member = {}, .flags = "--type", .env = "", .choices = "", .env_inverted = false,
     .dflt = "Q2_K", .cls = C::kProduction,
     .doc = "llama-quantize type of the expert copies (Q2_K, Q3_K, IQ4_XS, Q4_0, ...)",
     .key = "", .range = "", .commands = "make-fallback", .traits = 0,
     .command_member = &Fb::type, .command_field = "FallbackOptions::type"},
    {.field = "", .member = {}, .flags = "-t,--threads", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "llama-quantize threads (0: its default)",
     .key = "", .range = "0..512", .commands = "make-fallback", .traits = 0,
     .command_member = &Fb::n_threads, .command_field = "FallbackOptions::n_threads"},
    {.field = "", .member = {}, .flags = "--quantize-tool", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the private prefix's, else PATH", .cls = C::kProduction,
     .doc = "the llama-quantize command (default: the private prefix's, else PATH)",
     .key = "", .range = "", .commands = "make-fallback", .traits = 0,
     .command_member = &Fb::quantize_tool, .command_field = "FallbackOptions::quantize_tool"},
    // --- synth's flags (SynthCommandOptions: the library's SynthOptions and --force) ---
    {.field = "", .member = {}, .flags = "--preset", .env = "", .choices = "", .env_inverted = false,
     .dflt = "(required)", .cls = C::kProduction,
     .doc = "model shapes",
     .key = "", .range = "", .commands = "synth", .traits = kRequired,
     .command_member = &Sy::preset, .command_field = "SynthCommandOptions::preset"},
    {.field = "", .member = {}, .flags = "--arch", .env = "", .choices = "", .env_inverted = false,
     .dflt = "qwen3moe", .cls = C::kProduction,
     .doc = "architecture (router gating differs)",
     .key = "", .range = "", .commands = "synth", .traits = 0,
     .command_member = &Sy::arch, .command_field = "SynthCommandOptions::arch"},
    {.field = "", .member = {}, .flags = "--type", .env = "", .choices = "", .env_inverted = false,
     .dflt = "q8_0", .cls = C::kProduction,
     .doc = "type of the expert tensors",
     .key = "", .range = "", .commands = "synth", .traits = 0,
     .command_member = &Sy::expert_type, .command_field = "SynthCommandOptions::expert_type"},
    {.field = "", .member = {}, .flags = "--seed", .env = "", .choices = "", .env_inverted = false,
     .dflt = "1", .cls = C::kProduction,
     .doc = "PRNG seed (same options => same bytes)",
     .key = "", .range = "0..9223372036854775807", .commands = "synth", .traits = 0,
     .command_member = &Sy::seed, .command_field = "SynthCommandOptions::seed"},
    {.field = "", .member = {}, .flags = "--alignment", .env = "", .choices = "", .env_inverted = false,
     .dflt = "32", .cls = C::kProduction,
     .doc = "general.alignment (power of two)",
     .key = "", .range = "32..2097152", .commands = "synth", .traits = 0,
     .command_member = &Sy::alignment, .command_field = "SynthCommandOptions::alignment"},
    {.field = "", .member = {}, .flags = "--attn-gain", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0.3", .cls = C::kProduction,
     .doc = "attention output gain x 1/sqrt(fan_in): 0.3 keeps routing as local as chance; 1.0 (plain init) makes greedy output and routing repeat",
     .key = "", .range = "0.001..4", .commands = "synth", .traits = 0,
     .command_member = &Sy::attn_out_gain, .command_field = "SynthCommandOptions::attn_out_gain"},
    {.field = "", .member = {}, .flags = "--nextn-layers", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "glm4moe: NextN layers after the last layer (kept in the file, not run)",
     .key = "", .range = "0..4", .commands = "synth", .traits = 0,
     .command_member = &Sy::nextn_layers, .command_field = "SynthCommandOptions::nextn_layers"},
    {.field = "", .member = {}, .flags = "-o,--output", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "output file (written via temp + rename; required unless --dry-run)",
     .key = "", .range = "FILE", .commands = "synth", .traits = 0,
     .command_member = &Sy::out_path, .command_field = "SynthCommandOptions::out_path"},
    {.field = "", .member = {}, .flags = "--force", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "overwrite an existing output file",
     .key = "", .range = "", .commands = "synth", .traits = 0,
     .command_member = &Sy::force, .command_field = "SynthCommandOptions::force"},
    {.field = "", .member = {}, .flags = "--progress", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "progress bar on stderr (automatic above 1 GB)",
     .key = "", .range = "", .commands = "synth", .traits = 0,
     .command_member = &Sy::progress, .command_field = "SynthCommandOptions::progress"},
    {.field = "", .member = {}, .flags = "--threads", .env = "", .choices = "", .env_inverted = false,
     .dflt = "0", .cls = C::kProduction,
     .doc = "generator threads (0 = auto; same bytes)",
     .key = "", .range = "0..64", .commands = "synth", .traits = 0,
     .command_member = &Sy::threads, .command_field = "SynthCommandOptions::threads"},
    {.field = "", .member = {}, .flags = "--dry-run", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print the planned file size, write nothing",
     .key = "", .range = "", .commands = "synth", .traits = 0,
     .command_member = &Sy::dry_run, .command_field = "SynthCommandOptions::dry_run"},
    // --- replay's flags (ReplayOptions) ---
    {.field = "", .member = {}, .flags = "trace", .env = "", .choices = "", .env_inverted = false,
     .dflt = "(required)", .cls = C::kProduction,
     .doc = "route trace file",
     .key = "", .range = "FILE", .commands = "replay", .traits = kRequired,
     .command_member = &Rp::trace, .command_field = "ReplayOptions::trace"},
    {.field = "", .member = {}, .flags = "--budgets", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the recorded one", .cls = C::kProduction,
     .doc = "cache budgets in MiB, comma-separated; 0 = cache off (default: the recorded one)",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::budgets, .command_field = "ReplayOptions::budgets"},
    {.field = "", .member = {}, .flags = "--policy", .env = "", .choices = "", .env_inverted = false,
     .dflt = "lru", .cls = C::kProduction,
     .doc = "eviction policies: lru,lfu,belady (default lru)",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::policies, .command_field = "ReplayOptions::policies"},
    {.field = "", .member = {}, .flags = "--drop-cold", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the recorded one", .cls = C::kProduction,
     .doc = "drop-cold fractions F in [0,1], comma-separated (default: the recorded one)",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::drops, .command_field = "ReplayOptions::drops"},
    {.field = "", .member = {}, .flags = "--drop-in-prefill", .env = "", .choices = "", .env_inverted = false,
     .dflt = "as recorded", .cls = C::kProduction,
     .doc = "apply the drop policy in prefill too (default: as recorded)",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::drop_in_prefill, .command_field = "ReplayOptions::drop_in_prefill"},
    {.field = "", .member = {}, .flags = "--n-expert-used", .env = "", .choices = "", .env_inverted = false,
     .dflt = "the trace's k", .cls = C::kProduction,
     .doc = "experts per token K <= the trace's k, comma-separated",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::ks, .command_field = "ReplayOptions::ks"},
    {.field = "", .member = {}, .flags = "--substitute-experts", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "estimate --substitute-experts margins M in [0,1], comma-separated (LOSSY; a trace recorded with --route-trace-scores; each at drop-cold 0)",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::substitute, .command_field = "ReplayOptions::substitute"},
    {.field = "", .member = {}, .flags = "--miss-fallback", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "estimate --miss-fallback with this companion's expert sizes (LOSSY; needs --fallback-threshold and a trace with final weights)",
     .key = "", .range = "FILE", .commands = "replay", .traits = 0,
     .command_member = &Rp::fallback, .command_field = "ReplayOptions::fallback"},
    {.field = "", .member = {}, .flags = "--fallback-threshold", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "final router weight W in (0, 1] below which a miss reads the low-bit copy",
     .key = "", .range = "(0..1", .commands = "replay", .traits = 0,
     .command_member = &Rp::fallback_w, .command_field = "ReplayOptions::fallback_w"},
    {.field = "", .member = {}, .flags = "--json", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print the results as one JSON object",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::json, .command_field = "ReplayOptions::json"},
    {.field = "", .member = {}, .flags = "--plot", .env = "", .choices = "", .env_inverted = false,
     .dflt = "none", .cls = C::kProduction,
     .doc = "write a PNG: hit rate vs budget; reads avoided vs weight discarded",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::plot, .command_field = "ReplayOptions::plot"},
    {.field = "", .member = {}, .flags = "--validate", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "replay the recorded settings and require the recorded hits/misses/drops exactly",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::validate, .command_field = "ReplayOptions::validate"},
    {.field = "", .member = {}, .flags = "--routing-stats", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print how the model routes (expert usage, reuse by the next token vs shuffled) instead of simulating",
     .key = "", .range = "", .commands = "replay", .traits = 0,
     .command_member = &Rp::routing_stats, .command_field = "ReplayOptions::routing_stats"},
    {.field = "", .member = {}, .flags = "--warm-split", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "estimate a warm expert set: learn it from the prompt and the first N decode tokens, then replay the rest cold and with it preloaded (lossless; --budgets default 2000,4000)",
     .key = "", .range = "0..1073741824", .commands = "replay", .traits = 0,
     .command_member = &Rp::warm_split, .command_field = "ReplayOptions::warm_split"},
    {.field = "", .member = {}, .flags = "--warm-measure", .env = "", .choices = "", .env_inverted = false,
     .dflt = "64", .cls = C::kProduction,
     .doc = "with --warm-split: decode tokens measured after the split",
     .key = "", .range = "1..1073741824", .commands = "replay", .traits = 0,
     .command_member = &Rp::warm_measure, .command_field = "ReplayOptions::warm_measure"},
};

// "a|b|c" -> {"a", "b", "c"}.
std::vector<std::string> split_choices(const char * choices) {
    std::vector<std::string> out;
    std::string cur;
    for (const char * p = choices; *p; ++p) {
        if (*p == '|') {
            out.push_back(cur);
            cur.clear();
        } else {
            cur += *p;
        }
    }
    if (*choices) out.push_back(cur);
    return out;
}

// "2, 3 or 4" from {"2", "3", "4"}.
std::string choices_text(const std::vector<std::string> & c) {
    std::string s;
    for (size_t i = 0; i < c.size(); ++i)
        s += (i == 0 ? "" : i + 1 == c.size() ? " or " : ", ") + c[i];
    return s;
}

std::string num_text(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
}

// f(the row's member of options O) — RunOptions: Setting::member; a command's options:
// Setting::command_member — or f(std::monostate) when the row has none of O's.
template <class O, class F>
auto visit_member(const Setting & s, F && f) {
    if constexpr (std::is_same_v<O, RunOptions>) {
        return std::visit(f, s.member);
    } else {
        return std::visit(
            [&f](auto m) {
                using M = decltype(m);
                if constexpr (std::is_same_v<M, std::monostate>)
                    return f(m);
                else if constexpr (std::is_same_v<typename MemberOf<M>::Class, O>)
                    return f(m);
                else
                    return f(std::monostate{});
            },
            s.command_member);
    }
}

bool is_command_row(const Setting & s) {
    return !std::holds_alternative<std::monostate>(s.command_member);
}

// The options a row's field belongs to, default-made: f(options) — RunOptions, or the class
// of its command_member.
template <class F>
auto with_default_options(const Setting & s, F && f) {
    return std::visit(
        [&f](auto m) {
            using M = decltype(m);
            if constexpr (std::is_same_v<M, std::monostate>) {
                RunOptions o;
                return f(o);
            } else {
                typename MemberOf<M>::Class o;
                return f(o);
            }
        },
        s.command_member);
}

// Whether a row's field is a bool (its flag takes no value).
bool is_bool_row(const Setting & s) {
    auto is_bool = [](auto m) {
        if constexpr (std::is_same_v<decltype(m), std::monostate>)
            return false;
        else
            return std::is_same_v<typename MemberOf<decltype(m)>::Value, bool>;
    };
    return is_command_row(s) ? std::visit(is_bool, s.command_member) : std::visit(is_bool, s.member);
}

// A field's value as a flag or variable value ("0.5", "1", "rows"; bools "1" / "0").
template <class O>
std::string value_text(const Setting & s, const O & o) {
    return visit_member<O>(
        s,
        [&o](auto m) -> std::string {
            using M = decltype(m);
            if constexpr (std::is_same_v<M, std::monostate>) {
                return "";
            } else {
                const auto & v = o.*m;
                using V = std::decay_t<decltype(v)>;
                if constexpr (std::is_same_v<V, std::string>) {
                    return v;
                } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
                    std::string all;  // a repeatable flag's values (-r)
                    for (const std::string & x : v) all += (all.empty() ? "" : " ") + x;
                    return all;
                } else if constexpr (std::is_same_v<V, bool>) {
                    return v ? "1" : "0";
                } else if constexpr (std::is_floating_point_v<V>) {
                    return num_text(double(v));
                } else {
                    return std::to_string(v);
                }
            }
        });
}

// Sets a field from a variable's text (already one of its choices when it has any); false
// when the text is no value of the field's type.
template <class O>
bool set_from_text(const Setting & s, const std::string & t, O * o) {
    return visit_member<O>(
        s,
        [&](auto m) -> bool {
            using M = decltype(m);
            if constexpr (std::is_same_v<M, std::monostate>) {
                return false;
            } else {
                auto & v = o->*m;
                using V = std::decay_t<decltype(v)>;
                if constexpr (std::is_same_v<V, std::string>) {
                    v = t;
                    return true;
                } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
                    v.push_back(t);  // a repeatable flag: each value is one more
                    return true;
                } else if constexpr (std::is_same_v<V, bool>) {
                    if (t != "0" && t != "1") return false;
                    v = (t == "1") != s.env_inverted;
                    return true;
                } else {
                    char * end = nullptr;
                    const double d = std::strtod(t.c_str(), &end);
                    if (t.empty() || end != t.c_str() + t.size()) return false;
                    if constexpr (std::is_floating_point_v<V>) {  // 0.7 as a float: near it
                        v = V(d);
                        return std::isfinite(double(v));
                    } else {  // an integer field holds it exactly, or it is refused
                        errno = 0;
                        const long long n = std::strtoll(t.c_str(), &end, 10);
                        if (errno != 0 || end != t.c_str() + t.size()) return false;
                        if constexpr (std::is_signed_v<V>) {
                            if (n < (long long)std::numeric_limits<V>::lowest() ||
                                n > (long long)std::numeric_limits<V>::max())
                                return false;
                        } else {
                            if (n < 0 || (unsigned long long)n > std::numeric_limits<V>::max())
                                return false;
                        }
                        v = V(n);
                        return true;
                    }
                }
            }
        });
}

// Whether text sets the row's field (of default-made options): it fits the field's type.
bool fits_field(const Setting & s, const std::string & t) {
    return with_default_options(s, [&](auto & o) { return set_from_text(s, t, &o); });
}

bool is_default(const Setting & s, const RunOptions & o) {
    static const RunOptions kDefaults;
    return value_text(s, o) == value_text(s, kDefaults);
}

// One alternative of a row's range (Setting::range).
struct RangeAlt {
    enum Kind { kInterval, kNumber, kWord } kind = kNumber;
    double lo = 0, hi = 0;  // kInterval
    bool lo_open = false;   // kInterval: lo itself excluded
    double value = 0;       // kNumber, kWord: the value
    std::string text;       // as the user reads it ("16..4194304", "0: the model's", "auto")
};

template <class V>
constexpr bool kIsNumber = std::is_arithmetic_v<V> && !std::is_same_v<V, bool>;

// Whether the row's field is a number of an integer type (ranges print as lo..hi), a number of
// a floating type ([lo, hi]), or no number.
enum class NumKind { kNone, kInt, kReal };
NumKind num_kind(const Setting & s) {
    auto kind = [](auto m) {
        using M = decltype(m);
        if constexpr (std::is_same_v<M, std::monostate>) {
            return NumKind::kNone;
        } else {
            using V = typename MemberOf<M>::Value;
            if constexpr (!kIsNumber<V>) return NumKind::kNone;
            else if constexpr (std::is_floating_point_v<V>) return NumKind::kReal;
            else return NumKind::kInt;
        }
    };
    return is_command_row(s) ? std::visit(kind, s.command_member) : std::visit(kind, s.member);
}

std::string int_text(double v) {
    if (v >= 9223372036854775807.0) return "9223372036854775807";  // the largest a flag takes
    return std::to_string(static_cast<long long>(v));
}

std::vector<RangeAlt> range_alts(const Setting & s) {
    std::vector<RangeAlt> out;
    const NumKind k = num_kind(s);
    if (k == NumKind::kNone) return out;  // a string's range is the name of its value
    for (const std::string & t : split_choices(s.range)) {
        RangeAlt a;
        a.text = t;
        const size_t eq = t.find('='), dots = t.find("..");
        if (eq != std::string::npos) {
            a.kind = RangeAlt::kWord;
            a.text = t.substr(0, eq);
            a.value = std::strtod(t.c_str() + eq + 1, nullptr);
        } else if (dots != std::string::npos) {
            a.kind = RangeAlt::kInterval;
            a.lo_open = t[0] == '(';
            a.lo = std::strtod(t.c_str() + (a.lo_open ? 1 : 0), nullptr);
            a.hi = std::strtod(t.c_str() + dots + 2, nullptr);
            a.text = k == NumKind::kInt ? int_text(a.lo) + ".." + int_text(a.hi)
                                        : std::string(a.lo_open ? "(" : "[") + num_text(a.lo) +
                                              ", " + num_text(a.hi) + "]";
        } else {
            a.value = std::strtod(t.c_str(), nullptr);
        }
        out.push_back(a);
    }
    return out;
}

// A flag's text as a number of the row's kind (integers: whole numbers only); false when it
// is none.
bool parse_number(const Setting & s, const std::string & t, double * d) {
    if (t.empty()) return false;
    char * end = nullptr;
    if (num_kind(s) == NumKind::kInt) {
        errno = 0;
        const long long n = std::strtoll(t.c_str(), &end, 10);
        if (errno != 0 || end != t.c_str() + t.size()) return false;
        *d = double(n);
        return true;
    }
    *d = std::strtod(t.c_str(), &end);
    return end == t.c_str() + t.size() && std::isfinite(*d);
}

// The field's value as JSON of its type; a range word where one stands for it.
template <class O>
nlohmann::json field_json(const Setting & s, const O & o) {
    const std::vector<RangeAlt> alts = range_alts(s);
    return visit_member<O>(
        s,
        [&](auto m) -> nlohmann::json {
            using M = decltype(m);
            if constexpr (std::is_same_v<M, std::monostate>) {
                return nullptr;
            } else {
                const auto & v = o.*m;
                using V = std::decay_t<decltype(v)>;
                if constexpr (kIsNumber<V>)
                    for (const RangeAlt & a : alts)
                        if (a.kind == RangeAlt::kWord && double(v) == a.value) return a.text;
                return v;
            }
        });
}

// A lossy row in effect: its value is not the default (fallback_threshold: with miss_fallback,
// whose threshold it is; n_expert_used: unless it equals the model's top-k).
bool lossy_in_effect(const Setting & s, const RunOptions & o, uint32_t top_k) {
    const std::string f = s.field;
    if (f == "fallback_threshold") return !o.miss_fallback.empty();
    if (f == "n_expert_used")
        return o.n_expert_used > 0 && (top_k == 0 || uint32_t(o.n_expert_used) != top_k);
    return !is_default(s, o);
}

std::string md_cell(const std::string & s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
}

}  // namespace

const char * setting_class_name(SettingClass c) {
    switch (c) {
        case C::kProduction:
            return "production";
        case C::kExperiment:
            return "experiment";
        case C::kLossy:
            return "lossy";
        case C::kTestOnly:
            return "test-only";
    }
    return "?";
}

std::string Setting::flag() const {
    const std::vector<std::string> names = [this] {
        std::vector<std::string> n;
        std::string cur;
        for (const char * p = flags;; ++p) {
            if (*p == ',' || *p == 0) {
                if (!cur.empty()) n.push_back(cur);
                cur.clear();
                if (*p == 0) break;
            } else {
                cur += *p;
            }
        }
        return n;
    }();
    for (const std::string & n : names)  // the short name, as llama.cpp's users write it
        if (n.rfind("--", 0) != 0) return n;
    return names.empty() ? std::string() : names[0];
}

bool Setting::for_command(std::string_view command) const {
    if (*commands == 0)  // the engine's flags
        return command == "run" || command == "chat" || command == "eval" ||
               command == "serve" || command == "inspect";
    for (const std::string & c : split_choices(commands))
        if (c == command) return true;
    return false;
}

std::string check_setting_text(const Setting & s, const std::string & t) {
    const NumKind k = num_kind(s);
    if (k == NumKind::kNone && is_command_row(s) && *s.choices) {  // a command's text of choices
        const std::vector<std::string> c = split_choices(s.choices);
        return std::find(c.begin(), c.end(), t) != c.end() ? "" : t + " is not " + choices_text(c);
    }
    if (k == NumKind::kNone) return "";  // text, or a flag without a value
    std::string note;
    if (s.draw && !s.draw(t, &note).empty()) return "";  // a value drawn when it is set
    const std::vector<RangeAlt> alts = range_alts(s);
    for (const RangeAlt & a : alts)
        if (a.kind == RangeAlt::kWord && a.text == t) return "";
    double d = 0;
    if (!parse_number(s, t, &d)) {
        std::vector<std::string> words;
        bool numbers = alts.empty();
        for (const RangeAlt & a : alts) {
            if (a.kind == RangeAlt::kWord) words.push_back(a.text);
            numbers = numbers || a.kind != RangeAlt::kWord;
        }
        if (numbers) words.insert(words.begin(), k == NumKind::kInt ? "a whole number" : "a number");
        return "'" + t + "' is not " + choices_text(words);
    }
    std::string first, rest;  // the first interval; the other alternatives
    std::vector<std::string> all;
    bool ok = alts.empty();
    for (const RangeAlt & a : alts) {
        if (a.kind == RangeAlt::kInterval)
            ok = ok || ((a.lo_open ? d > a.lo : d >= a.lo) && d <= a.hi);
        else if (a.kind == RangeAlt::kNumber)
            ok = ok || d == a.value;
        all.push_back(a.text);
        if (first.empty() && a.kind == RangeAlt::kInterval)
            first = a.text;
        else
            rest += (rest.empty() ? "" : ", ") + a.text;
    }
    if (ok && !fits_field(s, t))  // the value must fit the field's type too
        return t + " does not fit " + (is_command_row(s) ? s.command_field : s.field);
    if (ok) return "";
    if (first.empty()) return t + " is not " + choices_text(all);  // "1 is not on, off or auto"
    return t + " is not in " + first + (rest.empty() ? "" : " (or " + rest + ")");
}

namespace {
// set_setting_text of options O (RunOptions, or a command's own).
template <class O>
bool set_text(const Setting & s, const std::string & t, O * opt, std::string * note) {
    if (note) note->clear();
    if (!check_setting_text(s, t).empty()) return false;
    std::string drawn_note;
    if (const std::string d = s.draw ? s.draw(t, &drawn_note) : ""; !d.empty()) {
        if (note) *note = drawn_note;
        return set_from_text(s, d, opt);
    }
    for (const RangeAlt & a : range_alts(s))
        if (a.kind == RangeAlt::kWord && a.text == t) return set_from_text(s, num_text(a.value), opt);
    return set_from_text(s, t, opt);
}

template <class O>
std::string value_text_of(const Setting & s, const O & opt) {
    const nlohmann::json j = field_json(s, opt);
    return j.is_string() && num_kind(s) != NumKind::kNone ? j.get<std::string>() : value_text(s, opt);
}
}  // namespace

bool set_setting_text(const Setting & s, const std::string & t, RunOptions * opt,
                      std::string * note) {
    return set_text(s, t, opt, note);
}

bool set_setting_text(const Setting & s, const std::string & t, ServeOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, ChatOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, EvalOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, InspectOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, FallbackOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, SynthCommandOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, ReplayOptions * opt) {
    return set_text(s, t, opt, nullptr);
}
bool set_setting_text(const Setting & s, const std::string & t, RunCmdOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, ChatTemplateOptions * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, SamplingParams * opt) {
    return set_text(s, t, opt, nullptr);
}

bool set_setting_text(const Setting & s, const std::string & t, GenerateRequest * opt) {
    return set_text(s, t, opt, nullptr);
}

bool setting_flag_value(const Setting & s) {
    return is_bool_row(s) &&
           with_default_options(s, [&s](auto & o) { return value_text(s, o) == "0"; });
}

std::string setting_value_text(const Setting & s, const RunOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const ServeOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const ChatOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const EvalOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const InspectOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const FallbackOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const SynthCommandOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const ReplayOptions & opt) {
    return value_text_of(s, opt);
}
std::string setting_value_text(const Setting & s, const RunCmdOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const ChatTemplateOptions & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const SamplingParams & opt) {
    return value_text_of(s, opt);
}

std::string setting_value_text(const Setting & s, const GenerateRequest & opt) {
    return value_text_of(s, opt);
}

std::string setting_range_text(const Setting & s) {
    std::string t;
    for (const RangeAlt & a : range_alts(s)) {
        if (a.kind == RangeAlt::kWord) continue;
        t += (t.empty() ? "" : "|") + (a.kind == RangeAlt::kInterval ? a.text
                                       : num_kind(s) == NumKind::kInt ? int_text(a.value)
                                                                      : num_text(a.value));
    }
    return t;
}

std::string setting_type_name(const Setting & s) {
    if (is_bool_row(s)) return "";
    if (std::holds_alternative<std::monostate>(s.member) && !is_command_row(s)) return s.range;
    const NumKind k = num_kind(s);
    if (k == NumKind::kNone && is_command_row(s) && *s.choices) return s.choices;  // on|off|auto
    if (k == NumKind::kNone) return *s.range ? s.range : "TEXT";
    std::string words;
    bool numbers = false;
    for (const RangeAlt & a : range_alts(s)) {
        if (a.kind == RangeAlt::kWord)
            words += (words.empty() ? "" : "|") + a.text;
        else
            numbers = true;
    }
    if (!numbers && !words.empty()) return words;
    return words + (words.empty() ? "" : "|") + (k == NumKind::kInt ? "INT" : "FLOAT");
}

Status settings_object(const RunOptions & opt, const nlohmann::json & resolved,
                       const nlohmann::json & observed, nlohmann::json * out) {
    nlohmann::json j = nlohmann::json::object();
    std::unordered_set<std::string> keys;
    for (const Setting & s : kSettings) {
        if (!*s.key) continue;
        keys.insert(s.key);
        j[s.key] = resolved.contains(s.key) ? resolved[s.key] : field_json(s, opt);
    }
    for (const auto & [k, v] : resolved.items())
        if (keys.count(k) == 0)
            return Status::Runtime("internal: settings key " + k + " has no registry row");
    for (const auto & [k, v] : observed.items()) {
        if (keys.count(k) != 0)
            return Status::Runtime("internal: settings key " + k +
                                   " is a registry row's, not an observation");
        j[k] = v;
    }
    *out = std::move(j);
    return Status::Ok();
}

const std::vector<Setting> & settings_registry() {
    return kSettings;
}

const Setting * find_flag_setting(std::string_view flag) {
    const std::string f = "," + std::string(flag) + ",";
    for (const Setting & s : kSettings)
        for (const char * names : {s.flags, s.off_flags})
            if (*names && ("," + std::string(names) + ",").find(f) != std::string::npos) return &s;
    return nullptr;
}

const Setting * find_setting(std::string_view field) {
    for (const Setting & s : kSettings)
        if (*s.field && field == s.field) return &s;
    return nullptr;
}

std::string setting_help(std::string_view field) {
    const Setting * s = find_setting(field);
    if (s == nullptr) return "";
    std::string h = s->doc;
    if (s->cls == C::kLossy) h = "LOSSY: " + h;
    if (s->cls == C::kExperiment) h += "; an experiment, for A/B benchmarks";
    return h;
}

Status apply_env_overlay(RunOptions * opt) {
    for (const Setting & s : kSettings) {
        if (!*s.env || !*s.field) continue;
        const char * v = std::getenv(s.env);
        if (v == nullptr || *v == 0) continue;
        const std::string t = v;
        const std::vector<std::string> c = split_choices(s.choices);
        bool ok = c.empty();
        for (const std::string & x : c) ok = ok || x == t;
        if (!ok || !set_from_text(s, t, opt))
            return Status::Usage(std::string(s.env) + "=" + t + ": must be " +
                                 (c.empty() ? std::string("a number") : choices_text(c)));
        MS_LOG_INFO("%s=%s: RunOptions::%s set from the environment", s.env, v, s.field);
    }
    return Status::Ok();
}

Status check_setting_choices(const RunOptions & opt) {
    for (const Setting & s : kSettings) {
        if (!*s.field || !*s.choices) continue;
        const std::vector<std::string> c = split_choices(s.choices);
        const std::string v = value_text(s, opt);
        bool ok = false;
        for (const std::string & x : c) ok = ok || x == v;
        if (!ok)
            return Status::Usage("RunOptions::" + std::string(s.field) + " " + v + " is not " +
                                 choices_text(c));
    }
    return Status::Ok();
}

std::string lossy_knobs_text(const RunOptions & opt, uint32_t model_top_k) {
    std::string k;
    for (const Setting & s : kSettings) {
        if (s.cls != C::kLossy || !*s.field || !lossy_in_effect(s, opt, model_top_k)) continue;
        std::string part = s.flag();
        if (!std::holds_alternative<bool RunOptions::*>(s.member)) part += " " + value_text(s, opt);
        if (std::string(s.field) == "n_expert_used" && model_top_k > 0)
            part += " (the model's " + std::to_string(model_top_k) + ")";
        k += (k.empty() ? "" : " ") + part;
    }
    return k;
}

bool lossy_options(const RunOptions & opt, uint32_t model_top_k) {
    return !lossy_knobs_text(opt, model_top_k).empty();
}

RunOptions without_lossy_knobs(RunOptions opt) {
    static const RunOptions kDefaults;
    for (const Setting & s : kSettings)
        if (s.cls == C::kLossy)
            std::visit(
                [&opt](auto m) {
                    if constexpr (!std::is_same_v<decltype(m), std::monostate>)
                        opt.*m = kDefaults.*m;
                },
                s.member);
    return opt;
}

namespace {
// What a user does to set a field that has neither a flag nor a variable (nullptr: nothing;
// the message keeps the library's name).
const char * field_words(const Setting * s) {
    if (s == nullptr) return nullptr;
    if (std::strcmp(s->field, "drop_cold_later") == 0)
        return "--drop-cold-experts given at start (serve: requests may then change it)";
    return nullptr;
}
}  // namespace

std::string option_words(const std::string & msg) {
    static const std::string kPrefix = "RunOptions::";
    auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    std::string out;
    size_t i = 0;
    for (size_t at; (at = msg.find(kPrefix, i)) != std::string::npos;) {
        out.append(msg, i, at - i);
        const size_t name = at + kPrefix.size();
        size_t end = name;
        while (end < msg.size() && ident(msg[end])) ++end;
        const Setting * s = find_setting(std::string_view(msg).substr(name, end - name));
        const bool is_bool = s && std::holds_alternative<bool RunOptions::*>(s->member);
        // "<field> = <value>" (a boolean turned off, or a variable's value).
        size_t vend = end;
        std::string value;
        if (msg.compare(end, 3, " = ") == 0) {
            vend = end + 3;
            while (vend < msg.size() && (ident(msg[vend]) || msg[vend] == '-')) ++vend;
            value = msg.substr(end + 3, vend - end - 3);
        }
        if (s && *s->flags && (!is_bool || value.empty() || value == "false")) {
            out += s->flag();  // a bool's flag sets what the message says
            i = value.empty() ? end : vend;
        } else if (s && *s->env) {
            std::string v = value == "true" ? "1" : value == "false" ? "0" : value;
            if (s->env_inverted && (v == "0" || v == "1")) v = v == "1" ? "0" : "1";
            out += std::string(s->env) + (value.empty() ? "" : "=" + v);
            i = value.empty() ? end : vend;
        } else if (const char * w = field_words(s)) {  // a field the CLI sets for the user
            out += w;
            i = end;
        } else {  // a field without a flag or words keeps the library's name
            out += kPrefix;
            i = name;
        }
    }
    out.append(msg, i, std::string::npos);
    return out;
}

std::string settings_markdown() {
    std::string md;
    const SettingClass order[] = {C::kProduction, C::kLossy, C::kExperiment, C::kTestOnly};
    for (SettingClass c : order) {
        md += std::string("\n### ") +
              (c == C::kProduction   ? "Production"
               : c == C::kLossy      ? "Lossy (opt-in)"
               : c == C::kExperiment ? "Experiments (A/B)"
                                     : "Test-only") +
              "\n\n| Flag | Environment | RunOptions | Values | Default | `settings` key | What it "
              "does |\n"
              "|---|---|---|---|---|---|---|\n";
        for (const Setting & s : kSettings) {
            if (s.cls != c || is_command_row(s)) continue;
            auto code = [](const std::string & x) { return x.empty() ? "" : "`" + x + "`"; };
            // The flag's value (its type and range), or the variable's choices.
            std::string values = *s.choices ? std::string(s.choices) : setting_type_name(s);
            if (const std::string r = setting_range_text(s); !r.empty()) values += ": " + r;
            std::string flag = code(*s.flags ? s.flags : "");
            if (*s.off_flags) flag += " / " + code(s.off_flags);
            if (*s.commands) {  // "run|eval" -> " (run, eval)"
                std::string cmds;
                for (const std::string & c : split_choices(s.commands))
                    cmds += (cmds.empty() ? "" : ", ") + c;
                flag += " (" + cmds + ")";
            }
            md += "| " + flag + " | " + code(s.env) + " | " + code(s.field) + " | " +
                  md_cell(values) + " | " + md_cell(s.dflt) + " | " + code(s.key) + " | " +
                  md_cell(s.doc) + (s.traits & kStreaming ? " (streaming only)" : "") +
                  (*s.off_flags ? std::string("; ") + s.off_flags + ": " + s.off_doc : "") +
                  " |\n";
        }
    }
    // A command's own flags (Setting::command_member), one table per options struct: its
    // heading and the structs whose rows it lists (the first's names the field column; a row
    // of another is named with its struct).
    struct Table {
        const char * heading;
        std::vector<std::string> types;
    };
    const Table tables[] = {
        {"`serve`", {"ServeOptions"}},
        {"`chat`", {"ChatOptions"}},
        {"Sampling (`run`, `chat`, `serve`)", {"SamplingParams", "GenerateRequest"}},
        {"`run`", {"RunCmdOptions"}},
        {"Chat template (`chat`, `serve`)", {"ChatTemplateOptions"}},
        {"`eval`", {"EvalOptions"}},
        {"`inspect`", {"InspectOptions"}},
        {"`make-fallback`", {"FallbackOptions"}},
        {"`synth`", {"SynthCommandOptions"}},
        {"`replay`", {"ReplayOptions"}},
    };
    for (const Table & t : tables) {
        const std::string & type = t.types[0];
        md += "\n### " + std::string(t.heading) + "\n\n| Flag | " + type +
              " | Values | Default | What it does |\n|---|---|---|---|---|\n";
        for (const Setting & s : kSettings) {
            const std::string cf = s.command_field;
            const std::string of = cf.substr(0, cf.find("::"));
            if (!is_command_row(s) ||
                std::find(t.types.begin(), t.types.end(), of) == t.types.end())
                continue;
            std::string values = setting_type_name(s);
            if (const std::string r = setting_range_text(s); !r.empty()) values += ": " + r;
            const std::string field = of == type ? cf.substr(type.size() + 2) : cf;
            std::string flag = "`" + std::string(s.flags) + "`";
            if (*s.off_flags) flag += " / `" + std::string(s.off_flags) + "`";
            md += "| " + flag + " | `" + field + "` | " + md_cell(values) + " | " +
                  md_cell(s.dflt) + " | " + md_cell(s.doc) +
                  (*s.off_flags ? std::string("; ") + s.off_flags + ": " + s.off_doc : "") +
                  (*s.excludes ? std::string(" (not with ") + s.excludes + ")" : "") + " |\n";
        }
    }
    return md;
}

}  // namespace moestream
