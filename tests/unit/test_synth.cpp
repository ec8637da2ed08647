// test_synth.cpp — `moestream synth`: every tiny arch x type loads and generates in
// llama.cpp; the bytes are deterministic (same seed, any thread count) and seed-dependent;
// --alignment governs the tensor offsets; bad flags exit 64; I/O errors exit 1 with the
// file named and no file left behind; the weights have realistic scale (quant blocks decode
// to the intended distribution, activations finite, logits vary, routing covers all experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama-cpp.h"
#include "moestream/synth.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace moestream::test;

namespace {

// A fresh temp directory, removed at the end of the test.

CmdResult synth(const std::string & args) {
    return run_cmd(sh_quote(cli_bin()) + " synth " + args);
}

struct GgufCloser {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
using Gguf = std::unique_ptr<gguf_context, GgufCloser>;

Gguf open_gguf(const std::string & path) {
    gguf_init_params ip = {/*no_alloc=*/true, /*ctx=*/nullptr};
    return Gguf(gguf_init_from_file(path.c_str(), ip));
}

// Reads one tensor's data and dequantizes it with ggml's own row converter.
std::vector<float> read_tensor_f32(const std::string & path, const std::string & name) {
    Gguf g = open_gguf(path);
    if (!g) return {};
    const int64_t id = gguf_find_tensor(g.get(), name.c_str());
    if (id < 0) return {};
    const ggml_type type = gguf_get_tensor_type(g.get(), id);
    const int64_t * ne = gguf_get_tensor_ne(g.get(), id);
    const int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
    std::vector<uint8_t> raw(gguf_get_tensor_size(g.get(), id));
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) return {};
    const long off = long(gguf_get_data_offset(g.get()) + gguf_get_tensor_offset(g.get(), id));
    const bool ok =
        std::fseek(f, off, SEEK_SET) == 0 && std::fread(raw.data(), 1, raw.size(), f) == raw.size();
    std::fclose(f);
    if (!ok) return {};
    std::vector<float> out(static_cast<size_t>(n));
    if (type == GGML_TYPE_F32) {
        std::memcpy(out.data(), raw.data(), raw.size());
    } else {
        ggml_get_type_traits(type)->to_float(raw.data(), out.data(), n);
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// Every architecture x expert type of the tiny preset loads and generates in llama.cpp.

using ArchType = std::tuple<std::string, std::string>;

class SynthTinyLoads : public ::testing::TestWithParam<ArchType> {};

TEST_P(SynthTinyLoads, GeneratesInLlamaCompletion) {
    const auto & [arch, type] = GetParam();
    const std::string model = moestream::test::synth_model("tiny", arch, type);
    const std::string prompt = "Once upon a time";
    TempDir dir("synth-loads");
    const std::string session = dir.path("session.bin");
    // The generated ids come from the session file the tool writes before it exits, not from
    // its stdout (whose end its asynchronous logger loses on a loaded machine: seen as "stdout
    // only the prompt, exit 0" in a fresh-clone `make test`). No retry.
    CmdResult r = run_cmd(sh_quote(llama_tool()) + " llama-completion -m " + sh_quote(model) +
                          " -p " + sh_quote(prompt) +
                          " -n 8 --temp 0 -s 1 -no-cnv --no-warmup -lm mmap --no-repack -t 1"
                          " -fit off --prompt-cache " + sh_quote(session) + " --prompt-cache-all");
    ASSERT_EQ(r.exit_code, 0) << r.err.substr(r.err.size() > 3000 ? r.err.size() - 3000 : 0);
    // The prompt's ids as the tool makes them (its special tokens added, as the vocabulary says).
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model_ptr vm(llama_model_load_from_file(model.c_str(), mp));
    ASSERT_NE(vm, nullptr);
    std::vector<llama_token> want(64);
    const int n = llama_tokenize(llama_model_get_vocab(vm.get()), prompt.c_str(),
                                 int32_t(prompt.size()), want.data(), int32_t(want.size()), true, true);
    ASSERT_GT(n, 0);
    want.resize(size_t(n));
    // Then 8 generated ids (never fewer: control tokens have all-zero output rows, so greedy
    // decoding does not stop early).
    const std::vector<int32_t> ids = session_file_tokens(session);
    ASSERT_EQ(ids.size(), want.size() + 8) << "not a session file, or not 8 generated tokens";
    EXPECT_TRUE(std::equal(want.begin(), want.end(), ids.begin()));
}

INSTANTIATE_TEST_SUITE_P(synth, SynthTinyLoads,
                         ::testing::Combine(::testing::Values("qwen3moe", "olmoe", "glm4moe"),
                                            ::testing::Values("f32", "f16", "q8_0", "q4_k")),
                         [](const ::testing::TestParamInfo<ArchType> & i) {
                             return std::get<0>(i.param) + "_" + std::get<1>(i.param);
                         });

// ---------------------------------------------------------------------------------------
// Determinism.

TEST(synth, SameSeedSameBytesAnyThreadCountOtherSeedDiffers) {
    TempDir d;
    const std::string base = "--preset tiny --arch glm4moe --type q4_k --seed 7 ";
    ASSERT_EQ(synth(base + "--threads 1 -o " + d.path("a.gguf")).exit_code, 0);
    ASSERT_EQ(synth(base + "--threads 3 -o " + d.path("b.gguf")).exit_code, 0);
    ASSERT_EQ(
        synth("--preset tiny --arch glm4moe --type q4_k --seed 8 -o " + d.path("c.gguf")).exit_code,
        0);
    const std::string a = slurp(d.path("a.gguf")), b = slurp(d.path("b.gguf")),
                      c = slurp(d.path("c.gguf"));
    ASSERT_GT(a.size(), 1000000u);
    EXPECT_TRUE(a == b) << "same options, different thread count: bytes differ";
    // Negative control: another seed changes the data (same layout, so the same size).
    EXPECT_EQ(a.size(), c.size());
    EXPECT_FALSE(a == c) << "different seeds gave identical files";
    size_t n_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) n_diff += a[i] != c[i];
    EXPECT_GT(n_diff, a.size() / 2);
}

// --attn-gain rescales the attention output projections and nothing else; the default
// keeps the bytes (and name) of a model made before the flag existed.
TEST(synth, AttnGainChangesOnlyTheAttentionOutputs) {
    TempDir d;
    const std::string base = "--preset tiny --type q8_0 ";
    ASSERT_EQ(synth(base + "-o " + d.path("a.gguf")).exit_code, 0);
    ASSERT_EQ(synth(base + "--attn-gain 0.3 -o " + d.path("b.gguf")).exit_code, 0);
    ASSERT_EQ(synth(base + "--attn-gain 1 -o " + d.path("c.gguf")).exit_code, 0);
    EXPECT_TRUE(slurp(d.path("a.gguf")) == slurp(d.path("b.gguf")));
    Gguf a = open_gguf(d.path("a.gguf")), c = open_gguf(d.path("c.gguf"));
    ASSERT_TRUE(a && c);
    auto name_of = [](const Gguf & g) {
        return std::string(gguf_get_val_str(g.get(), gguf_find_key(g.get(), "general.name")));
    };
    EXPECT_EQ(name_of(c), name_of(a) + " attn-gain 1");
    ASSERT_EQ(gguf_get_n_tensors(a.get()), gguf_get_n_tensors(c.get()));
    int n_changed = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(a.get()); ++i) {
        const std::string name = gguf_get_tensor_name(a.get(), i);
        const std::vector<float> x = read_tensor_f32(d.path("a.gguf"), name),
                                 y = read_tensor_f32(d.path("c.gguf"), name);
        ASSERT_EQ(x.size(), y.size()) << name;
        if (name.find("attn_output") == std::string::npos) {
            EXPECT_TRUE(x == y) << name << " changed with --attn-gain";
            continue;
        }
        ++n_changed;
        // Same random draws, scaled by 1/0.3: the standard deviations differ by that factor
        // (q8_0 rounding aside).
        double sx = 0, sy = 0;
        for (size_t j = 0; j < x.size(); ++j) sx += double(x[j]) * x[j], sy += double(y[j]) * y[j];
        EXPECT_NEAR(std::sqrt(sy / sx), 1.0 / 0.3, 0.05) << name;
    }
    EXPECT_GT(n_changed, 0);
    // The library refuses a gain outside (0, 4] with a usage error, as the CLI does.
    moestream::SynthOptions opt;
    opt.out_path = d.path("x.gguf");
    opt.attn_out_gain = 0.0f;
    EXPECT_EQ(moestream::synth_model(opt, nullptr).exit_code(), 64);
    opt.attn_out_gain = std::nanf("");
    EXPECT_EQ(moestream::synth_model(opt, nullptr).exit_code(), 64);
    EXPECT_FALSE(fs::exists(d.path("x.gguf")));
}

// ---------------------------------------------------------------------------------------
// Alignment.

void expect_aligned(const std::string & path, size_t alignment) {
    Gguf g = open_gguf(path);
    ASSERT_TRUE(g) << path;
    EXPECT_EQ(gguf_get_alignment(g.get()), alignment);
    const int64_t key = gguf_find_key(g.get(), "general.alignment");
    ASSERT_GE(key, 0);
    EXPECT_EQ(gguf_get_val_u32(g.get(), key), alignment);
    EXPECT_EQ(gguf_get_data_offset(g.get()) % alignment, 0u);
    const int64_t n = gguf_get_n_tensors(g.get());
    ASSERT_GT(n, 0);
    for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(gguf_get_tensor_offset(g.get(), i) % alignment, 0u)
            << gguf_get_tensor_name(g.get(), i);
    }
    // The file ends at the padded end of the last tensor.
    const uint64_t end = gguf_get_data_offset(g.get()) + gguf_get_tensor_offset(g.get(), n - 1) +
                         gguf_get_tensor_size(g.get(), n - 1);
    const uint64_t size = fs::file_size(path);
    EXPECT_GE(size, end);
    EXPECT_LT(size - end, alignment);
}

