// test_route_trace.cpp — route traces (docs/route-trace.md):
//  - the writer and reader agree field for field; the size is what the format says and
//    500 tokens of a Qwen3-30B-shaped model (48 MoE layers x 8 slots) stay under 3 MB;
//  - every prefix of a valid trace (truncation) and corrupted fields are rejected with an
//    error naming the byte offset, exit 3 from the CLI;
//  - a trace recorded by `run` matches the run's own figures (hits, misses, bytes read),
//    carries phases, positions and (after the first graph) the final router weights;
//  - tracing never changes the output, and a trace that cannot be written (missing
//    directory, file size limit hit mid-run) only warns: the run succeeds with identical output.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "route_tracer.h"
#include "test_util.h"

using nlohmann::json;
using namespace moestream;
using namespace moestream::test;

namespace {

void spit(const std::string & p, const std::string & data) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(data.data(), std::streamsize(data.size()));
}

std::string tmp_path(const std::string & name) {
    return models_dir() + "/rt-" + std::to_string(getpid()) + "-" + name;
}

TraceHeader shape_header(uint32_t n_moe, uint32_t n_expert, uint32_t k, uint64_t slice) {
    TraceHeader h;
    h.n_layer = n_moe;
    h.n_expert = n_expert;
    h.k_model = h.k = k;
    h.page_bytes = 4096;
    h.cache_budget_bytes = 64ull << 20;
    h.drop_cold = 0.5;
    h.drop_in_prefill = true;
    h.settings_json = R"({"note":"hand-made"})";
    for (uint32_t l = 0; l < n_moe; ++l) {
        TraceLayerShape s;
        s.layer = l;
        s.slice_bytes = {slice, slice, slice + 4096};
        s.phase_bytes = {0, 32, 4064};
        s.expert_bytes = 3 * slice + 4096;
        h.moe_layers.push_back(s);
    }
    return h;
}

// Writes a hand-made trace: `tokens` decode graphs over every layer, plus one 3-row prefill
// (marked as the prompt's end when prompt_end: version 7's phase 2).
void write_synthetic(const std::string & path, const TraceHeader & h, int tokens,
                     uint64_t max_bytes = kTraceMaxFileBytes, bool prompt_end = false) {
    auto t = RouteTracer::open(path, h, max_bytes);
    ASSERT_TRUE(t->active());
    std::vector<int32_t> ids(size_t(h.k) * 3);
    t->begin_graph(false, 0, 3, prompt_end);
    for (uint32_t l = 0; l < h.moe_layers.size(); ++l) {
        for (size_t s = 0; s < ids.size(); ++s) ids[s] = int32_t((s * 7 + l) % h.n_expert);
        t->routing_start(l, int(h.k), 3, ids.data());
        t->on_stage(l, {}, {}, 0);
    }
    for (int tok = 0; tok < tokens; ++tok) {
        t->begin_graph(true, uint32_t(3 + tok), 1);
        for (uint32_t l = 0; l < h.moe_layers.size(); ++l) {
            for (uint32_t j = 0; j < h.k; ++j)
                ids[j] = int32_t((tok * 5 + l * 3 + j * 11) % h.n_expert);
            t->routing_start(l, int(h.k), 1, ids.data());
            for (uint32_t j = 0; j < h.k; ++j) t->set_weight(0, int(j), 1.0f / float(j + 1));
            t->done_weights();
            if (h.k > 1) t->mark_dropped(0, int(h.k) - 1);
            std::vector<uint32_t> ex = {uint32_t(ids[0])};
            t->on_stage(l, ex, {uint8_t(tok % 2)}, 1000 + l);
        }
        t->end_graph();
    }
    t->finish();
}

