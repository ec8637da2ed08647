// test_subst_replay.cpp — router scores in route traces (--route-trace-scores) and
// `replay --substitute-experts` (docs/route-trace.md, docs/replay.md):
//  - format: a hand-made trace with scores round-trips (order, scores, row counts, the
//    substitute margin, the size arithmetic); a trace without scores of an older version
//    still reads; every prefix of a trace with scores is rejected with its offset, and a
//    corrupted scores block (not a permutation, out of order, not finite, a row count, a
//    slot that is not the router's rank) is one error naming the file and the record (exit 3);
//  - a run on a synth model with a small cache (it evicts), recorded with scores and
//    --substitute-experts M, validates exactly (hits, misses and substitutions slot for slot);
//    negative control: the same trace with another margin in its header fails to validate;
//  - a lossless trace with scores replayed at M reproduces a real run with M exactly up to
//    and including the routing of its first substitution (after it the hidden states differ);
//  - the flag is refused without --route-trace; recording scores does not change the output;
//    eval records them for its scored run (not its lossless reference run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moestream/replay.h"
#include "moestream/route_trace.h"
#include "route_tracer.h"
#include "test_util.h"

using nlohmann::json;
using namespace moestream;
using namespace moestream::test;

namespace {

constexpr size_t kMarginAt = 60;  // the header's f64 substitute margin (version 6)

TraceHeader scored_header(uint32_t n_moe, uint32_t n_expert, uint32_t k) {
    TraceHeader h;
    h.n_layer = n_moe;
    h.n_expert = n_expert;
    h.k_model = h.k = k;
    h.page_bytes = 4096;
    h.cache_budget_bytes = 1 << 20;
    h.scores = true;
    h.substitute = 0.25;
    h.settings_json = "{}";
    for (uint32_t l = 0; l < n_moe; ++l) {
        TraceLayerShape s;
        s.layer = l;
        s.slice_bytes = {4096};
        s.phase_bytes = {0};
        s.expert_bytes = 4096;
        h.moe_layers.push_back(s);
    }
    return h;
}

// The router order of decode token `tok`, layer l: a rotation; scores fall along it.
void hand_scores(uint32_t n, int tok, uint32_t l, std::vector<int32_t> * order,
                 std::vector<float> * scores) {
    order->resize(n);
    scores->resize(n);
    for (uint32_t q = 0; q < n; ++q) {
        const int32_t e = int32_t((q + uint32_t(tok) * 3 + l) % n);
        (*order)[q] = e;
        (*scores)[size_t(e)] = 1.0f - float(q) / float(n);
    }
}

// One 2-row prefill, then `tokens` decode graphs; in each, slot 1 of layer 0 is substituted
// by the router's rank k (when substitute is set).
void write_scored(const std::string & path, const TraceHeader & h, int tokens, bool substitute) {
    auto t = RouteTracer::open(path, h);
    ASSERT_TRUE(t->active());
    std::vector<int32_t> ids(size_t(h.k) * 2), order;
    std::vector<float> scores;
    t->begin_graph(false, 0, 2);
    for (uint32_t l = 0; l < h.moe_layers.size(); ++l) {
        for (size_t s = 0; s < ids.size(); ++s) ids[s] = int32_t(s % h.n_expert);
        t->routing_start(l, int(h.k), 2, ids.data());
    }
    for (int tok = 0; tok < tokens; ++tok) {
        t->begin_graph(true, uint32_t(2 + tok), 1);
        for (uint32_t l = 0; l < h.moe_layers.size(); ++l) {
            hand_scores(h.n_expert, tok, l, &order, &scores);
            t->stash_scores(l, 1, int(h.n_expert), order.data(), h.n_expert, scores.data(),
                            h.n_expert);
            for (uint32_t j = 0; j < h.k; ++j) ids[j] = order[j];
            if (substitute && l == 0) ids[1] = order[h.k];
            t->routing_start(l, int(h.k), 1, ids.data());
            for (uint32_t j = 0; j < h.k; ++j) t->set_weight(0, int(j), 1.0f / float(h.k));
            t->done_weights();
            if (substitute && l == 0) t->mark_substituted(0, 1);
            t->on_stage(l, {uint32_t(ids[1])}, {uint8_t(substitute && l == 0)}, 0);
        }
        t->end_graph();
    }
    t->finish();
}

Status parse(const std::string & bytes, RouteTrace * t, const std::string & name = "s.trace") {
    return parse_route_trace(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), name,
                             t);
}

