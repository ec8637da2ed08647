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
    {"-nkvo,--no-kv-offload,--no-op-offload", kWhyCpu},
    {"-ot,--override-tensor", "moestream places the expert tensors itself"},
    {"-cmoe,--cpu-moe,-ncmoe,--n-cpu-moe", "the experts always stay in RAM or on flash"},
    {"--mlock", "the experts are read from flash, not locked in RAM"},
    {"--numa", "no NUMA placement: one CPU node is assumed"},
    {"-C,--cpu-mask,-Cr,--cpu-range,--cpu-strict,-Cb,--cpu-mask-batch,-Crb,--cpu-range-batch,"
     "--prio,--prio-batch,--poll,--poll-batch",
     kWhyThreadsOs},
    {"--log-file,--log-colors,--log-prefix,--log-timestamps", kWhyLog},
    {"-hf,-hfr,--hf-repo,-hff,--hf-file,-hft,--hf-token,-mu,--model-url,--offline", kWhyDownload},
    {"-md,--model-draft,-cd,--ctx-size-draft,-devd,--device-draft,-ngld,--gpu-layers-draft,"
     "--n-gpu-layers-draft,--draft,--draft-max,--draft-n,--draft-min,--draft-n-min,--draft-p-min,"
     "-tbd,--threads-batch-draft,-td,--threads-draft,--spec-replace",
     kWhyNoDraft},
    {"--lora,--lora-scaled,--lora-init-without-apply,--control-vector,--control-vector-scaled,"
     "--control-vector-layer-range",
     kWhyAdapters},
    {"--mmproj,--mmproj-url,--no-mmproj,--no-mmproj-offload,--image", "text models only: no multimodal projector"},
    {"-mv,--model-vocoder,--tts-use-guide-tokens", "no speech output"},
    {"--rope-scaling,--rope-scale,--rope-freq-base,--rope-freq-scale,--yarn-orig-ctx,"
     "--yarn-ext-factor,--yarn-attn-factor,--yarn-beta-slow,--yarn-beta-fast",
     kWhyRope},
    {"-gan,--grp-attn-n,-gaw,--grp-attn-w", kWhyRope},
    {"-ctk,--cache-type-k,-ctv,--cache-type-v", "the KV cache is f16"},
    {"-dt,--defrag-thold,-kvu,--kv-unified,--swa-full", "one sequence: the KV cache has one layout"},
    {"--context-shift,--no-context-shift,--keep",
     "no context shift: a generation ends at a full context (chat drops its oldest turns)"},
    {"-np,--parallel,-cb,--cont-batching,-nocb,--no-cont-batching,--threads-http", kWhyOneSeq},
    {"--embedding,--embeddings,--pooling,--rerank,--reranking", kWhyGenOnly},
    {"--ssl-key-file,--ssl-cert-file", "serve speaks plain HTTP: put a TLS proxy in front"},
    {"--override-kv", "the model's GGUF metadata is used as it is"},
    {"--in-prefix,--in-prefix-bos,--in-suffix", "chat wraps each turn in the model's own chat template"},
    {"--dynatemp-range,--dynatemp-exp,--xtc-probability,--xtc-threshold,--dry-multiplier,"
     "--dry-base,--dry-allowed-length,--dry-penalty-last-n,--dry-sequence-breaker,--top-nsigma,"
     "--samplers,--sampling-seq,--mirostat,--mirostat-lr,--mirostat-ent,--typical,-l,--logit-bias",
     "not yet: these samplers (moestream samples with temperature, top-k, top-p, min-p)"},
    {"--grammar,--grammar-file,--json-schema",
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
