// test_settings.cpp — the registry of settings (include/moestream/settings.h): the docs'
// tables are the registry's, the environment overlay sets the fields it names, the lossy-knob
// text and the library's words come from the rows. No model: the registry is data.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "moestream/settings.h"
#include "settings_report.h"
#include "test_util.h"

using namespace moestream;

namespace {

std::string docs_block() {
    return moestream::test::doc_block("docs/cli.md", "<!-- settings:begin -->\n",
                                      "<!-- settings:end -->");
}

}  // namespace

// docs/cli.md's settings tables are exactly what the registry renders. Negative control: a
// row's doc line changed in the rendering no longer matches.
TEST(Settings, DocsTablesMatchTheRegistry) {
    const std::string md = settings_markdown();
    EXPECT_EQ(docs_block(), md) << "paste between the docs/cli.md markers:\n" << md;
    std::string changed = md;
    changed.replace(changed.find("compute threads"), 7, "computE");
    EXPECT_NE(docs_block(), changed);
}

// Every field appears once, every environment variable once; every RunOptions field that has
// a flag is rewritten to it in messages.
TEST(Settings, FieldsAndVariablesAreUnique) {
    std::set<std::string> fields, envs;
    for (const Setting & s : settings_registry()) {
        if (*s.field) {
            EXPECT_TRUE(fields.insert(s.field).second) << s.field;
        }
        if (*s.env) {
            EXPECT_TRUE(envs.insert(s.env).second) << s.env;
        }
        EXPECT_NE(std::string(s.doc), "") << s.field << s.env;
    }
    EXPECT_EQ(find_setting("no_such_field"), nullptr);  // control
    ASSERT_NE(find_setting("n_ctx"), nullptr);
}

// The environment overlay sets the row's field; a value not in the row's choices is refused
// naming the variable and the values. Control: unset leaves the default.
TEST(Settings, EnvironmentOverlaySetsTheField) {
    RunOptions o;
    ASSERT_TRUE(apply_env_overlay(&o).ok());
    EXPECT_EQ(o.overlap_stages, 3);
    EXPECT_TRUE(o.prefetch_uring);
    setenv("MOESTREAM_OVERLAP_STAGES", "2", 1);
    setenv("MOESTREAM_PREFETCH_NO_URING", "1", 1);
    Status st = apply_env_overlay(&o);
    unsetenv("MOESTREAM_PREFETCH_NO_URING");
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(o.overlap_stages, 2);
    EXPECT_FALSE(o.prefetch_uring);  // the variable is the field's negation
    setenv("MOESTREAM_OVERLAP_STAGES", "4", 1);
    st = apply_env_overlay(&o);
    unsetenv("MOESTREAM_OVERLAP_STAGES");
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_EQ(st.message(), "MOESTREAM_OVERLAP_STAGES=4: must be 2 or 3");
}

// A field set by a program is checked against the row's values like the variable.
TEST(Settings, FieldOutsideItsChoicesIsRefused) {
    RunOptions o;
    EXPECT_TRUE(check_setting_choices(o).ok());
    o.slot_populate = "lazy";
    const Status st = check_setting_choices(o);
    EXPECT_EQ(st.code(), ErrorCode::kUsage);
    EXPECT_EQ(st.message(), "RunOptions::slot_populate lazy is not idle, nice or off");
}

// The lossy knobs in effect, as flags, from the lossy rows; none at the defaults.
TEST(Settings, LossyKnobsTextNamesTheKnobsInEffect) {
    RunOptions o;
    EXPECT_EQ(lossy_knobs_text(o, 4), "");
    EXPECT_FALSE(lossy_options(o, 4));
    o.n_expert_used = 4;  // the model's own top-k: lossless
    EXPECT_EQ(lossy_knobs_text(o, 4), "");
    o.n_expert_used = 3;
    o.drop_cold = 0.5;
    o.drop_renorm = true;
    EXPECT_EQ(lossy_knobs_text(o, 4),
              "--n-expert-used 3 (the model's 4) --drop-cold-experts 0.5 --drop-renorm");
    o.miss_fallback = "c.gguf";
    EXPECT_NE(lossy_knobs_text(o, 4).find("--miss-fallback c.gguf --fallback-threshold 0.1"),
              std::string::npos);
    const RunOptions ref = without_lossy_knobs(o);
    EXPECT_EQ(lossy_knobs_text(ref, 4), "");
    EXPECT_EQ(ref.model_path, o.model_path);
}

