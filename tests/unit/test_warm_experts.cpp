// test_warm_experts.cpp — RunOptions::warm_experts (--warm-experts, src/promptcache/
// warm_experts.h, the streamer's warm set): with the prompt restored from the prompt cache (so
// decode starts with an empty expert cache, the case the warm set is for), a run with the usage
// file of an earlier run gives the cold run's tokens and logits bit for bit and a higher hit
// rate over its first 16 decode tokens than the same restored run without it, and tails of
// several experts per routing preload more and hit more than tails of one (deterministic
// counts: MOESTREAM_DEBUG_WARM_TAIL fixes the tail size and reads every tail whole), while a
// file listing only experts that run never routed (the negative control) does not raise it;
// the adaptive, stoppable tails (no test hook) are byte-identical too; the file is validated
// like any input (truncated, bit-flipped, another model's, another shape: refused in one line,
// the run exact, the file replaced); `auto` writes only under $XDG_CACHE_HOME/moestream/warm;
// no cache refuses. The preload at open (the warm lists read before the first decode): with it
// waited for (MOESTREAM_DEBUG_WARM_PRELOAD=wait: deterministic) the first decode token misses
// nothing and no listed expert is left unread, while without it (=off, the control) the first
// token misses and a one-token run leaves listed experts unread; the suite's other runs turn
// it off (their counts are the tails'), the adaptive run keeps it (in the background).
// One model (the trained demo model), a handful of 24-token runs.
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

#include "moestream/gguf_index.h"
#include "moestream/moestream.h"
#include "prompt_cache.h"
#include "test_util.h"
#include "warm_experts.h"

namespace moestream::test {
namespace {

constexpr int kTokens = 24;
const std::string kPrompt = "The kernel maps the page";

std::string demo() { return src_dir() + "/models/moestream-linuxdoc-4l32e-q4_k_m.gguf"; }

RunOptions warm_options(const std::string & usage) {
    RunOptions o;
    o.model_path = demo();
    o.n_ctx = 256;
    o.cache_mb = 8;  // about a quarter of the experts per layer: decode misses when cold
    o.warm_experts = usage;
    return o;
}

constexpr const char * kTailKnob = "MOESTREAM_DEBUG_WARM_TAIL";
constexpr const char * kTail = "4";  // the suite's fixed tail size (experts per tail)
constexpr const char * kPreloadKnob = "MOESTREAM_DEBUG_WARM_PRELOAD";

struct WarmRun {
    GenerateResult r;
    RunStats s;
};

WarmRun run_once(const RunOptions & o, int n_tokens = kTokens) {
    WarmRun out;
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!e) return out;
    st = e->generate(kPrompt, n_tokens, nullptr, &out.r);
    EXPECT_TRUE(st.ok()) << st.message();
    out.s = e->stats();
    return out;
}

void expect_same_output(const WarmRun & a, const WarmRun & b) {
    EXPECT_EQ(a.r.tokens, b.r.tokens);
    EXPECT_EQ(a.r.final_logits, b.r.final_logits);
    EXPECT_EQ(a.s.logits_sha, b.s.logits_sha);
}

// One cold run that writes the usage file and the prompt cache, and one run that restores the
// prompt without a warm set (the hit-rate baseline), shared by every test. The fixture's runs
// restore the prompt and use fixed tails of kTail experts.
class WarmExperts : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir("warm");
        setenv(kTailKnob, kTail, 1);
        setenv(kPreloadKnob, "off", 1);
        cold_ = new WarmRun(run_once(restored(dir_->path("cold.usage"))));
        usage_ = new std::string(slurp(dir_->path("cold.usage")));
        // (It records its usage too: no file yet, so it reads nothing ahead.)
        restored_ = new WarmRun(run_once(restored(dir_->path("restored.usage"))));
        restored_usage_ = new std::string(slurp(dir_->path("restored.usage")));
    }
    static void TearDownTestSuite() {
        unsetenv(kTailKnob);
        unsetenv(kPreloadKnob);
        delete cold_;
        delete restored_;
        delete restored_usage_;
        delete usage_;
        delete dir_;
    }
    // warm_options with the suite's prompt cache (the first run writes it, the rest restore).
    static RunOptions restored(const std::string & usage) {
        RunOptions o = warm_options(usage);
        o.prompt_cache = dir_->path("pc");
        return o;
    }
    static TempDir * dir_;
    static WarmRun * cold_;
    static WarmRun * restored_;  // prompt restored, no warm set
    static std::string * usage_;           // the cold run's usage file
    static std::string * restored_usage_;  // the restored run's (its decode routings only)
};
TempDir * WarmExperts::dir_ = nullptr;
WarmRun * WarmExperts::cold_ = nullptr;
WarmRun * WarmExperts::restored_ = nullptr;
std::string * WarmExperts::restored_usage_ = nullptr;
std::string * WarmExperts::usage_ = nullptr;

