// test_model_files.cpp — model files that pass GGUF validation but that llama.cpp or ggml
// would trust and crash on (docs/reliability.md, "Model files llama.cpp trusts"). Each file
// is a tiny synth model with one field changed by tests/tools/gguf_mutate.py; each CLI run is
// under an address-space limit, so a regression fails instead of exhausting the machine.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moestream/moestream.h"
#include "test_util.h"

namespace fs = std::filesystem;
using moestream::test::cli_bin;
using moestream::test::CmdResult;
using moestream::test::run_cmd;
using moestream::test::sh_quote;
using moestream::test::synth_model;

namespace {

std::string src_dir() {
    const char * e = std::getenv("MOESTREAM_SRC");
    return e && *e ? e : MOESTREAM_TEST_SRC;
}

void backend_env() {
    setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
}

class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/moestream-model-files-XXXXXX";
        if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        dir_ = tmpl;
    }
    ~TempDir() { fs::remove_all(dir_); }
    std::string path(const std::string & n) const { return dir_ + "/" + n; }

private:
    std::string dir_;
};

// Copies `in` to `out` with the mutator's operations applied (each op is "VERB ARG").
void mutate(const std::string & in, const std::string & out, const std::vector<std::string> & ops) {
    std::string cmd = "python3 " + sh_quote(src_dir() + "/tests/tools/gguf_mutate.py") + " " +
                      sh_quote(in) + " " + sh_quote(out);
    for (const std::string & op : ops) cmd += " " + op;
    CmdResult r = run_cmd(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
}

// `moestream run` under a 4 GiB address-space limit (ASan builds reserve far more virtual
// memory than they use: they run without it) and a 120 s timeout.
CmdResult run_model(const std::string & model, const std::string & extra = "") {
    std::string limit = "prlimit --as=4294967296 ";
#if defined(__SANITIZE_ADDRESS__)
    limit = "";
#endif
    return run_cmd("timeout 120 " + limit + sh_quote(cli_bin()) + " run -m " + sh_quote(model) +
                   " -p 'hello world' -n 6 --io-threads 2 " + extra);
}

int count_lines(const std::string & s) {
    int n = 0;
    size_t b = 0;
    while (b < s.size()) {
        size_t e = s.find('\n', b);
        if (e == std::string::npos) e = s.size();
        if (e > b) ++n;
        b = e + 1;
    }
    return n;
}

}  // namespace

// The mutator changes nothing when asked to change nothing (so every case below differs
// from a model that runs by exactly the field it names).
TEST(ModelFiles, MutatorRoundTripIsByteIdentical) {
    TempDir tmp;
    for (const char * type : {"q8_0", "f32"}) {
        const std::string base = synth_model("tiny", "qwen3moe", type);
        mutate(base, tmp.path("same.gguf"), {});
        std::ifstream a(base, std::ios::binary), b(tmp.path("same.gguf"), std::ios::binary);
        std::string sa((std::istreambuf_iterator<char>(a)), {}),
            sb((std::istreambuf_iterator<char>(b)), {});
        EXPECT_EQ(sa.size(), sb.size()) << type;
        EXPECT_TRUE(sa == sb) << type;
    }
}

// A failed llama.cpp load is reported with llama.cpp's own reason, in one error line, exit 2
// (here: a tokenizer it does not know, and a head count that contradicts the tensor shapes;
// both pass moestream's index).
TEST(ModelFiles, LlamaLoadErrorsCarryLlamaCppsReason) {
    backend_env();
    TempDir tmp;
    const std::string base = synth_model("tiny", "qwen3moe", "q8_0");
    struct C {
        const char * op;
        const char * reason;
    } cases[] = {
        {"set tokenizer.ggml.model=foo", "unknown tokenizer: 'foo'"},
        {"set qwen3moe.attention.head_count=0", "has wrong shape"},
    };
    for (const C & c : cases) {
        const std::string m = tmp.path("m.gguf");
        mutate(base, m, {c.op});
        for (const char * mode : {"", "--no-stream"}) {
            SCOPED_TRACE(std::string(c.op) + " " + mode);
            CmdResult r = run_model(m, mode);
            EXPECT_EQ(r.exit_code, 2) << r.err;
            EXPECT_NE(r.err.find("llama.cpp could not load the model: error loading model"),
                      std::string::npos)
                << r.err;
            EXPECT_NE(r.err.find(c.reason), std::string::npos) << r.err;
            EXPECT_EQ(count_lines(r.err), 1) << r.err;  // llama.cpp's own line not repeated
            EXPECT_EQ(r.out, "");
        }
    }
}

// NaN in the weights (an f32 norm filled with NaN passes every file check): the logits are
// NaN and generation stops with kRuntime before emitting a token; scoring stops likewise.
// Control: the same model without the NaN generates and scores.
TEST(ModelFiles, NonFiniteLogitsStopGenerationWithoutEmittingTokens) {
    backend_env();
    TempDir tmp;
    const std::string base = synth_model("tiny", "qwen3moe", "f32");
    const std::string nan_model = tmp.path("nan.gguf");
    mutate(base, nan_model, {"nan-data output_norm.weight"});
    for (bool stream : {true, false}) {
        SCOPED_TRACE(stream ? "streaming" : "--no-stream");
        for (const std::string & path : {base, nan_model}) {
            const bool bad = path == nan_model;
            moestream::RunOptions opt;
            opt.model_path = path;
            opt.stream = stream;
            opt.n_ctx = 256;
            opt.io_threads = 2;
            opt.cache_mb = 0;
            std::unique_ptr<moestream::Engine> e;
            moestream::Status st = moestream::Engine::open(opt, &e);
            ASSERT_TRUE(st.ok()) << st.message();
            moestream::GenerateResult res;
            int pieces = 0;
            st = e->generate(
                "hello world", 8, [&](const std::string &) { return ++pieces > 0; }, &res);
            std::vector<int32_t> toks;
            ASSERT_TRUE(e->tokenize("hello world, scored", &toks).ok());
            moestream::Status sc = e->score(toks, 0, [](size_t, const float * l) {
                return std::isfinite(l[0]) ? moestream::Status::Ok()
                                           : moestream::Status::Runtime("NaN reached on_logits");
            });
            if (bad) {
                EXPECT_EQ(st.code(), moestream::ErrorCode::kRuntime);
                EXPECT_NE(st.message().find("non-finite logit (NaN)"), std::string::npos)
                    << st.message();
                EXPECT_NE(st.message().find("at step 0"), std::string::npos) << st.message();
                EXPECT_TRUE(res.tokens.empty());
                EXPECT_EQ(pieces, 0);
                EXPECT_NE(sc.message().find("non-finite logit"), std::string::npos) << sc.message();
            } else {
                ASSERT_TRUE(st.ok()) << st.message();
                EXPECT_EQ(res.tokens.size(), 8u);
                EXPECT_TRUE(sc.ok()) << sc.message();
            }
        }
    }
}