TEST(RouteTraceFormat, RoundTripsEveryField) {
    TraceHeader h = shape_header(3, 16, 4, 10000);
    h.cache_chunks = true;
    h.slots_per_layer = 5;
    h.slot_warm = true;
    const std::string path = tmp_path("roundtrip.trace");
    write_synthetic(path, h, 5, kTraceMaxFileBytes, /*prompt_end=*/true);
    RouteTrace t;
    Status st = read_route_trace(path, &t);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(t.header.version, kRouteTraceVersion);
    EXPECT_EQ(t.header.n_expert, 16u);
    EXPECT_EQ(t.header.k, 4u);
    EXPECT_EQ(t.header.page_bytes, 4096u);
    EXPECT_EQ(t.header.cache_budget_bytes, 64ull << 20);
    EXPECT_EQ(t.header.drop_cold, 0.5);
    EXPECT_TRUE(t.header.drop_in_prefill);
    EXPECT_FALSE(t.header.drop_renorm);
    EXPECT_TRUE(t.header.cache_chunks);
    EXPECT_EQ(t.header.slots_per_layer, 5u);
    EXPECT_TRUE(t.header.slot_warm);
    EXPECT_EQ(t.header.settings_json, h.settings_json);
    ASSERT_EQ(t.header.moe_layers.size(), 3u);
    EXPECT_EQ(t.header.moe_layers[1].slice_bytes, (std::vector<uint64_t>{10000, 10000, 14096}));
    EXPECT_EQ(t.header.moe_layers[1].phase_bytes, (std::vector<uint64_t>{0, 32, 4064}));
    EXPECT_EQ(t.header.moe_layers[1].expert_bytes, 34096u);
    ASSERT_EQ(t.routings.size(), 3u + 5u * 3u);
    // Prefill records: 3 rows, weights unknown, no flags.
    EXPECT_EQ(t.routings[0].decode, 0);
    EXPECT_EQ(t.routings[0].prompt_end, 1);  // the prefill ends the prompt
    EXPECT_EQ(t.routings[0].n_rows, 3u);
    EXPECT_EQ(t.routings[0].pos, 0u);
    EXPECT_TRUE(std::isnan(t.weight[0]));
    // Decode token 2, layer 1.
    const TraceRouting & r = t.routings[3 + 2 * 3 + 1];
    EXPECT_EQ(r.decode, 1);
    EXPECT_EQ(r.prompt_end, 0);
    EXPECT_EQ(r.layer, 1u);
    EXPECT_EQ(r.pos, 5u);
    EXPECT_EQ(r.graph, 3u);
    EXPECT_EQ(r.n_rows, 1u);
    EXPECT_EQ(r.bytes_read, 1001u);
    for (uint32_t j = 0; j < 4; ++j) {
        EXPECT_EQ(t.expert[r.first_slot + j], int32_t((2 * 5 + 1 * 3 + j * 11) % 16));
        EXPECT_EQ(t.weight[r.first_slot + j], 1.0f / float(j + 1));
    }
    EXPECT_EQ(t.flags[r.first_slot + 3], kSlotDropped);
    EXPECT_EQ(t.flags[r.first_slot + 0], 0);  // tok 2: staged as not resident
    EXPECT_EQ(t.flags[t.routings[3 + 3 + 1].first_slot], kSlotResident);  // tok 1: resident
    // Size: exactly the format's arithmetic.
    uint64_t header =
        8 + 4 * 6 + 8 + 8 + 8 + 4 + 8 + 4 + 4 + 3 * (8 + 3 * 8 + 3 * 8) + 4 +
        h.settings_json.size();
    uint64_t body = t.routings.size() * 28 + t.expert.size() * 8 + 20;
    EXPECT_EQ(t.file_bytes, header + body);
    std::remove(path.c_str());
}

TEST(RouteTraceFormat, FiveHundredTokensOfA30BShapeTakeUnderThreeMB) {
    TraceHeader h = shape_header(48, 128, 8, 884736);
    const std::string path = tmp_path("30b.trace");
    write_synthetic(path, h, 500);
    const uint64_t size = std::filesystem::file_size(path);
    EXPECT_LT(size, 3u * 1000 * 1000) << size;
    RouteTrace t;
    ASSERT_TRUE(read_route_trace(path, &t).ok());
    EXPECT_EQ(t.routings.size(), 48u * 501u);
    std::remove(path.c_str());
}

