// test_prompt_cache.cpp — RunOptions::prompt_cache (src/promptcache/prompt_cache.h): the gate
// (a prompt restored from its file, whole or at a prompt-batch boundary, then continued, gives
// the cold run's tokens and logits bit for bit) on the trained demo model and two synth
// architectures; the refusals (a truncated, bit-flipped file, one of another prompt, another
// model, a lossy run) each leave the run exactly the cold run, with an intact file restored as
// the positive control; and the directory's bound (least recently used files removed, nothing
// else touched).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "moestream/moestream.h"
#include "prompt_cache.h"
#include "test_util.h"

namespace moestream::test {
namespace {

constexpr int kBatch = 8;  // small prompt batches: short prompts have a boundary to restore at
const std::string kPrompt = "The river runs past the old mill and on to the sea, where";
const std::string kExt = kPrompt + " the boats wait for the tide to turn.";

std::unique_ptr<Engine> open_cached(const std::string & model, const std::string & dir,
                                    int n_expert_used = 0) {
    RunOptions o;
    o.model_path = model;
    o.n_batch = kBatch;
    o.n_ctx = 256;
    o.prompt_cache = dir;
    o.n_expert_used = n_expert_used;
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    EXPECT_TRUE(st.ok()) << st.message();
    return e;
}

struct GenRun {
    GenerateResult r;
    RunStats s;
};

GenRun gen(Engine & e, const std::string & prompt) {
    GenRun out;
    Status st = e.generate(prompt, 6, nullptr, &out.r);
    EXPECT_TRUE(st.ok()) << st.message();
    out.s = e.stats();
    return out;
}

// The prompt cache's files in dir (prompt-*.kv), by path.
std::set<std::string> cache_files(const std::string & dir) {
    std::set<std::string> out;
    if (DIR * d = opendir(dir.c_str())) {
        while (const dirent * e = readdir(d)) {
            const std::string n = e->d_name;
            if (n.rfind("prompt-", 0) == 0 && n.size() > 3 && n.substr(n.size() - 3) == ".kv")
                out.insert(dir + "/" + n);
        }
        closedir(d);
    }
    return out;
}

// Of the files in `now` and not in `before`, the largest (a prompt's whole-prompt file is
// larger than its boundary file).
std::string largest_new(const std::set<std::string> & now, const std::set<std::string> & before) {
    std::string best;
    off_t best_size = -1;
    for (const std::string & p : now) {
        struct stat st;
        if (before.count(p) || stat(p.c_str(), &st) != 0) continue;
        if (st.st_size > best_size) best = p, best_size = st.st_size;
    }
    return best;
}

void expect_same_output(const GenRun & a, const GenRun & b) {
    SCOPED_TRACE("restored " + std::to_string(a.s.prompt_cache_tokens) + " of " +
                 std::to_string(a.s.n_prompt) + " prompt tokens");
    EXPECT_EQ(a.r.tokens, b.r.tokens);
    EXPECT_EQ(a.r.final_logits, b.r.final_logits);
    EXPECT_EQ(a.s.logits_sha, b.s.logits_sha);
}

// --- The gate, per model ---

std::string gate_model(const std::string & name) {
    if (name == "demo") return src_dir() + "/models/moestream-linuxdoc-4l32e-q4_k_m.gguf";
    return synth_model("tiny", name, "q8_0");
}
std::string synth_qwen3() { return synth_model("tiny", "qwen3moe", "q8_0"); }

class PromptCacheGate : public ::testing::TestWithParam<std::string> {};

TEST_P(PromptCacheGate, RestoreThenContinueIsByteIdenticalToColdRun) {
    TempDir dir("pcache-gate");
    auto e = open_cached(gate_model(GetParam()), dir.dir());
    ASSERT_TRUE(e);
    // Cold references: the long prompt first, its files then removed.
    const GenRun ext_cold = gen(*e, kExt);
    EXPECT_EQ(ext_cold.s.prompt_cache_tokens, 0);
    EXPECT_GT(ext_cold.s.prompt_cache_written_bytes, 0u);
    for (const std::string & p : cache_files(dir.dir())) std::remove(p.c_str());
    const GenRun cold = gen(*e, kPrompt);
    const int n = cold.s.n_prompt;
    ASSERT_GT(n, kBatch) << "the prompt must pass a batch boundary";
    ASSERT_NE(n % kBatch, 0) << "the prompt must end inside a batch";
    EXPECT_EQ(cache_files(dir.dir()).size(), 2u) << "the whole prompt and its boundary prefix";

    // The same prompt again: everything restored (the logits too), nothing prefilled.
    const GenRun warm = gen(*e, kPrompt);
    EXPECT_EQ(warm.s.prompt_cache_tokens, n);
    EXPECT_GT(warm.s.prompt_cache_read_bytes, 0u);
    EXPECT_EQ(warm.s.prefill_time.steps, 0u);
    expect_same_output(warm, cold);

    // The longer prompt: its first (n-1)/kBatch*kBatch tokens restored, the rest prefilled.
    const GenRun ext_warm = gen(*e, kExt);
    EXPECT_EQ(ext_warm.s.prompt_cache_tokens, (n - 1) / kBatch * kBatch);
    expect_same_output(ext_warm, ext_cold);
    EXPECT_NE(ext_warm.s.logits_sha, warm.s.logits_sha) << "control: the prompts differ";
}

// The trained demo model and two synth architectures.
INSTANTIATE_TEST_SUITE_P(Models, PromptCacheGate,
                         ::testing::Values("demo", "qwen3moe", "glm4moe"),
                         [](const auto & info) { return info.param; });

// --- Refusals: one engine, one cold reference, foreign files made once ---

class PromptCacheRefusal : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir("pcache-refuse");
        engine_ = open_cached(synth_qwen3(), dir_->dir()).release();
        cold_ = new GenRun(gen(*engine_, kPrompt));
        file_ = largest_new(cache_files(dir_->dir()), {});
        intact_ = slurp(file_);
        // Another prompt of this engine.
        const auto before = cache_files(dir_->dir());
        gen(*engine_, "A quite different prompt about mountains and snow and wind.");
        other_prompt_ = slurp(largest_new(cache_files(dir_->dir()), before));
        // The same prompt in another model of the same shape, and in a lossy run.
        TempDir other("pcache-other");
        {
            auto e = open_cached(synth_model("tiny", "qwen3moe", "q8_0", 2), other.dir());
            gen(*e, kPrompt);
            other_model_ = slurp(largest_new(cache_files(other.dir()), {}));
        }
        for (const std::string & p : cache_files(other.dir())) std::remove(p.c_str());
        {
            auto e = open_cached(synth_qwen3(), other.dir(), 1);
            ASSERT_TRUE(e->lossy());
            gen(*e, kPrompt);
            lossy_ = slurp(largest_new(cache_files(other.dir()), {}));
        }
    }
    static void TearDownTestSuite() {
        delete engine_;
        delete cold_;
        delete dir_;
    }
    // Puts `bytes` where the engine looks for kPrompt's file and runs kPrompt.
    static GenRun run_with_file(const std::string & bytes) {
        EXPECT_TRUE(write_bytes(file_, bytes));
        return gen(*engine_, kPrompt);
    }
    static void expect_refused(const GenRun & r, const std::string & why) {
        EXPECT_EQ(r.s.prompt_cache_tokens, 0);
        EXPECT_NE(r.s.prompt_cache_refused.find(why), std::string::npos)
            << r.s.prompt_cache_refused;
        expect_same_output(r, *cold_);
    }
    static TempDir * dir_;
    static Engine * engine_;
    static GenRun * cold_;
    static std::string file_, intact_, other_prompt_, other_model_, lossy_;
};
TempDir * PromptCacheRefusal::dir_ = nullptr;
Engine * PromptCacheRefusal::engine_ = nullptr;
GenRun * PromptCacheRefusal::cold_ = nullptr;
std::string PromptCacheRefusal::file_, PromptCacheRefusal::intact_,
    PromptCacheRefusal::other_prompt_, PromptCacheRefusal::other_model_, PromptCacheRefusal::lossy_;

