// `moestream replay TRACE` — re-runs a route trace (`run --route-trace`) through a simulated
// residency cache for a sweep of settings: budgets x policies x drop-cold fractions x top-k,
// and substitution margins (a trace recorded with --route-trace-scores).
// Prints per setting the decode hit rate, bytes read per token, the reads avoided and the
// router weight mass discarded against the lossless baseline (same policy and budget, the
// trace's k, no dropping). --validate replays the recorded settings and requires the recorded
// hits, misses, drops and (with scores) substitutions slot for slot. See docs/replay.md.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli.h"
#include "moestream/gguf_index.h"
#include "moestream/log.h"
#include "moestream/replay.h"
#include "moestream/route_stats.h"
#include "moestream/route_trace.h"

namespace moestream::cli {
namespace {

struct ReplayFlags {
    ReplayOptions own;  // the command's flags (registry rows, settings.h)
    int verbose = 0;
    CLI::App * sub = nullptr;
};

int replay_fail(const Status & st) {
    MS_LOG_ERROR("%s", st.message().c_str());
    return st.exit_code();
}

// A comma-separated list; an empty item ("4,,8", "4,") is an error naming the flag.
Status split(const std::string & flag, const std::string & s, std::vector<std::string> * out) {
    out->clear();
    size_t at = 0;
    while (true) {
        const size_t comma = s.find(',', at);
        const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (item.empty())
            return Status::Usage(flag + ": empty item in '" + s + "' (a comma-separated list)");
        out->push_back(item);
        if (comma == std::string::npos) return Status::Ok();
        at = comma + 1;
    }
}


Status parse_doubles(const std::string & flag, const std::string & s, double lo, double hi,
                     std::vector<double> * out) {
    std::vector<std::string> items;
    Status st = split(flag, s, &items);
    if (!st.ok()) return st;
    for (const std::string & v : items) {
        size_t pos = 0;
        double d = NAN;
        try {
            d = std::stod(v, &pos);
        } catch (...) {
        }
        if (pos != v.size() || !(d >= lo && d <= hi))
            return Status::Usage(flag + ": '" + v + "' is not in [" + fmt_num(lo) + ", " + fmt_num(hi) + "]");
        out->push_back(d);
    }
    return Status::Ok();
}

nlohmann::json result_json(const ReplayResult & r, const ReplayResult * base) {
    nlohmann::json j;
    j["policy"] = policy_name(r.setting.policy);
    j["budget_bytes"] = r.setting.budget_bytes;
    j["budget_mib"] = double(r.setting.budget_bytes) / kMiB;
    j["drop_cold"] = r.setting.drop_cold;
    j["drop_in_prefill"] = r.setting.drop_in_prefill;
    j["n_expert_used"] = r.setting.k;
    j["lossy"] = r.setting.drop_cold > 0 || (base && r.setting.k != base->setting.k);
    j["substitute_experts"] = r.setting.substitute;
    j["substitutions"] = r.substitutions;
    if (r.setting.substitute > 0) {
        j["substitute_score_lost"] = r.substitute_score_lost;
        j["weight_substituted"] = r.weight_substituted;
        j["weight_substituted_share"] =
            r.weight_total > 0 ? r.weight_substituted / r.weight_total : 0.0;
        j["lossy"] = true;
    }
    j["routings"] = r.routings;
    j["lookups"] = r.lookups;
    j["hits"] = r.hits;
    j["misses"] = r.misses;
    j["hit_pct"] = r.lookups ? 100.0 * double(r.hits) / double(r.lookups) : 0.0;
    j["evictions"] = r.evictions;
    j["rereads"] = r.rereads;
    j["over_budget_stages"] = r.over_budget_stages;
    j["peak_committed_bytes"] = r.peak_committed_bytes;
    j["bytes_read"] = r.bytes_read;
    j["decode_tokens"] = r.decode_tokens;
    j["decode_lookups"] = r.decode_lookups;
    j["decode_hits"] = r.decode_hits;
    j["decode_misses"] = r.decode_misses;
    j["decode_hit_pct"] = r.decode_hit_pct;
    j["decode_bytes_read"] = r.decode_bytes_read;
    j["bytes_per_token"] = r.bytes_per_token;
    j["slots_total"] = r.slots_total;
    j["slots_cut"] = r.slots_cut;
    j["slots_dropped"] = r.slots_dropped;
    j["rows_weight_unknown"] = r.rows_weight_unknown;
    j["weight_mass_discarded"] = r.weight_mass_discarded;
    if (r.setting.fallback_w > 0) {
        j["fallback_threshold"] = r.setting.fallback_w;
        j["fallbacks"] = r.fallbacks;
        j["fallback_bytes_saved"] = r.fallback_bytes_saved;
        j["lossy"] = true;
    }
    const uint64_t bm = base ? base->decode_misses : r.decode_misses;
    j["baseline_decode_misses"] = bm;
    j["reads_avoided"] = bm ? 1.0 - double(r.decode_misses) / double(bm) : 0.0;
    if (r.setting.fallback_w > 0) {  // a low-bit read is a read: the bytes are what it saves
        const uint64_t bb = base ? base->decode_bytes_read : r.decode_bytes_read;
        j["baseline_decode_bytes_read"] = bb;
        j["reads_avoided"] = bb ? 1.0 - double(r.decode_bytes_read) / double(bb) : 0.0;
    }
    return j;
}

// The plot: matplotlib (Debian python3-matplotlib) fed the series as JSON.
const char * kPlotScript = R"PY(
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = json.load(open(sys.argv[1]))
res = d["results"]
lossy = [r for r in res if r["lossy"]]
fig, axes = plt.subplots(1, 2 if lossy else 1, figsize=(13 if lossy else 7, 5), squeeze=False)
ax = axes[0][0]
budgets = sorted({r["budget_mib"] for r in res})
for pol in sorted({r["policy"] for r in res}):
    pts = sorted((r["budget_mib"], r["decode_hit_pct"]) for r in res if r["policy"] == pol and not r["lossy"])
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol)
ws, allx = d.get("working_set_mib", 0), d.get("all_experts_mib", 0)
if ws > 0:
    ax.axvline(ws, color="grey", ls="--", lw=1, label="one token's working set (%.1f MiB)" % ws)
if allx > 0:
    ax.axvline(allx, color="black", ls=":", lw=1, label="every expert (%.1f MiB)" % allx)
hi = max(budgets + [allx * 1.05 if allx else 0, ws * 1.5 if ws else 0, 1])
ax.set_xlim(0, hi)
ax.set_ylim(0, 100)
ax.set_xlabel("cache budget (MiB)")
ax.set_ylabel("decode hit rate (%)")
ax.set_title("hit rate vs budget (lossless)")
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8, loc="lower right")
if lossy:
    ax = axes[0][1]
    # One (policy, budget) so the panel stays readable: lru if swept, at the largest budget.
    pols = sorted({r["policy"] for r in lossy})
    pol = "lru" if "lru" in pols else pols[0]
    mib = max(r["budget_mib"] for r in lossy if r["policy"] == pol)
    k0 = d["trace"]["k"]
    series = {}
    for r in res:
        if r["policy"] != pol or r["budget_mib"] != mib:
            continue
        k, f = r["n_expert_used"], r["drop_cold"]
        m = r.get("substitute_experts", 0)
        if m > 0:
            series.setdefault("--substitute-experts M" + ("" if k == k0 else " (K=%d)" % k),
                              []).append(("M=%g" % m, r))
        elif k == k0 and f == 0:
            series.setdefault("lossless", []).append(("", r))
        elif k == k0:
            series.setdefault("--drop-cold-experts F", []).append(("F=%g" % f, r))
        elif f == 0:
            series.setdefault("--n-expert-used K", []).append(("K=%d" % k, r))
        else:
            series.setdefault("K=%d with F" % k, []).append(("F=%g" % f, r))
    for name, pts in sorted(series.items()):
        pts.sort(key=lambda p: p[1]["weight_mass_discarded"])
        xs = [100 * p[1]["weight_mass_discarded"] for p in pts]
        ys = [100 * p[1]["reads_avoided"] for p in pts]
        ax.plot(xs, ys, marker="o", label=name)
        for (lab, _), x, y in zip(pts, xs, ys):
            if lab:
                ax.annotate(lab, (x, y), fontsize=7, textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("router weight mass discarded (%)")
    ax.set_ylabel("decode reads avoided (%)")
    ax.set_title("lossy knobs at %s, %g MiB (vs lossless there)" % (pol, mib))
    ax.grid(True, alpha=0.3)
    ax.margins(0.1)
    ax.legend(fontsize=8, loc="lower right")
fig.suptitle(d.get("title", "moestream replay"), fontsize=9)
fig.tight_layout()
# The name given, as given: the format from its extension when matplotlib knows it, else PNG
# (savefig alone would append ".png" to a name without one).
ext = sys.argv[2].rsplit(".", 1)[-1].lower() if "." in sys.argv[2].rsplit("/", 1)[-1] else ""
fmt = ext if ext in fig.canvas.get_supported_filetypes() else "png"
fig.savefig(sys.argv[2], dpi=110, format=fmt)
)PY";

