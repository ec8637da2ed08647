// test_split_models.cpp — model files other than one plain GGUF: split sets, NextN layers,
// large general.alignment.
//
// Split sets are made from a synth model with Debian's llama-gguf-split (scripts/llama-tool),
// by tensor count and by size. Asserted:
//  - streaming a set, given by any of its shards, is byte-identical (tokens, every step's logits
//    hash, final logits) to streaming the merged file and to --no-stream, with the cache off, a
//    small forced cache and prefetch;
//  - the settings list every shard; each shard's mapping is not resident after llama.cpp's load
//    (no shard read whole), and the bytes read at load are the dense weights (not the set);
//  - each malformed set is refused before llama.cpp sees it, exit 2, one line naming the shard
//    file: missing shard, a shard of another set (tensors in two shards), a wrong split.count, a
//    shard of another model (split.tensors.count), a name that is not NAME-0000K-of-0000N.gguf,
//    a NUL byte in a tensor name of a later shard; the intact set loads (control).
// A same-shaped shard of another model is not detectable from the files (the test shows every
// field the reader takes is the genuine set's); a prompt cache made with the set is not reused
// after such a swap.
// NextN: a glm4moe file with a NextN layer streams == --no-stream over repeated runs, its
// NextN layer is out of the working set and of the dense reads, inspect says so.
// Alignment: 1 MiB and 2 MiB general.alignment stream == --no-stream on every one of several
// runs (llama.cpp unmaps the unused alignment padding of its mapping and other allocations
// land there: the binder must not take them for the file's weights).
// Negative control: a planted corrupt slice changes the split set's output.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "moestream/gguf_index.h"
#include "moestream/sysinfo.h"
#include "test_stats_run.h"

using nlohmann::json;
using namespace moestream::test;
namespace fs = std::filesystem;

namespace {

using RunOut = ParsedRun;

RunOut run(const std::string & model, const std::string & flags, const std::string & env = "",
           bool must_succeed = true) {
    RunOut out = run_parsed(model, kRouterPrompt, 16, flags, env.empty() ? "" : env + " ",
                            /*with_logits=*/true);
    if (must_succeed) {
        EXPECT_EQ(out.rc, 0) << flags << "\n" << out.err;
    }
    return out;
}

// Splits `model` into dir/prefix-0000K-of-0000N.gguf with llama-gguf-split's `how` options.
void split(const std::string & model, const std::string & how, const std::string & prefix) {
    CmdResult r = run_cmd(sh_quote(llama_tool()) + " llama-gguf-split --split " + how + " " +
                          sh_quote(model) + " " + sh_quote(prefix));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

std::string shard(const std::string & prefix, int k, int n) {
    char b[32];
    std::snprintf(b, sizeof b, "-%05d-of-%05d.gguf", k, n);
    return prefix + b;
}

void expect_same(const RunOut & a, const RunOut & ref, const std::string & what) {
    ASSERT_FALSE(a.stats.is_null()) << what;
    EXPECT_EQ(a.stats["tokens"], ref.stats["tokens"]) << what;
    EXPECT_EQ(a.stats["logits_sha"], ref.stats["logits_sha"]) << what;
    EXPECT_TRUE(a.logits == ref.logits) << what << ": final logits differ";
}

// The model's refusal: exit 2, one error line naming `file`, no llama.cpp load.
void expect_refused(const std::string & model, const std::string & file, const std::string & words) {
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p hi -n 1");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(file + ":"), std::string::npos) << "names " << file << ": " << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
    CmdResult i = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(model));
    EXPECT_EQ(i.exit_code, 2) << i.err;
    EXPECT_NE(i.err.find(file + ":"), std::string::npos) << i.err;
}

}  // namespace