std::string replay(const std::string & trace, const std::string & flags, CmdResult * r) {
    *r = run_cmd(sh_quote(cli_bin()) + " replay " + sh_quote(trace) + " " + flags);
    return r->out;
}

// Patches the trace's header margin (the negative control: another M).
void set_margin(const std::string & path, double m) {
    std::string b = slurp(path);
    std::memcpy(b.data() + kMarginAt, &m, 8);
    ASSERT_TRUE(write_bytes(path, b));
}

// The first `n` routings of t (slots and scores cut to match).
RouteTrace prefix(const RouteTrace & t, size_t n) {
    RouteTrace p;
    p.header = t.header;
    p.routings.assign(t.routings.begin(), t.routings.begin() + long(n));
    const TraceRouting & last = p.routings.back();
    const size_t slots = size_t(last.first_slot + uint64_t(last.n_rows) * last.k);
    p.expert.assign(t.expert.begin(), t.expert.begin() + long(slots));
    p.weight.assign(t.weight.begin(), t.weight.begin() + long(slots));
    p.flags.assign(t.flags.begin(), t.flags.begin() + long(slots));
    uint64_t rows = 0;
    for (const TraceRouting & r : p.routings)
        if (r.score_rows) rows = r.first_score_row + r.score_rows;
    const size_t sc = size_t(rows * t.header.n_expert);
    p.score_order.assign(t.score_order.begin(), t.score_order.begin() + long(sc));
    p.scores.assign(t.scores.begin(), t.scores.begin() + long(sc));
    return p;
}

}  // namespace

TEST(SubstReplayFormat, ScoresRoundTripAndOlderVersionsStillRead) {
    TempDir dir("subst-fmt");
    const std::string path = dir.path("s.trace");
    const TraceHeader h = scored_header(2, 16, 4);
    write_scored(path, h, 3, true);
    RouteTrace t;
    Status st = read_route_trace(path, &t);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_TRUE(t.header.scores);
    EXPECT_EQ(t.header.substitute, 0.25);
    ASSERT_EQ(t.routings.size(), 2u + 3u * 2u);
    EXPECT_EQ(t.routings[0].score_rows, 0u);  // prefill: no scores
    std::vector<int32_t> order;
    std::vector<float> scores;
    for (size_t i = 2; i < t.routings.size(); ++i) {
        const TraceRouting & r = t.routings[i];
        ASSERT_EQ(r.score_rows, 1u);
        const int tok = int(i - 2) / 2;
        hand_scores(16, tok, r.layer, &order, &scores);
        for (uint32_t q = 0; q < 16; ++q) {
            EXPECT_EQ(t.score_order[r.first_score_row * 16 + q], uint16_t(order[q]));
            EXPECT_EQ(t.scores[r.first_score_row * 16 + q], scores[q]);
        }
        EXPECT_EQ(bool(t.flags[r.first_slot + 1] & kSlotSubstituted), r.layer == 0);
    }
    // Size: each decode record gains 4 + 6 x n_expert bytes per row.
    const uint64_t header = 8 + 4 * 6 + 8 + 8 + 8 + 4 + 8 + 4 + 4 + 2 * (8 + 8 + 8) + 4 + 2;
    const uint64_t body = t.routings.size() * 28 + t.expert.size() * 8 + 6 * (4 + 6 * 16) + 20;
    EXPECT_EQ(t.file_bytes, header + body);

    // A trace without scores, made version 5 (no margin field), still reads.
    TraceHeader plain = h;
    plain.scores = false;
    plain.substitute = 0;
    write_scored(path, plain, 2, false);
    std::string v5 = slurp(path);
    v5.replace(8, 4, std::string("\x05\0\0\0", 4));
    v5.erase(kMarginAt, 16);  // the margin (version 6) and the slot fields (version 7)
    st = parse(v5, &t);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(t.header.version, 5u);
    EXPECT_FALSE(t.header.scores);
    EXPECT_TRUE(t.scores.empty());
    v5[56] = char(v5[56] | 8);  // the scores flag did not exist in version 5
    st = parse(v5, &t);
    EXPECT_NE(st.message().find("offset 56: unknown settings flags 8"), std::string::npos)
        << st.message();
}

