// test_inspect.cpp — `moestream inspect` end to end (the CLI binary).
//
// Every number of --json is re-derived here from gguf.h's own reader (names, shapes, offsets,
// ggml_nbytes), not from moestream's index: models written with gguf.h's writer (32- and
// 4096-aligned), a `moestream synth` model and a test-llama-archs model when available.
// Errors: bad model files exit 2 with one line naming the file; bad flags exit 64.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ggml.h"
#include "gguf.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace moestream::test;
using json = nlohmann::json;

namespace {

CmdResult inspect(const std::string & args) {
    return run_cmd(sh_quote(cli_bin()) + " inspect " + args);
}

struct ModelSpec {
    std::string arch = "olmoe";
    uint32_t n_layer = 3;  // layer 0 dense, the rest MoE
    uint32_t n_embd = 256, n_ff = 64, n_expert = 8, n_used = 3;
    ggml_type expert_type = GGML_TYPE_Q8_0;
    uint32_t alignment = 32;
    bool moe = true;
};

// Writes a model with gguf.h's own writer. For alignment != 32 the metadata is written,
// re-read and the tensors added to the re-read context (gguf_add_tensor lays out offsets
// with the context's alignment, which only a read sets).
void write_model(const std::string & path, const ModelSpec & s) {
    gguf_context * g = gguf_init_empty();
    const std::string a = s.arch;
    gguf_set_val_str(g, "general.architecture", a.c_str());
    gguf_set_val_u32(g, (a + ".block_count").c_str(), s.n_layer);
    gguf_set_val_u32(g, (a + ".embedding_length").c_str(), s.n_embd);
    gguf_set_val_u32(g, (a + ".expert_count").c_str(), s.moe ? s.n_expert : 0);
    gguf_set_val_u32(g, (a + ".expert_used_count").c_str(), s.moe ? s.n_used : 0);
    gguf_set_val_u32(g, (a + ".expert_feed_forward_length").c_str(), s.n_ff);
    std::vector<std::string> toks;
    for (int i = 0; i < 320; ++i) toks.push_back("t" + std::to_string(i));
    std::vector<const char *> tp;
    for (auto & t : toks) tp.push_back(t.c_str());
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", tp.data(), tp.size());
    if (s.alignment != 32) {
        gguf_set_val_u32(g, "general.alignment", s.alignment);
        const std::string meta = path + ".meta";
        ASSERT_TRUE(gguf_write_to_file(g, meta.c_str(), true));
        gguf_free(g);
        gguf_init_params p = {/*no_alloc=*/true, /*ctx=*/nullptr};
        g = gguf_init_from_file(meta.c_str(), p);
        ASSERT_NE(g, nullptr);
        fs::remove(meta);
    }
    ggml_init_params ip = {/*mem_size=*/128u << 20, /*mem_buffer=*/nullptr, /*no_alloc=*/false};
    ggml_context * ctx = ggml_init(ip);
    auto add = [&](const std::string & name, std::vector<int64_t> ne, ggml_type t) {
        ggml_tensor * x = ggml_new_tensor(ctx, t, int(ne.size()), ne.data());
        ggml_set_name(x, name.c_str());
        std::memset(x->data, 0x22, ggml_nbytes(x));
        gguf_add_tensor(g, x);
    };
    add("token_embd.weight", {s.n_embd, 320}, GGML_TYPE_F16);
    for (uint32_t il = 0; il < s.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        add(p + "attn_norm.weight", {s.n_embd}, GGML_TYPE_F32);
        add(p + "attn_q.weight", {s.n_embd, s.n_embd}, GGML_TYPE_F16);
        if (il == 0 || !s.moe) {
            add(p + "ffn_up.weight", {s.n_embd, 4 * s.n_ff}, GGML_TYPE_F16);
            add(p + "ffn_down.weight", {4 * s.n_ff, s.n_embd}, GGML_TYPE_F16);
            continue;
        }
        add(p + "ffn_gate_inp.weight", {s.n_embd, s.n_expert}, GGML_TYPE_F32);
        add(p + "ffn_gate_exps.weight", {s.n_embd, s.n_ff, s.n_expert}, s.expert_type);
        add(p + "ffn_up_exps.weight", {s.n_embd, s.n_ff, s.n_expert}, s.expert_type);
        add(p + "ffn_down_exps.weight", {s.n_ff, s.n_embd, s.n_expert}, s.expert_type);
    }
    ASSERT_TRUE(gguf_write_to_file(g, path.c_str(), false));
    gguf_free(g);
    ggml_free(ctx);
}

bool is_expert_name(const std::string & n) {
    return n.rfind("blk.", 0) == 0 &&
           (n.ends_with(".ffn_gate_exps.weight") || n.ends_with(".ffn_up_exps.weight") ||
            n.ends_with(".ffn_down_exps.weight") || n.ends_with(".ffn_gate_up_exps.weight"));
}

uint64_t kv_u32(gguf_context * g, const std::string & key) {
    const int64_t id = gguf_find_key(g, key.c_str());
    return id < 0 ? 0 : gguf_get_val_u32(g, id);
}

// Re-derives inspect's figures from gguf.h and compares them with the --json output.
void expect_json_matches_gguf_h(const std::string & path, const json & j) {
    ggml_context * gctx = nullptr;
    gguf_init_params p = {/*no_alloc=*/true, /*ctx=*/&gctx};
    gguf_context * g = gguf_init_from_file(path.c_str(), p);
    ASSERT_NE(g, nullptr);
    const std::string arch = gguf_get_val_str(g, gguf_find_key(g, "general.architecture"));
    const uint64_t n_expert = kv_u32(g, arch + ".expert_count");
    const uint64_t n_used = kv_u32(g, arch + ".expert_used_count");
    EXPECT_EQ(j.at("arch"), arch);
    EXPECT_EQ(j.at("n_layer"), kv_u32(g, arch + ".block_count"));
    EXPECT_EQ(j.at("n_embd"), kv_u32(g, arch + ".embedding_length"));
    EXPECT_EQ(j.at("n_expert"), n_expert);
    EXPECT_EQ(j.at("n_expert_used"), n_used);
    EXPECT_EQ(j.at("n_tensors"), gguf_get_n_tensors(g));
    EXPECT_EQ(j.at("alignment"), gguf_get_alignment(g));
    EXPECT_EQ(j.at("data_offset"), gguf_get_data_offset(g));
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(j.at("file_size"), uint64_t(st.st_size));

    uint64_t expert = 0, dense = 0, or_offsets = 0, odirect = 0, n_slices = 0, aligned = 0;
    std::map<int, uint64_t> one_expert_by_layer;  // layer -> bytes of one expert
    std::map<int, uint64_t> bank_by_layer;        // layer -> bytes of all its experts
    const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
    uint64_t cache_all = 0;  // a cache holding every expert: each slice's chunk of pages
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const std::string name = gguf_get_tensor_name(g, i);
        const ggml_tensor * t = ggml_get_tensor(gctx, name.c_str());
        const uint64_t nbytes = ggml_nbytes(t);
        if (!is_expert_name(name)) {
            dense += nbytes;
            continue;
        }
        expert += nbytes;
        const int layer = std::atoi(name.c_str() + 4);
        EXPECT_EQ(uint64_t(t->ne[2]), n_expert) << name;
        const uint64_t slice = t->nb[2];
        one_expert_by_layer[layer] += slice;
        bank_by_layer[layer] += nbytes;
        const uint64_t off0 = gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i);
        uint64_t most_pages = 0;  // the cache's chunk for this tensor (page_pool.h)
        for (uint64_t e = 0; e < n_expert; ++e) {
            const uint64_t off = off0 + e * slice;
            most_pages = std::max(most_pages, (off + slice + page - 1) / page - off / page);
            or_offsets |= off;
            ++n_slices;
            aligned += off % 4096 == 0;
            odirect += (off + slice + 4095) / 4096 * 4096 - off / 4096 * 4096;
        }
        cache_all += n_expert * most_pages * page;
    }
    uint64_t ws = 0, max_one = 0, max_bank = 0;
    for (auto [l, b] : one_expert_by_layer) {
        ws += b * n_used;
        max_one = std::max(max_one, b);
        max_bank = std::max(max_bank, bank_by_layer[l]);
    }
    EXPECT_EQ(j.at("n_moe_layer"), one_expert_by_layer.size());
    EXPECT_EQ(j.at("expert_bytes_total"), expert);
    EXPECT_EQ(j.at("dense_bytes_total"), dense);
    EXPECT_EQ(j.at("token_working_set_bytes"), ws);
    EXPECT_EQ(j.at("expert_bytes"), max_one);
    EXPECT_EQ(j.at("expert_bytes_per_layer"), max_bank);
    EXPECT_EQ(j.at("n_slices"), n_slices);
    EXPECT_EQ(j.at("slices_4096_aligned"), aligned == n_slices);
    EXPECT_EQ(j.at("slice_offset_alignment"), or_offsets & (~or_offsets + 1));
    EXPECT_EQ(j.at("odirect_read_bytes"), odirect);
    EXPECT_NEAR(j.at("odirect_overread_pct").get<double>(),
                100.0 * double(odirect - expert) / double(expert), 1e-9);
    const uint64_t cache_min = uint64_t(double(ws) * 1.5 + 0.5);
    EXPECT_EQ(j.at("cache_min_bytes"), cache_min);
    EXPECT_EQ(j.at("cache_min_mib"), (cache_min + (1 << 20) - 1) >> 20);
    EXPECT_GE(cache_all, expert);
    EXPECT_EQ(j.at("cache_all_experts_mib"), (cache_all + (1 << 20) - 1) >> 20);
    EXPECT_NEAR(j.at("expert_pct_of_file").get<double>(), 100.0 * expert / st.st_size, 1e-9);
    // Projections of the first MoE layer appear with their type and slice size.
    const int first = one_expert_by_layer.begin()->first;
    for (const char * proj : {"gate", "up", "down", "gate_up"}) {
        const std::string name = "blk." + std::to_string(first) + ".ffn_" + proj + "_exps.weight";
        const ggml_tensor * t = ggml_get_tensor(gctx, name.c_str());
        if (!t) continue;
        bool found = false;
        for (const auto & pj : j.at("projections")) {
            if (pj.at("name") == proj && pj.at("type") == ggml_type_name(t->type) &&
                pj.at("slice_bytes") == uint64_t(t->nb[2])) {
                found = true;
            }
        }
        EXPECT_TRUE(found) << "projection " << proj << " missing from " << j.at("projections");
    }
    ggml_free(gctx);
    gguf_free(g);
}