TEST(SplitModels, SplitSetStreamsLikeTheMergedFile) {
    TempDir dir("split");
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string by_count = dir.path("cnt"), by_size = dir.path("size");
    split(model, "--split-max-tensors 20", by_count);  // 51 tensors: 20 + 20 + 11
    split(model, "--split-max-size 10M", by_size);
    ASSERT_TRUE(fs::exists(shard(by_count, 3, 3)));
    int n_size = 0;
    // The size split's count is what llama-gguf-split chose: find it from the first shard.
    std::string size_first;
    for (int n = 2; n <= 9 && size_first.empty(); ++n)
        if (fs::exists(shard(by_size, 1, n))) size_first = shard(by_size, 1, n), n_size = n;
    ASSERT_FALSE(size_first.empty()) << "no size split written";

    const RunOut ref = run(model, "--no-stream");
    ASSERT_FALSE(ref.stats.is_null());
    expect_same(run(shard(by_count, 1, 3), "--no-stream"), ref, "--no-stream of the set");
    for (const std::string & flags : {std::string("--cache-mb 0"),
                                      std::string("--cache-mb 1 --force-cache --cache-debug"),
                                      std::string("--cache-mb 4 --force-cache --prefetch")}) {
        expect_same(run(model, flags), ref, "merged " + flags);
        for (int k : {1, 2, 3}) {
            const RunOut s = run(shard(by_count, k, 3), flags);
            expect_same(s, ref, "shard " + std::to_string(k) + " given, " + flags);
            if (s.stats.is_null()) continue;
            const json & set = s.stats["settings"];
            ASSERT_EQ(set["model_files"].size(), 3u);
            uint64_t dense = 0, bytes = 0;
            for (int i = 0; i < 3; ++i) {
                const json & f = set["model_files"][i];
                EXPECT_EQ(f["path"].get<std::string>(), shard(by_count, i + 1, 3));
                EXPECT_EQ(f["file_bytes"].get<uint64_t>(), fs::file_size(shard(by_count, i + 1, 3)));
                EXPECT_GT(f["tensors"].get<uint64_t>(), 0u);
                // No shard read whole: llama.cpp's mapping of it holds no resident page.
                EXPECT_LT(f["resident_after_load_bytes"].get<uint64_t>(), 64u << 10)
                    << f["path"] << " resident after load";
                dense += f["dense_bytes"].get<uint64_t>();
                bytes += f["file_bytes"].get<uint64_t>();
            }
            // The bytes read at load are the dense weights (plus O_DIRECT rounding), nowhere near
            // the set.
            const uint64_t at_load = set["load_bytes_read"].get<uint64_t>();
            EXPECT_GE(at_load, dense);
            EXPECT_LT(at_load, dense + dense / 4 + (64u << 10)) << "load read " << at_load;
            EXPECT_LT(at_load, bytes / 4);
            if (flags.find("--prefetch") != std::string::npos) {
                EXPECT_TRUE(s.stats["prefetch"].get<bool>());
                EXPECT_GT(s.stats["prefetch_experts"].get<uint64_t>(), 0u);
            }
        }
    }
    expect_same(run(size_first, "--cache-mb 0"), ref, "size split");
    expect_same(run(shard(by_size, n_size, n_size), "--cache-mb 4 --force-cache"), ref,
                "size split, last shard given");

    // inspect lists the shards and sizes.
    CmdResult ins = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(shard(by_count, 2, 3)) +
                            " --json");
    ASSERT_EQ(ins.exit_code, 0) << ins.err;
    const json j = json::parse(ins.out);
    ASSERT_EQ(j["shards"].size(), 3u);
    uint64_t sum = 0;
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(j["shards"][i]["path"].get<std::string>(), shard(by_count, i + 1, 3));
        EXPECT_EQ(j["shards"][i]["file_bytes"].get<uint64_t>(),
                  fs::file_size(shard(by_count, i + 1, 3)));
        sum += j["shards"][i]["file_bytes"].get<uint64_t>();
    }
    EXPECT_EQ(j["set_bytes"].get<uint64_t>(), sum);
    CmdResult human = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(shard(by_count, 1, 3)));
    EXPECT_NE(human.out.find("3 shards"), std::string::npos) << human.out;
    EXPECT_NE(human.out.find(shard(by_count, 3, 3)), std::string::npos) << human.out;

    // Negative control: a planted corrupt slice changes the set's output.
    const RunOut bad = run(shard(by_count, 1, 3), "--cache-mb 0", "MOESTREAM_DEBUG_CORRUPT_EXPERT='1:*'");
    ASSERT_FALSE(bad.stats.is_null());
    EXPECT_NE(bad.stats["logits_sha"], ref.stats["logits_sha"]);
}

