// test_settings.cpp — the registry of settings (include/moestream/settings.h): the docs'
// tables are the registry's, the environment overlay sets the fields it names, the lossy-knob
// text and the library's words come from the rows. No model: the registry is data.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "moestream/settings.h"
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
        // miss_fallback and fallback_threshold are reported with --miss-fallback only.
        if (key.empty() || key == "miss_fallback" || key == "fallback_threshold") continue;
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
    for (const char * name : {"store", "io_overlap", "prefill_readahead", "prefetch", "lossy"})
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