// The library's names become the CLI's: a flag, or for an environment-only field the variable
// with its value. A name without a row stays.
TEST(Settings, OptionWordsNameFlagsAndVariables) {
    EXPECT_EQ(option_words("RunOptions::stream = false and RunOptions::n_ctx 8"),
              "--no-stream and -c 8");
    EXPECT_EQ(option_words("RunOptions::slot_cache = 1: x with RunOptions::cache_move = false"),
              "MOESTREAM_SLOT_CACHE=1: x with --cache-no-move");
    EXPECT_EQ(option_words("RunOptions::pool_warm = true"), "MOESTREAM_POOL_WARM=1");
    EXPECT_EQ(option_words("RunOptions::no_such_field"), "RunOptions::no_such_field");
}

// A field the CLI sets for the user (no flag, no variable) is named by what the user does:
// the library's advice after serve refuses a request's drop_cold_experts reads as flags.
// Control: the same message without the rewriting names the library's field.
TEST(Settings, OptionWordsNameWhatTheUserDoesForDropColdLater) {
    const std::string lib = "open with RunOptions::drop_cold_later, or RunOptions::slot_cache = 0";
    const std::string w = option_words(lib);
    EXPECT_EQ(w, "open with --drop-cold-experts given at start (serve: requests may then change "
                 "it), or MOESTREAM_SLOT_CACHE=0");
    EXPECT_EQ(w.find("RunOptions::"), std::string::npos) << w;
    EXPECT_NE(lib.find("RunOptions::drop_cold_later"), std::string::npos);
}

// Every registry key is in a run's `settings`, and the plan is there with a reason per choice.
// Control: a key the registry does not have is absent.
TEST(Settings, EveryRegistryKeyIsInTheSettings) {
    const std::string model = moestream::test::synth_model("tiny", "qwen3moe", "q8_0");
    const moestream::test::StatsRun ok = moestream::test::run_with_stats(model, "hello", 2, "");
    ASSERT_EQ(ok.rc, 0) << ok.err;
    const nlohmann::json set = nlohmann::json::parse(ok.stats)["settings"];
    for (const Setting & s : settings_registry()) {
        const std::string key = s.key;
        if (key.empty()) continue;
        EXPECT_TRUE(set.contains(key)) << key;
    }
    EXPECT_FALSE(set.contains("no_such_key"));
    ASSERT_TRUE(set.contains("plan"));
    EXPECT_GE(set["plan"].size(), 8u);
    for (const auto & c : set["plan"]) EXPECT_FALSE(c["reason"].get<std::string>().empty()) << c;
}

// `inspect --plan` prints the plan a run with the same flags gets (the store, the overlap and
// the read-ahead choices agree with the run's settings.plan); engine flags without --plan are
// refused by name. Control: different flags give a different plan.
TEST(Settings, InspectPlanIsTheRunsPlan) {
    using namespace moestream::test;
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string flags = "--cache-mb 0 --io-threads 2";
    const StatsRun run = run_with_stats(model, "hello", 2, flags);
    ASSERT_EQ(run.rc, 0) << run.err;
    const nlohmann::json ran = nlohmann::json::parse(run.stats)["settings"]["plan"];
    const std::string inspect =
        sh_quote(cli_bin()) + " inspect --json --plan -m " + sh_quote(model) + " ";
    const CmdResult r = run_cmd(inspect + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json planned = nlohmann::json::parse(r.out);
    auto value = [](const nlohmann::json & plan, const std::string & name) {
        for (const auto & c : plan)
            if (c["name"] == name) return c["value"].get<std::string>();
        return std::string("<none>");
    };
    for (const char * name :
         {"n_ctx", "n_batch", "store", "io_overlap", "prefill_readahead", "prefetch", "lossy"})
        EXPECT_EQ(value(planned, name), value(ran, name)) << name;
    const CmdResult lru = run_cmd(inspect + "--cache-mb 8 --force-cache --cache-no-move");
    ASSERT_EQ(lru.exit_code, 0) << lru.err;
    EXPECT_EQ(value(nlohmann::json::parse(lru.out), "store"), "lru");
    EXPECT_NE(value(planned, "store"), "lru");
    const CmdResult refused =
        run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(model) + " --cache-mb 0");
    EXPECT_EQ(refused.exit_code, 64);
    EXPECT_NE(refused.err.find("--cache-mb applies to --plan"), std::string::npos) << refused.err;
}