TEST(synth, Alignment4096GivesAlignedOffsetsAndLoads) {
    const std::string model = moestream::test::synth_model("tiny", "qwen3moe", "q4_k", 1, 4096);
    expect_aligned(model, 4096);
    CmdResult r = run_cmd(sh_quote(llama_tool()) + " llama-completion -m " + sh_quote(model) +
                          " -p hi -n 2 --temp 0 -s 1 -no-cnv --no-warmup -lm mmap --no-repack"
                          " -t 1 -fit off");
    EXPECT_EQ(r.exit_code, 0) << r.err.substr(r.err.size() > 2000 ? r.err.size() - 2000 : 0);
}

TEST(synth, DefaultAlignmentIs32) {
    expect_aligned(moestream::test::synth_model("tiny", "qwen3moe", "q8_0"), 32);
}

// ---------------------------------------------------------------------------------------
// Flags and errors.

TEST(synth, BadFlagsExit64) {
    TempDir d;
    const std::string o = " -o " + d.path("x.gguf");
    const std::vector<std::string> bad = {
        "--preset huge" + o,
        "--preset tiny --arch llama" + o,
        "--preset tiny --type q5_k" + o,
        "--preset tiny --alignment 100" + o,
        "--preset tiny --alignment 16" + o,
        "--preset tiny --alignment x" + o,
        "--preset tiny --seed -1" + o,
        "--preset tiny --seed abc" + o,
        "--preset tiny --attn-gain 0" + o,
        "--preset tiny --attn-gain 5" + o,
        "--preset tiny --attn-gain x" + o,
        "--preset tiny --bogus" + o,
        "--arch qwen3moe" + o,  // no --preset
        "--preset tiny",        // no -o
    };
    for (const auto & args : bad) {
        CmdResult r = synth(args);
        EXPECT_EQ(r.exit_code, 64) << args << "\n" << r.err;
        // One line naming the subcommand, then the pointer to --help (no usage dump).
        EXPECT_EQ(r.err.rfind("moestream synth: ", 0), 0u) << args << "\n" << r.err;
        EXPECT_NE(r.err.find("\nsee `moestream synth --help`\n"), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
    }
    EXPECT_TRUE(fs::is_empty(d.dir()));
}

TEST(synth, UnwritableOutputIsAClearError) {
    TempDir d;
    // Missing directory.
    const std::string missing = d.path("no/such/dir/m.gguf");
    CmdResult r = synth("--preset tiny -o " + sh_quote(missing));
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    // The output path is an existing directory: refused before writing (never renamed over).
    fs::create_directory(d.path("adir"));
    r = synth("--preset tiny -o " + sh_quote(d.path("adir")));
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_NE(r.err.find(d.path("adir") + "' exists and is a directory"), std::string::npos)
        << r.err;
    EXPECT_TRUE(fs::is_directory(d.path("adir")));
    // Write failure part-way (file size limit: EFBIG, like a full disk): no half file left.
    const std::string big = d.path("big.gguf");
    r = run_cmd("trap '' XFSZ; ulimit -f 4096; exec " + sh_quote(cli_bin()) +
                " synth --preset tiny --type f32 -o " + sh_quote(big));
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find(big), std::string::npos) << r.err;
    std::vector<std::string> left;
    for (const auto & e : fs::directory_iterator(d.dir())) {
        if (e.path().filename() != "adir") left.push_back(e.path().string());
    }
    EXPECT_TRUE(left.empty()) << left.front();
    EXPECT_TRUE(fs::is_empty(d.path("adir")));
}

