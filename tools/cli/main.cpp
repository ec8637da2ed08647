// moestream CLI entry point: dispatches to the subcommands (run, inspect, synth, ...).
#include <cstdio>

#include "cli.h"
#include "moestream/log.h"

namespace moestream::cli {
void apply_verbosity(int count) {
    if (count >= 2) log_set_level(LogLevel::kDebug);
    else if (count == 1) log_set_level(LogLevel::kInfo);
}
}  // namespace moestream::cli

int main(int argc, char ** argv) {
    using namespace moestream::cli;
    CLI::App app{"moestream: run Mixture-of-Experts GGUF models whose experts do not fit in RAM,\n"
                 "reading from flash only the experts each token is routed to."};
    app.require_subcommand(1);
    Action action;
    add_run_command(app, &action);
    add_inspect_command(app, &action);
    add_synth_command(app, &action);
    add_replay_command(app, &action);
    add_eval_command(app, &action);
    add_serve_command(app, &action);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp & e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp & e) {
        return app.exit(e);
    } catch (const CLI::ParseError & e) {
        std::fprintf(stderr, "moestream: %s\n", e.what());
        std::fprintf(stderr, "%s", app.help().c_str());
        return 64;
    }
    if (!action) return 64;
    return action();
}