json inspect_json(const std::string & path) {
    CmdResult r = inspect("-m " + sh_quote(path) + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    try {
        return json::parse(r.out);
    } catch (const std::exception & e) {
        ADD_FAILURE() << "bad json: " << e.what() << "\n" << r.out;
        return json::object();
    }
}

// ---- good models -----------------------------------------------------------------------------

TEST(Inspect, JsonMatchesGgufH) {
    TempDir tmp;
    const std::string path = tmp.path("m.gguf");
    ModelSpec s;
    write_model(path, s);
    json j = inspect_json(path);
    expect_json_matches_gguf_h(path, j);
    // The figures by hand: q8_0 row of 256 = 8 blocks x 34 B = 272 B; 64 rows per gate/up
    // slice, down: 256 rows of 64 (2 blocks = 68 B).
    const uint64_t one = 272 * 64 * 2 + 68 * 256;
    EXPECT_EQ(j.at("n_layer"), 3);
    EXPECT_EQ(j.at("n_moe_layer"), 2);
    EXPECT_EQ(j.at("streams"), true);
    EXPECT_EQ(j.at("expert_layouts"), "gate+up+down");
    EXPECT_EQ(j.at("n_ff_exp"), 64);
    EXPECT_EQ(j.at("n_vocab"), 320);
    EXPECT_EQ(j.at("expert_bytes"), one);
    EXPECT_EQ(j.at("expert_bytes_per_layer"), one * 8);
    EXPECT_EQ(j.at("expert_bytes_total"), one * 8 * 2);
    EXPECT_EQ(j.at("token_working_set_bytes"), one * 3 * 2);
    ASSERT_EQ(j.at("projections").size(), 3u);
    EXPECT_EQ(j.at("projections")[0].at("name"), "gate");
    EXPECT_EQ(j.at("projections")[0].at("type"), "q8_0");
    EXPECT_EQ(j.at("projections")[0].at("slice_bytes"), 272 * 64);
    EXPECT_EQ(j.at("projections")[2].at("name"), "down");
    EXPECT_EQ(j.at("projections")[2].at("slice_bytes"), 68 * 256);
    EXPECT_EQ(j.at("alignment"), 32);
    ASSERT_EQ(j.at("moe_layers").size(), 2u);
    EXPECT_EQ(j.at("moe_layers")[0].at("layer"), 1);
    EXPECT_EQ(j.at("moe_layers")[0].at("expert_bytes"), one);
}

TEST(Inspect, Alignment4096SlicesAreODirectReady) {
    TempDir tmp;
    const std::string path = tmp.path("a4096.gguf");
    ModelSpec s;
    s.expert_type = GGML_TYPE_F32;  // slices of 64 KiB: multiples of 4096
    s.alignment = 4096;
    write_model(path, s);
    json j = inspect_json(path);
    expect_json_matches_gguf_h(path, j);
    EXPECT_EQ(j.at("alignment"), 4096);
    EXPECT_EQ(j.at("slices_4096_aligned"), true);
    EXPECT_GE(j.at("slice_offset_alignment").get<uint64_t>(), 4096u);
    EXPECT_EQ(j.at("odirect_overread_pct").get<double>(), 0.0);
    EXPECT_EQ(j.at("odirect_read_bytes"), j.at("expert_bytes_total"));
}

TEST(Inspect, HumanOutput) {
    TempDir tmp;
    const std::string path = tmp.path("m.gguf");
    write_model(path, ModelSpec{});
    CmdResult r = inspect("-m " + sh_quote(path));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    for (const char * want :
         {"architecture  olmoe", "layers        3 (2 MoE)",
          "streams       yes by the index: experts gate+up+down", "8 per MoE layer, top-k 3", "q8_0",
          "17.00 KiB", "expert bytes", "% of file", "dense bytes",
          "working set   306.00 KiB per token = 2 MoE layers x 3 experts x 51.00 KiB",
          "general.alignment 32", "O_DIRECT", "--cache-mb 0", "holds every expert"}) {
        EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
    }
}

// A model from `moestream synth` (skipped while synth is unavailable).
TEST(Inspect, SynthModel) {
    std::string path;
    try {
        path = moestream::test::synth_model("tiny", "qwen3moe", "q4_k");
    } catch (const std::exception & e) {
        GTEST_SKIP() << "synth unavailable: " << e.what();
    }
    json j = inspect_json(path);
    expect_json_matches_gguf_h(path, j);
    EXPECT_EQ(j.at("arch"), "qwen3moe");
    EXPECT_EQ(j.at("projections")[0].at("type"), "q4_K");
}

TEST(Inspect, NamesTheChatTemplateAndWhetherItRenders) {
    TempDir dir("inspect");
    const std::string base = moestream::test::synth_model("tiny", "qwen3moe", "q4_k");
    auto with_template = [&](const std::string & text, const std::string & name) {
        std::ofstream(dir.path(name + ".jinja")) << text;
        CmdResult r = run_cmd(gguf_mutate_cmd() + " " + sh_quote(base) + " " +
                              sh_quote(dir.path(name + ".gguf")) + " set-file " +
                              sh_quote("tokenizer.chat_template=" + dir.path(name + ".jinja")));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return dir.path(name + ".gguf");
    };
    CmdResult bad = inspect("-m " + sh_quote(with_template("{{ x", "bad")));
    ASSERT_EQ(bad.exit_code, 0) << bad.err;
    EXPECT_NE(bad.out.find("does not render: minja: Expected closing expression tag"),
              std::string::npos) << bad.out;
    // Control: a template that renders is named, with its renderer.
    CmdResult good = inspect("-m " + sh_quote(with_template("{{ messages[0].content }}", "good")) +
                             " --json");
    ASSERT_EQ(good.exit_code, 0) << good.err;
    const json t = json::parse(good.out).at("chat_template");
    EXPECT_EQ(t.at("renders"), true) << t.dump();
    EXPECT_EQ(t.at("renderer"), "minja") << t.dump();
    EXPECT_EQ(t.at("name"), "the model's template (minja; tool calls not parsed)") << t.dump();
}

// inspect names the training context and whether the file carries a chat template (the synth
// model: 512 tokens, none; the same file with a template set: its size).
TEST(Inspect, ContextLengthAndChatTemplate) {
    const std::string path = moestream::test::synth_model("tiny", "qwen3moe", "q4_k");
    json j = inspect_json(path);
    EXPECT_EQ(j.at("context_length"), 512);
    EXPECT_TRUE(j.at("chat_template_bytes").is_null());
    CmdResult r = inspect("-m " + sh_quote(path));
    EXPECT_NE(r.out.find("context       512 tokens (the model's training context"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("chat template none in the file"), std::string::npos) << r.out;
    TempDir tmp;
    const std::string with = tmp.path("t.gguf");
    CmdResult m = run_cmd(gguf_mutate_cmd() + " " + sh_quote(path) + " " + sh_quote(with) + " set " +
                          sh_quote("tokenizer.chat_template=str:{{ messages }}"));
    ASSERT_EQ(m.exit_code, 0) << m.err;
    EXPECT_EQ(inspect_json(with).at("chat_template_bytes"), 14) << "control: a template is seen";
}

// Debian's test-llama-archs qwen3moe model (skipped when the tool is not available).
TEST(Inspect, TestLlamaArchsModel) {
    const char * tool = std::getenv("LLAMA_TOOL");
    if (!tool || !fs::exists(tool)) GTEST_SKIP() << "LLAMA_TOOL not set";
    TempDir tmp;
    const std::string dir = tmp.path("archs");
    fs::create_directories(dir);
    CmdResult g =
        run_cmd(sh_quote(tool) + " test-llama-archs -a '^qwen3moe$' -s 1 -o " + sh_quote(dir));
    const std::string path = dir + "/qwen3moe-moe.gguf";
    if (g.exit_code != 0 || !fs::exists(path)) GTEST_SKIP() << "test-llama-archs: " << g.err;
    json j = inspect_json(path);
    expect_json_matches_gguf_h(path, j);
}

// ---- errors ----------------------------------------------------------------------------------

void expect_bad_model(const CmdResult & r, const std::string & path, const std::string & what) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(path + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
}

TEST(Inspect, BadModelsExit2WithOneLine) {
    TempDir tmp;
    const std::string missing = tmp.path("missing.gguf");
    expect_bad_model(inspect("-m " + sh_quote(missing)), missing,
                     "cannot open: No such file or directory");
    expect_bad_model(inspect("--json -m " + sh_quote(missing)), missing, "cannot open");

    const std::string text = tmp.path("readme.txt");
    std::ofstream(text) << "just some text\nover two lines\n";
    expect_bad_model(inspect("-m " + sh_quote(text)), text, "not a GGUF file");

    const std::string good = tmp.path("good.gguf");
    write_model(good, ModelSpec{});
    std::string bytes;
    {
        std::ifstream f(good, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(f), {});
    }
    const std::string trunc = tmp.path("truncated.gguf");
    for (size_t cut : {size_t(20), size_t(600), bytes.size() / 2, bytes.size() - 1}) {
        std::ofstream(trunc, std::ios::binary | std::ios::trunc).write(bytes.data(), cut);
        expect_bad_model(inspect("-m " + sh_quote(trunc) + " --json"), trunc,
                         cut < 1000 ? "truncated" : "");
    }

    const std::string dense = tmp.path("dense.gguf");
    ModelSpec ds;
    ds.moe = false;
    write_model(dense, ds);
    expect_bad_model(inspect("-m " + sh_quote(dense)), dense, "not a MoE model");
}

TEST(Inspect, BadFlagsExit64) {
    EXPECT_EQ(inspect("").exit_code, 64);                     // -m is required
    EXPECT_EQ(inspect("-m x.gguf --bogus").exit_code, 64);    // unknown flag
    EXPECT_EQ(inspect("-m").exit_code, 64);                   // missing value
    EXPECT_EQ(inspect("-m a.gguf extra-arg").exit_code, 64);  // stray positional
    CmdResult help = inspect("--help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("--json"), std::string::npos);
}

}  // namespace