// A trace never outgrows what the reader accepts: the graph that would cross the limit is cut
// off and the file ends after the whole graphs before it, whether the cut graph is still in the
// write buffer (500 kB) or partly on disk already (2 MB, past the 1 MiB buffer). The control is
// the same trace under the default limit: every graph.
TEST(RouteTraceFormat, ATraceEndsAtTheLastWholeGraphUnderItsSizeLimit) {
    TraceHeader h = shape_header(48, 128, 8, 884736);
    const std::string path = tmp_path("limit.trace");
    write_synthetic(path, h, 500);
    RouteTrace full;
    ASSERT_TRUE(read_route_trace(path, &full).ok());
    ASSERT_EQ(full.routings.size(), 48u * 501u);
    for (const uint64_t limit : {500000ull, 2000000ull}) {
        SCOPED_TRACE(limit);
        write_synthetic(path, h, 500, limit);
        EXPECT_LE(std::filesystem::file_size(path), limit);
        RouteTrace t;
        const Status st = read_route_trace(path, &t);
        ASSERT_TRUE(st.ok()) << st.message();
        EXPECT_GT(t.routings.size(), 48u * 100u);
        EXPECT_LT(t.routings.size(), full.routings.size());
        EXPECT_EQ(t.routings.size() % 48u, 0u) << "a graph was cut in the middle";
        for (size_t i = 0; i < t.routings.size(); ++i)
            ASSERT_EQ(t.routings[i].graph, full.routings[i].graph) << i;
    }
    std::remove(path.c_str());
}

TEST(RouteTraceFormat, EveryTruncationIsRejectedWithItsOffset) {
    const std::string path = tmp_path("trunc.trace");
    write_synthetic(path, shape_header(2, 8, 2, 4096), 3);
    const std::string data = slurp(path);
    for (size_t n = 0; n < data.size(); ++n) {
        RouteTrace t;
        Status st =
            parse_route_trace(reinterpret_cast<const uint8_t *>(data.data()), n, "x.trace", &t);
        ASSERT_FALSE(st.ok()) << "prefix of " << n << " bytes accepted";
        EXPECT_EQ(st.code(), ErrorCode::kBadInput);
        EXPECT_NE(st.message().find("x.trace: offset "), std::string::npos) << st.message();
    }
    // And a byte too many.
    RouteTrace t;
    std::string longer = data + "x";
    Status st = parse_route_trace(reinterpret_cast<const uint8_t *>(longer.data()), longer.size(),
                                  "x.trace", &t);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("trailing"), std::string::npos) << st.message();
    std::remove(path.c_str());
}

// Traces of earlier versions still read: version 2 is version 3 without settings flag 4.
TEST(RouteTraceFormat, ReadsVersion2) {
    const std::string path = tmp_path("v2.trace");
    TraceHeader h = shape_header(2, 8, 2, 4096);
    write_synthetic(path, h, 3);
    std::string bytes = slurp(path);
    bytes.replace(8, 4, std::string("\x02\0\0\0", 4));  // version u32 after the magic
    bytes.erase(60, 16);  // the substitute margin (version 6) and the slot fields (version 7)
    RouteTrace t;
    Status st = parse_route_trace(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(),
                                  "v2", &t);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(t.header.version, 2u);
    EXPECT_FALSE(t.header.cache_chunks);
    bytes[56] = char(bytes[56] | 4);  // flag 4 did not exist in version 2
    st = parse_route_trace(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "v2", &t);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("offset 56: unknown settings flags"), std::string::npos)
        << st.message();
}

// A read-ahead record (version 8) after the first routing record parses; a bad one is refused
// naming its offset; in a version 7 file the tag is unknown.
TEST(RouteTraceFormat, ReadAheadRecordsAreCheckedAndOnlyFromVersion8) {
    const std::string path = tmp_path("ra.trace");
    write_synthetic(path, shape_header(2, 8, 2, 4096), 3);
    const std::string good = slurp(path);
    std::remove(path.c_str());
    RouteTrace t;
    ASSERT_TRUE(
        parse_route_trace(reinterpret_cast<const uint8_t *>(good.data()), good.size(), "r", &t)
            .ok());
    const uint64_t at = t.routings[1].offset;
    const uint32_t layer = t.routings[1].layer;
    auto record = [&](uint8_t flags, uint32_t routing, uint32_t expert_word) {
        std::string a("A");
        a += char(flags);
        a.append(2, '\0');
        for (uint32_t v : {routing, layer, 1u, expert_word})
            a.append(reinterpret_cast<const char *>(&v), 4);
        std::string b = good;
        b.insert(size_t(at), a);
        return b;
    };
    auto parse = [&](const std::string & b, RouteTrace * out) {
        return parse_route_trace(reinterpret_cast<const uint8_t *>(b.data()), b.size(), "r", out);
    };
    Status st = parse(record(kReadAheadOk, 0, 3 | kReadAheadCommitted), &t);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(t.read_aheads.size(), 1u);
    EXPECT_EQ(t.read_aheads[0].committed, 1u);
    EXPECT_EQ(t.read_ahead_experts[0], 3u | kReadAheadCommitted);
    const std::string off = "offset " + std::to_string(at);
    st = parse(record(0x10, 0, 3), &t);
    EXPECT_NE(st.message().find("offset " + std::to_string(at + 1) + ": unknown read-ahead flags 16"),
              std::string::npos) << st.message();
    st = parse(record(kReadAheadOk, 1, 3), &t);
    EXPECT_NE(st.message().find("offset " + std::to_string(at + 4) + ": read-ahead names routing #1"),
              std::string::npos) << st.message();
    st = parse(record(kReadAheadOk, 0, 8), &t);
    EXPECT_NE(st.message().find("offset " + std::to_string(at + 16) + ": expert id 8"),
              std::string::npos) << st.message();
    std::string v7 = record(kReadAheadOk, 0, 3);
    v7[8] = 7;
    st = parse(v7, &t);
    EXPECT_NE(st.message().find(off + ": unknown record tag 65"), std::string::npos) << st.message();
}

