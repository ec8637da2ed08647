// `moestream synth` — placeholder until the synth subcommand lands.
#include "cli.h"
namespace moestream::cli {
void add_synth_command(CLI::App & app, Action * action) {
    auto * sub = app.add_subcommand("synth", "write a random-weight MoE GGUF model");
    sub->callback([action] { *action = [] { return 1; }; });
}
}  // namespace moestream::cli
