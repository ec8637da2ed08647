// test_settings.cpp — the registry of settings (include/moestream/settings.h): the docs'
// tables are the registry's, the environment overlay sets the fields it names, the lossy-knob
// text and the library's words come from the rows. No model: the registry is data.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "moestream/settings.h"
#include "test_util.h"

using namespace moestream;

namespace {

std::string docs_block() {
    std::ifstream in(std::string(MOESTREAM_TEST_SRC) + "/docs/cli.md");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    const std::string b = "<!-- settings:begin -->\n", e = "<!-- settings:end -->";
    const size_t at = s.find(b), end = s.find(e);
    if (at == std::string::npos || end == std::string::npos || end < at) return "<no markers>";
    return s.substr(at + b.size(), end - at - b.size());
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
        if (*s.field) EXPECT_TRUE(fields.insert(s.field).second) << s.field;
        if (*s.env) EXPECT_TRUE(envs.insert(s.env).second) << s.env;
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
    EXPECT_EQ(option_words("RunOptions::drop_cold_later"), "RunOptions::drop_cold_later");
}