TEST(synth, InterruptedRunLeavesNoFile) {
    TempDir d;
    // mid is ~3 GB: SIGTERM arrives once its partial file exists (the shell waits for that
    // state, up to 60 s to catch a hang), so the run is always stopped mid-write.
    const std::string dir = sh_quote(d.dir());
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " synth --preset mid --type q4_k -o " +
                          sh_quote(d.path("mid.gguf")) + " & p=$!; for i in $(seq 6000); do " +
                          "[ -n \"$(ls -A " + dir + ")\" ] && break; sleep 0.01; done; " +
                          "[ -n \"$(ls -A " + dir + ")\" ] && echo writing; kill -TERM $p; wait $p");
    EXPECT_NE(r.out.find("writing"), std::string::npos) << "control: no partial file before the signal";
    EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
    EXPECT_TRUE(fs::is_empty(d.dir()));
}

TEST(synth, DryRunPlansRealSizes) {
    // qwen3-30b-a3b with Q4_K experts: ~17 GB, almost all of it experts; written: nothing.
    moestream::SynthOptions o;
    o.preset = "qwen3-30b-a3b";
    o.expert_type = "q4_k";
    o.out_path = "/nonexistent/30b.gguf";
    o.dry_run = true;
    moestream::SynthResult r;
    moestream::Status st = moestream::synth_model(o, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_GT(r.file_bytes, 16'000'000'000ull);
    EXPECT_LT(r.file_bytes, 19'000'000'000ull);
    // 48 layers x 3 x [2048, 768, 128] Q4_K (144 bytes per 256 weights).
    EXPECT_EQ(r.expert_bytes, 48ull * 3 * 2048 * 768 * 128 / 256 * 144);
    o.preset = "mid";
    st = moestream::synth_model(o, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_GT(r.file_bytes, 1'000'000'000ull);
    EXPECT_LT(r.file_bytes, 8'000'000'000ull);
    EXPECT_FALSE(fs::exists("/nonexistent/30b.gguf"));
}

// ---------------------------------------------------------------------------------------
// Realistic scale.

// Random quant blocks decode (with ggml's own dequantizer) to zero-mean weights with the
// intended standard deviation: 1/sqrt(fan_in) for the expert matrices.
TEST(synth, ExpertWeightsDecodeToIntendedScale) {
    for (const char * type : {"f32", "f16", "q8_0", "q4_k"}) {
        const std::string model = moestream::test::synth_model("tiny", "qwen3moe", type);
        for (const char * name : {"blk.0.ffn_gate_exps.weight", "blk.3.ffn_down_exps.weight"}) {
            std::vector<float> w = read_tensor_f32(model, name);
            ASSERT_EQ(w.size(), 256u * 256 * 32) << type << " " << name;
            double sum = 0, sq = 0;
            for (float v : w) {
                ASSERT_TRUE(std::isfinite(v));
                sum += v;
                sq += double(v) * v;
            }
            const double mean = sum / double(w.size());
            const double sd = std::sqrt(sq / double(w.size()) - mean * mean);
            const double want = 1.0 / 16;  // 1/sqrt(256)
            EXPECT_NEAR(sd, want, 0.1 * want) << type << " " << name;
            EXPECT_LT(std::fabs(mean), 0.02 * want) << type << " " << name;
        }
    }
}

struct Probe {
    uint32_t n_expert = 0;
    std::map<int, std::set<int>> routed;  // layer -> experts selected at least once
    bool nonfinite = false;
    size_t l_out_seen = 0;
    std::map<std::string, std::string> moe_ops;  // "ffn_moe_probs" -> "SIGMOID", ...
};

bool probe_cb(ggml_tensor * t, bool ask, void * ud) {
    auto * p = static_cast<Probe *>(ud);
    const char * n = t->name;
    const bool topk = std::strncmp(n, "ffn_moe_topk-", 13) == 0;
    const bool lout = std::strncmp(n, "l_out-", 6) == 0;
    if (ask) {
        if (std::strncmp(n, "ffn_moe_", 8) == 0) {
            // Only "<base>-<il>" names: views such as "... (reshaped)" keep the base name.
            const char * dash = std::strrchr(n, '-');
            if (dash && dash[1] && std::strspn(dash + 1, "0123456789") == std::strlen(dash + 1)) {
                p->moe_ops.emplace(std::string(n, dash), ggml_op_desc(t));
            }
        }
        return topk || lout;
    }
    if (topk) {
        auto & s = p->routed[std::atoi(n + 13)];
        for (int64_t j = 0; j < t->ne[1]; ++j) {
            for (int64_t i = 0; i < t->ne[0]; ++i) {
                s.insert(*reinterpret_cast<const int32_t *>(static_cast<const char *>(t->data) +
                                                            j * t->nb[1] + i * t->nb[0]));
            }
        }
    } else if (lout && t->type == GGML_TYPE_F32) {
        const float * f = static_cast<const float *>(t->data);
        for (int64_t i = 0; i < ggml_nelements(t); ++i) p->nonfinite |= !std::isfinite(f[i]);
        p->l_out_seen++;
    }
    return true;
}

// Loads the model with llama.cpp in-process, prefills two different prompts and decodes
// greedily: activations finite, logits spread, outputs prompt-dependent, routing covers
// (nearly) all experts in every MoE layer.
class SynthRealism : public ::testing::TestWithParam<std::string> {
protected:
    static void SetUpTestSuite() {
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
        // The CPU backend variant the reference tools load (tests/CMakeLists.txt), else
        // the one scripts/ggml-backend-path picks.
        std::string so;
        if (const char * e = std::getenv("GGML_BACKEND_PATH")) so = e;
        const char * src = std::getenv("MOESTREAM_SRC");
        if (so.empty() && src) {
            CmdResult r = run_cmd(sh_quote(std::string(src) + "/scripts/ggml-backend-path"));
            if (r.exit_code == 0) so = r.out.substr(0, r.out.find('\n'));
        }
        if (!so.empty() && ggml_backend_dev_count() == 0) ggml_backend_load(so.c_str());
        llama_backend_init();
    }
};

TEST_P(SynthRealism, ActivationsLogitsRouting) {
    if (ggml_backend_dev_count() == 0)
        GTEST_SKIP() << "no ggml backend (GGML_BACKEND_PATH / MOESTREAM_SRC unset)";
    const std::string model_path = moestream::test::synth_model("tiny", GetParam(), "q8_0");
    llama_model_params mp = llama_model_default_params();
    llama_model_ptr model_ptr(llama_model_load_from_file(model_path.c_str(), mp));
    ASSERT_NE(model_ptr, nullptr);
    llama_model * model = model_ptr.get();
    Probe probe;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_threads = cp.n_threads_batch = 1;  // robust on a loaded machine (no spin-waits)
    cp.cb_eval = probe_cb;
    cp.cb_eval_user_data = &probe;
    llama_context_ptr ctx_ptr(llama_init_from_model(model, cp));  // freed before the model
    ASSERT_NE(ctx_ptr, nullptr);
    llama_context * ctx = ctx_ptr.get();
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const char * prompts[] = {
        "The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs.",
        "0123456789 <>[]{}() ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz ?!",
    };
    std::vector<std::vector<llama_token>> outs;
    for (const char * prompt : prompts) {
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> toks(256);
        const int n = llama_tokenize(vocab, prompt, int32_t(std::strlen(prompt)), toks.data(),
                                     int32_t(toks.size()), false, true);
        ASSERT_GT(n, 40);
        toks.resize(size_t(n));
        ASSERT_EQ(llama_decode(ctx, llama_batch_get_one(toks.data(), n)), 0);
        std::vector<llama_token> out;
        for (int step = 0; step < 8; ++step) {
            const float * lg = llama_get_logits_ith(ctx, -1);
            double sum = 0, sq = 0;
            int best = 0;
            for (int i = 0; i < n_vocab; ++i) {
                ASSERT_TRUE(std::isfinite(lg[i]));
                sum += lg[i];
                sq += double(lg[i]) * lg[i];
                if (lg[i] > lg[best]) best = i;
            }
            const double mean = sum / n_vocab, sd = std::sqrt(sq / n_vocab - mean * mean);
            EXPECT_GT(sd, 0.5) << "logits nearly constant";
            EXPECT_LT(sd, 20.0);
            out.push_back(best);
            llama_token t = best;
            ASSERT_EQ(llama_decode(ctx, llama_batch_get_one(&t, 1)), 0);
        }
        outs.push_back(out);
    }
    EXPECT_NE(outs[0], outs[1]) << "different prompts gave the same continuation";
    // The router graph is the architecture's: softmax + normalized top-k weights (qwen3moe),
    // softmax without normalization (olmoe), sigmoid + selection bias + normalization
    // (glm4moe).
    const std::string arch = GetParam();
    EXPECT_EQ(probe.moe_ops["ffn_moe_probs"], arch == "glm4moe" ? "SIGMOID" : "SOFT_MAX");
    EXPECT_EQ(probe.moe_ops.count("ffn_moe_probs_biased"), arch == "glm4moe" ? 1u : 0u);
    EXPECT_EQ(probe.moe_ops.count("ffn_moe_weights_norm"), arch == "olmoe" ? 0u : 1u);
    EXPECT_EQ(probe.moe_ops["ffn_moe_down"], "MUL_MAT_ID");
    EXPECT_FALSE(probe.nonfinite);
    EXPECT_GT(probe.l_out_seen, 0u);
    // Every MoE layer but the last (which only routes the output rows during prefill)
    // selects nearly every expert over ~2 x 80 prompt tokens.
    ASSERT_GE(probe.routed.size(), 3u);
    const int last = probe.routed.rbegin()->first;
    for (const auto & [il, experts] : probe.routed) {
        if (il == last) continue;
        EXPECT_GE(experts.size(), 30u) << "layer " << il << ": routing does not spread";
        EXPECT_LT(*experts.rbegin(), 32);
    }
}

INSTANTIATE_TEST_SUITE_P(synth, SynthRealism, ::testing::Values("qwen3moe", "olmoe", "glm4moe"),
                         [](const ::testing::TestParamInfo<std::string> & i) { return i.param; });

}  // namespace