// `settings` is generated from the rows: every key, the field's value as its type (a range
// word where one stands for it), a resolved value where the run gives one; observations are
// added beside. Controls: a resolved key no row has, and an observation under a row's key,
// are refused (the report would drift from the registry).
TEST(Settings, SettingsObjectIsTheRowsWithResolvedValues) {
    RunOptions o;
    o.temp = 0.5f;
    nlohmann::json resolved, observed, j;
    resolved["io_overlap"] = false;
    observed["cache_mb"] = 7;
    ASSERT_TRUE(settings_object(o, resolved, observed, &j).ok());
    size_t keys = 0;
    for (const Setting & s : settings_registry())
        if (*s.key) {
            ++keys;
            EXPECT_TRUE(j.contains(s.key)) << s.key;
        }
    EXPECT_EQ(j.size(), keys + 1);
    EXPECT_EQ(j["temp"], 0.5);
    EXPECT_EQ(j["flash_attn"], "auto");
    EXPECT_EQ(j["cache_mb_requested"], "auto");
    EXPECT_EQ(j["prefill_readahead_option"], "where it applies");
    EXPECT_EQ(j["io_overlap"], false);  // resolved, though the field is true
    EXPECT_EQ(j["cache_mb"], 7);
    o.cache_mb = 512;
    o.flash_attn = 0;
    ASSERT_TRUE(settings_object(o, {}, {}, &j).ok());
    EXPECT_EQ(j["cache_mb_requested"], 512);
    EXPECT_EQ(j["flash_attn"], "off");
    EXPECT_EQ(j["io_overlap"], true);
    EXPECT_FALSE(settings_object(o, {{"no_such_key", 1}}, {}, &j).ok());
    EXPECT_FALSE(settings_object(o, {}, {{"temp", 1}}, &j).ok());
}

// A flag's value is checked against its row's range and type, and sets the field (a word:
// the value it stands for). Controls: values outside the range, or no number, are refused
// with one line naming what the value may be, and leave the field as it was.
TEST(Settings, FlagValuesFollowTheRowsRange) {
    const Setting & ctx = *find_setting("n_ctx");
    EXPECT_EQ(check_setting_text(ctx, "16"), "");
    EXPECT_EQ(check_setting_text(ctx, "0"), "");
    EXPECT_EQ(check_setting_text(ctx, "8"), "8 is not in 16..4194304 (or 0: the model's)");
    EXPECT_EQ(check_setting_text(ctx, "x"), "'x' is not a whole number");
    EXPECT_EQ(check_setting_text(ctx, "1.5"), "'1.5' is not a whole number");
    const Setting & cache = *find_setting("cache_mb");
    RunOptions o;
    o.cache_mb = 5;
    EXPECT_TRUE(set_setting_text(cache, "auto", &o));
    EXPECT_EQ(o.cache_mb, -1);
    EXPECT_TRUE(set_setting_text(cache, "0", &o));
    EXPECT_EQ(o.cache_mb, 0);
    EXPECT_FALSE(set_setting_text(cache, "-1", &o));  // the number behind the word is no value
    EXPECT_EQ(o.cache_mb, 0);
    EXPECT_EQ(check_setting_text(cache, "lots"), "'lots' is not a whole number or auto");
    EXPECT_EQ(check_setting_text(*find_setting("flash_attn"), "maybe"),
              "'maybe' is not on, off or auto");
    EXPECT_EQ(check_setting_text(*find_setting("flash_attn"), "1"), "1 is not on, off or auto");
    const Setting & drop = *find_setting("drop_cold");
    EXPECT_EQ(check_setting_text(drop, "0"), "0 is not in (0, 1]");
    EXPECT_TRUE(set_setting_text(drop, "0.25", &o));
    EXPECT_EQ(o.drop_cold, 0.25);
    EXPECT_TRUE(set_setting_text(*find_setting("temp"), "0.7", &o));  // a float holds 0.7 nearly
    EXPECT_FLOAT_EQ(o.temp, 0.7f);
    EXPECT_EQ(check_setting_text(*find_setting("temp"), "101"), "101 is not in [0, 100]");
    EXPECT_EQ(check_setting_text(*find_setting("n_threads"), "99999999999999999999"),
              "'99999999999999999999' is not a whole number");
    EXPECT_EQ(check_setting_text(*find_setting("n_threads"), "5000000000"),
              "5000000000 is not in 1..512");
    // A bool's flag sets the opposite of its default, whatever its name: --cache-no-move
    // clears cache_move (control: --prefetch sets prefetch).
    EXPECT_FALSE(setting_flag_value(*find_setting("cache_move")));
    EXPECT_FALSE(setting_flag_value(*find_setting("stream")));
    EXPECT_TRUE(setting_flag_value(*find_setting("prefetch")));
    EXPECT_EQ(setting_type_name(cache), "auto|INT");
    EXPECT_EQ(setting_type_name(*find_setting("flash_attn")), "on|off|auto");
    EXPECT_EQ(setting_type_name(*find_setting("miss_fallback")), "FILE");
}

namespace {
// The row of `flag` (one of its names or off names) that `command` takes (nullptr: none).
const Setting * find_command_flag(const std::string & command, const std::string & flag) {
    for (const Setting & r : settings_registry())
        for (const char * names : {r.flags, r.off_flags})
            if (*names && ("," + std::string(names) + ",").find("," + flag + ",") != std::string::npos &&
                r.for_command(command))
                return &r;
    return nullptr;
}
}  // namespace

