// `moestream run` — placeholder until the run subcommand lands.
#include "cli.h"
namespace moestream::cli {
void add_run_command(CLI::App & app, Action * action) {
    auto * sub = app.add_subcommand("run", "generate text, streaming the experts");
    sub->callback([action] { *action = [] { return 1; }; });
}
}  // namespace moestream::cli