// The index over a set: every tensor of the merged file, in its shard, at an offset whose bytes
// are the merged file's bytes of that tensor.
TEST(SplitModels, IndexOfASetPointsAtTheSameBytes) {
    TempDir dir("splitidx");
    const std::string model = synth_model("tiny", "glm4moe", "q8_0");
    const std::string pre = dir.path("g");
    split(model, "--split-max-tensors 17", pre);
    int n = 0;
    for (int c = 2; c <= 9 && n == 0; ++c)
        if (fs::exists(shard(pre, 1, c))) n = c;
    ASSERT_GE(n, 3);
    moestream::ModelIndex merged, set;
    ASSERT_TRUE(moestream::load_model_index(model, &merged).ok());
    moestream::Status st = moestream::load_model_index(shard(pre, n, n), &set);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(set.path, shard(pre, 1, n));
    ASSERT_EQ(set.shards.size(), size_t(n));
    ASSERT_EQ(set.tensors.size(), merged.tensors.size());
    EXPECT_EQ(set.expert_bytes_total, merged.expert_bytes_total);
    EXPECT_EQ(set.dense_bytes_total, merged.dense_bytes_total);
    EXPECT_EQ(set.token_working_set_bytes, merged.token_working_set_bytes);
    uint64_t sum = 0;
    for (const moestream::ShardFile & f : set.shards) sum += f.file_size;
    EXPECT_EQ(set.set_bytes, sum);
    const std::string whole = slurp(model);
    std::vector<std::string> files;
    for (int k = 1; k <= n; ++k) files.push_back(slurp(shard(pre, k, n)));
    std::vector<int> per_shard(n, 0);
    for (const moestream::TensorInfo & t : set.tensors) {
        const moestream::TensorInfo * m = merged.find_tensor(t.name);
        ASSERT_NE(m, nullptr) << t.name;
        ASSERT_LT(t.shard, uint32_t(n));
        ++per_shard[t.shard];
        ASSERT_EQ(t.nbytes, m->nbytes) << t.name;
        ASSERT_LE(t.file_offset + t.nbytes, files[t.shard].size()) << t.name;
        EXPECT_TRUE(files[t.shard].compare(t.file_offset, t.nbytes, whole, m->file_offset, m->nbytes) == 0)
            << t.name << " in shard " << t.shard + 1;
    }
    for (int k = 0; k < n; ++k) EXPECT_EQ(per_shard[k], int(set.shards[k].n_tensors));
    for (const moestream::MoeLayer & l : set.moe_layers)
        for (const moestream::ExpertTensor & e : l.tensors)
            EXPECT_EQ(e.shard, set.find_tensor(e.name)->shard) << e.name;
}

// The measurement behind "no shard read whole" sees a prefaulted mapping (its control).
TEST(SplitModels, ResidentMappedBytesSeesAPrefaultedFile) {
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    struct stat st;
    ASSERT_EQ(::stat(model.c_str(), &st), 0);
    const int fd = ::open(model.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const size_t len = size_t(st.st_size);
    void * lazy = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    ASSERT_NE(lazy, MAP_FAILED);
    EXPECT_LT(moestream::resident_mapped_bytes_of_file(st.st_dev, st.st_ino), 64u << 10);
    void * full = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    ASSERT_NE(full, MAP_FAILED);
    EXPECT_GE(moestream::resident_mapped_bytes_of_file(st.st_dev, st.st_ino), len / 4096 * 4096);
    ::munmap(full, len);
    ::munmap(lazy, len);
    ::close(fd);
}

TEST(SplitModels, MalformedSetsAreRefusedNamingTheShard) {
    TempDir dir("splitbad");
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string a = dir.path("a"), b = dir.path("b"), other = dir.path("o");
    split(model, "--split-max-tensors 20", a);  // 20 + 20 + 11
    split(model, "--split-max-tensors 25", b);  // 25 + 25 + 1
    split(synth_model("tiny", "glm4moe", "q8_0"), "--split-max-tensors 30", other);
    // Control: the intact set loads.
    CmdResult ok = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(shard(a, 1, 3)));
    ASSERT_EQ(ok.exit_code, 0) << ok.err;

    auto copy_set = [&](const std::string & to) {
        for (int k = 1; k <= 3; ++k) fs::copy_file(shard(a, k, 3), shard(to, k, 3));
    };
    {  // missing shard
        const std::string s = dir.path("miss");
        copy_set(s);
        fs::remove(shard(s, 3, 3));
        expect_refused(shard(s, 1, 3), shard(s, 3, 3), "missing shard 3");
        expect_refused(shard(s, 2, 3), shard(s, 3, 3), "missing shard 3");
    }
    {  // a shard of another split of the same model: its tensors are also in another shard
        const std::string s = dir.path("mix");
        copy_set(s);
        fs::copy_file(shard(b, 2, 3), shard(s, 2, 3), fs::copy_options::overwrite_existing);
        expect_refused(shard(s, 1, 3), shard(s, 3, 3), "also in " + shard(s, 2, 3));
    }
    {  // a shard of another model (another tensor count)
        const std::string s = dir.path("model");
        copy_set(s);
        ASSERT_TRUE(fs::exists(shard(other, 2, 2)) || fs::exists(shard(other, 2, 3)));
        const std::string o2 = fs::exists(shard(other, 2, 3)) ? shard(other, 2, 3) : shard(other, 2, 2);
        fs::copy_file(o2, shard(s, 2, 3), fs::copy_options::overwrite_existing);
        expect_refused(shard(s, 1, 3), shard(s, 2, 3), "not shard 2 of");
    }
    {  // a wrong split.count in one shard
        const std::string s = dir.path("count");
        copy_set(s);
        CmdResult m = run_cmd(gguf_mutate_cmd() + " " + sh_quote(shard(a, 3, 3)) + " " +
                              sh_quote(shard(s, 3, 3) + ".new") + " set split.count=4");
        ASSERT_EQ(m.exit_code, 0) << m.err;
        fs::rename(shard(s, 3, 3) + ".new", shard(s, 3, 3));
        expect_refused(shard(s, 1, 3), shard(s, 3, 3), "split.count 4");
    }
    {  // a NUL byte in a tensor name of a later shard
        const std::string s = dir.path("nul");
        copy_set(s);
        // Shard 2 holds tensors 20..39 of the file: layer 1's experts among them.
        const std::string first = "blk.1.ffn_up_exps.weight";
        CmdResult m = run_cmd(gguf_mutate_cmd() + " " + sh_quote(shard(a, 2, 3)) + " " +
                              sh_quote(shard(s, 2, 3) + ".new") + " " +
                              "rename " + sh_quote(first + "=" + first + "\\x00Z"));
        ASSERT_EQ(m.exit_code, 0) << m.err;
        fs::rename(shard(s, 2, 3) + ".new", shard(s, 2, 3));
        expect_refused(shard(s, 1, 3), shard(s, 2, 3), "contains a NUL byte");
    }
    {  // not llama.cpp's naming: the other shards cannot be found
        const std::string s = dir.path("renamed.gguf");
        fs::copy_file(shard(a, 2, 3), s);
        expect_refused(s, s, "-00002-of-00003.gguf");
    }
}