// Every row with a flag is an option of each command the row names (the CLI binds the
// registry's rows); a row for one command is no other's. Control: `run`'s --route-trace is
// not serve's.
TEST(Settings, EveryRowsFlagIsBoundOnItsCommands) {
    using namespace moestream::test;
    // `flag` as --help lists an option: among the names that begin a line ("  -c,--ctx-size
    // INT..."), before a space or the end of the line; not a mention in some help text.
    auto lists = [](const std::string & help, const std::string & flag) {
        for (size_t at = help.find(flag); at != std::string::npos; at = help.find(flag, at + 1)) {
            const size_t line = help.rfind('\n', at) + 1;  // npos + 1 = 0
            const std::string names = help.substr(line, at - line);
            const size_t first = names.find_first_not_of(' ');
            const bool begins = first == std::string::npos ||
                                (names.find(' ', first) == std::string::npos && names.back() == ',');
            const char after = at + flag.size() < help.size() ? help[at + flag.size()] : '\n';
            if (begins && (after == ' ' || after == '\n')) return true;
        }
        return false;
    };
    for (const char * cmd :
         {"run", "chat", "eval", "serve", "inspect", "make-fallback", "synth", "replay"}) {
        const CmdResult h = run_cmd(sh_quote(cli_bin()) + " " + cmd + " --help");
        ASSERT_EQ(h.exit_code, 0) << cmd << h.err;
        for (const Setting & s : settings_registry()) {
            if (!*s.flags) continue;
            for (std::string flag : {std::string(s.flags), std::string(s.off_flags)}) {
                if (flag.empty()) continue;
                flag = flag.substr(flag.rfind(',') + 1);  // the last spelling: its long name
                // Another row of this flag that this command takes (run's, chat's and serve's
                // -n are three rows, each its command's only).
                const Setting * own = find_command_flag(cmd, flag);
                if (own != nullptr && own != &s) continue;
                if (std::string(cmd) == "eval" && flag == "--file") continue;  // eval binds its -f
                EXPECT_EQ(lists(h.out, flag), s.for_command(cmd)) << cmd << " " << flag;
            }
        }
    }
    const Setting * trace = find_setting("route_trace");
    ASSERT_NE(trace, nullptr);
    EXPECT_TRUE(trace->for_command("run"));
    EXPECT_FALSE(trace->for_command("serve"));
    EXPECT_TRUE(find_setting("n_ctx")->for_command("inspect"));  // the engine's flags
    EXPECT_FALSE(find_setting("n_ctx")->for_command("make-fallback"));
}

// serve's lossy-knob text is the registry's: the app's default named by its flag.
TEST(Settings, ServeNamesItsLossyDefaultsByTheirFlags) {
    using namespace moestream::test;
    const CmdResult h = run_cmd(sh_quote(cli_bin()) + " serve --help");
    ASSERT_EQ(h.exit_code, 0) << h.err;
    RunOptions app;
    app.drop_cold = 0.75;
    const std::string knobs = lossy_knobs_text(app, 0);
    EXPECT_EQ(knobs, "--drop-cold-experts 0.75");
    EXPECT_NE(h.out.find("LOSSY: " + knobs), std::string::npos) << h.out;
    EXPECT_NE(h.out.find(std::string(find_flag_setting("--lossless")->doc) + " (" + knobs + ")"),
              std::string::npos)
        << h.out;
    EXPECT_EQ(find_flag_setting("--no-such-flag"), nullptr);
}