TEST_F(PromptCacheRefusal, IntactFileIsRestored) {  // the positive control of the refusals
    ASSERT_FALSE(intact_.empty());
    const GenRun r = run_with_file(intact_);
    EXPECT_EQ(r.s.prompt_cache_tokens, cold_->s.n_prompt);
    EXPECT_EQ(r.s.prompt_cache_refused, "");
    expect_same_output(r, *cold_);
}

TEST_F(PromptCacheRefusal, TruncatedFileIsRefused) {
    expect_refused(run_with_file(intact_.substr(0, intact_.size() / 2)), "truncated");
}

TEST_F(PromptCacheRefusal, BitFlippedFileIsRefused) {
    std::string b = intact_;
    b[b.size() - 100] ^= 0x10;  // inside the llama.cpp state
    expect_refused(run_with_file(b), "checksum mismatch");
}

TEST_F(PromptCacheRefusal, FileOfAnotherPromptIsRefused) {
    ASSERT_FALSE(other_prompt_.empty());
    expect_refused(run_with_file(other_prompt_), "another prompt");
}

TEST_F(PromptCacheRefusal, FileOfAnotherModelIsRefused) {
    ASSERT_FALSE(other_model_.empty());
    expect_refused(run_with_file(other_model_), "another model");
}

TEST_F(PromptCacheRefusal, LossyFileIsNeverRestoredIntoLosslessRun) {
    ASSERT_FALSE(lossy_.empty());
    expect_refused(run_with_file(lossy_), "lossy KV is never restored");
}

// --- The command line ---