TEST_F(WarmExperts, ColdRunWritesTheUsageFileAndPreloadsNothing) {
    EXPECT_EQ(cold_->s.warm_experts_preloaded, 0u);
    EXPECT_EQ(cold_->s.warm_experts_listed, 0u);
    EXPECT_EQ(cold_->s.warm_experts_refused, "");
    EXPECT_FALSE(usage_->empty()) << "the usage file was not written";
    EXPECT_LT(cold_->s.first16_hit_pct, 100.0) << "the cold run must miss for the test to mean anything";
    EXPECT_GT(restored_->s.prompt_cache_tokens, 0) << "the baseline restores the prompt";
    EXPECT_EQ(restored_->s.warm_experts_preloaded, 0u);
    expect_same_output(*restored_, *cold_);
}

// A warm run with the usage file (a copy of it at `name`) and tails of `tail` experts.
WarmRun warm_run(const RunOptions & o, const std::string & usage, const std::string & name,
                 const char * tail) {
    EXPECT_TRUE(write_bytes(o.warm_experts, usage)) << name;
    if (tail) setenv(kTailKnob, tail, 1);
    else unsetenv(kTailKnob);
    WarmRun w = run_once(o);
    setenv(kTailKnob, kTail, 1);
    return w;
}

TEST_F(WarmExperts, WarmRunIsByteIdenticalAndHitsMoreInItsFirst16Tokens) {
    const WarmRun w = warm_run(restored(dir_->path("warm.usage")), *usage_, "warm", kTail);
    EXPECT_GT(w.s.warm_experts_listed, 0u);
    EXPECT_GT(w.s.warm_experts_preloaded, 0u);
    EXPECT_EQ(w.s.warm_experts_refused, "");
    EXPECT_GT(w.s.prompt_cache_tokens, 0);
    expect_same_output(w, *cold_);
    EXPECT_GT(w.s.first16_hit_pct, restored_->s.first16_hit_pct);
}

// The warm set fills the idle reading time: tails of several experts per routing preload more
// of the list and hit more in the first 16 decode tokens than tails of one (the control).
TEST_F(WarmExperts, TailsOfSeveralExpertsHitMoreThanTailsOfOne) {
    const WarmRun one = warm_run(restored(dir_->path("one.usage")), *usage_, "one", "1");
    const WarmRun several = warm_run(restored(dir_->path("four.usage")), *usage_, "four", kTail);
    expect_same_output(one, *cold_);
    expect_same_output(several, *cold_);
    EXPECT_GT(several.s.warm_experts_preloaded, one.s.warm_experts_preloaded);
    EXPECT_GT(several.s.first16_hit_pct, one.s.first16_hit_pct);
}

// The production tails (sized by what the last one read, stopped when the next routing comes)
// depend on timing in what they read, never in what the run computes.
TEST_F(WarmExperts, AdaptiveTailsAreByteIdentical) {
    unsetenv(kPreloadKnob);  // the production preload too, in the background
    const WarmRun w = warm_run(restored(dir_->path("adaptive.usage")), *usage_, "adaptive", nullptr);
    setenv(kPreloadKnob, "off", 1);
    EXPECT_EQ(w.s.warm_experts_refused, "");
    EXPECT_LE(w.s.warm_experts_preloaded, w.s.warm_experts_listed);
    expect_same_output(w, *cold_);
}

// A warm run with the preload at open set by `preload` (wait|off), tails of one expert, a
// cache that holds every expert (nothing the preload reads is evicted) and n_tokens tokens.
WarmRun preload_run(const RunOptions & base, const std::string & usage, const char * preload,
                    int n_tokens = kTokens) {
    RunOptions o = base;
    o.cache_mb = 32;  // the whole demo model's experts
    EXPECT_TRUE(write_bytes(o.warm_experts, usage));
    setenv(kPreloadKnob, preload, 1);
    setenv(kTailKnob, "1", 1);
    WarmRun w = run_once(o, n_tokens);
    setenv(kPreloadKnob, "off", 1);
    setenv(kTailKnob, kTail, 1);
    return w;
}