// Under --no-stream every command refuses each flag of a streaming row (kStreaming) that it
// takes, by name: the list comes from the registry. Negative control: a row not marked
// streaming (--temp) passes the check (the run then fails on the missing model, not exit 64).
TEST(Settings, StreamingRowsAreRefusedUnderNoStream) {
    using namespace moestream::test;
    const std::string missing = "/nonexistent/moestream-settings-model.gguf";
    // A value the row's flag accepts (its check is empty), or none for a bare flag.
    auto value_of = [](const Setting & s) -> std::string {
        if (std::holds_alternative<bool RunOptions::*>(s.member) || *s.off_flags) return "";
        if (std::holds_alternative<std::string RunOptions::*>(s.member))
            return " /nonexistent/moestream-settings-out";
        for (const char * v : {"1", "2", "auto"})
            if (check_setting_text(s, v).empty()) return std::string(" ") + v;
        return " ?";
    };
    size_t refused = 0;
    for (const char * cmd : {"run", "chat", "eval -f /nonexistent/t.txt", "serve",
                             "inspect --plan"}) {
        const std::string name = std::string(cmd).substr(0, std::string(cmd).find(' '));
        for (const Setting & s : settings_registry()) {
            if (!(s.traits & kStreaming) || !s.for_command(name)) continue;
            std::string flag = s.flags;
            flag = flag.substr(flag.rfind(',') + 1);
            const CmdResult r = run_cmd(sh_quote(cli_bin()) + " " + cmd + " -m " + missing +
                                        " --no-stream " + flag + value_of(s) + " 2>&1");
            EXPECT_EQ(r.exit_code, 64) << cmd << " " << flag << ": " << r.out;
            EXPECT_NE(r.out.find(flag + " applies to streaming; remove --no-stream"),
                      std::string::npos)
                << cmd << ": " << r.out;
            ++refused;
        }
    }
    EXPECT_GE(refused, 5u * 8u);  // every command has the cache and I/O rows
    const CmdResult control = run_cmd(sh_quote(cli_bin()) + " run -m " + missing +
                                      " -p Hi --no-stream --temp 0.5 2>&1");
    EXPECT_NE(control.exit_code, 64) << control.out;
    EXPECT_EQ(control.out.find("applies to streaming"), std::string::npos) << control.out;
    ASSERT_NE(find_setting("temp"), nullptr);
    EXPECT_FALSE(find_setting("temp")->traits & kStreaming);
}

// --seed -1 stands for a random seed: set_setting_text draws it and says so; any other value
// is the seed itself (control), and a number outside the range is refused naming it.
TEST(Settings, SeedMinusOneDrawsARandomSeed) {
    const Setting & seed = *find_setting("seed");
    RunOptions o;
    std::string note;
    EXPECT_EQ(check_setting_text(seed, "-1"), "");
    ASSERT_TRUE(set_setting_text(seed, "-1", &o, &note));
    EXPECT_EQ(note, "random seed " + std::to_string(o.seed));
    ASSERT_TRUE(set_setting_text(seed, "5", &o, &note));
    EXPECT_EQ(o.seed, 5u);
    EXPECT_EQ(note, "");
    EXPECT_EQ(check_setting_text(seed, "-2"), "-2 is not in 0..4294967295 (or -1: random)");
    EXPECT_EQ(check_setting_text(seed, "4294967296"),
              "4294967296 is not in 0..4294967295 (or -1: random)");
}

// A negation pair is one row: --no-prefill-readahead finds the prefill_readahead row, and the
// two flags exclude each other on the command line. Control: one of them alone passes the
// parse (the run then fails on the missing model, not exit 64).
TEST(Settings, NegationPairIsOneRowOfTwoFlags) {
    using namespace moestream::test;
    EXPECT_EQ(find_flag_setting("--no-prefill-readahead"), find_setting("prefill_readahead"));
    EXPECT_EQ(find_flag_setting("--prefill-readahead"), find_setting("prefill_readahead"));
    const std::string run = sh_quote(cli_bin()) + " run -p Hi -m /nonexistent/m.gguf ";
    const CmdResult both = run_cmd(run + "--prefill-readahead --no-prefill-readahead 2>&1");
    EXPECT_EQ(both.exit_code, 64) << both.out;
    EXPECT_NE(both.out.find("excludes"), std::string::npos) << both.out;
    const CmdResult one = run_cmd(run + "--no-prefill-readahead 2>&1");
    EXPECT_NE(one.exit_code, 64) << one.out;
}

namespace {

// The MOESTREAM_* names `text` reads: string literals that are exactly a variable name
// ("MOESTREAM_SLOT_CACHE"), as getenv, env() and test_switch() take them; a name inside a
// message ("or set MOESTREAM_PYTHON)") is no read.
std::set<std::string> env_names_read(const std::string & text) {
    std::set<std::string> out;
    for (size_t at = text.find("\"MOESTREAM_"); at != std::string::npos;
         at = text.find("\"MOESTREAM_", at + 1)) {
        size_t end = at + 1;
        while (end < text.size() && (std::isupper(static_cast<unsigned char>(text[end])) ||
                                     std::isdigit(static_cast<unsigned char>(text[end])) ||
                                     text[end] == '_'))
            ++end;
        if (end < text.size() && text[end] == '"') out.insert(text.substr(at + 1, end - at - 1));
    }
    return out;
}

}  // namespace

