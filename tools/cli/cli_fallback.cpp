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
    FallbackOptions own;  // the command's flags (registry rows, settings.h)
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
    add_fallback_flags(sub, &f->own);
    sub->callback([f, action] {
        *action = [f] {
            MakeFallbackOptions o;
            o.model_path = f->own.model_path;
            o.out_path = f->own.out_path;
            o.type = f->own.type;
            o.n_threads = f->own.n_threads;
            o.quantize_cmd = quantize_command(f->own.quantize_tool);
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
