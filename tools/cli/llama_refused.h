// llama_refused.h — the one table of llama.cpp's flags (llama-cli, llama-server) that moestream
// does not have, each with the one-line reason it is refused. The CLI refuses them by name
// before CLI11 reads the arguments (cli_common.cpp: "not supported by moestream: FLAG
// (REASON)", exit 64); docs/cli.md's table between `<!-- llama-refused:begin -->` and
// `<!-- llama-refused:end -->` is refused_flags_markdown() (a test compares them).
//
// Invariants: a spelling appears in one row only; a flag a subcommand defines is never refused
// (the CLI looks up the subcommand's own options first), so a row speaks only for the
// subcommands that lack it. Header-only data: the tests include it.
// Thread-safety: immutable.
#pragma once

#include <string>

namespace moestream::cli {

struct RefusedFlag {
    const char * flags;  // llama.cpp's spellings, comma-separated ("-dev,--device")
    const char * why;    // one line: why moestream has no such flag
};

inline constexpr const char * kWhyCpu = "CPU only";
inline constexpr const char * kWhyNoDraft = "no speculative decoding";
inline constexpr const char * kWhyRope =
    "the model's own RoPE settings (from its GGUF) are used; no context extension";
inline constexpr const char * kWhyDownload = "give a local GGUF file with -m; moestream never downloads";
inline constexpr const char * kWhyOneSeq = "one sequence at a time; requests queue (503 with Retry-After when full)";
inline constexpr const char * kWhyAdapters = "no adapters: the model's weights are used as they are";
inline constexpr const char * kWhyGenOnly = "text generation only: no embeddings, pooling or reranking";
inline constexpr const char * kWhyThreadsOs = "thread placement and priority are the OS's";
inline constexpr const char * kWhyLog = "the log goes to stderr only, plain (redirect it; -v / --log-disable set how much)";

inline constexpr RefusedFlag kRefusedFlags[] = {
    {"-dev,--device,--list-devices", kWhyCpu},
    {"-sm,--split-mode", kWhyCpu},
    {"-ts,--tensor-split", kWhyCpu},
    {"-mg,--main-gpu", kWhyCpu},
    {"-nkvo,--no-kv-offload,--no-op-offload,-kvo,--kv-offload,--op-offload", kWhyCpu},
    {"-fit,--fit,-fitc,--fit-ctx,-fitt,--fit-target,--moe-cache-mib,-bs,--backend-sampling,--rpc",
     kWhyCpu},
    {"--repack,-nr,--no-repack,--no-host,-ncffn,--n-cpu-ffn", "the CPU backend's own weight layout is used"},
    {"-lm,--load-mode,-lzm,--lazy-mode,--check-tensors",
     "moestream loads the dense weights itself and reads each expert when it is routed"},
    {"-ot,--override-tensor", "moestream places the expert tensors itself"},
    {"-cmoe,--cpu-moe,-ncmoe,--n-cpu-moe", "the experts always stay in RAM or on flash"},
    {"--mlock", "the experts are read from flash, not locked in RAM"},
    {"--numa", "no NUMA placement: one CPU node is assumed"},
    {"-C,--cpu-mask,-Cr,--cpu-range,--cpu-strict,-Cb,--cpu-mask-batch,-Crb,--cpu-range-batch,"
     "--prio,--prio-batch,--poll,--poll-batch,--cpu-strict-batch",
     kWhyThreadsOs},
    {"--log-file,--log-colors,--log-prefix,--log-timestamps,--no-log-prefix,--no-log-timestamps,"
     "--log-jsonl,--no-log-jsonl,--log-verbose,-lv,--verbosity,--log-verbosity,--log-prompts-dir",
     kWhyLog},
    {"--perf,--no-perf,--show-timings,--no-show-timings,-ptc,--print-token-count",
     "run prints its timing summary on stderr (-v for more; --stats-json for all figures)"},
    {"-hf,-hfr,--hf-repo,-hff,--hf-file,-hft,--hf-token,-mu,--model-url,--offline,-dr,--docker-repo,"
     "-cl,--cache-list,--embd-gemma-default,--fim-qwen-1.5b-default,--fim-qwen-3b-default,"
     "--fim-qwen-7b-default,--fim-qwen-7b-spec,--fim-qwen-14b-spec,--fim-qwen-30b-default,"
     "--gpt-oss-20b-default,--gpt-oss-120b-default,--vision-gemma-4b-default,--vision-gemma-12b-default",
     kWhyDownload},
    {"-md,--model-draft,-cd,--ctx-size-draft,-devd,--device-draft,-ngld,--gpu-layers-draft,"
     "--n-gpu-layers-draft,--draft,--draft-max,--draft-n,--draft-min,--draft-n-min,--draft-p-min,"
     "-tbd,--threads-batch-draft,-td,--threads-draft,--spec-replace,--draft-p-split,-ctkd,"
     "--cache-type-k-draft,-ctvd,--cache-type-v-draft,-Cd,--cpu-mask-draft,-Cbd,--cpu-mask-batch-draft,"
     "-Crd,--cpu-range-draft,--cpu-strict-draft,--cpu-strict-batch-draft,--prio-draft,"
     "--prio-batch-draft,--poll-draft,--poll-batch-draft,-cmoed,--cpu-moe-draft,-ncmoed,"
     "--n-cpu-moe-draft,-otd,--override-tensor-draft,-hfd,-hfrd,--hf-repo-draft,-lcs,"
     "--lookup-cache-static,-lcd,--lookup-cache-dynamic",
     kWhyNoDraft},
    {"--spec-default,--spec-type,--spec-draft-model,--spec-draft-hf,--spec-draft-device,"
     "--spec-draft-ngl,--spec-draft-threads,--spec-draft-threads-batch,--spec-draft-cpu-mask,"
     "--spec-draft-cpu-mask-batch,--spec-draft-cpu-range,--spec-draft-cpu-strict,"
     "--spec-draft-cpu-strict-batch,--spec-draft-prio,--spec-draft-prio-batch,--spec-draft-poll,"
     "--spec-draft-poll-batch,--spec-draft-cpu-moe,--spec-draft-n-cpu-moe,--spec-draft-ncmoe,"
     "--spec-draft-override-tensor,--spec-draft-type-k,--spec-draft-type-v,--spec-draft-n-max,"
     "--spec-draft-n-min,--spec-draft-n-ubatch,--spec-draft-p-min,--spec-draft-p-split,"
     "--spec-draft-sampling,--spec-draft-backend-sampling,--no-spec-draft-backend-sampling,"
     "--spec-ngram-size-n,--spec-ngram-size-m,--spec-ngram-min-hits,--spec-ngram-simple-size-n,"
     "--spec-ngram-simple-size-m,--spec-ngram-simple-min-hits,--spec-ngram-map-k-size-n,"
     "--spec-ngram-map-k-size-m,--spec-ngram-map-k-min-hits,--spec-ngram-map-k4v-size-n,"
     "--spec-ngram-map-k4v-size-m,--spec-ngram-map-k4v-min-hits,--spec-ngram-mod-n-min,"
     "--spec-ngram-mod-n-max,--spec-ngram-mod-n-match,--spec-synth-len,--spec-synth-rates",
     kWhyNoDraft},
    {"--lora,--lora-scaled,--lora-init-without-apply,--control-vector,--control-vector-scaled,"
     "--control-vector-layer-range",
     kWhyAdapters},
    {"-mm,--mmproj,-mmu,--mmproj-url,--no-mmproj,--no-mmproj-offload,--mmproj-offload,--mmproj-auto,"
     "--no-mmproj-auto,-mmdev,--mmproj-device,--image,--image-min-tokens,--image-max-tokens,--audio,"
     "--video,--video-fps,--video-ffmpeg-dir,--video-timestamp-interval,--media-path,"
     "--mtmd-batch-max-tokens",
     "text models only: no multimodal projector"},
    {"-mv,--model-vocoder,--tts-use-guide-tokens", "no speech output"},
    {"--rope-scaling,--rope-scale,--rope-freq-base,--rope-freq-scale,--yarn-orig-ctx,"
     "--yarn-ext-factor,--yarn-attn-factor,--yarn-beta-slow,--yarn-beta-fast",
     kWhyRope},
    {"-gan,--grp-attn-n,-gaw,--grp-attn-w", kWhyRope},
    {"-ctk,--cache-type-k,-ctv,--cache-type-v", "the KV cache is f16"},
    {"-dt,--defrag-thold,-kvu,--kv-unified,-no-kvu,--no-kv-unified,--kv-unified-per-slot,--swa-full,"
     "-ctxcp,--ctx-checkpoints,--swa-checkpoints,-cms,--checkpoint-min-step",
     "one sequence: the KV cache has one layout"},
    {"--context-shift,--no-context-shift,--keep",
     "no context shift: a generation ends at a full context (chat drops its oldest turns)"},
    {"-np,--parallel,-cb,--cont-batching,-nocb,--no-cont-batching,--threads-http,-sps,"
     "--slot-prompt-similarity,--cache-reuse,-cram,--cache-ram,--cache-idle-slots,--no-cache-idle-slots,"
     "--no-slots,--sleep-idle-seconds",
     kWhyOneSeq},
    {"--embedding,--embeddings,--pooling,--rerank,--reranking,--embd-normalize", kWhyGenOnly},
    {"--reasoning-format,--reasoning-budget,--chat-template-kwargs",
     "reasoning is set per conversation: chat takes --reasoning on, off or auto and --reasoning-effort, a "
     "serve request chat_template_kwargs and reasoning_effort"},
    {"--ssl-key-file,--ssl-cert-file", "serve speaks plain HTTP: put a TLS proxy in front"},
    {"--api-prefix,--path,--reuse-port,-to,--timeout,--sse-ping-interval,--cors-origins,--cors-methods,"
     "--cors-headers,--cors-credentials,--no-cors-credentials",
     "serve answers at / on one port with its own page and fixed HTTP settings: put a proxy in front"},
    {"--webui,--ui,--no-ui,--webui-config,--webui-config-file,--ui-config,--ui-config-file,"
     "--webui-mcp-proxy,--no-webui-mcp-proxy,--ui-mcp-proxy,--no-ui-mcp-proxy",
     "serve's page has no settings file (--no-webui turns it off)"},
    {"--models-dir,--models-preset,--models-max,--models-autoload,--no-models-autoload,--tags,"
     "--server-base,--props",
     "one model per server, fixed at start (-m)"},
    {"-ag,--agent,-no-ag,--no-agent,--tools,--tools-runtime,--mcp-servers-config,--mcp-servers-json",
     "no built-in tools: a client runs the tools it declares"},
    {"--override-kv", "the model's GGUF metadata is used as it is"},
    {"--in-prefix,--in-prefix-bos,--in-suffix", "chat wraps each turn in the model's own chat template"},
    {"--no-jinja,--skip-chat-parsing,--no-skip-chat-parsing,--prefill-assistant,--no-prefill-assistant,"
     "--reasoning-preserve,--no-reasoning-preserve,--reasoning-budget-message",
     "the model's chat template is always rendered with minja and its replies parsed (docs/server.md)"},
    {"-mli,--multiline-input,--simple-io", "chat reads one line per turn (end a line with \\ to go on)"},
    {"-sp,--special", "special tokens are never printed as text"},
    {"--spm-infill", "no infill: text generation from a prompt only"},
    {"--warmup", "moestream runs no warm-up decode (--no-warmup is accepted)"},
    {"--completion-bash", "no shell completion script"},
    {"-bf,--binary-file,--prompt-cache-all,--prompt-cache-ro",
     "the prompt is text (-p, -f FILE, -f -); --prompt-cache saves and reloads the prompt's state"},
    {"--hellaswag,--hellaswag-tasks,--winogrande,--winogrande-tasks,--multiple-choice,"
     "--multiple-choice-tasks,--kl-divergence,--kl-divergence-base,--chunks,--ppl-stride,"
     "--ppl-output-type,--save-all-logits,-o,--output,--output-file",
     "eval scores perplexity over a text (--stats-json for its figures); no task suites"},
    {"--dynatemp-range,--dynatemp-exp,--xtc-probability,--xtc-threshold,--dry-multiplier,"
     "--dry-base,--dry-allowed-length,--dry-penalty-last-n,--dry-sequence-breaker,--top-nsigma,"
     "--samplers,--sampling-seq,--sampler-seq,--mirostat,--mirostat-lr,--mirostat-ent,--typical,"
     "--typical-p,-l,--logit-bias,--top-n-sigma,--adaptive-target,--adaptive-decay",
     "not yet: these samplers (moestream samples with temperature, top-k, top-p, min-p)"},
    {"--grammar,--grammar-file,--json-schema,-j,-jf,--json-schema-file",
     "not yet on this command line (chat takes --grammar and --grammar-file; serve takes a request's "
     "grammar or response_format)"},
};

// Whether `flag` is one of the row's spellings.
inline bool refused_row_has(const RefusedFlag & r, const std::string & flag) {
    const std::string all = std::string(",") + r.flags + ",";
    return all.find("," + flag + ",") != std::string::npos;
}

// The reason `flag` is refused (nullptr: not in the table).
inline const char * refused_flag_reason(const std::string & flag) {
    for (const RefusedFlag & r : kRefusedFlags)
        if (refused_row_has(r, flag)) return r.why;
    return nullptr;
}

// docs/cli.md's table, exactly as the doc has it between its markers.
inline std::string refused_flags_markdown() {
    std::string md = "\n| llama.cpp flag | Why moestream refuses it |\n|---|---|\n";
    for (const RefusedFlag & r : kRefusedFlags) {
        std::string cell;
        const std::string all = r.flags;
        for (size_t at = 0; at <= all.size();) {
            size_t end = all.find(',', at);
            if (end == std::string::npos) end = all.size();
            cell += (cell.empty() ? "`" : ", `") + all.substr(at, end - at) + "`";
            at = end + 1;
        }
        md += "| " + cell + " | " + r.why + " |\n";
    }
    return md + "\n";
}

}  // namespace moestream::cli