TEST(PromptCacheCli, SecondRunRestoresTheWholePromptWithTheSameOutput) {
    TempDir dir("pcache-cli");
    const std::string flags = "--prompt-cache " + sh_quote(dir.path("kv"));
    const StatsRun a = run_with_stats(gate_model("demo"), kPrompt, 8, flags);
    const StatsRun b = run_with_stats(gate_model("demo"), kPrompt, 8, flags);
    ASSERT_EQ(a.rc, 0) << a.err;
    ASSERT_EQ(b.rc, 0) << b.err;
    const auto ja = nlohmann::json::parse(a.stats), jb = nlohmann::json::parse(b.stats);
    EXPECT_EQ(ja["prompt_cache_tokens"], 0);
    EXPECT_GT(ja["prompt_cache_written_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(jb["prompt_cache_tokens"], jb["n_prompt"]);
    EXPECT_EQ(jb["tokens"], ja["tokens"]);
    EXPECT_EQ(jb["logits_sha"], ja["logits_sha"]);
    EXPECT_NE(b.err.find("prompt cache: " + jb["n_prompt"].dump() + " of"), std::string::npos)
        << b.err;
    // No prefill warmed the expert cache of the restored run: its first decode tokens hit less.
    EXPECT_LT(jb["first16_hit_pct"].get<double>(), ja["first16_hit_pct"].get<double>());
}

TEST(PromptCacheCli, BadDirectoryOrLoneBudgetIsOneClearError) {
    TempDir dir("pcache-bad");
    ASSERT_TRUE(write_bytes(dir.path("file"), "x"));
    const std::string run = sh_quote(cli_bin()) + " run -m " + sh_quote(gate_model("demo")) +
                            " -p hi -n 1 ";
    const CmdResult file = run_cmd(run + "--prompt-cache " + sh_quote(dir.path("file")));
    EXPECT_EQ(file.exit_code, 3) << file.err;
    EXPECT_NE(file.err.find("not a directory"), std::string::npos) << file.err;
    const CmdResult lone = run_cmd(run + "--prompt-cache-mb 10");
    EXPECT_EQ(lone.exit_code, 64) << lone.err;
    EXPECT_NE(lone.err.find("--prompt-cache"), std::string::npos) << lone.err;
    const CmdResult ok = run_cmd(run + "--prompt-cache " + sh_quote(dir.path("made")));
    EXPECT_EQ(ok.exit_code, 0) << "control: " << ok.err;
}

// --- The directory's bound ---

void set_mtime(const std::string & path, time_t sec) {
    const timespec ts[2] = {{sec, 0}, {sec, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), ts, 0), 0) << path;
}

TEST(PromptCacheDir, WriteRemovesLeastRecentlyUsedFilesBeyondBudgetOnly) {
    TempDir dir("pcache-lru");
    std::unique_ptr<PromptCache> pc;
    ASSERT_TRUE(PromptCache::open(dir.dir(), 2500, &pc).ok());
    const PromptCacheKey key{"model", "settings", false};
    // Not a cache file: never counted, never removed, though the oldest and larger than all.
    ASSERT_TRUE(write_bytes(dir.path("notes.txt"), std::string(5000, 'x')));
    set_mtime(dir.path("notes.txt"), 1);
    std::vector<std::string> paths;
    for (int32_t t = 0; t < 3; ++t) {
        PromptCache::File f{pc->file_path(key, &t, 1), std::vector<uint8_t>(1000, uint8_t(t))};
        uint64_t evicted = 9;
        ASSERT_TRUE(pc->write(f, &evicted).ok());
        EXPECT_EQ(evicted, t < 2 ? 0u : 1u);
        paths.push_back(f.path);
        set_mtime(f.path, 1000000 + (t == 0 ? 2 : t == 1 ? 1 : 3));  // file 1 least recent
    }
    // 3 x 1000 > 2500: the least recently used (file 1) went when file 2 was written.
    struct stat st;
    EXPECT_EQ(stat(paths[0].c_str(), &st), 0);
    EXPECT_NE(stat(paths[1].c_str(), &st), 0) << "the least recently used file was kept";
    EXPECT_EQ(stat(paths[2].c_str(), &st), 0);
    EXPECT_EQ(stat(dir.path("notes.txt").c_str(), &st), 0) << "another file was removed";
}

TEST(PromptCacheDir, OpenRefusesAFileAsDirectory) {
    TempDir dir("pcache-open");
    ASSERT_TRUE(write_bytes(dir.path("f"), "x"));
    std::unique_ptr<PromptCache> pc;
    Status st = PromptCache::open(dir.path("f"), 1 << 20, &pc);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("not a directory"), std::string::npos) << st.message();
    EXPECT_TRUE(PromptCache::open(dir.path("made"), 1 << 20, &pc).ok()) << "control";
}

}  // namespace
}  // namespace moestream::test