TEST(SubstReplayFormat, MalformedScoresGetOneErrorNamingTheFileAndRecord) {
    TempDir dir("subst-bad");
    const std::string path = dir.path("s.trace");
    write_scored(path, scored_header(2, 16, 4), 2, true);
    const std::string good = slurp(path);
    RouteTrace t;
    ASSERT_TRUE(parse(good, &t).ok());
    for (size_t n = 0; n < good.size(); ++n) {  // every prefix
        Status st = parse(good.substr(0, n), &t);
        ASSERT_FALSE(st.ok()) << "prefix of " << n << " bytes accepted";
        EXPECT_NE(st.message().find("s.trace: offset "), std::string::npos) << st.message();
    }
    ASSERT_TRUE(parse(good, &t).ok());
    const TraceRouting & r = t.routings[2];  // decode, layer 0 (slot 1 substituted)
    const uint64_t block = r.offset + 28 + 8 * r.k;  // u32 rows, then order, then scores
    const uint64_t ord = block + 4, sco = ord + 2 * 16;
    const std::string rec = "routing record at offset " + std::to_string(r.offset) + ": scores: ";
    const uint16_t o0 = t.score_order[r.first_score_row * 16];
    auto u16 = [](uint16_t v) { return std::string(reinterpret_cast<const char *>(&v), 2); };
    auto f32 = [](float v) { return std::string(reinterpret_cast<const char *>(&v), 4); };
    struct Case {
        uint64_t at;
        std::string bytes, expect;
    };
    const Case cases[] = {
        {block, std::string("\x02\0\0\0", 4), rec + "2 rows, the record has 1"},
        {ord + 2, u16(o0), rec + "row 0: the router order is not a permutation"},
        {ord, u16(16), rec + "row 0: the router order is not a permutation"},
        {sco + 4 * uint64_t(t.score_order[r.first_score_row * 16 + 5]), f32(2.0f),
         "scores above the expert ranked before it"},
        {sco + 4 * uint64_t(o0), f32(NAN), "'s score is not finite"},
        // Slot 0 named as a substitute: it was the router's rank 0.
        {r.offset + 28 + 3, "\x05", "slot 0 (expert " + std::to_string(o0) +
                                        ", router rank 0) is marked substituted but was routed"},
        // Slot 2 holds another expert than the router's rank 2.
        {r.offset + 28 + 16, u16(t.score_order[r.first_score_row * 16 + 3]),
         "is not the router's rank 2"},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(c.expect);
        std::string bad = good;
        bad.replace(size_t(c.at), c.bytes.size(), c.bytes);
        ASSERT_TRUE(write_bytes(path, bad));
        CmdResult res;
        replay(path, "", &res);
        EXPECT_EQ(res.exit_code, 3) << res.err;
        EXPECT_NE(res.err.find(path + ": offset "), std::string::npos) << res.err;
        EXPECT_NE(res.err.find(c.expect), std::string::npos) << res.err;
        EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << res.err;
    }
    // Control: the good bytes pass the same command.
    ASSERT_TRUE(write_bytes(path, good));
    CmdResult res;
    replay(path, "", &res);
    EXPECT_EQ(res.exit_code, 0) << res.err;
}

TEST(SubstReplayRun, RecordedWithScoresAndSubstitutionValidatesExactly) {
    TempDir dir("subst-run");
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    StatsRun plain = run_with_stats(model, kRouterPrompt, 32, "--cache-mb 4 --force-cache");
    ASSERT_EQ(plain.rc, 0) << plain.err;
    for (const char * m : {"1", "0.05"}) {
        SCOPED_TRACE(m);
        const std::string path = dir.path(std::string("m") + m + ".trace");
        const std::string lossless = dir.path(std::string("l") + m + ".trace");
        StatsRun on = run_with_stats(model, kRouterPrompt, 32,
                                     std::string("--cache-mb 4 --force-cache --cache-debug "
                                                 "--substitute-experts ") +
                                         m + " --route-trace " + sh_quote(path) +
                                         " --route-trace-scores");
        ASSERT_EQ(on.rc, 0) << on.err;
        const json st = json::parse(on.stats);
        const uint64_t substituted = st["experts_substituted"].get<uint64_t>();
        EXPECT_GT(substituted, 0u);
        RouteTrace t;
        ASSERT_TRUE(read_route_trace(path, &t).ok());
        EXPECT_TRUE(t.header.scores);
        EXPECT_EQ(t.header.substitute, std::stod(m));
        uint64_t decode = 0, scored = 0;
        for (const TraceRouting & r : t.routings) {
            decode += r.decode;
            scored += r.score_rows > 0;
        }
        EXPECT_EQ(scored, decode);  // every decode row's scores were readable
        CmdResult v;
        const std::string out = replay(path, "--validate --json", &v);
        ASSERT_EQ(v.exit_code, 0) << v.err;
        EXPECT_NE(v.err.find(": OK"), std::string::npos) << v.err;
        EXPECT_EQ(json::parse(out)["validate"]["substitutions"].get<uint64_t>(), substituted);

        // Negative control: the same trace under another margin does not validate.
        set_margin(path, std::stod(m) / 1000);
        replay(path, "--validate", &v);
        EXPECT_EQ(v.exit_code, 1) << v.err;
        EXPECT_NE(v.err.find(": recorded substituted, replay miss of expert "), std::string::npos)
            << v.err;

        // Recording scores changes nothing in a lossless run.
        StatsRun l = run_with_stats(model, kRouterPrompt, 32,
                                    "--cache-mb 4 --force-cache --route-trace " +
                                        sh_quote(lossless) + " --route-trace-scores");
        ASSERT_EQ(l.rc, 0) << l.err;
        EXPECT_EQ(json::parse(l.stats)["logits_sha"], json::parse(plain.stats)["logits_sha"]);
    }
}