// Every MOESTREAM_* variable the library or the CLI reads (a literal name in src/ or tools/,
// the registry itself aside) is a registry row, so docs/cli.md lists it. Negative control: the
// scanner reports a name that is not a row, and does see the reads it must (the logger's).
TEST(Settings, EveryVariableTheCodeReadsIsARow) {
    namespace fs = std::filesystem;
    std::set<std::string> rows;
    for (const Setting & s : settings_registry())
        if (*s.env) rows.insert(s.env);
    std::set<std::string> read;
    for (const char * dir : {"src", "tools"})
        for (const auto & e : fs::recursive_directory_iterator(moestream::test::src_dir() + "/" + dir)) {
            const std::string p = e.path().string(), ext = e.path().extension().string();
            if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
            if (e.path().filename() == "settings.cpp") continue;  // the rows themselves
            for (const std::string & n : env_names_read(moestream::test::slurp(p)))
                read.insert(n + " (" + p.substr(moestream::test::src_dir().size() + 1) + ")");
        }
    EXPECT_GE(read.size(), 10u);
    bool saw_log = false;
    for (const std::string & r : read) {
        const std::string name = r.substr(0, r.find(' '));
        saw_log = saw_log || name == "MOESTREAM_LOG";
        EXPECT_EQ(rows.count(name), 1u) << r << " is read but is no registry row";
    }
    EXPECT_TRUE(saw_log);
    const std::set<std::string> control =
        env_names_read("std::getenv(\"MOESTREAM_NOT_A_ROW\"); \"set MOESTREAM_PYTHON)\"");
    EXPECT_EQ(control, std::set<std::string>{"MOESTREAM_NOT_A_ROW"});
    EXPECT_EQ(rows.count("MOESTREAM_NOT_A_ROW"), 0u);
}

// The option names a --help lists: the first word of each option line, split at commas
// ("  -n,--n-predict INT..." -> -n, --n-predict).
static std::vector<std::string> help_flags(const std::string & help) {
    std::vector<std::string> out;
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) {
        const size_t a = line.find_first_not_of(' ');
        if (a == std::string::npos || line[a] != '-') continue;
        std::istringstream names(line.substr(a, line.find(' ', a) - a));
        for (std::string n; std::getline(names, n, ',');) out.push_back(n);
    }
    return out;
}

// The flags of `command`'s --help that are neither a row for that command nor in `others`.
static std::vector<std::string> flags_without_row(const std::string & help, const char * command,
                                                  const std::set<std::string> & others) {
    std::vector<std::string> missing;
    for (const std::string & f : help_flags(help))
        if (find_command_flag(command, f) == nullptr && others.count(f) == 0) missing.push_back(f);
    return missing;
}

// Every flag each command's --help lists is a registry row of that command (the engine's, the
// command's own, the sampling flags, the chat template), or one of a short list of flags that
// are no setting (help, version, log level). Negative controls: without that list the check
// names them; make-fallback's flags are no rows of synth's; a flag of another command's row
// (chat's --system-prompt) in run's listing is named.
TEST(Settings, EveryCommandFlagIsARow) {
    using namespace moestream::test;
    const std::set<std::string> not_settings = {"-h", "--help", "--version", "-v", "--verbose"};
    // The command and how many flags its --help lists at least (the listing was read).
    const std::pair<const char *, size_t> commands[] = {
        {"run", 40},  {"serve", 40},        {"chat", 40},  {"eval", 40},
        {"inspect", 30}, {"make-fallback", 8}, {"synth", 14}, {"replay", 16}};
    for (const auto & [cmd, at_least] : commands) {
        const CmdResult h = run_cmd(sh_quote(cli_bin()) + " " + cmd + " --help");
        ASSERT_EQ(h.exit_code, 0) << h.err;
        const std::vector<std::string> missing = flags_without_row(h.out, cmd, not_settings);
        EXPECT_TRUE(missing.empty()) << cmd << " " << missing.front();
        ASSERT_GE(help_flags(h.out).size(), at_least) << h.out;
        const std::vector<std::string> control = flags_without_row(h.out, cmd, {});
        EXPECT_NE(std::find(control.begin(), control.end(), "--help"), control.end()) << cmd;
    }
    for (const char * cmd : {"run", "serve", "chat"}) {
        const CmdResult h = run_cmd(sh_quote(cli_bin()) + " " + cmd + " --help");
        for (const char * shared : {"--top-k", "-r", "--ignore-eos"})  // the sampling rows
            EXPECT_NE(find_command_flag(cmd, shared), nullptr) << cmd << " " << shared;
        const std::vector<std::string> control = flags_without_row(h.out, cmd, {});
        EXPECT_NE(std::find(control.begin(), control.end(), "--verbose"), control.end());
        EXPECT_EQ(std::find(control.begin(), control.end(), "-n"), control.end());
    }
    const CmdResult fb = run_cmd(sh_quote(cli_bin()) + " make-fallback --help");
    const std::vector<std::string> other = flags_without_row(fb.out, "synth", not_settings);
    EXPECT_NE(std::find(other.begin(), other.end(), "--quantize-tool"), other.end());
    EXPECT_NE(std::find(other.begin(), other.end(), "-t"), other.end());
    const CmdResult run = run_cmd(sh_quote(cli_bin()) + " run --help");
    const std::vector<std::string> foreign =
        flags_without_row(run.out + "  --system-prompt TEXT\n", "run", not_settings);
    EXPECT_EQ(foreign, std::vector<std::string>{"--system-prompt"});
}

