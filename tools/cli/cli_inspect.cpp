// `moestream inspect -m MODEL [--json]` — describes a MoE GGUF model from moestream's own
// validated index (include/moestream/gguf_index.h): shapes, expert vs dense bytes, one token's routed
// working set, how the expert slices sit in the file for O_DIRECT, and the cache sizes
// worth using. See docs/inspect.md for every field.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "moestream/cache_budget.h"
#include "cli.h"
#include "moestream/settings.h"
#include "ggml.h"
#include "gguf.h"
#include "moestream/gguf_index.h"
#include "moestream/sysinfo.h"

namespace moestream::cli {

namespace {

constexpr uint64_t kPage = 4096;  // O_DIRECT granularity assumed for flash reads

std::string human_bytes(uint64_t b) {
    char buf[64];
    if (b >= (1ull << 30))
        std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / (1ull << 30));
    else if (b >= kMiB)
        std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / kMiB);
    else if (b >= 1024)
        std::snprintf(buf, sizeof buf, "%.2f KiB", double(b) / 1024);
    else
        std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
    return buf;
}

std::string type_name(int32_t t) {
    const char * n = ggml_type_name(static_cast<ggml_type>(t));
    return n ? n : "type" + std::to_string(t);
}

double pct(uint64_t part, uint64_t whole) {
    return whole ? 100.0 * double(part) / whole : 0.0;
}

// Everything inspect reports, computed once from the index.
struct Report {
    struct Proj {
        std::string name, type;
        uint64_t slice_bytes = 0;
        uint32_t n_layers = 0;
    };
    std::vector<Proj> projections;  // distinct (projection, type, slice size)
    uint64_t expert_bytes_max = 0;  // one expert, all projections, largest layer
    uint64_t expert_bytes_min = 0;
    uint64_t expert_bytes_per_layer = 0;  // all experts of the largest MoE layer
    uint64_t slice_offset_alignment = 0;  // largest power of two dividing every slice offset
    uint64_t n_slices = 0;
    uint64_t slices_4096_aligned = 0;  // slices whose offset is a multiple of 4096
    uint64_t odirect_read_bytes = 0;   // sum of page-rounded reads of every slice
    double odirect_overread_pct = 0;
    uint64_t cache_min_bytes = 0;  // 1.5 x working set
    uint64_t cache_min_mib = 0;
    uint64_t cache_all_mib = 0;  // every expert resident
    uint64_t auto_mib = 0;       // what --cache-mb auto would choose now (0 = off)
    std::string auto_text;
    std::string layouts;  // the MoE layers' expert layouts, e.g. "gate+up+down" or "up+down"
};