// A lossless trace replayed at M against a real run with M: the routings agree exactly up to
// and including the first one the run substituted in (the hidden states are the same until
// then), and there the replay makes the run's decisions, counts included. Later routings of
// the lossy run depend on what the substitutes computed, which no trace can know.
TEST(SubstReplayRun, LosslessTraceAtMPredictsTheRunUpToItsFirstSubstitution) {
    TempDir dir("subst-pred");
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string a = dir.path("lossless.trace"), b = dir.path("m.trace");
    const std::string base = "--cache-mb 4 --force-cache --route-trace-scores --route-trace ";
    StatsRun ra = run_with_stats(model, kRouterPrompt, 32, base + sh_quote(a));
    StatsRun rb = run_with_stats(model, kRouterPrompt, 32, base + sh_quote(b) + " --substitute-experts 1");
    ASSERT_EQ(ra.rc, 0) << ra.err;
    ASSERT_EQ(rb.rc, 0) << rb.err;
    RouteTrace ta, tb;
    ASSERT_TRUE(read_route_trace(a, &ta).ok());
    ASSERT_TRUE(read_route_trace(b, &tb).ok());
    size_t first = tb.routings.size();
    for (size_t i = 0; i < tb.routings.size() && first == tb.routings.size(); ++i) {
        const TraceRouting & r = tb.routings[i];
        for (uint64_t s = r.first_slot; s < r.first_slot + uint64_t(r.n_rows) * r.k; ++s)
            if (tb.flags[s] & kSlotSubstituted) first = i;
    }
    ASSERT_LT(first, tb.routings.size());
    ASSERT_GT(tb.routings[first].decode, 0);
    const size_t n = first + 1;
    ASSERT_GE(ta.routings.size(), n);
    // The same router order and scores up to there (the lossy run's trace keeps the order
    // before substitution).
    const RouteTrace pa = prefix(ta, n), pb = prefix(tb, n);
    EXPECT_EQ(pa.score_order, pb.score_order);
    EXPECT_EQ(pa.scores, pb.scores);
    ReplaySetting s;
    s.budget_bytes = ta.header.cache_budget_bytes;
    s.substitute = 1;
    ReplayResult ea, eb;
    ValidateReport vb;
    Replayer xa(pa), xb(pb);
    ASSERT_TRUE(xa.run(s, &ea).ok());
    ASSERT_TRUE(xb.run(xb.recorded_setting(), &eb, &vb).ok());
    EXPECT_TRUE(vb.ok) << vb.first_mismatch;
    EXPECT_GT(ea.substitutions, 0u);
    EXPECT_EQ(ea.substitutions, vb.recorded_substitutions);
    EXPECT_EQ(ea.hits, vb.recorded_hits);
    EXPECT_EQ(ea.misses, vb.recorded_misses);
    // Control: without the margin the lossless prefix substitutes nothing and misses more.
    ReplaySetting off = s;
    off.substitute = 0;
    ReplayResult e0;
    ASSERT_TRUE(xa.run(off, &e0).ok());
    EXPECT_EQ(e0.substitutions, 0u);
    EXPECT_GT(e0.misses, ea.misses);

    // The whole traces: the estimate and the run, side by side (they may differ after the
    // first substitution), through the CLI's JSON.
    CmdResult r;
    const json est = json::parse(replay(a, "--substitute-experts 0,1 --json", &r));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(est["results"].size(), 3u);  // the recorded setting, M = 0, M = 1
    const json & m0 = est["results"][1];
    const json & m1 = est["results"][2];
    EXPECT_EQ(m0["decode_misses"], est["results"][0]["decode_misses"]);
    EXPECT_EQ(m0["substitutions"], 0);
    EXPECT_TRUE(m1["lossy"].get<bool>());
    EXPECT_GT(m1["substitutions"].get<uint64_t>(), 0u);
    EXPECT_GT(m1["reads_avoided"].get<double>(), 0.0);
    EXPECT_GT(m1["weight_mass_discarded"].get<double>(), 0.0);
    Replayer xr(tb);
    ReplayResult run_b;
    ASSERT_TRUE(xr.run(xr.recorded_setting(), &run_b).ok());
    EXPECT_EQ(run_b.substitutions, json::parse(rb.stats)["experts_substituted"].get<uint64_t>());
    std::printf("replay of the lossless trace at M = 1: %llu substitutions, %llu decode misses; "
                "the run at M = 1: %llu substitutions, %llu decode misses\n",
                (unsigned long long)m1["substitutions"].get<uint64_t>(),
                (unsigned long long)m1["decode_misses"].get<uint64_t>(),
                (unsigned long long)run_b.substitutions,
                (unsigned long long)run_b.decode_misses);
    // A text table names the knob as LOSSY.
    replay(a, "--substitute-experts 1", &r);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("--substitute-experts 1 (LOSSY estimate)"), std::string::npos) << r.out;
}

