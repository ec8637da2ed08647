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
using namespace moestream::test;

namespace {

// Copies `in` to `out` with the mutator's operations applied (each op is "VERB ARG").
void mutate(const std::string & in, const std::string & out, const std::vector<std::string> & ops) {
    std::string cmd = gguf_mutate_cmd() + " " + sh_quote(in) + " " + sh_quote(out);
    for (const std::string & op : ops) cmd += " " + op;
    CmdResult r = run_cmd(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
}

// `moestream run` under a memory limit and a 120 s timeout: a 4 GiB address-space limit, or
// in an ASan build (whose shadow memory reserves terabytes of address space) ASan's own
// hard_rss_limit_mb of 3 GiB, which kills the process with a report when exceeded.
CmdResult run_model(const std::string & model, const std::string & extra = "", int n = 6) {
    std::string limit = "prlimit --as=4294967296 ";
#if defined(__SANITIZE_ADDRESS__)
    const char * asan = std::getenv("ASAN_OPTIONS");
    limit = "env ASAN_OPTIONS=" + sh_quote(std::string(asan ? asan : "") + ":hard_rss_limit_mb=3072") +
            " ";
#endif
    // Read lanes are a streaming option: the CLI refuses them with --no-stream.
    const bool resident = extra.find("--no-stream") != std::string::npos;
    return run_cmd("timeout 120 " + limit + sh_quote(cli_bin()) + " run -m " + sh_quote(model) +
                   " -p 'hello world' -n " + std::to_string(n) +
                   (resident ? " " : " --io-threads 2 ") + extra);
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
    TempDir tmp("model-files");
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
    TempDir tmp("model-files");
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
    TempDir tmp("model-files");
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
            if (stream) {  // streaming options: refused with stream = false
                opt.io_threads = 2;
                opt.cache_mb = 0;
            }
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

// ---- the corruption matrix ------------------------------------------------------------------
// One field of a working model changed per case. Every case must end in one of:
//   refused: exit 2, stdout empty, exactly one stderr line, naming `field`;
//   runs:    exit 0 (the engine refuses NaN logits, so an exit-0 run had finite ones);
//   stops:   exit 1 with `field` in the message and no token printed (NaN weights).
// Never a signal, an abort, a timeout, a sanitizer report or the memory limit.
namespace {

enum class Want { kRefused, kRuns, kStops };

struct MatrixCase {
    const char * base;  // "q8" (tiny qwen3moe q8_0), "f32" (tiny qwen3moe f32), "glm" (tiny glm4moe)
    std::vector<std::string> ops;
    Want want;
    const char * field;  // what the error line must name
};

std::vector<MatrixCase> matrix_cases() {
    const Want R = Want::kRefused, OK = Want::kRuns, S = Want::kStops;
    return {
        // tensor types per role (data unchanged; smaller types fit, larger ones overlap)
        {"f32", {"type role:experts=i8"}, R, "ffn_gate_exps.weight' has type i8"},
        {"f32", {"type role:experts=i32"}, R, "ffn_gate_exps.weight' has type i32"},
        {"f32", {"type role:experts=f64"}, R, "_exps.weight"},  // twice the bytes: overlaps
        {"f32", {"type role:router=i8"}, R, "ffn_gate_inp.weight' has type i8"},
        {"f32", {"type role:router=i32"}, R, "ffn_gate_inp.weight' has type i32"},
        {"f32", {"type role:router=f64"}, R, "ffn_gate_inp.weight"},
        {"f32", {"type role:norms=f16"}, R, "norm.weight' has type f16"},
        {"f32", {"type role:norms=i32"}, R, "norm.weight' has type i32"},
        {"f32", {"type role:token_embd=i16"}, R, "token_embd.weight' has type i16"},
        {"f32", {"type role:token_embd=i32"}, R, "token_embd.weight' has type i32"},
        {"f32", {"type role:attn=i32"}, R, "attn_q.weight' has type i32"},
        {"f32", {"type role:output=i8"}, R, "output.weight' has type i8"},
        // computable, but half the bytes: llama.cpp's reader wants packed offsets
        {"f32", {"type role:experts=f16"}, R, "ffn_up_exps.weight' has offset"},
        // alignment
        {"q8", {"alignment 1"}, R, "general.alignment 1"},
        {"q8", {"alignment 8"}, R, "general.alignment 8"},
        {"q8", {"alignment 16"}, R, "general.alignment 16"},
        {"q8", {"alignment 48"}, R, "general.alignment 48"},
        {"q8", {"alignment 4096"}, R, "alignment 4096"},  // offsets were laid out for 32
        {"q8", {"alignment 32"}, OK, ""},
        // hyperparameters
        {"q8", {"set qwen3moe.block_count=513"}, R, "qwen3moe.block_count"},
        {"q8", {"set qwen3moe.block_count=65536"}, R, "qwen3moe.block_count"},
        {"q8", {"set qwen3moe.block_count=0"}, R, "qwen3moe.block_count"},
        {"q8", {"set qwen3moe.attention.layer_norm_rms_epsilon=nan"}, R, "layer_norm_rms_epsilon"},
        {"q8", {"set qwen3moe.attention.layer_norm_rms_epsilon=-1"}, R, "layer_norm_rms_epsilon"},
        {"q8", {"set qwen3moe.attention.layer_norm_rms_epsilon=0"}, R, "layer_norm_rms_epsilon"},
        {"q8", {"set qwen3moe.attention.layer_norm_rms_epsilon=inf"}, R, "layer_norm_rms_epsilon"},
        {"q8", {"set qwen3moe.attention.layer_norm_rms_epsilon=u32:1"}, R, "layer_norm_rms_epsilon"},
        {"q8", {"del qwen3moe.attention.layer_norm_rms_epsilon"}, R, "layer_norm_rms_epsilon"},
        {"q8", {"set qwen3moe.rope.freq_base=0"}, R, "rope.freq_base"},
        {"q8", {"set qwen3moe.rope.freq_base=nan"}, R, "rope.freq_base"},
        {"q8", {"set qwen3moe.rope.freq_base=-10000"}, R, "rope.freq_base"},
        {"q8", {"set qwen3moe.rope.dimension_count=8"}, R, "rope.dimension_count"},
        {"q8", {"set qwen3moe.rope.dimension_count=0"}, R, "rope.dimension_count"},
        {"q8", {"set qwen3moe.rope.dimension_count=1000"}, R, "rope.dimension_count"},
        {"q8", {"set qwen3moe.attention.head_count_kv=0"}, R, "head_count_kv"},
        {"q8", {"set qwen3moe.attention.head_count_kv=3"}, R, "head_count_kv"},
        {"q8", {"set qwen3moe.attention.head_count=0"}, R, "attn_q.weight' has wrong shape"},
        {"q8", {"set qwen3moe.attention.key_length=7"}, R, "rope.dimension_count"},
        {"q8", {"set qwen3moe.expert_used_count=0"}, R, "expert_used_count"},
        {"q8", {"set qwen3moe.expert_used_count=99"}, R, "expert_used_count"},
        {"q8", {"set qwen3moe.expert_count=1"}, R, "expert_count"},
        {"q8", {"set qwen3moe.context_length=0"}, R, "qwen3moe.context_length"},  // was exit 64
        {"glm", {"set glm4moe.expert_gating_func=5"}, R, "glm4moe.expert_gating_func"},
        {"glm", {"set glm4moe.expert_gating_func=4"}, OK, ""},  // sqrt_softplus (deepseek4)
        {"glm", {"set glm4moe.expert_gating_func=4294967295"}, R, "glm4moe.expert_gating_func"},
        {"glm", {"set glm4moe.expert_gating_func=0"}, OK, ""},  // llama.cpp's default (sigmoid)
        {"glm", {"set glm4moe.nextn_predict_layers=4"}, R, "glm4moe.nextn_predict_layers"},
        {"glm", {"set glm4moe.nextn_predict_layers=99"}, R, "glm4moe.nextn_predict_layers"},
        {"glm", {"set glm4moe.expert_weights_scale=nan"}, R, "glm4moe.expert_weights_scale"},
        {"glm", {"set glm4moe.expert_weights_scale=inf"}, R, "glm4moe.expert_weights_scale"},
        {"glm", {"set glm4moe.rope.dimension_count=1000"}, R, "glm4moe.rope.dimension_count"},
        {"glm", {"set glm4moe.leading_dense_block_count=99"}, R, "leading_dense_block_count"},
        // tokenizer
        {"q8", {"set tokenizer.ggml.model=llama"}, R, "tokenizer.ggml.model"},
        {"q8", {"set tokenizer.ggml.model=foo"}, R, "unknown tokenizer: 'foo'"},
        {"q8", {"set tokenizer.ggml.model=u32:7"}, R, "tokenizer.ggml.model"},
        {"q8", {"token 200='\\xff\\xfe'"}, R, "tokenizer.ggml.tokens[200]"},
        {"q8", {"token 201='a\\xc3'"}, R, "tokenizer.ggml.tokens[201]"},
        {"q8", {"token 202='\\xed\\xa0'"}, R, "tokenizer.ggml.tokens[202]"},
        {"q8", {"dup-token 200=201"}, R, "duplicates token 200"},
        {"q8", {"dup-token 258=3"}, R, "duplicates token 3"},
        {"q8", {"token 200="}, OK, ""},  // llama.cpp keys an empty token as [EMPTY_200]
        {"q8", {"del tokenizer.ggml.merges"}, R, "cannot find tokenizer merges"},
        // a token type outside llama.cpp's 0..6 (the token printed nothing)
        {"q8", {"token-type 200=7"}, R, "tokenizer.ggml.token_type[200] = 7"},
        {"q8", {"token-type 201=-1"}, R, "tokenizer.ggml.token_type[201] = -1"},
        {"q8", {"token-type 202=3"}, OK, ""},  // LLAMA_TOKEN_TYPE_CONTROL: in range
        {"q8", {"set tokenizer.ggml.token_type=u32:1"}, R, "tokenizer.ggml.token_type must be an array"},
        // names and keys
        {"q8", {"rename-key general.name='general.na\\x00me'"}, R, "contains a NUL byte"},
        {"q8", {"rename output_norm.weight='output_norm\\x00.weight'"}, R, "contains a NUL byte"},
        {"q8", {"rename output_norm.weight=output_norm.weight2"}, R, "output_norm.weight"},
        {"q8", {"rename blk.0.ffn_gate_exps.weight=blk.0.ffn_gate_exps.weight2"}, R,
         "blk.0.ffn_gate_exps.weight"},
        {"q8", {"rename blk.0.attn_q.weight=blk.0.attn_k.weight"}, R, "duplicate tensor name"},
        {"q8", {"del general.architecture"}, R, "general.architecture"},
        {"q8", {"set general.architecture=qwen9moe"}, R, "qwen9moe.expert_count"},
        // weights that pass every file check but produce NaN logits
        {"f32", {"nan-data output_norm.weight"}, S, "non-finite logit"},
    };
}

std::string base_model(const std::string & b) {
    if (b == "f32") return synth_model("tiny", "qwen3moe", "f32");
    if (b == "glm") return synth_model("tiny", "glm4moe", "q8_0");
    return synth_model("tiny", "qwen3moe", "q8_0");
}

}  // namespace

// Runs every case whose index is `shard` mod 2 (two tests, so ctest -j runs them side by side).
void run_matrix(int shard) {
    TempDir tmp("model-files");
    int n = 0, refused = 0, runs = 0, stops = 0, crashes = 0, i = -1;
    // Controls: each base model runs as it is.
    for (const char * b : {"q8", "f32", "glm"}) {
        CmdResult r = run_model(base_model(b), "-c 64", 2);
        ASSERT_EQ(r.exit_code, 0) << b << "\n" << r.err;
    }
    for (const MatrixCase & c : matrix_cases()) {
        if (++i % 2 != shard) continue;
        std::string label = c.base;
        for (const std::string & op : c.ops) label += " " + op;
        SCOPED_TRACE(label);
        const std::string m = tmp.path("case-" + std::to_string(n++) + ".gguf");
        mutate(base_model(c.base), m, c.ops);
        CmdResult r = run_model(m, "-c 64", 2);
        if (r.exit_code > 2 || r.err.find("Sanitizer") != std::string::npos) ++crashes;
        switch (c.want) {
            case Want::kRefused:
                ++refused;
                EXPECT_EQ(r.exit_code, 2) << r.err;
                EXPECT_EQ(count_lines(r.err), 1) << r.err;
                EXPECT_NE(r.err.find(c.field), std::string::npos) << r.err;
                EXPECT_EQ(r.out, "");
                break;
            case Want::kRuns:
                ++runs;
                EXPECT_EQ(r.exit_code, 0) << r.err;
                break;
            case Want::kStops:
                ++stops;
                EXPECT_EQ(r.exit_code, 1) << r.err;
                EXPECT_NE(r.err.find(c.field), std::string::npos) << r.err;
                EXPECT_EQ(r.out.find_first_not_of(" \n"), std::string::npos) << r.out;
                break;
        }
        std::remove(m.c_str());
    }
    EXPECT_EQ(crashes, 0);
    std::printf("model-file corruption matrix, shard %d: %d cases (%d refused, %d run, %d stopped), %d crashes\n",
                shard, n, refused, runs, stops, crashes);
}

TEST(ModelFiles, CorruptionMatrixShard0) { run_matrix(0); }
TEST(ModelFiles, CorruptionMatrixShard1) { run_matrix(1); }

TEST(ModelFiles, CorruptionMatrixHasEveryClass) {
    int types = 0, align = 0, hparams = 0, tok = 0, names = 0;
    for (const MatrixCase & c : matrix_cases()) {
        const std::string op = c.ops[0];
        if (op.rfind("type ", 0) == 0) ++types;
        else if (op.rfind("alignment", 0) == 0) ++align;
        else if (op.find("tokenizer") != std::string::npos || op.rfind("token", 0) == 0 ||
                 op.rfind("dup-token", 0) == 0)
            ++tok;
        else if (op.rfind("rename", 0) == 0 || op.find("architecture") != std::string::npos)
            ++names;
        else if (op.rfind("set ", 0) == 0 || op.rfind("del ", 0) == 0)
            ++hparams;
    }
    EXPECT_GE(types, 12);
    EXPECT_GE(align, 6);
    EXPECT_GE(hparams, 25);
    EXPECT_GE(tok, 9);
    EXPECT_GE(names, 6);
}