// A same-shaped shard of another model in place of shard 2 (two synth models that differ only
// in their seed, split alike): the files carry no identity of the set. Every field the reader
// takes from the mixed set's files equals the genuine set's (llama-gguf-split writes only
// split.no, split.count and split.tensors.count into a later shard, and shard 1 holds no digest
// of the others' data), so the set loads and runs with the foreign weights, exit 0
// (docs/limitations.md). What holds: a prompt cache made with the genuine set is not reused
// after the swap (its identity covers every shard). Control: the swapped shard's tensor data do
// differ, the output changes, and the unchanged set reuses its cache.
TEST(SplitModels, ForeignSameShapedShardIsNotInTheFilesButEndsPromptCacheReuse) {
    TempDir dir("splitforeign");
    const std::string a = dir.path("a"), b = dir.path("b"), mix = dir.path("mix");
    split(synth_model("tiny", "qwen3moe", "q8_0", 1), "--split-max-tensors 20", a);
    split(synth_model("tiny", "qwen3moe", "q8_0", 2), "--split-max-tensors 20", b);
    for (int k = 1; k <= 3; ++k) fs::copy_file(shard(a, k, 3), shard(mix, k, 3));
    const std::string cache = dir.path("pc");
    const std::string pc = "--cache-mb 0 --prompt-cache " + sh_quote(cache);
    const RunOut first = run(shard(mix, 1, 3), pc);
    const RunOut again = run(shard(mix, 1, 3), pc);
    ASSERT_FALSE(again.stats.is_null());
    EXPECT_GT(again.stats["prompt_cache_tokens"].get<int>(), 0) << "control: the intact set reuses";
    fs::copy_file(shard(b, 2, 3), shard(mix, 2, 3), fs::copy_options::overwrite_existing);

    moestream::ModelIndex good, mixed;
    ASSERT_TRUE(moestream::load_model_index(shard(a, 1, 3), &good).ok());
    moestream::Status st = moestream::load_model_index(shard(mix, 2, 3), &mixed);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(mixed.tensors.size(), good.tensors.size());
    for (size_t i = 0; i < good.tensors.size(); ++i) {
        const moestream::TensorInfo & g = good.tensors[i], & m = mixed.tensors[i];
        EXPECT_EQ(std::tie(m.name, m.type, m.shard, m.file_offset, m.nbytes),
                  std::tie(g.name, g.type, g.shard, g.file_offset, g.nbytes)) << g.name;
    }
    ASSERT_EQ(mixed.kv.size(), good.kv.size());
    for (const auto & [key, v] : good.kv) {
        auto it = mixed.kv.find(key);
        ASSERT_NE(it, mixed.kv.end()) << key;
        EXPECT_EQ(std::tie(it->second.i, it->second.s, it->second.arr_len), std::tie(v.i, v.s, v.arr_len))
            << key;
    }
    for (size_t k = 0; k < 3; ++k)
        EXPECT_EQ(std::tie(mixed.shards[k].file_size, mixed.shards[k].n_tensors, mixed.shards[k].tensor_bytes),
                  std::tie(good.shards[k].file_size, good.shards[k].n_tensors, good.shards[k].tensor_bytes));
    // Control: shard 2's data are the other model's.
    const std::string ga = slurp(shard(a, 2, 3)), gb = slurp(shard(b, 2, 3));
    ASSERT_EQ(ga.size(), gb.size());
    EXPECT_NE(ga.substr(good.shards[1].data_offset), gb.substr(good.shards[1].data_offset));

    const RunOut swapped = run(shard(mix, 1, 3), pc);
    ASSERT_FALSE(swapped.stats.is_null());
    EXPECT_EQ(swapped.stats["prompt_cache_tokens"].get<int>(), 0) << "the cache of the old set reused";
    EXPECT_NE(swapped.stats["logits_sha"], first.stats["logits_sha"]) << "control: other weights";
}