TEST(RouteTraceFormat, CorruptFieldsNameTheirOffset) {
    const std::string path = tmp_path("corrupt.trace");
    const TraceHeader h = shape_header(2, 8, 2, 4096);
    write_synthetic(path, h, 3);
    const std::string good = slurp(path);
    RouteTrace t;
    ASSERT_TRUE(
        parse_route_trace(reinterpret_cast<const uint8_t *>(good.data()), good.size(), "c", &t)
            .ok());
    const uint64_t rec = t.routings[4].offset;  // a decode record
    const uint64_t slot = rec + 28;
    struct Case {
        uint64_t at;
        std::string bytes, expect;
    };
    const Case cases[] = {
        {0, "X", "offset 0: not a moestream route trace"},
        {8, std::string("\x0a\0\0\0", 4), "offset 8: unsupported trace version 10"},
        {56, "\x10", "offset 56: unknown settings flags 16"},
        {68, std::string("\x09\0\0\0", 4), "offset 68: slots per layer 9 above the experts per layer 8"},
        {72, "\x02", "offset 72: unknown slot flags 2"},
        {rec, "Q", "offset " + std::to_string(rec) + ": unknown record tag"},
        {rec + 1, "\x07", "offset " + std::to_string(rec + 1) + ": phase 7"},
        {rec + 4, std::string("\x63\0\0\0", 4), "offset " + std::to_string(rec + 4) + ": layer 99"},
        {slot, std::string("\x20\0\0\0", 4), "offset " + std::to_string(slot) + ": expert id 32"},
        {slot + 3, "\x03", "offset " + std::to_string(slot) + ": invalid slot flags 3"},
        {good.size() - 16, "\x05", "end marker counts 5"},
    };
    const std::string bin = sh_quote(cli_bin());
    for (const Case & c : cases) {
        std::string bad = good;
        bad.replace(size_t(c.at), c.bytes.size(), c.bytes);
        spit(path, bad);
        CmdResult r = run_cmd(bin + " replay " + sh_quote(path));
        EXPECT_EQ(r.exit_code, 3) << c.expect << "\n" << r.err;
        EXPECT_NE(r.err.find(c.expect), std::string::npos)
            << "want '" << c.expect << "' in: " << r.err;
    }
    // Truncated mid-record through the CLI.
    spit(path, good.substr(0, size_t(slot + 5)));
    CmdResult r = run_cmd(bin + " replay " + sh_quote(path) + " --validate");
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("offset " + std::to_string(slot) + ": truncated"), std::string::npos)
        << r.err;
    r = run_cmd(bin + " replay " + sh_quote(path + ".missing"));
    EXPECT_EQ(r.exit_code, 3) << r.err;
    std::remove(path.c_str());
}