TEST(SubstReplayCli, RefusedWithoutWhatItNeeds) {
    TempDir dir("subst-cli");
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    StatsRun r = run_with_stats(model, kRouterPrompt, 4, "--route-trace-scores");
    EXPECT_EQ(r.rc, 64) << r.err;
    EXPECT_NE(r.err.find("--route-trace-scores needs --route-trace"), std::string::npos) << r.err;
    const std::string path = dir.path("plain.trace");
    r = run_with_stats(model, kRouterPrompt, 4, "--cache-mb 4 --force-cache --route-trace " + sh_quote(path));
    ASSERT_EQ(r.rc, 0) << r.err;
    CmdResult c;
    replay(path, "--substitute-experts 0.1", &c);
    EXPECT_EQ(c.exit_code, 64) << c.err;
    EXPECT_NE(c.err.find("recorded without them"), std::string::npos) << c.err;
    EXPECT_NE(c.err.find("--route-trace-scores"), std::string::npos) << c.err;
    // With scores: belady and the fallback are refused by name; a lossless M = 0 runs.
    r = run_with_stats(model, kRouterPrompt, 4,
                       "--cache-mb 4 --force-cache --route-trace-scores --route-trace " + sh_quote(path));
    ASSERT_EQ(r.rc, 0) << r.err;
    replay(path, "--substitute-experts 0.1 --policy lru,belady", &c);
    EXPECT_EQ(c.exit_code, 64) << c.err;
    EXPECT_NE(c.err.find("--policy belady"), std::string::npos) << c.err;
    replay(path, "--substitute-experts 0", &c);
    EXPECT_EQ(c.exit_code, 0) << c.err;
    replay(path, "--substitute-experts 1.5", &c);
    EXPECT_EQ(c.exit_code, 64) << c.err;
}

// eval records the scored run's trace (its lossless reference run is not traced), and the
// trace validates with its substitutions.
TEST(SubstReplayCli, EvalRecordsScoresToo) {
    TempDir dir("subst-eval");
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string text = dir.path("text.txt"), trace = dir.path("eval.trace");
    std::string body;
    for (int i = 0; i < 6; ++i) body += "The quick brown fox jumps over the lazy dog. ";
    ASSERT_TRUE(write_bytes(text, body));
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " eval -m " + sh_quote(model) + " -f " +
                          sh_quote(text) + " -t 1 --cache-mb 4 --force-cache "
                          "--substitute-experts 0.05 --route-trace " + sh_quote(trace) +
                          " --route-trace-scores");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(trace, &t).ok());
    EXPECT_TRUE(t.header.scores);
    EXPECT_FALSE(t.scores.empty());
    CmdResult v;
    replay(trace, "--validate", &v);
    EXPECT_EQ(v.exit_code, 0) << v.err;
    EXPECT_NE(v.err.find(": OK"), std::string::npos) << v.err;
}
