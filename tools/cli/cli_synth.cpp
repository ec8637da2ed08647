// `moestream synth` — writes a GGUF MoE model with deterministic random weights.
//   moestream synth --preset NAME [--arch A] [--type T] [--seed S] [--alignment N] [--attn-gain G] [--nextn-layers N]
//                   [--progress] -o FILE
// Bad flags exit 64; an output that cannot be written exits 3 with one line naming the file.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "cli.h"
#include "moestream/log.h"
#include "moestream/synth.h"

namespace moestream::cli {

namespace {

// Case-insensitive: --type q4_K (the spelling inspect and ggml print) is q4_k; the value is
// replaced by the canonical name.
CLI::Validator one_of(const std::vector<std::string> & names, const std::string & what) {
    std::string list;
    for (const auto & n : names) list += (list.empty() ? "" : "|") + n;
    return CLI::Validator(
        [names, what](std::string & v) -> std::string {
            auto lower = [](std::string x) {
                for (char & c : x) c = char(std::tolower((unsigned char)c));
                return x;
            };
            for (const auto & n : names)
                if (lower(n) == lower(v)) {
                    v = n;
                    return "";
                }
            std::string msg = "unknown " + what + " '" + v + "' (one of:";
            for (const auto & n : names) msg += " " + n;
            return msg + ")";
        },
        list);
}

}  // namespace

void add_synth_command(CLI::App & app, Action * action) {
    auto * sub = app.add_subcommand(
        "synth", "write a random-weight MoE GGUF model (deterministic, for tests and benchmarks)");
    auto opt = std::make_shared<SynthCommandOptions>();
    auto verbosity = std::make_shared<int>(0);
    add_synth_flags(sub, opt.get());  // registry rows (settings.h); the checks beyond a range:
    sub->get_option("--preset")->transform(one_of(synth_presets(), "preset"));
    sub->get_option("--arch")->transform(one_of(synth_archs(), "architecture"));
    sub->get_option("--type")->transform(one_of(synth_types(), "type"));
    sub->get_option("--alignment")
        ->check(CLI::Validator(
            [](std::string & v) -> std::string {
                unsigned long n = 0;
                try {
                    n = std::stoul(v);
                } catch (const std::exception &) {
                    return "alignment must be a number";
                }
                return (n & (n - 1)) == 0 ? "" : "alignment must be a power of two";
            },
            "POW2"));
    sub->add_flag("-v", *verbosity, "more log (-vv: debug)");
    sub->callback([action, opt, verbosity, sub] {
        *action = [opt, verbosity, sub] {
            apply_verbosity(*verbosity);
            if (opt->dry_run) {
                if (int rc = refuse_given(sub, {"--force", "--progress"},
                                          "has no effect with --dry-run (nothing is written)"))
                    return rc;
            } else {
                if (opt->out_path.empty())
                    return usage_error("synth", "-o FILE is required (or --dry-run to plan only)");
                Status ck = check_output_paths({{"synth: -o", opt->out_path}});
                if (!ck.ok()) return report(ck);
                std::error_code ec;
                if (std::filesystem::exists(opt->out_path, ec) && !opt->force)
                    return usage_error("synth", "-o " + opt->out_path +
                                                    " exists; add --force to overwrite it");
            }
            SynthResult r;
            if (!opt->dry_run) remove_on_signals({synth_temp_path(*opt)});
            Status st = synth_model(*opt, &r);
            if (!st.ok()) {
                std::fprintf(stderr, "moestream: %s\n", st.message().c_str());
                return st.exit_code();
            }
            const double mb = double(r.file_bytes) / 1e6;
            if (opt->dry_run) {
                std::printf("%s: %llu bytes (%.1f MB), %llu tensors, experts %.1f MB\n",
                            opt->out_path.empty() ? "dry run" : opt->out_path.c_str(), static_cast<unsigned long long>(r.file_bytes),
                            mb, static_cast<unsigned long long>(r.n_tensors),
                            double(r.expert_bytes) / 1e6);
                return 0;
            }
            std::printf("wrote %s: %llu bytes (%.1f MB) in %.2f s, %.1f MB/s\n",
                        opt->out_path.c_str(), static_cast<unsigned long long>(r.file_bytes), mb,
                        r.seconds, r.seconds > 0 ? mb / r.seconds : 0.0);
            return 0;
        };
    });
}

}  // namespace moestream::cli