Report make_report(const ModelIndex & m) {
    Report r;
    std::vector<std::string> layouts;
    for (const MoeLayer & l : m.moe_layers) {
        std::string lay;
        for (const ExpertTensor & e : l.tensors)
            lay += (lay.empty() ? "" : "+") + std::string(projection_name(e.proj));
        if (std::find(layouts.begin(), layouts.end(), lay) == layouts.end()) layouts.push_back(lay);
    }
    for (const std::string & lay : layouts) r.layouts += (r.layouts.empty() ? "" : ", ") + lay;
    std::map<std::tuple<int, int32_t, uint64_t>, size_t> seen;
    uint64_t or_offsets = 0;
    r.expert_bytes_min = UINT64_MAX;
    for (const MoeLayer & l : m.moe_layers) {
        r.expert_bytes_max = std::max(r.expert_bytes_max, l.expert_bytes);
        r.expert_bytes_min = std::min(r.expert_bytes_min, l.expert_bytes);
        uint64_t layer_bytes = 0;
        for (const ExpertTensor & e : l.tensors) {
            layer_bytes += e.tensor_bytes;
            auto key = std::make_tuple(int(e.proj), e.type, e.slice_bytes);
            auto it = seen.find(key);
            if (it == seen.end()) {
                seen.emplace(key, r.projections.size());
                r.projections.push_back(
                    {projection_name(e.proj), type_name(e.type), e.slice_bytes, 1});
            } else {
                r.projections[it->second].n_layers++;
            }
            for (uint32_t x = 0; x < uint32_t(e.ne[2]); ++x) {
                const uint64_t off = e.slice_offset(x);
                const uint64_t end = off + e.slice_bytes;
                const uint64_t lo = off & ~(kPage - 1);
                const uint64_t hi = (end + kPage - 1) & ~(kPage - 1);
                or_offsets |= off;
                r.n_slices++;
                if (off % kPage == 0) r.slices_4096_aligned++;
                r.odirect_read_bytes += hi - lo;
            }
        }
        r.expert_bytes_per_layer = std::max(r.expert_bytes_per_layer, layer_bytes);
    }
    if (m.moe_layers.empty()) r.expert_bytes_min = 0;
    // Lowest set bit of the OR of all offsets = largest power of two dividing them all.
    r.slice_offset_alignment = or_offsets ? (or_offsets & (~or_offsets + 1)) : 0;
    if (m.expert_bytes_total) {
        r.odirect_overread_pct =
            100.0 * double(r.odirect_read_bytes - m.expert_bytes_total) / m.expert_bytes_total;
    }
    r.cache_min_bytes = m.token_working_set_bytes + (m.token_working_set_bytes + 1) / 2;
    r.cache_min_mib = (r.cache_min_bytes + kMiB - 1) / kMiB;
    // What the cache needs to hold every expert (pool chunks, system pages): a budget of this
    // many MiB holds them all (the bench's `all-experts` cell uses it).
    r.cache_all_mib = (cache_bytes_for_all_experts(m, system_page_bytes()) + kMiB - 1) / kMiB;
    r.cache_min_mib = cache_rule_min_mib(m);
    // What auto would choose on this machine now, as run counts it before the KV cache exists
    // (run's choice is lower by the KV cache of its context).
    BudgetDecision d;
    const Status st = decide_cache_budget(m, -1, false, auto_needs_bytes(m, 512),
                                          memory_availability(), system_page_bytes(), &d);
    r.auto_mib = st.ok() ? d.budget_bytes / kMiB : 0;
    r.auto_text = !st.ok() ? st.message()
                  : d.budget_bytes
                      ? std::to_string(r.auto_mib) + " MiB now (" + d.reason +
                            "; run's choice is lower by the KV cache of its context)"
                      : "cache off now (" + d.reason + ")";
    return r;
}

// What the file's metadata says beyond the index: the training context and the chat template.
struct Meta {
    int64_t context_length = -1;       // ARCH.context_length; -1: absent
    int64_t chat_template_bytes = -1;  // tokenizer.chat_template; -1: absent
};

Meta read_meta(const ModelIndex & m) {
    Meta out;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gp.ctx = nullptr;
    gguf_context * g = gguf_init_from_file(m.path.c_str(), gp);
    if (!g) return out;
    const int64_t k = gguf_find_key(g, (m.arch + ".context_length").c_str());
    if (k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_UINT32) out.context_length = gguf_get_val_u32(g, k);
    else if (k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_UINT64) out.context_length = int64_t(gguf_get_val_u64(g, k));
    const int64_t t = gguf_find_key(g, "tokenizer.chat_template");
    if (t >= 0 && gguf_get_kv_type(g, t) == GGUF_TYPE_STRING)
        out.chat_template_bytes = int64_t(std::string(gguf_get_val_str(g, t)).size());
    gguf_free(g);
    return out;
}