Status write_plot(const nlohmann::json & doc, const std::string & png) {
    char dir[] = "/tmp/moestream-plot-XXXXXX";
    if (!mkdtemp(dir)) return Status::Runtime("--plot: cannot create a temporary directory");
    const std::string d = dir, data = d + "/series.json", script = d + "/plot.py";
    {
        std::ofstream f(data);
        f << doc.dump();
        std::ofstream g(script);
        g << kPlotScript;
        if (!f || !g) return Status::Runtime("--plot: cannot write " + d);
    }
    const char * py = std::getenv("MOESTREAM_PYTHON");
    std::string python =
        py && *py ? py : (access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3");
    auto q = [](const std::string & s) {
        std::string r = "'";
        for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
        return r + "'";
    };
    const std::string errf = d + "/stderr";
    const std::string cmd = q(python) + " " + q(script) + " " + q(data) + " " + q(png);
    const int ws = std::system((cmd + " 2>" + q(errf)).c_str());
    std::string err;
    {
        std::ifstream e(errf);
        std::ostringstream ss;
        ss << e.rdbuf();
        err = ss.str();
    }
    for (const std::string & f : {data, script, errf}) std::remove(f.c_str());
    rmdir(dir);
    // The wait status, decoded: an exit code or a signal, never the raw number.
    const int code = ws == -1 ? -1 : WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    if (code == 0) return Status::Ok();
    if (code == 127)
        return Status::Runtime("--plot: " + python + " not found (install python3 and "
                               "python3-matplotlib, or set MOESTREAM_PYTHON)");
    if (err.find("No module named 'matplotlib'") != std::string::npos)
        return Status::Runtime("--plot: " + python + " has no matplotlib (Debian: python3-matplotlib)");
    while (!err.empty() && err.back() == '\n') err.pop_back();
    const size_t nl = err.rfind('\n');
    return Status::Runtime("--plot: the plot script failed (exit " + std::to_string(code) +
                           "): " + (nl == std::string::npos ? err : err.substr(nl + 1)));
}

// --routing-stats: how the traced model routes (route_stats.h), per layer and overall.
int print_routing_stats(const ReplayFlags & f, const RouteTrace & trace) {
    RoutingStats rs;
    Status st = routing_stats(trace, 20261129, &rs);
    if (!st.ok()) return replay_fail(Status::BadInput(f.own.trace + ": " + st.message()));
    if (f.own.json) {
        nlohmann::json j = {{"trace", f.own.trace},          {"n_expert", rs.n_expert},
                            {"k", rs.k},                 {"reuse_uniform", rs.reuse_uniform},
                            {"entropy_norm", rs.entropy_norm},
                            {"top_expert_share", rs.top_expert_share},
                            {"reuse", rs.reuse},         {"reuse_shuffled", rs.reuse_shuffled}};
        for (const LayerRoutingStats & L : rs.layers)
            j["layers"].push_back({{"layer", L.layer},
                                   {"rows", L.rows},
                                   {"entropy_norm", L.entropy_norm},
                                   {"top_expert_share", L.top_expert_share},
                                   {"unused_experts", L.unused_experts},
                                   {"reuse", L.reuse},
                                   {"reuse_shuffled", L.reuse_shuffled}});
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("routing of %s (decode tokens; %u experts, k %u; uniform random reuse %.3f)\n",
                f.own.trace.c_str(), rs.n_expert, rs.k, rs.reuse_uniform);
    std::printf("%6s %7s %9s %9s %7s | %7s %9s\n", "layer", "tokens", "entropy", "top_share",
                "unused", "reuse", "shuffled");
    for (const LayerRoutingStats & L : rs.layers)
        std::printf("%6u %7llu %9.3f %9.3f %7u | %7.3f %9.3f\n", L.layer,
                    (unsigned long long)L.rows, L.entropy_norm, L.top_expert_share,
                    L.unused_experts, L.reuse, L.reuse_shuffled);
    std::printf("%6s %7s %9.3f %9.3f %7s | %7.3f %9.3f\n", "all", "", rs.entropy_norm,
                rs.top_expert_share, "", rs.reuse, rs.reuse_shuffled);
    return 0;
}

// --warm-split: per budget and policy, the hit rate of the first --warm-measure decode tokens
// after the split, cold vs with the first part's hottest experts preloaded (replay.h).
int print_warm_estimate(const ReplayFlags & f, const RouteTrace & trace) {
    std::vector<double> budgets_mib;
    Status st = parse_doubles("--budgets", f.own.budgets.empty() ? "2000,4000" : f.own.budgets, 1, 1e9,
                              &budgets_mib);
    if (!st.ok()) return replay_fail(st);
    std::vector<std::string> names;
    st = split("--policy", f.own.policies, &names);
    if (!st.ok()) return replay_fail(st);
    nlohmann::json rows = nlohmann::json::array();
    for (const std::string & p : names) {
        ReplaySetting s;
        if (!parse_policy(p, &s.policy))
            return replay_fail(Status::Usage("--policy: unknown policy '" + p + "' (lru, lfu, belady)"));
        for (double mib : budgets_mib) {
            s.budget_bytes = uint64_t(mib * double(kMiB));
            WarmEstimate w;
            st = estimate_warm_start(trace, s, uint32_t(f.own.warm_split), uint32_t(f.own.warm_measure), &w);
            if (!st.ok()) return replay_fail(st);
            rows.push_back({{"policy", p},
                            {"budget_mib", mib},
                            {"warm_split", f.own.warm_split},
                            {"tokens", w.tokens},
                            {"lookups", w.lookups},
                            {"experts_preloaded", w.experts_preloaded},
                            {"preloaded_mib", double(w.bytes_preloaded) / kMiB},
                            {"cold_hit_pct", w.cold_hit_pct},
                            {"warm_hit_pct", w.warm_hit_pct}});
        }
    }
    if (f.own.json) {
        std::printf("%s\n", nlohmann::json{{"warm_start", rows}}.dump(2).c_str());
        return 0;
    }
    std::printf("warm start estimate: %s, split after decode token %d, the next %d decode tokens "
                "measured\n%-7s %10s %10s %12s %10s %10s\n",
                f.own.trace.c_str(), f.own.warm_split, f.own.warm_measure, "policy", "budget MiB", "preloaded",
                "preload MiB", "cold hit%", "warm hit%");
    for (const auto & r : rows)
        std::printf("%-7s %10.0f %10llu %12.1f %10.1f %10.1f\n",
                    r["policy"].get<std::string>().c_str(), r["budget_mib"].get<double>(),
                    (unsigned long long)r["experts_preloaded"].get<uint64_t>(),
                    r["preloaded_mib"].get<double>(), r["cold_hit_pct"].get<double>(),
                    r["warm_hit_pct"].get<double>());
    return 0;
}

int do_replay(const ReplayFlags & f) {
    apply_verbosity(f.verbose);
    const std::vector<std::string> sweep = {"--budgets",           "--policy",
                                            "--drop-cold",         "--n-expert-used",
                                            "--drop-in-prefill",   "--plot",
                                            "--miss-fallback",     "--fallback-threshold",
                                            "--substitute-experts"};
    if (f.own.warm_split >= 0) {
        if (f.own.validate || f.own.routing_stats)
            return usage_error("replay", "--warm-split excludes --validate and --routing-stats");
        if (int rc = refuse_given(f.sub,
                                  {"--drop-cold", "--n-expert-used", "--drop-in-prefill", "--plot",
                                   "--miss-fallback", "--fallback-threshold",
                                   "--substitute-experts"},
                                  "has no effect with --warm-split (it estimates lossless "
                                  "warm starts: --budgets and --policy only)"))
            return rc;
    } else if (int rc = refuse_given(f.sub, {"--warm-measure"}, "needs --warm-split N"))
        return rc;
    if (f.own.validate && f.own.routing_stats)
        return usage_error("replay", "--validate and --routing-stats exclude each other");
    if (f.own.validate)
        if (int rc = refuse_given(f.sub, sweep, "has no effect with --validate (it replays the "
                                                "recorded settings)"))
            return rc;
    if (f.own.routing_stats)
        if (int rc = refuse_given(f.sub, sweep, "has no effect with --routing-stats (it "
                                                "simulates no cache)"))
            return rc;
    Status st = check_output_paths({{"--plot", f.own.plot}},
                                   {{"the trace", f.own.trace}, {"--miss-fallback", f.own.fallback}});
    if (!st.ok()) return replay_fail(st);
    RouteTrace trace;
    const auto t_load = std::chrono::steady_clock::now();
    st = read_route_trace(f.own.trace, &trace);
    if (!st.ok()) return replay_fail(st);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    Replayer rp(trace);
    const TraceHeader & h = trace.header;

    if (f.own.routing_stats) return print_routing_stats(f, trace);
    if (f.own.warm_split >= 0) return print_warm_estimate(f, trace);
    std::vector<double> subs;  // --substitute-experts margins
    if (!f.own.substitute.empty()) {
        st = parse_doubles("--substitute-experts", f.own.substitute, 0, 1, &subs);
        if (!st.ok()) return replay_fail(st);
        if (!h.scores)
            return usage_error(
                "replay", "--substitute-experts needs the router's scores of every decode row, "
                          "and " + f.own.trace + " was recorded without them: record it with "
                          "`moestream run --route-trace FILE --route-trace-scores` (a trace "
                          "otherwise holds only the routed experts and their final weights)");
        if (!f.own.fallback.empty())
            return usage_error("replay", "--substitute-experts and --miss-fallback exclude each "
                                         "other (each decides what a miss becomes)");
        if (f.own.policies.find("belady") != std::string::npos)
            return usage_error("replay", "--substitute-experts cannot be replayed with --policy "
                                         "belady (a substitute's next use is not in the trace)");
    }

    if (f.own.validate) {
        for (uint8_t fl : trace.flags)
            if (fl & kSlotFallback)
                return usage_error("replay",
                                   "--validate cannot reproduce a --miss-fallback recording "
                                   "(which experts the low-bit copies displaced is not in the "
                                   "trace); replay it without --validate");
        ReplayResult r;
        ValidateReport v;
        st = rp.run(rp.recorded_setting(), &r, &v);
        if (!st.ok()) return replay_fail(st);
        std::fprintf(
            stderr,
            "replay --validate: %s: budget %.2f MiB, drop-cold %g, substitute %g%s, k %u: %llu "
            "slots checked; recorded %llu hits / %llu misses / %llu drops / %llu "
            "substitutions, replay %llu / %llu / %llu / %llu: %s\n",
            f.own.trace.c_str(), double(h.cache_budget_bytes) / kMiB, h.drop_cold, h.substitute,
            h.substitute > 0 && !h.scores ? " (not replayed: no scores)" : "", h.k,
            (unsigned long long)v.slots_checked, (unsigned long long)v.recorded_hits,
            (unsigned long long)v.recorded_misses, (unsigned long long)v.recorded_drops,
            (unsigned long long)v.recorded_substitutions, (unsigned long long)v.replay_hits,
            (unsigned long long)v.replay_misses, (unsigned long long)v.replay_drops,
            (unsigned long long)v.replay_substitutions, v.ok ? "OK" : "MISMATCH");
        if (!v.ok) {
            MS_LOG_ERROR("%s: replay differs from the recording: %s (%llu slots differ)",
                         f.own.trace.c_str(), v.first_mismatch.c_str(),
                         (unsigned long long)v.mismatches);
            return 1;
        }
        if (f.own.json) {
            nlohmann::json j;
            j["validate"] = {{"ok", true},
                             {"slots_checked", v.slots_checked},
                             {"hits", v.replay_hits},
                             {"misses", v.replay_misses},
                             {"drops", v.replay_drops},
                             {"substitutions", v.replay_substitutions}};
            std::printf("%s\n", j.dump(2).c_str());
        }
        return 0;
    }

    // The sweep.
    std::vector<double> budgets_mib, drops, ks;
    if (!f.own.budgets.empty()) {
        st = parse_doubles("--budgets", f.own.budgets, 0, 1e9, &budgets_mib);
        if (!st.ok()) return replay_fail(st);
    } else {
        budgets_mib.push_back(double(h.cache_budget_bytes) / kMiB);
    }
    std::vector<ReplayPolicy> policies;
    std::vector<std::string> policy_names;
    st = split("--policy", f.own.policies, &policy_names);
    if (!st.ok()) return replay_fail(st);
    for (const std::string & p : policy_names) {
        ReplayPolicy pol;
        if (!parse_policy(p, &pol))
            return replay_fail(Status::Usage("--policy: unknown policy '" + p + "' (lru, lfu, belady)"));
        policies.push_back(pol);
    }
    if (!f.own.drops.empty()) {
        st = parse_doubles("--drop-cold", f.own.drops, 0, 1, &drops);
        if (!st.ok()) return replay_fail(st);
    } else {
        drops.push_back(h.drop_cold);
    }
    if (!f.own.ks.empty()) {
        st = parse_doubles("--n-expert-used", f.own.ks, 1, double(h.k), &ks);
        if (!st.ok()) return replay_fail(st);
        for (double k : ks)
            if (k != std::floor(k))
                return replay_fail(Status::Usage("--n-expert-used: whole numbers only"));
    } else {
        ks.push_back(h.k);
    }
    const bool in_prefill = f.own.drop_in_prefill || h.drop_in_prefill;
    std::vector<uint64_t> fb_bytes;  // --miss-fallback: the companion's expert bytes per layer
    if (f.own.fallback.empty() != (f.own.fallback_w <= 0))
        return usage_error("replay", "--miss-fallback FILE and --fallback-threshold W go together");
    if (!f.own.fallback.empty()) {
        ModelIndex c;
        st = load_model_index(f.own.fallback, &c);
        if (!st.ok()) return replay_fail(Status::BadModel("--miss-fallback " + f.own.fallback + ": " + st.message()));
        bool match = c.moe_layers.size() == h.moe_layers.size() && c.n_expert == h.n_expert;
        for (size_t i = 0; match && i < c.moe_layers.size(); ++i) {
            match = c.moe_layers[i].layer == h.moe_layers[i].layer;
            fb_bytes.push_back(c.moe_layers[i].expert_bytes);
        }
        if (!match)
            return replay_fail(Status::BadModel("--miss-fallback " + f.own.fallback +
                                         ": its MoE layers or expert count differ from the "
                                         "trace's model"));
        uint64_t known = 0;
        for (size_t i = 0; i < trace.routings.size(); ++i) {
            const TraceRouting & r = trace.routings[i];
            if (!r.decode) continue;
            bool fin = true;
            for (uint64_t s = r.first_slot; s < r.first_slot + uint64_t(r.n_rows) * h.k; ++s)
                fin = fin && std::isfinite(trace.weight[s]);
            known += fin;
        }
        if (known == 0)
            return usage_error("replay",
                               "--fallback-threshold needs the final router weights of decode "
                               "rows, and " + f.own.trace + " holds none (record it with a decode "
                               "run, e.g. `moestream eval --route-trace`)");
    }

    nlohmann::json doc;
    doc["trace"] = {{"path", f.own.trace},
                    {"bytes", trace.file_bytes},
                    {"version", h.version},
                    {"n_layer", h.n_layer},
                    {"moe_layers", h.moe_layers.size()},
                    {"n_expert", h.n_expert},
                    {"k", h.k},
                    {"k_model", h.k_model},
                    {"page_bytes", h.page_bytes},
                    {"cache_budget_bytes", h.cache_budget_bytes},
                    {"drop_cold", h.drop_cold},
                    {"drop_in_prefill", h.drop_in_prefill},
                    {"scores", h.scores},
                    {"substitute_experts", h.substitute},
                    {"routings", trace.routings.size()},
                    {"slots", trace.expert.size()}};
    doc["title"] = f.own.trace;
    // For the plot's markers: one token's routed working set (k experts of every MoE layer)
    // and the bytes of every expert (the budget beyond which nothing more is hit).
    double ws_bytes = 0, all_bytes = 0;
    for (const TraceLayerShape & L : h.moe_layers) {
        ws_bytes += double(h.k) * double(L.expert_bytes);
        all_bytes += double(h.n_expert) * double(L.expert_bytes);
    }
    doc["working_set_mib"] = ws_bytes / kMiB;
    doc["all_experts_mib"] = all_bytes / kMiB;
    nlohmann::json results = nlohmann::json::array();
    double sim_s = 0;
    uint64_t sim_routings = 0, sim_slots = 0;
    std::map<std::pair<int, uint64_t>, ReplayResult> baselines;
    for (ReplayPolicy pol : policies)
        for (double b : budgets_mib) {
            const uint64_t budget = uint64_t(std::llround(b * kMiB));
            auto key = std::make_pair(int(pol), budget);
            auto run = [&](const ReplaySetting & s, ReplayResult * r) {
                const auto t0 = std::chrono::steady_clock::now();
                Status rs = rp.run(s, r);
                sim_s +=
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                sim_routings += trace.routings.size();
                sim_slots += trace.expert.size();
                return rs;
            };
            ReplaySetting base_s;
            base_s.fallback_expert_bytes = fb_bytes;
            base_s.policy = pol;
            base_s.budget_bytes = budget;
            base_s.k = h.k;
            base_s.drop_in_prefill = in_prefill;
            st = run(base_s, &baselines[key]);
            if (!st.ok()) return replay_fail(st);
            for (double k : ks)
                for (double d : drops) {
                    ReplaySetting s = base_s;
                    s.k = uint32_t(k);
                    s.drop_cold = d;
                    s.fallback_w = f.own.fallback_w;
                    ReplayResult r;
                    if (s.k == h.k && d == 0 && s.fallback_w == 0) {
                        r = baselines[key];
                    } else {
                        st = run(s, &r);
                        if (!st.ok()) return replay_fail(st);
                    }
                    results.push_back(result_json(r, &baselines[key]));
                }
            // Each margin is one cell at drop-cold 0: the trace has no final weights for a
            // substitute, so the two knobs are not combined.
            for (double k : ks)
                for (double m : subs) {
                    ReplaySetting s = base_s;
                    s.k = uint32_t(k);
                    s.substitute = m;
                    ReplayResult r;
                    st = run(s, &r);
                    if (!st.ok()) return replay_fail(st);
                    results.push_back(result_json(r, &baselines[key]));
                }
        }
    doc["results"] = results;
    const double rps = sim_s > 0 ? double(sim_routings) / sim_s : 0;
    doc["timing"] = {{"load_s", load_s},
                     {"replay_s", sim_s},
                     {"routings_replayed", sim_routings},
                     {"routings_per_s", rps},
                     {"slots_per_s", sim_s > 0 ? double(sim_slots) / sim_s : 0}};

    if (f.own.json) {
        std::printf("%s\n", doc.dump(2).c_str());
    } else {
        std::printf(
            "trace %s: %zu routings (%llu decode tokens), %u MoE layers x %u experts, k %u, "
            "recorded at %.0f MiB%s\n",
            f.own.trace.c_str(), trace.routings.size(),
            (unsigned long long)(results.empty() ? 0 : results[0]["decode_tokens"].get<uint64_t>()),
            unsigned(h.moe_layers.size()), h.n_expert, h.k, double(h.cache_budget_bytes) / kMiB,
            h.drop_cold > 0 ? (", drop-cold " + std::to_string(h.drop_cold)).c_str() : "");
        std::printf("%-7s %11s %3s %6s %6s | %8s %8s %10s | %13s %12s\n", "policy", "budget_MiB",
                    "k", "drop", "subst", "hit%dec", "hit%all", "MiB/token", "reads_avoided",
                    "w_discarded");
        for (const auto & r : results)
            std::printf("%-7s %11.1f %3u %6.3g %6.3g | %8.2f %8.2f %10.3f | %12.2f%% %11.2f%%\n",
                        r["policy"].get<std::string>().c_str(), r["budget_mib"].get<double>(),
                        r["n_expert_used"].get<unsigned>(), r["drop_cold"].get<double>(),
                        r["substitute_experts"].get<double>(),
                        r["decode_hit_pct"].get<double>(), r["hit_pct"].get<double>(),
                        r["bytes_per_token"].get<double>() / kMiB,
                        100 * r["reads_avoided"].get<double>(),
                        100 * r["weight_mass_discarded"].get<double>());
        for (const auto & r : results)
            if (r["substitute_experts"].get<double>() > 0)
                std::printf("--substitute-experts %g (LOSSY estimate), %s %.1f MiB, k %u: %llu "
                            "substitutions, mean score margin %.4f, %.2f%% of the router weight "
                            "moved to a substitute\n",
                            r["substitute_experts"].get<double>(),
                            r["policy"].get<std::string>().c_str(), r["budget_mib"].get<double>(),
                            r["n_expert_used"].get<unsigned>(),
                            (unsigned long long)r["substitutions"].get<uint64_t>(),
                            r["substitutions"].get<uint64_t>()
                                ? r["substitute_score_lost"].get<double>() /
                                      double(r["substitutions"].get<uint64_t>())
                                : 0.0,
                            100 * r["weight_substituted_share"].get<double>());
        if (!f.own.fallback.empty())
            for (const auto & r : results)
                std::printf("--miss-fallback %s --fallback-threshold %g (LOSSY estimate), %s "
                            "%.1f MiB: %llu expert reads from the low-bit copy, %.1f MiB saved\n",
                            f.own.fallback.c_str(), f.own.fallback_w,
                            r["policy"].get<std::string>().c_str(), r["budget_mib"].get<double>(),
                            (unsigned long long)r["fallbacks"].get<uint64_t>(),
                            double(r["fallback_bytes_saved"].get<uint64_t>()) / kMiB);
    }
    std::fprintf(
        stderr,
        "replay: %llu routings replayed in %.3f s: %.2f M routings/s (%.1f M slots/s); trace "
        "parsed in %.3f s\n",
        (unsigned long long)sim_routings, sim_s, rps / 1e6,
        (sim_s > 0 ? double(sim_slots) / sim_s : 0) / 1e6, load_s);
    if (!f.own.plot.empty()) {
        st = write_plot(doc, f.own.plot);
        if (!st.ok()) return replay_fail(st);
    }
    return 0;
}

}  // namespace

void add_replay_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<ReplayFlags>();
    auto * sub = app.add_subcommand(
        "replay", "simulate the expert cache over a route trace (run --route-trace)");
    f->sub = sub;
    add_replay_flags(sub, &f->own);
    // Their defaults mean "not given": none to show.
    sub->get_option("--fallback-threshold")->default_str("");
    sub->get_option("--warm-split")->default_str("");
    sub->add_flag("-v,--verbose", f->verbose, "more log");
    sub->callback([f, action] { *action = [f] { return do_replay(*f); }; });
}

}  // namespace moestream::cli
