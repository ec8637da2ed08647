// test_run_config.cpp — Engine::open refuses bad RunOptions before touching the model, in the
// library's words (RunOptions::<field>), and the CLI prints the same refusals with its flags.
#include <gtest/gtest.h>

#include <string>

#include "moestream/moestream.h"
#include "test_util.h"

using namespace moestream;
using namespace moestream::test;

namespace {

// Options that pass every check; the model path does not exist, so open stops at the model.
RunOptions valid() {
    RunOptions o;
    o.model_path = "/nonexistent/model.gguf";
    return o;
}

void expect_refused(const RunOptions & o, const std::string & words) {
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    EXPECT_EQ(st.code(), ErrorCode::kUsage) << st.message();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find("--"), std::string::npos) << "a CLI flag: " << st.message();
    EXPECT_EQ(e, nullptr);
}

TEST(RunConfig, BadOptionsAreRefusedInTheLibrarysWords) {
    RunOptions o = valid();
    o.n_threads = 0;
    expect_refused(o, "RunOptions::n_threads must be in 1..512");
    o = valid();
    o.n_ctx = 8;
    expect_refused(o, "RunOptions::n_ctx must be >= 16");
    o = valid();
    o.stream = false;
    o.drop_cold = 0.5;
    expect_refused(o, "RunOptions::drop_cold needs streaming (it drops cache misses), not "
                      "RunOptions::stream = false");
    o = valid();
    o.resident_mmap = false;
    expect_refused(o, "RunOptions::resident_mmap = false applies to RunOptions::stream = false");
    o = valid();
    o.prefetch = true;
    o.io_threads = 1;
    expect_refused(o, "RunOptions::prefetch needs a worker lane");
    o = valid();
    o.drop_renorm = true;
    expect_refused(o, "need RunOptions::drop_cold > 0");
    // Control: the same options without the fault pass the checks and stop at the model file.
    std::unique_ptr<Engine> e;
    Status st = Engine::open(valid(), &e);
    EXPECT_EQ(st.code(), ErrorCode::kBadModel) << st.message();
}

// Refusals that need the model (the cache rule, the companion file) name RunOptions fields
// too, never a CLI flag. Negative control: the CLI's words for the same refusals (below).
TEST(RunConfig, ModelDependentRefusalsAreInTheLibrarysWords) {
    setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
    RunOptions o = valid();
    o.model_path = synth_model("tiny", "qwen3moe", "q8_0");
    o.cache_mb = 1;
    expect_refused(o, "RunOptions::cache_mb 1 is below the cache rule");
    expect_refused(o, "Use RunOptions::cache_mb 0 (off) or >= ");
    expect_refused(o, "smaller budgets need RunOptions::force_cache");
    o.cache_mb = 0;
    o.miss_fallback = "/nonexistent/companion.gguf";
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    EXPECT_EQ(st.code(), ErrorCode::kBadModel) << st.message();
    EXPECT_EQ(st.message().rfind("RunOptions::miss_fallback /nonexistent/companion.gguf: ", 0), 0u)
        << st.message();
    EXPECT_EQ(st.message().find("--"), std::string::npos) << st.message();
}

// The CLI rewrites the library's names as its flags (negative control of the mapping: the
// library's message above names RunOptions::resident_mmap and RunOptions::stream).
TEST(RunConfig, TheCliPrintsItsFlags) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -n 1 --no-mmap");
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("--no-mmap applies to --no-stream (streaming maps the file itself)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("RunOptions::"), std::string::npos) << r.err;
    r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(model) +
                " -n 1 --prefetch --io-threads 1");
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("--prefetch needs a worker lane to read ahead with: --io-threads 2 or more"),
              std::string::npos)
        << r.err;
    r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -n 1 --cache-mb 1");
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("error: --cache-mb 1 is below the cache rule"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Use --cache-mb 0 (off) or >= "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("smaller budgets need --force-cache"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("RunOptions::"), std::string::npos) << r.err;
    // chat prints the engine's refusals with the same flags.
    for (const char * flags : {"--prefetch --io-threads 1", "--cache-mb 1"}) {
        r = run_cmd("echo hi | " + sh_quote(cli_bin()) + " chat -m " + sh_quote(model) + " -n 1 " + flags);
        EXPECT_EQ(r.exit_code, 64) << r.err;
        EXPECT_NE(r.err.find(std::string("error: ") + (flags[2] == 'p' ? "--prefetch" : "--cache-mb 1")),
                  std::string::npos)
            << r.err;
        EXPECT_EQ(r.err.find("RunOptions::"), std::string::npos) << r.err;
    }
}

// `serve` opens the engine inside the server library and prints its refusals with the same
// flags as `run`.
TEST(RunConfig, TheServerPrintsTheCliFlags) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " serve -m " + sh_quote(model) +
                          " --port 0 --no-mmap");
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("--no-mmap applies to --no-stream (streaming maps the file itself)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("RunOptions::"), std::string::npos) << r.err;
}

}  // namespace