nlohmann::ordered_json to_json(const ModelIndex & m, const Report & r) {
    nlohmann::ordered_json j;
    j["path"] = m.path;
    j["file_size"] = m.file_size;
    j["set_bytes"] = m.set_bytes;  // all files of the model (a split set: every shard)
    auto shards = nlohmann::ordered_json::array();
    for (const ShardFile & f : m.shards)
        shards.push_back({{"path", f.path},
                          {"file_bytes", f.file_size},
                          {"tensors", f.n_tensors},
                          {"tensor_bytes", f.tensor_bytes}});
    j["shards"] = shards;
    j["nextn_layers_unused"] = m.n_nextn_layers;
    j["unused_bytes_total"] = m.unused_bytes_total;
    j["gguf_version"] = m.version;
    j["arch"] = m.arch;
    j["name"] = m.name;
    j["n_layer"] = m.n_layer;
    j["n_moe_layer"] = m.moe_layers.size();
    j["streams"] = true;  // a file the index refuses exits 2 with the reason instead
    j["expert_layouts"] = r.layouts;
    j["n_expert"] = m.n_expert;
    j["n_expert_used"] = m.n_expert_used;
    j["n_embd"] = m.n_embd;
    j["n_ff_exp"] = m.n_ff_exp;
    j["n_vocab"] = m.n_vocab;
    const Meta meta = read_meta(m);
    j["context_length"] = meta.context_length < 0 ? nlohmann::ordered_json(nullptr)
                                                  : nlohmann::ordered_json(meta.context_length);
    j["chat_template_bytes"] = meta.chat_template_bytes < 0 ? nlohmann::ordered_json(nullptr)
                                                            : nlohmann::ordered_json(meta.chat_template_bytes);
    j["n_tensors"] = m.tensors.size();
    j["expert_bytes_total"] = m.expert_bytes_total;
    j["dense_bytes_total"] = m.dense_bytes_total;
    j["expert_pct_of_file"] = pct(m.expert_bytes_total, m.set_bytes);
    j["dense_pct_of_file"] = pct(m.dense_bytes_total, m.set_bytes);
    j["expert_bytes"] = r.expert_bytes_max;
    j["expert_bytes_min"] = r.expert_bytes_min;
    j["expert_bytes_per_layer"] = r.expert_bytes_per_layer;
    j["token_working_set_bytes"] = m.token_working_set_bytes;
    auto projs = nlohmann::ordered_json::array();
    for (const auto & p : r.projections) {
        projs.push_back({{"name", p.name},
                         {"type", p.type},
                         {"slice_bytes", p.slice_bytes},
                         {"n_layers", p.n_layers}});
    }
    j["projections"] = projs;
    auto layers = nlohmann::ordered_json::array();
    for (const MoeLayer & l : m.moe_layers) {
        auto ts = nlohmann::ordered_json::array();
        for (const ExpertTensor & e : l.tensors) {
            ts.push_back({{"name", e.name},
                          {"proj", projection_name(e.proj)},
                          {"type", type_name(e.type)},
                          {"file_offset", e.file_offset},
                          {"slice_bytes", e.slice_bytes},
                          {"tensor_bytes", e.tensor_bytes}});
        }
        layers.push_back({{"layer", l.layer}, {"expert_bytes", l.expert_bytes}, {"tensors", ts}});
    }
    j["moe_layers"] = layers;
    j["alignment"] = m.alignment;
    j["data_offset"] = m.data_offset;
    j["slice_offset_alignment"] = r.slice_offset_alignment;
    j["slices_4096_aligned"] = r.slices_4096_aligned == r.n_slices;
    j["n_slices"] = r.n_slices;
    j["odirect_read_bytes"] = r.odirect_read_bytes;
    j["odirect_overread_pct"] = r.odirect_overread_pct;
    j["cache_min_bytes"] = r.cache_min_bytes;
    j["cache_min_mib"] = r.cache_min_mib;
    j["cache_all_experts_mib"] = r.cache_all_mib;
    j["cache_rule"] = cache_rule_text(m);
    j["cache_auto_mib_now"] = r.auto_mib;
#if MOESTREAM_SERVE_AND_CHAT
    j["chat_template"] = inspect_chat_template(m.shards.empty() ? m.path : m.shards[0].path);
#endif
    return j;
}

