// `moestream make-fallback` — writes the companion GGUF of --miss-fallback: the model's
// expert tensors re-quantized to a low-bit type by llama.cpp's llama-quantize
// (include/moestream/fallback.h; docs/quality.md, "Low-bit fallback").
//   moestream make-fallback -m MODEL.gguf -o COMPANION.gguf [--type Q2_K] [-t N]
//                           [--quantize-tool CMD]
// Exit codes as every subcommand (cli.h).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "cli.h"
#include "moestream/fallback.h"

#ifndef MOESTREAM_SOURCE_DIR
#define MOESTREAM_SOURCE_DIR ""
#endif

namespace moestream::cli {

namespace {

struct FallbackFlags {
    MakeFallbackOptions opt;
    std::string tool;
};

// The llama-quantize to run: --quantize-tool (split at spaces), else the source tree's
// scripts/llama-tool (the private prefix, under its own glibc), else llama-quantize on PATH.
std::vector<std::string> quantize_command(const std::string & tool) {
    std::vector<std::string> cmd;
    if (!tool.empty()) {
        std::istringstream is(tool);
        for (std::string w; is >> w;) cmd.push_back(w);
        return cmd;
    }
    const std::string lt = std::string(MOESTREAM_SOURCE_DIR) + "/scripts/llama-tool";
    if (*MOESTREAM_SOURCE_DIR && access(lt.c_str(), X_OK) == 0) return {lt, "llama-quantize"};
    return {"llama-quantize"};
}

}  // namespace

void add_fallback_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<FallbackFlags>();
    auto * sub = app.add_subcommand(
        "make-fallback",
        "write the low-bit companion of a model's experts for --miss-fallback (LOSSY knob)");
    sub->add_option("-m,--model", f->opt.model_path, "GGUF model file (or any shard of a split set)")
        ->required();
    sub->add_option("-o,--output", f->opt.out_path, "the companion GGUF to write")->required();
    sub->add_option("--type", f->opt.type,
                    "llama-quantize type of the expert copies (Q2_K, Q3_K, IQ4_XS, Q4_0, ...)");
    sub->add_option("-t,--threads", f->opt.n_threads, "llama-quantize threads (0: its default)")
        ->check(int_range(0, 512));
    sub->add_option("--quantize-tool", f->tool,
                    "the llama-quantize command (default: the private prefix's, else PATH)");
    sub->callback([f, action] {
        *action = [f] {
            MakeFallbackOptions o = f->opt;
            o.quantize_cmd = quantize_command(f->tool);
            if (o.quantize_cmd.empty())
                return usage_error("make-fallback", "--quantize-tool is empty");
            Status st = check_fallback_type(o.type);
            if (!st.ok()) return usage_error("make-fallback", "--type: " + st.message());
            // The directory exists and is writable before llama-quantize runs (exit 3).
            st = check_output_paths({{"-o", o.out_path}});
            if (!st.ok()) return report(st);
            remove_on_signals(make_fallback_temp_paths(o));
            MakeFallbackResult r;
            st = make_fallback(o, &r);
            if (!st.ok()) return report(st);
            std::printf("moestream make-fallback: %s -> %s: expert tensors %.1f MiB -> %.1f MiB "
                        "(%s), source fingerprint %s\n",
                        o.model_path.c_str(), o.out_path.c_str(),
                        double(r.expert_bytes_model) / (1 << 20),
                        double(r.expert_bytes_fallback) / (1 << 20), r.types.c_str(),
                        r.fingerprint.c_str());
            return 0;
        };
    });
}

}  // namespace moestream::cli