// The shape a header may claim is bounded by what a real model can have (512 layers, 4096
// experts, 2^20 layer x expert pairs), so replay never sizes its arrays from a hostile header.
// Control: a header at exactly the product bound parses.
TEST(RouteTraceFormat, ShapeIsBoundedByWhatARealModelCanHave) {
    const std::string path = tmp_path("shape.trace");
    RouteTrace t;
    write_synthetic(path, shape_header(256, 4096, 2, 4096), 0);  // 256 x 4096 = 2^20
    Status st = read_route_trace(path, &t);
    ASSERT_TRUE(st.ok()) << st.message();
    write_synthetic(path, shape_header(257, 4096, 2, 4096), 0);
    st = read_route_trace(path, &t);
    EXPECT_NE(st.message().find("offset 12: implausible model shape (n_layer 257, n_expert 4096"),
              std::string::npos)
        << st.message();
    write_synthetic(path, shape_header(2, 8, 2, 4096), 1);
    const std::string good = slurp(path);
    struct Case {
        uint64_t at;
        uint32_t value;
        const char * expect;
    } cases[] = {
        {12, 513, "n_layer 513"},          // above llama.cpp's 512 layers
        {12, 0xFFFFFFFFu, "n_layer 4294967295"},
        {16, 4097, "n_expert 4097,"},        // above 4096 experts
        {16, 1u << 24, "n_expert 16777216,"},  // with n_layer 2^8 this reached 2^32 ids
    };
    const std::string bin = sh_quote(cli_bin());
    for (const Case & c : cases) {
        std::string bad = good;
        std::memcpy(bad.data() + c.at, &c.value, 4);
        spit(path, bad);
        st = read_route_trace(path, &t);
        EXPECT_NE(st.message().find(c.expect),
                  std::string::npos)
            << st.message();
        CmdResult r = run_cmd(bin + " replay " + sh_quote(path));
        EXPECT_EQ(r.exit_code, 3) << r.err;
        EXPECT_NE(r.err.find("implausible model shape"), std::string::npos) << r.err;
    }
    std::remove(path.c_str());
}

// Bytes this process has read through read()/pread() so far (/proc/self/io rchar).
uint64_t bytes_read_so_far() {
    std::ifstream io("/proc/self/io");
    std::string key;
    uint64_t v = 0;
    while (io >> key >> v)
        if (key == "rchar:") return v;
    return 0;
}