void print_human(const ModelIndex & m, const Report & r) {
    auto line = [](const char * label, const std::string & text) {
        std::printf("%-13s %s\n", label, text.c_str());
    };
    line("model",
         m.path + " (" + human_bytes(m.file_size) + ", GGUF v" + std::to_string(m.version) + ")");
    if (m.shards.size() > 1) {
        line("split set", std::to_string(m.shards.size()) + " shards, " + human_bytes(m.set_bytes) +
                              " in all (llama.cpp's gguf-split layout; every shard is read)");
        for (size_t i = 0; i < m.shards.size(); ++i)
            std::printf("  %zu  %s  %s, %u tensors\n", i + 1, m.shards[i].path.c_str(),
                        human_bytes(m.shards[i].file_size).c_str(), m.shards[i].n_tensors);
    }
    line("architecture", m.arch + (m.name.empty() ? "" : "  \"" + m.name + "\""));
#if MOESTREAM_SERVE_AND_CHAT
    {  // the chat template as serve and chat take it
        const auto t = inspect_chat_template(m.shards.empty() ? m.path : m.shards[0].path);
        const std::string what = t["present"].get<bool>()
                                     ? std::to_string(t["bytes"].get<size_t>()) + " bytes, "
                                     : std::string("none in the file: ");
        line("chat template",
             t["renders"].get<bool>()
                 ? what + t["name"].get<std::string>() + ": renders"
                 : what + "does not render: " + t["error"].get<std::string>());
    }
#endif
    line("layers",
         std::to_string(m.n_layer) + " (" + std::to_string(m.moe_layers.size()) + " MoE)");
    line("streams", "yes by the index: experts " + r.layouts +
                        " (first projection read first, down overlapped with it); run checks "
                        "on its first graph that llama.cpp computes with them");
    if (m.n_nextn_layers > 0)
        line("NextN", std::to_string(m.n_nextn_layers) + " NextN layer(s) in the file, not used (" +
                          human_bytes(m.unused_bytes_total) +
                          " never read: llama.cpp does not build them)");
    line("experts", std::to_string(m.n_expert) + " per MoE layer, top-k " +
                        std::to_string(m.n_expert_used) + "  (n_embd " + std::to_string(m.n_embd) +
                        ", n_ff_exp " +
                        (m.n_ff_exp ? std::to_string(m.n_ff_exp) : std::string("n/a")) +
                        (m.n_vocab ? ", n_vocab " + std::to_string(m.n_vocab) : "") + ")");
    std::printf("per expert    one expert's slice of each projection:\n");
    for (const auto & p : r.projections) {
        std::printf("  %-8s %-6s %12s  (%u layer%s)\n", p.name.c_str(), p.type.c_str(),
                    human_bytes(p.slice_bytes).c_str(), p.n_layers, p.n_layers == 1 ? "" : "s");
    }
    std::string one = human_bytes(r.expert_bytes_max);
    if (r.expert_bytes_min != r.expert_bytes_max) {
        one = human_bytes(r.expert_bytes_min) + " .. " + one + " (varies by layer)";
    }
    std::printf("  one expert, all projections: %s\n", one.c_str());
    const Meta meta = read_meta(m);
    line("context", meta.context_length < 0
                        ? std::string("not in the file (run and serve need -c)")
                        : std::to_string(meta.context_length) +
                              " tokens (the model's training context; run and serve without -c: "
                              "this, capped by memory)");
#if !MOESTREAM_SERVE_AND_CHAT  // (with chat and serve built, the line above says more)
    line("chat template", meta.chat_template_bytes < 0
                              ? std::string("none in the file")
                              : std::to_string(meta.chat_template_bytes) + " bytes");
#endif
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s (%.1f%% of file), %s per MoE layer",
                  human_bytes(m.expert_bytes_total).c_str(), pct(m.expert_bytes_total, m.set_bytes),
                  human_bytes(r.expert_bytes_per_layer).c_str());
    line("expert bytes", buf);
    std::snprintf(buf, sizeof buf, "%s (%.1f%% of file; stays resident)",
                  human_bytes(m.dense_bytes_total).c_str(), pct(m.dense_bytes_total, m.set_bytes));
    line("dense bytes", buf);
    std::snprintf(buf, sizeof buf, "%s per token = %zu MoE layers x %u experts x %s",
                  human_bytes(m.token_working_set_bytes).c_str(), m.moe_layers.size(),
                  m.n_expert_used, one.c_str());
    line("working set", buf);
    const std::string aligned = r.slices_4096_aligned == r.n_slices
                                    ? std::string("all 4096-aligned")
                                    : std::to_string(r.slices_4096_aligned) + " of " +
                                          std::to_string(r.n_slices) + " slices 4096-aligned";
    std::snprintf(buf, sizeof buf,
                  "general.alignment %" PRIu64 "; expert slice offsets are multiples of %" PRIu64
                  " B (%s)",
                  m.alignment, r.slice_offset_alignment, aligned.c_str());
    line("alignment", buf);
    std::snprintf(buf, sizeof buf,
                  "reading each slice with 4096-aligned bounds reads %.1f%% more than the "
                  "slice (%s for all experts)",
                  r.odirect_overread_pct, human_bytes(r.odirect_read_bytes).c_str());
    line("O_DIRECT", buf);
    // The rule run enforces, in the words run uses (src/residency/cache_budget.h).
    line("cache rule", cache_rule_text(m));
    std::snprintf(buf, sizeof buf, "%" PRIu64 " MiB holds every expert (no reads once warm)",
                  r.cache_all_mib);
    line("cache all", buf);
    line("cache auto", r.auto_text);
    // A rough bound: with the cache off every token reads its working set from flash, so
    // decode is at most (flash read speed) / (working set) tokens per second.
    const double ws_mib = double(m.token_working_set_bytes) / kMiB;
    if (ws_mib > 0) {
        std::snprintf(buf, sizeof buf,
                      "cache off: %.1f MiB read per token, so at most %.1f tok/s per GB/s of "
                      "flash reads (e.g. %.1f tok/s at 3 GB/s); a cache cuts the reads by its "
                      "hit rate",
                      ws_mib, 1e9 / double(kMiB) / ws_mib, 3e9 / double(kMiB) / ws_mib);
        line("decode bound", buf);
    }
}

}  // namespace

