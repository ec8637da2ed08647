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
     .command_member = &S::api_key_file, .command_field = "ServeOptions::api_key_file"},
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
     .command_member = &S::lossless, .command_field = "ServeOptions::lossless"},
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
     .off_doc = "", .command_member = &H::system_prompt_file, .command_field = "ChatOptions::system_prompt_file"},
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
     .off_doc = "", .command_member = &H::grammar_file, .command_field = "ChatOptions::grammar_file"},
    {.field = "", .member = {}, .flags = "--verbose-prompt", .env = "", .choices = "", .env_inverted = false,
     .dflt = "off", .cls = C::kProduction,
     .doc = "print each turn's rendered prompt on stderr before its reply",
     .key = "", .range = "", .commands = "chat", .traits = 0, .off_flags = "",
     .off_doc = "", .command_member = &H::verbose_prompt, .command_field = "ChatOptions::verbose_prompt"},
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
     "move the mapping with mremap)",
     "cache_move", "", "", kStreaming},
    {"prefetch_uring", &R::prefetch_uring, "", "MOESTREAM_PREFETCH_NO_URING", "0|1", true, "0",
     C::kExperiment, "1: --prefetch tails are read by the worker lanes instead of io_uring",
     "prefetch_io"},
    {"overlap_stages", &R::overlap_stages, "", "MOESTREAM_OVERLAP_STAGES", "2|3", false, "3",
     C::kExperiment,
     "which expert reads a layer waits for before its first expert matmul: 2 gate and up; 3 "
     "only the projection the graph multiplies first, the second waited for before its own "
     "matmul (docs/design.md). Off with the overlap",
     "io_overlap_stages"},
    {"staged_reads", &R::staged_reads, "", "MOESTREAM_STAGED_READS", "0|1", false, "1",
     C::kExperiment,
     "1: the read lanes start a stage's reads only once the earlier stages' reads are in",
     "io_staged_reads"},
    {"stage_split", &R::stage_split, "", "MOESTREAM_STAGE_SPLIT", "0|1", false, "1", C::kExperiment,
     "1: a routing's reads start once the first stage's slices are committed, the rest "
     "committed while they read (docs/cache.md, \"Split staging\")",
     "io_stage_split"},
    {"prefill_guess", &R::prefill_guess, "", "MOESTREAM_PREFILL_GUESS", "rows|bank", false, "rows",
     C::kExperiment,
     "what prefill read-ahead reads for the next MoE layer: the union of the ubatch rows' "
     "guesses, or the layer's whole bank (docs/prefetch.md)",
     "prefill_guess"},
    {"pool_warm", &R::pool_warm, "", "MOESTREAM_POOL_WARM", "0|1", false, "0", C::kExperiment,
     "1: the LRU cache's page pool zero-fills up to the budget's worth of pages in a "
     "low-priority thread from the cache's creation on (docs/cache.md, \"Pool warm-up\")",
     "cache_pool_warm"},
    {"slot_cache", &R::slot_cache, "", "MOESTREAM_SLOT_CACHE", "auto|0|1", false, "auto",
     C::kExperiment,
     "which store holds a cache budget: auto, the fixed-slot cache where it can run, else the "
     "LRU cache; 0 the LRU cache; 1 the fixed-slot cache, refused by name where it cannot run "
     "(docs/cache.md)",
     "cache_store"},
    {"slot_warm", &R::slot_warm, "", "MOESTREAM_SLOT_WARM", "0|1", false, "1", C::kExperiment,
     "1: with the fixed-slot cache, the prompt's last ubatch fills the slots from the shared "
     "slots; 0 starts decode with empty slots",
     "cache_slot_warm"},
    {"huge_pages", &R::huge_pages, "", "MOESTREAM_HUGEPAGES", "0|1", false, "1", C::kExperiment,
     "1: the engine's own large buffers (expert slots, shared slots, dense weight copies) are "
     "advised for transparent huge pages; 0: 4 KiB pages. Not settled (huge-pages benchmark): "
     "decode 1.18x with the cache off and 1.02-1.10x at 2000-6000 MiB, but 0.95x [0.80, 1.13] "
     "at the default budget and a slower dense read under a memory cap",
     "huge_pages"},
    {"slot_populate", &R::slot_populate, "", "MOESTREAM_SLOT_POPULATE", "idle|nice|off", false,
     "idle", C::kExperiment,
     "how the fixed slots' pages are populated before first use: a SCHED_IDLE thread, a nice "
     "+10 thread, or not at all (docs/cache.md, \"Fixed slots\")",
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
                if constexpr (std::is_same_v<V, std::string>)
                    return v;
                else if constexpr (std::is_same_v<V, bool>)
                    return v ? "1" : "0";
                else if constexpr (std::is_floating_point_v<V>)
                    return num_text(double(v));
                else
                    return std::to_string(v);
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
                        if (!(d >= double(std::numeric_limits<V>::lowest()) &&
                              d <= double(std::numeric_limits<V>::max())))
                            return false;
                        v = V(d);
                        return double(v) == d;
                    }
                }
            }
        });
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
    if (*commands == 0) return true;
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
    RunOptions probe;  // the value must fit the field's type too
    ServeOptions serve_probe;
    ChatOptions chat_probe;
    if (ok && !(is_command_row(s) ? set_from_text(s, t, &serve_probe) || set_from_text(s, t, &chat_probe)
                                  : set_from_text(s, t, &probe)))
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

bool setting_flag_value(const Setting & s) {
    static const RunOptions kDefaults;
    static const ServeOptions kServeDefaults;
    static const ChatOptions kChatDefaults;
    if (const auto * c = std::get_if<bool ServeOptions::*>(&s.command_member))
        return !(kServeDefaults.**c);
    if (const auto * c = std::get_if<bool ChatOptions::*>(&s.command_member))
        return !(kChatDefaults.**c);
    const auto * m = std::get_if<bool RunOptions::*>(&s.member);
    return m != nullptr && !(kDefaults.**m);
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
    if (std::holds_alternative<bool RunOptions::*>(s.member) ||
        std::holds_alternative<bool ServeOptions::*>(s.command_member) ||
        std::holds_alternative<bool ChatOptions::*>(s.command_member))
        return "";
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
    // A command's own flags (Setting::command_member), one table per command.
    for (const char * command : {"serve", "chat"}) {
        const std::string type = command == std::string("serve") ? "ServeOptions" : "ChatOptions";
        md += "\n### `" + std::string(command) + "`\n\n| Flag | " + type +
              " | Values | Default | What it does |\n|---|---|---|---|---|\n";
        for (const Setting & s : kSettings) {
            if (!is_command_row(s) || !s.for_command(command)) continue;
            std::string values = setting_type_name(s);
            if (const std::string r = setting_range_text(s); !r.empty()) values += ": " + r;
            const std::string field = std::string(s.command_field).substr(type.size() + 2);
            std::string flag = "`" + std::string(s.flags) + "`";
            if (*s.off_flags) flag += " / `" + std::string(s.off_flags) + "`";
            md += "| " + flag + " | `" + field + "` | " + md_cell(values) + " | " +
                  md_cell(s.dflt) + " | " + md_cell(s.doc) +
                  (*s.off_flags ? std::string("; ") + s.off_flags + ": " + s.off_doc : "") + " |\n";
        }
    }
    return md;
}

}  // namespace moestream