// A row's `excludes` column: the CLI refuses its flag together with the one it names, with
// CLI11's words, on every command that takes the pair; each names a row that the row's
// commands take. Control: the second flag alone is not refused as a pair (the run then fails
// on the missing model or file).
TEST(Settings, ExcludesColumnRefusesThePair) {
    using namespace moestream::test;
    size_t pairs = 0;
    for (const Setting & s : settings_registry()) {
        if (!*s.excludes) continue;
        const Setting * other = find_flag_setting(s.excludes);
        ASSERT_NE(other, nullptr) << s.flags;
        for (const char * cmd : {"run", "chat", "serve", "eval", "inspect"})
            if (s.for_command(cmd)) {
                EXPECT_TRUE(other->for_command(cmd)) << s.flags << " " << cmd;
            }
        ++pairs;
    }
    // -f / -p, the system prompt, the grammar, the chat template, the key, --lossless
    EXPECT_EQ(pairs, 6u);
    const std::string bin = sh_quote(cli_bin()) + " ";
    const std::string m = " -m /nonexistent/moestream-settings-model.gguf ";
    struct Case {
        const char * cmd, *a, *b, *message;
    };
    for (const Case & c : {Case{"run", "-p x", "-f /nonexistent/p.txt", "--prompt excludes --file"},
                           Case{"chat", "--system-prompt x", "--system-prompt-file /nonexistent/s",
                                "--system-prompt excludes --system-prompt-file"},
                           Case{"chat", "--grammar x", "--grammar-file /nonexistent/g",
                                "--grammar excludes --grammar-file"},
                           Case{"serve", "--chat-template chatml", "--chat-template-file /nonexistent/t",
                                "--chat-template excludes --chat-template-file"},
                           Case{"serve", "--api-key k", "--api-key-file /nonexistent/k",
                                "--api-key excludes --api-key-file"},
                           Case{"serve", "--lossless", "--drop-cold-experts 0.5",
                                "--lossless excludes --drop-cold-experts"}}) {
        const CmdResult both = run_cmd(bin + c.cmd + m + c.a + " " + c.b + " 2>&1");
        EXPECT_EQ(both.exit_code, 64) << c.cmd << both.out;
        EXPECT_NE(both.out.find(c.message), std::string::npos) << both.out;
        const CmdResult one = run_cmd(bin + c.cmd + m + c.b + " 2>&1 </dev/null");
        EXPECT_EQ(one.out.find("excludes"), std::string::npos) << one.out;
    }
}

namespace {
// The row refuses `bad` with `why`, the field keeping its value, then sets it from `good`.
template <class O>
void expect_refuses_then_sets(const Setting & s, O * o, const std::string & bad,
                              const std::string & why, const std::string & good) {
    const std::string before = setting_value_text(s, *o);
    EXPECT_EQ(check_setting_text(s, bad), why);
    EXPECT_FALSE(set_setting_text(s, bad, o));
    EXPECT_EQ(setting_value_text(s, *o), before);
    EXPECT_TRUE(set_setting_text(s, good, o));
    EXPECT_EQ(setting_value_text(s, *o), good);
}
}  // namespace

// A sampling row sets its SamplingParams field and refuses a value outside its range with the
// registry's words; -r's row adds each value to GenerateRequest::stop; a run row's default is
// run's (-p, -n). Control: a refused value leaves the field unchanged.
TEST(Settings, SamplingAndRunRowsSetTheirFields) {
    const Setting * top_p = find_flag_setting("--top-p");
    ASSERT_NE(top_p, nullptr);
    SamplingParams sp;
    EXPECT_EQ(setting_value_text(*top_p, sp), "1");
    expect_refuses_then_sets(*top_p, &sp, "0", "0 is not in (0, 1]", "0.5");
    EXPECT_FLOAT_EQ(sp.top_p, 0.5f);
    EXPECT_TRUE(setting_flag_value(*find_flag_setting("--ignore-eos")));
    const Setting * stop = find_flag_setting("--reverse-prompt");
    ASSERT_NE(stop, nullptr);
    GenerateRequest req;
    EXPECT_TRUE(set_setting_text(*stop, "User:", &req));
    EXPECT_TRUE(set_setting_text(*stop, "###", &req));
    EXPECT_EQ(req.stop, (std::vector<std::string>{"User:", "###"}));
    RunCmdOptions ro;
    const Setting * n = find_command_flag("run", "-n");
    ASSERT_NE(n, nullptr);
    EXPECT_STREQ(n->command_field, "RunCmdOptions::n_predict");
    EXPECT_EQ(setting_value_text(*n, ro), "64");
    EXPECT_EQ(check_setting_text(*n, "-2"), "-2 is not in -1..16777216");
    EXPECT_EQ(setting_value_text(*find_command_flag("run", "-p"), ro), "Once upon a time");
}