void add_inspect_command(CLI::App & app, Action * action) {
    auto * sub = app.add_subcommand("inspect", "describe a MoE GGUF model (sizes, working set)");
    struct Opts {
        InspectOptions own;  // --json, --plan (registry rows, settings.h)
        RunOptions run;      // -m, and with --plan the run's engine flags
    };
    auto opts = std::make_shared<Opts>();
    add_inspect_flags(sub, &opts->own);
    const size_t before = sub->get_options().size();
    add_engine_flags(sub, &opts->run);
    std::vector<std::string> engine_flags;
    for (size_t i = before; i < sub->get_options().size(); ++i)
        if (sub->get_options()[i]->get_name() != "--model")  // -m is inspect's own input
            engine_flags.push_back(sub->get_options()[i]->get_name());
    sub->callback([action, opts, sub, engine_flags] {
        *action = [opts, sub, engine_flags] {
            if (!opts->own.plan)  // the engine flags only shape a plan
                if (int rc = refuse_given(sub, engine_flags, "applies to --plan")) return rc;
            if (opts->own.plan) {
                if (int rc = check_engine_flags(sub, opts->run)) return rc;
                std::string plan;
                Status st = describe_plan(opts->run, &plan);
                if (!st.ok()) return report(Status::Error(st.code(), flag_words(st.message())));
                const nlohmann::json j = nlohmann::json::parse(plan);
                if (opts->own.json) {
                    std::printf("%s\n", j.dump(2).c_str());
                } else {
                    for (const auto & c : j)
                        std::printf("%-18s %s  (%s)\n", c["name"].get<std::string>().c_str(),
                                    c["value"].get<std::string>().c_str(),
                                    flag_words(c["reason"].get<std::string>()).c_str());
                }
                return 0;
            }
            ModelIndex m;
            Status st = load_model_index(opts->run.model_path, &m);
            if (!st.ok()) {
                std::fprintf(stderr, "moestream: %s\n", st.message().c_str());
                return st.exit_code();
            }
            Report r = make_report(m);
            if (opts->own.json) {
                std::printf("%s\n", to_json(m, r).dump(2).c_str());
            } else {
                print_human(m, r);
            }
            return 0;
        };
    });
}

}  // namespace moestream::cli