// Files that are not traces: refused without reading them whole or waiting on them.
TEST(RouteTraceFormat, ReaderRefusesSpecialFilesHugeFilesAndOtherFormatsFast) {
    RouteTrace t;
    const std::string fifo = tmp_path("trace.fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    const std::string dir = tmp_path("trace.dir");
    std::filesystem::create_directory(dir);
    struct Case {
        std::string path, expect;
    } cases[] = {
        {"/dev/zero", "not a regular file (a character device)"},
        {"/dev/null", "not a regular file (a character device)"},
        {fifo, "not a regular file (a FIFO)"},  // opened without blocking for a writer
        {dir, "not a regular file (a directory)"},
    };
    const std::string bin = sh_quote(cli_bin());
    for (const Case & c : cases) {
        Status st = read_route_trace(c.path, &t);
        EXPECT_EQ(st.code(), ErrorCode::kBadInput);
        EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
        CmdResult r = run_cmd("timeout 60 " + bin + " replay " + sh_quote(c.path));
        EXPECT_EQ(r.exit_code, 3) << c.path << ": " << r.err;
        EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    }
    // A 104 MB model file: "bad magic" after reading 8 bytes, not the whole file.
    const std::string model = synth_model("tiny", "qwen3moe", "f32");
    ASSERT_GT(std::filesystem::file_size(model), 100000000u);
    const uint64_t before = bytes_read_so_far();
    Status st = read_route_trace(model, &t);
    const uint64_t read = bytes_read_so_far() - before;
    EXPECT_NE(st.message().find("offset 0: not a moestream route trace (bad magic)"),
              std::string::npos)
        << st.message();
    EXPECT_LT(read, 4096u) << "read " << read << " bytes of a file that is not a trace";
    // A (sparse) 2 GiB file that starts like a trace: refused by its size before reading it.
    const std::string huge = tmp_path("huge.trace");
    {
        std::ofstream f(huge, std::ios::binary);
        f.write(kRouteTraceMagic, sizeof kRouteTraceMagic);
    }
    ASSERT_EQ(truncate(huge.c_str(), off_t(2) << 30), 0);
    const uint64_t before_huge = bytes_read_so_far();
    st = read_route_trace(huge, &t);
    EXPECT_NE(st.message().find("more than the 1024 MiB a route trace may have"), std::string::npos)
        << st.message();
    EXPECT_LT(bytes_read_so_far() - before_huge, 4096u);
    std::remove(huge.c_str());
    std::remove(fifo.c_str());
    std::filesystem::remove(dir);
}

// --- Recorded by the engine -------------------------------------------------------------

struct RunOut {
    int rc = -1;
    std::string out, err;
    json stats;
    uint64_t stats_bytes = 0;  // the size of the --stats-json file it wrote
};

RunOut run(const std::string & model, const std::string & flags, const std::string & prefix = "") {
    static int counter = 0;
    const std::string js = tmp_path("stats-" + std::to_string(counter++) + ".json");
    CmdResult r = run_cmd(prefix + sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p " +
                          sh_quote(kRouterPrompt) + " -n 32 -t 1 " + flags + " --stats-json " + js);
    RunOut o;
    o.rc = r.exit_code;
    o.out = r.out;
    o.err = r.err;
    if (r.exit_code == 0) {
        const std::string text = slurp(js);
        o.stats = json::parse(text);
        o.stats_bytes = text.size();
    }
    std::remove(js.c_str());
    return o;
}

TEST(RouteTraceRun, RecordsWhatTheRunDid) {
    for (const char * arch : {"qwen3moe", "glm4moe"}) {
        SCOPED_TRACE(arch);
        const std::string model = synth_model("tiny", arch, "q8_0");
        const std::string path = tmp_path(std::string(arch) + ".trace");
        RunOut r =
            run(model, "--cache-mb 4 --force-cache --no-odirect --route-trace " + sh_quote(path));
        ASSERT_EQ(r.rc, 0) << r.err;
        RouteTrace t;
        Status st = read_route_trace(path, &t);
        ASSERT_TRUE(st.ok()) << st.message();
        const int n_prompt = r.stats["n_prompt"].get<int>();
        const int n_gen = r.stats["n_generated"].get<int>();
        const size_t n_moe = t.header.moe_layers.size();
        EXPECT_EQ(t.header.cache_budget_bytes, r.stats["cache_budget_bytes"].get<uint64_t>());
        EXPECT_EQ(t.header.k, r.stats["settings"]["n_expert_used"].get<uint32_t>());
        EXPECT_EQ(json::parse(t.header.settings_json)["arch"], arch);
        // One prefill graph (the prompt fits one batch), then n_generated - 1 decodes.
        ASSERT_EQ(t.routings.size(), n_moe * size_t(n_gen));
        uint64_t hits = 0, misses = 0, bytes = 0, decode_rows_with_weights = 0;
        std::vector<uint8_t> seen(t.header.n_expert, 0);
        for (size_t i = 0; i < t.routings.size(); ++i) {
            const TraceRouting & rt = t.routings[i];
            const size_t g = i / n_moe;
            EXPECT_EQ(rt.graph, g);
            EXPECT_EQ(rt.layer, t.header.moe_layers[i % n_moe].layer);
            EXPECT_EQ(rt.decode, g > 0 ? 1 : 0);
            if (g == 0) {
                const bool last = i % n_moe == n_moe - 1;  // the last layer routes the outputs only
                EXPECT_EQ(rt.n_rows, last ? 1u : uint32_t(n_prompt));
                EXPECT_EQ(rt.pos, last ? uint32_t(n_prompt - 1) : 0u);
            } else {
                EXPECT_EQ(rt.n_rows, 1u);
                EXPECT_EQ(rt.pos, uint32_t(n_prompt) + uint32_t(g) - 1);
                bool finite = true;
                double sum = 0;
                for (uint32_t j = 0; j < rt.k; ++j) {
                    finite = finite && std::isfinite(t.weight[rt.first_slot + j]);
                    sum += t.weight[rt.first_slot + j];
                }
                if (finite && sum > 0) ++decode_rows_with_weights;
            }
            bytes += rt.bytes_read;
            const uint64_t n = uint64_t(rt.n_rows) * rt.k;
            for (uint64_t s = rt.first_slot; s < rt.first_slot + n; ++s) {
                const uint32_t e = uint32_t(t.expert[s]);
                if (seen[e]) continue;
                seen[e] = 1;
                ++(t.flags[s] & kSlotResident ? hits : misses);
            }
            for (uint64_t s = rt.first_slot; s < rt.first_slot + n; ++s)
                seen[uint32_t(t.expert[s])] = 0;
        }
        EXPECT_EQ(hits, r.stats["cache_hits"].get<uint64_t>());
        EXPECT_EQ(misses, r.stats["cache_misses"].get<uint64_t>());
        EXPECT_EQ(bytes, r.stats["flash_bytes_read"].get<uint64_t>());
        // Weights are observed from the second graph on (the terminal node is learned in the
        // first).
        EXPECT_EQ(decode_rows_with_weights, n_moe * size_t(n_gen - 1));
        std::remove(path.c_str());
    }
}

TEST(RouteTraceRun, TracingNeverChangesTheOutputAndFailuresOnlyWarn) {
    const std::string model = synth_model("tiny", "qwen3moe", "q4_k");
    const std::string path = tmp_path("ok.trace");
    RunOut off = run(model, "--cache-mb 4 --force-cache");
    ASSERT_EQ(off.rc, 0) << off.err;
    RunOut on = run(model, "--cache-mb 4 --force-cache --route-trace " + sh_quote(path));
    ASSERT_EQ(on.rc, 0) << on.err;
    EXPECT_TRUE(std::filesystem::exists(path));
    EXPECT_EQ(on.out, off.out);
    EXPECT_EQ(on.stats["logits_sha"], off.stats["logits_sha"]);
    EXPECT_EQ(on.stats["tokens"], off.stats["tokens"]);

    // Unwritable from the start (the directory does not exist): refused before loading, like
    // every output path (exit 3, nothing generated).
    RunOut bad = run(model, "--cache-mb 4 --force-cache --route-trace /nonexistent-dir/x.trace");
    EXPECT_EQ(bad.rc, 3) << bad.err;
    EXPECT_NE(bad.err.find("--route-trace /nonexistent-dir/x.trace: the directory /nonexistent-dir does not exist"),
              std::string::npos) << bad.err;
    EXPECT_EQ(bad.out, "");

    // Disk full: a file size limit (SIGXFSZ ignored, so write() fails with EFBIG). It applies to
    // every file the run writes: the stats JSON must fit (the limit is what the traced run
    // wrote plus 2 KiB for figures that differ: digits, the trace's error) and the trace must
    // outgrow it (checked, else nothing is proven).
    const uint64_t blocks = (on.stats_bytes + 2048 + 511) / 512;  // sh counts 512-byte blocks
    ASSERT_GT(std::filesystem::file_size(path), blocks * 512) << "the trace fits the limit";
    const std::string full = tmp_path("full.trace");
    RunOut lim = run(model, "--cache-mb 4 --force-cache --route-trace " + sh_quote(full),
                     "trap '' XFSZ; ulimit -f " + std::to_string(blocks) + "; ");
    ASSERT_EQ(lim.rc, 0) << lim.err;
    EXPECT_NE(lim.err.find("route trace: cannot write"), std::string::npos) << lim.err;
    EXPECT_EQ(lim.out, off.out);
    EXPECT_EQ(lim.stats["logits_sha"], off.stats["logits_sha"]);
    EXPECT_FALSE(std::filesystem::exists(full));
    for (const auto & e : std::filesystem::directory_iterator(models_dir()))
        EXPECT_EQ(e.path().string().find(full + ".tmp."), std::string::npos)
            << "temp file left: " << e.path();

    // With drop-cold deferral too (weights read where the policy reads them).
    for (const char * arch : {"olmoe", "glm4moe"}) {
        const std::string m = synth_model("tiny", arch, "q8_0");
        const std::string flags = "--cache-mb 2 --force-cache --drop-cold-experts 0.8";
        RunOut d_off = run(m, flags);
        RunOut d_on = run(m, flags + " --route-trace " + sh_quote(path));
        ASSERT_EQ(d_on.rc, 0) << d_on.err;
        EXPECT_EQ(d_on.out, d_off.out) << arch;
        EXPECT_EQ(d_on.stats["logits_sha"], d_off.stats["logits_sha"]) << arch;
        EXPECT_EQ(d_on.stats["experts_dropped"], d_off.stats["experts_dropped"]) << arch;
    }

    // --no-stream has no router to observe.
    RunOut ns = run(model, "--no-stream --route-trace " + sh_quote(path));
    EXPECT_EQ(ns.rc, 64);
    std::remove(path.c_str());
}

}  // namespace