// The cold run's usage lists every expert its decode routed, and the warm run decodes the
// same tokens: read in full before decode, the list leaves its first token nothing to read.
TEST_F(WarmExperts, PreloadDoneBeforeDecodeLeavesTheFirstTokenNoMiss) {
    const WarmRun w = preload_run(restored(dir_->path("pre.usage")), *usage_, "wait");
    expect_same_output(w, *cold_);
    EXPECT_GT(w.s.prompt_cache_tokens, 0);
    ASSERT_FALSE(w.s.tokens.empty());
    EXPECT_GT(w.s.warm_experts_listed, 0u);
    EXPECT_EQ(w.s.warm_experts_before_decode, w.s.warm_experts_listed);
    EXPECT_EQ(w.s.tokens[0].cache_misses, 0u);
    EXPECT_GT(w.s.tokens[0].cache_hits, 0u);
}

// The control: without the preload (tails of one expert only) the first token misses.
TEST_F(WarmExperts, WithoutThePreloadTheFirstTokenMisses) {
    const WarmRun w = preload_run(restored(dir_->path("nopre.usage")), *usage_, "off");
    expect_same_output(w, *cold_);
    ASSERT_FALSE(w.s.tokens.empty());
    EXPECT_EQ(w.s.warm_experts_before_decode, 0u);
    EXPECT_GT(w.s.tokens[0].cache_misses, 0u);
}

// warm_experts_not_read: the listed experts neither a warm read nor a routing made resident.
TEST_F(WarmExperts, NotReadCountsTheListedExpertsLeftUnread) {
    const WarmRun done = preload_run(restored(dir_->path("nr-wait.usage")), *usage_, "wait", 1);
    EXPECT_EQ(done.s.warm_experts_not_read, 0u);
    // The control: a one-token run on tails of one expert reaches only part of the list.
    const WarmRun left = preload_run(restored(dir_->path("nr-off.usage")), *usage_, "off", 1);
    EXPECT_GT(left.s.warm_experts_not_read, 0u);
    EXPECT_LE(left.s.warm_experts_not_read + left.s.warm_experts_preloaded,
              left.s.warm_experts_listed);
}

// The negative control: a file that lists only experts the run never routes in decode.
TEST_F(WarmExperts, UsageOfTheWrongExpertsDoesNotRaiseTheHitRate) {
    ModelIndex idx;
    ASSERT_TRUE(load_model_index(demo(), &idx).ok());
    const uint32_t L = uint32_t(idx.moe_layers.size()), E = idx.n_expert;
    WarmUsage used;
    std::string why;
    const std::string cold_file = dir_->path("read.usage");  // what a restored run routes
    ASSERT_TRUE(write_bytes(cold_file, *restored_usage_));
    ASSERT_EQ(warm_usage_read(cold_file, prompt_cache_model_identity(idx), L, E, &used, &why),
              WarmRead::kOk)
        << why;
    WarmUsage wrong = warm_usage_empty(L, E);
    for (size_t i = 0; i < wrong.counts.size(); ++i) wrong.counts[i] = used.counts[i] ? 0 : 1;
    const std::string f = dir_->path("wrong.usage");
    ASSERT_TRUE(warm_usage_write(f, wrong, prompt_cache_model_identity(idx)).ok());
    const WarmRun w = run_once(restored(f));
    EXPECT_GT(w.s.warm_experts_preloaded, 0u) << "the wrong experts were read";
    expect_same_output(w, *cold_);
    EXPECT_LE(w.s.first16_hit_pct, restored_->s.first16_hit_pct);
}

// A damaged or foreign file: refused in one line, the run is the cold run, the file replaced.
struct Damage {
    const char * name;
    const char * why;  // in the refusal
    std::string (*apply)(const std::string & intact);
};

class WarmExpertsRefusal : public WarmExperts, public ::testing::WithParamInterface<Damage> {};