TEST(SplitModels, NextnLayerIsLeftOutAndStreamsOnEveryRun) {
    const std::string model = models_dir() + "/tiny-glm4moe-q8_0-nextn1.gguf";
    if (!fs::exists(model)) {
        const std::string tmp = model + ".tmp." + std::to_string(getpid());
        CmdResult r = run_cmd(sh_quote(cli_bin()) + " synth --preset tiny --arch glm4moe --type q8_0 "
                              "--nextn-layers 1 -o " + sh_quote(tmp));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        std::rename(tmp.c_str(), model.c_str());
    }
    CmdResult ins = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(model));
    ASSERT_EQ(ins.exit_code, 0) << ins.err;
    EXPECT_NE(ins.out.find("1 NextN layer(s) in the file, not used"), std::string::npos) << ins.out;
    CmdResult ij = run_cmd(sh_quote(cli_bin()) + " inspect -m " + sh_quote(model) + " --json");
    ASSERT_EQ(ij.exit_code, 0) << ij.err;
    const json j = json::parse(ij.out);
    EXPECT_EQ(j["n_layer"].get<int>(), 5);
    EXPECT_EQ(j["n_moe_layer"].get<int>(), 3);  // layer 0 dense, 1..3 MoE, 4 NextN (left out)
    for (const json & l : j["moe_layers"]) EXPECT_LT(l["layer"].get<int>(), 4);
    EXPECT_EQ(j["token_working_set_bytes"].get<uint64_t>(),
              3ull * j["n_expert_used"].get<uint64_t>() * j["expert_bytes"].get<uint64_t>());
    EXPECT_GT(j["unused_bytes_total"].get<uint64_t>(), 0u);

    const RunOut ref = run(model, "--no-stream");
    ASSERT_FALSE(ref.stats.is_null());
    const char * variants[] = {"--cache-mb 0", "--cache-mb 0", "--cache-mb 0",
                               "--cache-mb 1 --force-cache", "--cache-mb 4 --force-cache --prefetch",
                               ""};
    for (const char * flags : variants) {
        const RunOut s = run(model, flags);
        expect_same(s, ref, flags);
        if (s.stats.is_null()) continue;
        // Dense reads at load: the used dense weights, not the NextN layer's.
        const json & f = s.stats["settings"]["model_files"][0];
        EXPECT_EQ(f["dense_bytes"].get<uint64_t>(), j["dense_bytes_total"].get<uint64_t>());
        EXPECT_LT(s.stats["settings"]["load_bytes_read"].get<uint64_t>(),
                  j["dense_bytes_total"].get<uint64_t>() + (256u << 10));
        EXPECT_EQ(s.stats["settings"]["nextn_layers_unused"].get<int>(), 1);
    }
}

TEST(SplitModels, LargeAlignmentStreamsOnEveryRun) {
    for (const auto & [arch, align] : {std::pair<const char *, int>{"qwen3moe", 1048576},
                                       std::pair<const char *, int>{"glm4moe", 2097152}}) {
        const std::string model = synth_model("tiny", arch, "q8_0", 1, align);
        SCOPED_TRACE(model);
        const RunOut ref = run(model, "--no-stream");
        ASSERT_FALSE(ref.stats.is_null());
        for (int i = 0; i < 6; ++i) expect_same(run(model, i % 2 ? "--cache-mb 0" : ""), ref, "run " + std::to_string(i));
    }
}