// A serve row sets its ServeOptions field from the flag's text and refuses a value outside
// its range with the registry's wording (the field unchanged). Control: the default stays
// until a value is set.
TEST(Settings, ServeRowSetsItsField) {
    const Setting * port = find_flag_setting("--port");
    ASSERT_NE(port, nullptr);
    ServeOptions so;
    EXPECT_EQ(setting_value_text(*port, so), "8080");
    expect_refuses_then_sets(*port, &so, "70000", "70000 is not in 0..65535", "9000");
    EXPECT_EQ(so.port, 9000);
    const Setting * webui = find_flag_setting("--no-webui");
    ASSERT_NE(webui, nullptr);
    EXPECT_TRUE(setting_flag_value(*webui));  // the flag sets no_webui (default false)
}

// A chat row of choices refuses a value outside them by name, and its negation pair sets the
// field both ways. Control: a listed choice is accepted and set.
TEST(Settings, ChatRowsCheckChoicesAndPairs) {
    const Setting * reasoning = find_flag_setting("--reasoning");
    ASSERT_NE(reasoning, nullptr);
    ChatOptions co;
    EXPECT_EQ(check_setting_text(*reasoning, "maybe"), "maybe is not on, off or auto");
    EXPECT_FALSE(set_setting_text(*reasoning, "maybe", &co));
    EXPECT_EQ(co.reasoning, "auto");
    EXPECT_TRUE(set_setting_text(*reasoning, "off", &co));
    EXPECT_EQ(co.reasoning, "off");
    const Setting * escape = find_flag_setting("--no-escape");
    ASSERT_NE(escape, nullptr);
    EXPECT_EQ(escape, find_flag_setting("--escape"));  // one row of two flags
    EXPECT_EQ(setting_value_text(*escape, co), "1");   // on by default
}

// An integer row takes its flag's value exactly, beyond a double's 53 bits (synth --seed), and
// refuses a negative one with its range. Control: the value read as a double is another number.
TEST(Settings, IntegerRowsAreSetExactly) {
    const Setting * seed = nullptr;
    for (const Setting & s : settings_registry())
        if (std::string(s.command_field) == "SynthCommandOptions::seed") seed = &s;
    ASSERT_NE(seed, nullptr);
    SynthCommandOptions o;
    ASSERT_TRUE(set_setting_text(*seed, "9007199254740993", &o));
    EXPECT_EQ(o.seed, 9007199254740993ull);
    EXPECT_NE(uint64_t(std::strtod("9007199254740993", nullptr)), 9007199254740993ull);
    EXPECT_EQ(check_setting_text(*seed, "-1"), "-1 is not in 0..9223372036854775807");
    EXPECT_FALSE(set_setting_text(*seed, "-1", &o));
    EXPECT_EQ(o.seed, 9007199254740993ull);
}

namespace {

// The experiment rows of `rows` whose doc line states no verdict: neither "Settled" nor "Not
// settled", or no "kept because" (why the knob stays).
std::vector<std::string> experiments_without_verdict(const std::vector<Setting> & rows) {
    std::vector<std::string> out;
    for (const Setting & s : rows) {
        if (s.cls != SettingClass::kExperiment) continue;
        const std::string doc = s.doc;
        const bool verdict = doc.find("Settled") != std::string::npos ||
                             doc.find("Not settled") != std::string::npos;
        if (!verdict || doc.find("kept because") == std::string::npos) {
            out.push_back(*s.flags ? s.flags : s.env);
        }
    }
    return out;
}

}  // namespace

// Every A/B experiment row says in its doc line what its benchmark showed and why the knob
// stays. Negative control: an experiment row whose doc has no verdict is named.
TEST(Settings, EveryExperimentRowStatesItsVerdict) {
    std::vector<Setting> rows = settings_registry();
    EXPECT_EQ(experiments_without_verdict(rows), std::vector<std::string>{});
    auto it = std::find_if(rows.begin(), rows.end(), [](const Setting & s) {
        return s.cls == SettingClass::kExperiment && std::string(s.env) == "MOESTREAM_SLOT_CACHE";
    });
    ASSERT_NE(it, rows.end());
    it->doc = "which store holds a cache budget";
    EXPECT_EQ(experiments_without_verdict(rows), std::vector<std::string>{"MOESTREAM_SLOT_CACHE"});
}