TEST_P(WarmExpertsRefusal, DamagedFileIsRefusedAndReplaced) {
    const std::string f = dir_->path(std::string(GetParam().name) + ".usage");
    ASSERT_TRUE(write_bytes(f, GetParam().apply(*usage_)));
    const WarmRun w = run_once(restored(f));
    EXPECT_NE(w.s.warm_experts_refused.find(GetParam().why), std::string::npos)
        << w.s.warm_experts_refused;
    EXPECT_EQ(w.s.warm_experts_preloaded, 0u);
    expect_same_output(w, *cold_);
    EXPECT_EQ(slurp(f), *restored_usage_) << "replaced by this (cold) run's usage";
}

std::string truncated(const std::string & s) { return s.substr(0, s.size() - 9); }
std::string bit_flipped(const std::string & s) {
    std::string b = s;
    b[b.size() / 2] = char(b[b.size() / 2] ^ 0x10);
    return b;
}
// A whole, consistent file of this shape written for another model identity.
std::string foreign(const std::string &) {
    WarmUsage u = warm_usage_empty(4, 32);
    u.counts.assign(u.counts.size(), 1);
    const std::vector<uint8_t> b = warm_usage_bytes(u, "another model\n");
    return std::string(b.begin(), b.end());
}
std::string wrong_shape(const std::string &) {
    const std::vector<uint8_t> b = warm_usage_bytes(warm_usage_empty(3, 32), "x");
    return std::string(b.begin(), b.end());
}

INSTANTIATE_TEST_SUITE_P(Files, WarmExpertsRefusal,
                         ::testing::Values(Damage{"truncated", "truncated", truncated},
                                           Damage{"bitflip", "checksum", bit_flipped},
                                           Damage{"foreign", "another model", foreign},
                                           Damage{"shape", "another shape", wrong_shape}),
                         [](const auto & info) { return std::string(info.param.name); });

TEST(WarmExpertsAuto, AutoWritesOnlyUnderTheCacheHome) {
    TempDir home("warm-home");
    const char * old = std::getenv("XDG_CACHE_HOME");
    const std::string saved = old ? old : "";
    setenv("XDG_CACHE_HOME", home.dir().c_str(), 1);
    std::string why;
    const std::string expect = warm_usage_auto_path(demo(), &why);
    const WarmRun w = run_once(warm_options("auto"));
    if (old) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
    else unsetenv("XDG_CACHE_HOME");
    EXPECT_EQ(expect.rfind(home.dir() + "/moestream/warm/warm-", 0), 0u) << expect;
    EXPECT_EQ(w.s.warm_experts_file, expect);
    struct stat st;
    EXPECT_EQ(stat(expect.c_str(), &st), 0) << expect;
}

TEST(WarmExpertsNoCache, IsRefusedByNameWithTheCacheOff) {
    TempDir d("warm-off");
    RunOptions o = warm_options(d.path("u.usage"));
    o.cache_mb = 0;
    std::unique_ptr<Engine> e;
    const Status st = Engine::open(o, &e);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("--warm-experts"), std::string::npos) << st.message();
    struct stat sb;
    EXPECT_NE(stat(d.path("u.usage").c_str(), &sb), 0) << "nothing written";
}

TEST(WarmExpertsNoCache, IsRefusedByNameWithOneReadLane) {
    TempDir d("warm-lane");
    RunOptions o = warm_options(d.path("u.usage"));
    o.io_threads = 1;
    std::unique_ptr<Engine> e;
    const Status st = Engine::open(o, &e);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("--io-threads"), std::string::npos) << st.message();
}

TEST(WarmExpertsNoCache, IsRefusedByNameWithARouteTrace) {
    TempDir d("warm-trace");
    RunOptions o = warm_options(d.path("u.usage"));
    o.route_trace = d.path("t.trace");
    std::unique_ptr<Engine> e;
    const Status st = Engine::open(o, &e);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("RunOptions::warm_experts cannot be combined with "
                                "RunOptions::route_trace"),
              std::string::npos)
        << st.message();
    struct stat sb;
    EXPECT_NE(stat(d.path("u.usage").c_str(), &sb), 0) << "nothing written";
    EXPECT_NE(stat(d.path("t.trace").c_str(), &sb), 0) << "nothing written";
    o.route_trace.clear();  // control: the same options without the trace open
    const Status ok = Engine::open(o, &e);
    EXPECT_TRUE(ok.ok()) << ok.message();
}

}  // namespace
}  // namespace moestream::test
