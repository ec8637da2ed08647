// `moestream inspect` — placeholder until the inspect subcommand lands.
#include "cli.h"
namespace moestream::cli {
void add_inspect_command(CLI::App & app, Action * action) {
    auto * sub = app.add_subcommand("inspect", "describe a MoE GGUF model (sizes, working set)");
    sub->callback([action] { *action = [] { return 1; }; });
}
}  // namespace moestream::cli
