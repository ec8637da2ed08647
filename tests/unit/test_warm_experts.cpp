// test_warm_experts.cpp — RunOptions::warm_experts (--warm-experts, src/promptcache/
// warm_experts.h, the streamer's warm set): a run with the usage file of an earlier run gives
// the cold run's tokens and logits bit for bit and a higher hit rate over its first 16 decode
// tokens (deterministic counts), while a file listing only experts that run never routed (the
// negative control) does not raise it; the file is validated like any input (truncated,
// bit-flipped, another model's, another shape: refused in one line, the run cold and exact,
// the file replaced); `auto` writes only under $XDG_CACHE_HOME/moestream/warm; no cache refuses.
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

struct WarmRun {
    GenerateResult r;
    RunStats s;
};

WarmRun run_once(const RunOptions & o) {
    WarmRun out;
    std::unique_ptr<Engine> e;
    Status st = Engine::open(o, &e);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!e) return out;
    st = e->generate(kPrompt, kTokens, nullptr, &out.r);
    EXPECT_TRUE(st.ok()) << st.message();
    out.s = e->stats();
    return out;
}

void expect_same_output(const WarmRun & a, const WarmRun & b) {
    EXPECT_EQ(a.r.tokens, b.r.tokens);
    EXPECT_EQ(a.r.final_logits, b.r.final_logits);
    EXPECT_EQ(a.s.logits_sha, b.s.logits_sha);
}

// One cold run that writes the usage file, shared by every test.
class WarmExperts : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir("warm");
        usage_ = new std::string(slurp_after_cold());
    }
    static void TearDownTestSuite() {
        delete cold_;
        delete usage_;
        delete dir_;
    }
    static std::string slurp_after_cold() {
        cold_ = new WarmRun(run_once(warm_options(dir_->path("cold.usage"))));
        return slurp(dir_->path("cold.usage"));
    }
    static TempDir * dir_;
    static WarmRun * cold_;
    static std::string * usage_;
};
TempDir * WarmExperts::dir_ = nullptr;
WarmRun * WarmExperts::cold_ = nullptr;
std::string * WarmExperts::usage_ = nullptr;

TEST_F(WarmExperts, ColdRunWritesTheUsageFileAndPreloadsNothing) {
    EXPECT_EQ(cold_->s.warm_experts_preloaded, 0u);
    EXPECT_EQ(cold_->s.warm_experts_listed, 0u);
    EXPECT_EQ(cold_->s.warm_experts_refused, "");
    EXPECT_FALSE(usage_->empty()) << "the usage file was not written";
    EXPECT_LT(cold_->s.first16_hit_pct, 100.0) << "the cold run must miss for the test to mean anything";
}

TEST_F(WarmExperts, WarmRunIsByteIdenticalAndHitsMoreInItsFirst16Tokens) {
    const std::string f = dir_->path("warm.usage");
    ASSERT_TRUE(write_bytes(f, *usage_));
    const WarmRun w = run_once(warm_options(f));
    EXPECT_GT(w.s.warm_experts_listed, 0u);
    EXPECT_GT(w.s.warm_experts_preloaded, 0u);
    EXPECT_EQ(w.s.warm_experts_refused, "");
    expect_same_output(w, *cold_);
    EXPECT_GT(w.s.first16_hit_pct, cold_->s.first16_hit_pct);
}

// The negative control: a file that lists only experts the run never routes in decode.
TEST_F(WarmExperts, UsageOfTheWrongExpertsDoesNotRaiseTheHitRate) {
    ModelIndex idx;
    ASSERT_TRUE(load_model_index(demo(), &idx).ok());
    const uint32_t L = uint32_t(idx.moe_layers.size()), E = idx.n_expert;
    WarmUsage used;
    std::string why;
    const std::string cold_file = dir_->path("read.usage");
    ASSERT_TRUE(write_bytes(cold_file, *usage_));
    ASSERT_EQ(warm_usage_read(cold_file, prompt_cache_model_identity(idx), L, E, &used, &why),
              WarmRead::kOk)
        << why;
    WarmUsage wrong = warm_usage_empty(L, E);
    for (size_t i = 0; i < wrong.counts.size(); ++i) wrong.counts[i] = used.counts[i] ? 0 : 1;
    const std::string f = dir_->path("wrong.usage");
    ASSERT_TRUE(warm_usage_write(f, wrong, prompt_cache_model_identity(idx)).ok());
    const WarmRun w = run_once(warm_options(f));
    EXPECT_GT(w.s.warm_experts_preloaded, 0u) << "the wrong experts were read";
    expect_same_output(w, *cold_);
    EXPECT_LE(w.s.first16_hit_pct, cold_->s.first16_hit_pct);
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
    const WarmRun w = run_once(warm_options(f));
    EXPECT_NE(w.s.warm_experts_refused.find(GetParam().why), std::string::npos)
        << w.s.warm_experts_refused;
    EXPECT_EQ(w.s.warm_experts_preloaded, 0u);
    expect_same_output(w, *cold_);
    EXPECT_EQ(slurp(f), *usage_) << "replaced by this (cold) run's usage";
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

}  // namespace
}  // namespace moestream::test
