// replay.cpp — `moestream replay` (see replay.h): a route trace through the engine's expert
// ledger over a simulated back-end (replay_ledger.h), with the streamer's staging order and
// the engine's drop-cold decision.
#include "moestream/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policy_drop_cold.h"
#include "policy_substitute.h"
#include "replay_ledger.h"

namespace moestream {

namespace {
// By ReplayPolicy value.
constexpr const char * kPolicyNames[] = {"lru", "lfu", "belady"};
constexpr size_t kPolicies = sizeof(kPolicyNames) / sizeof(kPolicyNames[0]);
}  // namespace

const char * policy_name(ReplayPolicy p) {
    return size_t(p) < kPolicies ? kPolicyNames[size_t(p)] : "?";
}

bool parse_policy(const std::string & s, ReplayPolicy * out) {
    for (size_t i = 0; i < kPolicies; ++i)
        if (s == kPolicyNames[i]) {
            *out = ReplayPolicy(i);
            return true;
        }
    return false;
}

LedgerShape replay_ledger_shape(const TraceHeader & h) {
    LedgerShape shape;
    shape.page_bytes = h.page_bytes;
    shape.whole_chunks = h.cache_chunks;
    shape.layers.resize(h.moe_layers.size());
    for (size_t i = 0; i < h.moe_layers.size(); ++i) {
        const TraceLayerShape & S = h.moe_layers[i];
        for (size_t t = 0; t < S.slice_bytes.size(); ++t) {
            const uint64_t phase = t < S.phase_bytes.size() ? S.phase_bytes[t] : 0;
            shape.layers[i].push_back(PageLayout{phase, S.slice_bytes[t], h.page_bytes, h.n_expert});
        }
    }
    return shape;
}

std::unique_ptr<EvictionPolicy> make_replay_policy(ReplayPolicy p) {
    switch (p) {
        case ReplayPolicy::kLfu:
            return make_lfu_policy();
        case ReplayPolicy::kBelady:
            return make_belady_policy();
        case ReplayPolicy::kLru:
            break;
    }
    return make_lru_policy();
}

std::unique_ptr<ExpertLedger> make_replay_ledger(const TraceHeader & h, ReplayPolicy p,
                                                 uint64_t budget_bytes, uint32_t slots_per_layer) {
    LedgerShape shape = replay_ledger_shape(h);
    shape.slots_per_layer = slots_per_layer;
    shape.shared = budget_bytes == 0 && slots_per_layer == 0;
    return std::make_unique<ExpertLedger>(shape, budget_bytes, make_replay_policy(p),
                                          /*backend=*/nullptr);
}

namespace {

constexpr uint32_t kNever = EvictionPolicy::kNever;

bool all_finite(const float * w, uint32_t n) {
    for (uint32_t j = 0; j < n; ++j)
        if (!std::isfinite(w[j])) return false;
    return true;
}

}  // namespace

Replayer::Replayer(const RouteTrace & trace) : t_(trace) {}

ReplaySetting Replayer::recorded_setting() const {
    ReplaySetting s;
    s.policy = ReplayPolicy::kLru;
    s.budget_bytes = t_.header.cache_budget_bytes;
    s.drop_cold = t_.header.drop_cold;
    s.drop_in_prefill = t_.header.drop_in_prefill;
    s.k = t_.header.k;
    if (t_.header.scores) s.substitute = t_.header.substitute;
    s.slots_per_layer = t_.header.slots_per_layer;
    s.slot_warm = t_.header.slot_warm;
    return s;
}

const std::vector<uint32_t> & Replayer::next_use(uint32_t k) {
    if (next_use_.size() <= k) next_use_.resize(size_t(k) + 1);
    std::vector<uint32_t> & nu = next_use_[k];
    if (!nu.empty() || t_.expert.empty()) return nu;
    const TraceHeader & h = t_.header;
    const uint32_t kk = h.k;
    nu.assign(t_.expert.size(), kNever);
    std::vector<uint32_t> last(size_t(h.moe_layers.size()) * h.n_expert, kNever);
    for (size_t i = t_.routings.size(); i-- > 0;) {
        const TraceRouting & r = t_.routings[i];
        const size_t base = size_t(r.moe_idx) * h.n_expert;
        for (uint32_t row = 0; row < r.n_rows; ++row)
            for (uint32_t j = 0; j < k; ++j) {
                const uint64_t s = r.first_slot + uint64_t(row) * kk + j;
                nu[s] = last[base + size_t(t_.expert[s])];
            }
        for (uint32_t row = 0; row < r.n_rows; ++row)
            for (uint32_t j = 0; j < k; ++j) {
                const uint64_t s = r.first_slot + uint64_t(row) * kk + j;
                last[base + size_t(t_.expert[s])] = uint32_t(i);
            }
    }
    return nu;
}

Status Replayer::run(const ReplaySetting & s, ReplayResult * out, ValidateReport * v) {
    const TraceHeader & h = t_.header;
    const uint32_t kk = h.k;
    const uint32_t K = s.k ? s.k : kk;
    if (K > kk)
        return Status::Usage("--n-expert-used " + std::to_string(K) +
                             " is more than the trace's k (" + std::to_string(kk) +
                             "): a trace only knows the experts it routed");
    if (!(s.drop_cold >= 0 && s.drop_cold <= 1))
        return Status::Usage("--drop-cold must be in [0, 1]");
    *out = ReplayResult{};
    out->setting = s;
    out->setting.k = K;
    if (v) *v = ValidateReport{};

    const uint32_t n_slots = s.slots_per_layer;
    if (n_slots > h.n_expert)
        return Status::Usage("fixed slots: " + std::to_string(n_slots) + " slots per layer, " +
                             "more than the trace's " + std::to_string(h.n_expert) + " experts");
    if (n_slots > 0 && s.policy != ReplayPolicy::kLru)
        return Status::Usage(std::string("--policy ") + policy_name(s.policy) +
                             " cannot replay the fixed-slot cache (it evicts a layer's least "
                             "recently used slot)");
    if (n_slots > 0 && s.fallback_w > 0)
        return Status::Usage("--miss-fallback cannot replay the fixed-slot cache (the engine "
                             "runs it on the LRU cache only)");
    // Cache off (budget 0): the shared slots' ledger (shared mode): every routed expert is
    // read but what the recorded read-ahead calls committed.
    const std::unique_ptr<ExpertLedger> ledger = make_replay_ledger(
        h, s.policy, n_slots > 0 ? std::max<uint64_t>(s.budget_bytes, 1) : s.budget_bytes, n_slots);
    const bool keeps = !ledger->shared();  // a store that keeps experts between routings
    // Fixed slots: the shared slots a routing wider than the slots is read into (the ledger
    // in shared mode, as with the cache off; SlotCache's bank), with their read-ahead.
    const std::unique_ptr<ExpertLedger> bank =
        n_slots > 0 ? make_replay_ledger(h, ReplayPolicy::kLru, 0, 0) : nullptr;
    // Fixed slots: per routing, whether it is in the last ubatch of a graph that ends the
    // prompt (from that graph's last routing of the first MoE layer on), where the engine's
    // warm start fills the slots (SlotRewriter).
    std::vector<uint8_t> last_ubatch(n_slots > 0 && s.slot_warm ? t_.routings.size() : 0, 0);
    {
        bool seen_first = false;
        uint32_t g = kNever;
        for (size_t i = last_ubatch.size(); i-- > 0;) {
            const TraceRouting & r = t_.routings[i];
            if (r.graph != g) {
                g = r.graph;
                seen_first = false;
            }
            last_ubatch[i] = r.prompt_end && !seen_first;
            if (r.moe_idx == 0) seen_first = true;
        }
    }
    std::vector<uint32_t> warm_list;
    // What the policies see (the store's is_resident: the fixed slots only, whatever the
    // routing's width), and what the stage of a routing finds (a hit): on the fixed slots, a
    // wide routing hits only what was read ahead into the shared slots.
    auto resident = [&](uint32_t moe, uint32_t e) { return ledger->would_hit(moe, e); };
    auto hit = [&](bool wide, uint32_t moe, uint32_t e) {
        return wide ? bank->would_hit(moe, e) : ledger->would_hit(moe, e);
    };
    const uint32_t * nu = s.policy == ReplayPolicy::kBelady ? next_use(K).data() : nullptr;

    DropColdConfig cfg;
    cfg.frac = s.drop_cold;
    cfg.in_prefill = s.drop_in_prefill;
    std::vector<int32_t> ids, pre(K);
    std::vector<float> w(K);
    std::vector<uint8_t> dropped, seen(h.n_expert, 0);
    std::vector<uint32_t> experts, nu_of(h.n_expert, kNever);
    DropCounters dc;
    uint32_t last_decode_graph = kNever;
    const bool fallback = s.fallback_w > 0;
    if (fallback && s.fallback_expert_bytes.size() != h.moe_layers.size())
        return Status::Usage("--miss-fallback: the companion has " +
                             std::to_string(s.fallback_expert_bytes.size()) +
                             " MoE layers, the trace " + std::to_string(h.moe_layers.size()));
    if (fallback && s.drop_cold > 0)
        return Status::Usage("--miss-fallback cannot be combined with --drop-cold");
    std::vector<uint8_t> lossy(fallback ? h.moe_layers.size() * h.n_expert : 0, 0);
    std::vector<uint8_t> fb_slot, is_fb(h.n_expert, 0);
    const bool subst = s.substitute > 0;
    if (subst && !h.scores)
        return Status::Usage("--substitute-experts needs a trace with the router scores "
                             "(recorded with --route-trace-scores)");
    // With drop-cold only as recorded: the trace's final weights are those of the recorded
    // substitutes, which the replay reproduces (validate checks it) only for that setting.
    const bool recorded_drop = s.drop_cold == h.drop_cold && s.substitute == h.substitute;
    if (subst && ((s.drop_cold > 0 && !recorded_drop) || fallback))
        return Status::Usage(std::string("--substitute-experts cannot be replayed with ") +
                             (fallback ? "--miss-fallback (each decides what a miss becomes)"
                                       : "--drop-cold (the final weights of a substitute are "
                                         "not in the trace)"));
    // Whether the recorded slots are the replay's slots: a trace's substituted slots are
    // replayed from the router's order, as the engine's decision against the simulated cache.
    const bool from_order = h.scores && (subst || h.substitute > 0);
    if (from_order && s.policy == ReplayPolicy::kBelady)
        return Status::Usage("--policy belady cannot replay substitution (the next use of an "
                             "expert the substitution changes is not in the trace)");
    std::vector<int32_t> sorted(h.n_expert);
    std::vector<uint8_t> sub_slot;
    SubstituteCounters sc;
    size_t ra = 0;  // the next read-ahead call (t_.read_aheads)
    std::vector<uint32_t> ra_list;

    for (size_t i = 0; i < t_.routings.size(); ++i) {
        const TraceRouting & r = t_.routings[i];
        const uint32_t moe = r.moe_idx;
        const bool decode = r.decode != 0;
        if (decode && r.graph != last_decode_graph) {
            ++out->decode_tokens;
            last_decode_graph = r.graph;
        }
        const bool policy = cfg.frac > 0 && (decode || cfg.in_prefill);
        const size_t n = size_t(r.n_rows) * K;
        ids.resize(n);
        dropped.assign(n, 0);
        fb_slot.assign(fallback ? n : 0, 0);
        sub_slot.assign(n, 0);
        const bool scored = from_order && decode && r.score_rows == r.n_rows;
        for (uint32_t row = 0; row < r.n_rows; ++row) {
            const uint64_t src = r.first_slot + uint64_t(row) * kk;
            int32_t * rid = ids.data() + size_t(row) * K;
            for (uint32_t j = 0; j < K; ++j) rid[j] = t_.expert[src + j];
            const float * rw = t_.weight.data() + src;
            const bool known = all_finite(rw, kk);
            if (scored) {  // the router's order, as routed; then the engine's substitution
                const size_t at = size_t(r.first_score_row + row) * h.n_expert;
                const uint16_t * ord = t_.score_order.data() + at;
                const float * sco = t_.scores.data() + at;
                for (uint32_t q = 0; q < h.n_expert; ++q) sorted[q] = ord[q];
                for (uint32_t j = 0; j < K; ++j) rid[j] = sorted[j];
                const uint64_t before = sc.substituted;
                substitute_row(
                    int(K), int(h.n_expert), sorted.data(), rid, 1,
                    [&](int32_t e) { return sco[e]; }, s.substitute,
                    [&](int32_t e) { return resident(moe, uint32_t(e)); },
                    sub_slot.data() + size_t(row) * K, &sc);
                out->substitutions += sc.substituted - before;
                if (known)
                    for (uint32_t j = 0; j < K; ++j)
                        if (sub_slot[size_t(row) * K + j]) out->weight_substituted += rw[j];
            }
            if (decode) {
                if (known) {
                    out->slots_total += kk;
                    out->slots_cut += kk - K;
                    for (uint32_t j = 0; j < kk; ++j) {
                        out->weight_total += rw[j];
                        if (j >= K) out->weight_cut += rw[j];
                    }
                } else {
                    ++out->rows_weight_unknown;
                }
            }
            if (fallback && decode && known)
                fallback_row(
                    int(K), rid, 1, rw, 1, s.fallback_w,
                    [&](int32_t e) {
                        return !resident(moe, uint32_t(e)) ||
                               lossy[size_t(moe) * h.n_expert + size_t(e)];
                    },
                    fb_slot.data() + size_t(row) * K);
            // The engine drops only where it observed the weights (docs/route-trace.md).
            if (policy && known) {
                std::copy(rw, rw + K, w.begin());
                std::copy(rid, rid + K, pre.begin());
                const uint64_t before = dc.dropped;
                const double wd_before = dc.weight_dropped;
                drop_cold_row(
                    int(K), rid, 1, w.data(), 1, int(K), cfg,
                    [&](int32_t e) { return resident(moe, uint32_t(e)); }, &dc);
                for (uint32_t j = 0; j < K; ++j)
                    if (rid[j] != pre[j]) dropped[size_t(row) * K + j] = 1;
                if (decode) {
                    out->slots_dropped += dc.dropped - before;
                    out->weight_dropped += dc.weight_dropped - wd_before;
                }
            }
        }
        // Distinct staged experts in first-seen order (Streamer::on_routing).
        experts.clear();
        for (size_t j = 0; j < n; ++j) {
            const uint32_t e = uint32_t(ids[j]);
            if (!seen[e]) {
                seen[e] = 1;
                experts.push_back(e);
            }
        }
        for (uint32_t e : experts) seen[e] = 0;
        // Fixed slots: wider than the slots, the routing is read into the shared slots.
        const bool wide = n_slots > 0 && experts.size() > n_slots;
        if (v && h.version < 9 && h.slots_per_layer > 0 &&
            experts.size() > h.slots_per_layer)
            return Status::Usage(
                "routing #" + std::to_string(i) + " at offset " + std::to_string(r.offset) +
                " is wider than the recorded fixed slots (" + std::to_string(experts.size()) +
                " experts, " + std::to_string(h.slots_per_layer) +
                " slots per layer): trace format version " + std::to_string(h.version) +
                " flags such a routing's experts by whether they held a slot, not by what the "
                "shared slots it was read into held; --validate needs version 9 (record the "
                "trace again)");
        if (nu)
            for (uint32_t row = 0; row < r.n_rows; ++row)
                for (uint32_t j = 0; j < K; ++j)
                    if (!dropped[size_t(row) * K + j]) {
                        const uint64_t src = r.first_slot + uint64_t(row) * kk + j;
                        nu_of[uint32_t(t_.expert[src])] = nu[src];
                    }

        if (v) {  // residency before the stage, slot by slot, against the record
            for (uint32_t row = 0; row < r.n_rows; ++row)
                for (uint32_t j = 0; j < K; ++j) {
                    const uint64_t src = r.first_slot + uint64_t(row) * kk + j;
                    // Without the scores a substitute is replayed as the resident expert
                    // it was; with them the substitution itself is replayed.
                    const uint8_t rec =
                        uint8_t(t_.flags[src] & (scored ? 0xFF : ~kSlotSubstituted));
                    const size_t slot = size_t(row) * K + j;
                    const uint8_t got = dropped[slot] ? kSlotDropped
                                        : sub_slot[slot]
                                            ? uint8_t(kSlotResident | kSlotSubstituted)
                                        : (hit(wide, moe, uint32_t(ids[slot])) ? kSlotResident : 0);
                    ++v->slots_checked;
                    v->recorded_substitutions += (t_.flags[src] & kSlotSubstituted) ? 1 : 0;
                    v->replay_substitutions += sub_slot[slot];
                    if (rec != got || (!dropped[slot] && ids[slot] != t_.expert[src])) {
                        ++v->mismatches;
                        if (v->ok) {
                            auto name = [](uint8_t f) {
                                return std::string(f & kSlotDropped       ? "dropped"
                                                   : f & kSlotSubstituted ? "substituted"
                                                   : f & kSlotResident    ? "hit"
                                                                          : "miss");
                            };
                            v->first_mismatch =
                                "routing #" + std::to_string(i) + " at offset " +
                                std::to_string(r.offset) + " (layer " + std::to_string(r.layer) +
                                ", graph " + std::to_string(r.graph) + ", position " +
                                std::to_string(r.pos + row) + "), slot " + std::to_string(j) +
                                " expert " + std::to_string(t_.expert[src]) + ": recorded " +
                                name(rec) + ", replay " + name(got) +
                                (!dropped[slot] && ids[slot] != t_.expert[src]
                                     ? " of expert " + std::to_string(ids[slot])
                                     : "");
                        }
                        v->ok = false;
                    }
                }
            // Recorded lookups: one per distinct non-dropped expert (the first slot naming it).
            for (size_t j = 0; j < n; ++j) {
                const uint64_t src = r.first_slot + uint64_t(j / K) * kk + j % K;
                const uint8_t rec = t_.flags[src];
                if (rec & kSlotDropped) {
                    ++v->recorded_drops;
                    continue;
                }
                const uint32_t e = uint32_t(t_.expert[src]);
                if (seen[e]) continue;
                seen[e] = 1;
                ++(rec & kSlotResident ? v->recorded_hits : v->recorded_misses);
            }
            for (size_t j = 0; j < n; ++j) {
                seen[uint32_t(t_.expert[r.first_slot + uint64_t(j / K) * kk + j % K])] = 0;
                v->replay_drops += dropped[j];
            }
        }

        // --miss-fallback: an expert is low-bit when every slot naming it is (as the streamer
        // decides); a lossy copy routed at full weight is forgotten and read again.
        if (fallback) {
            for (size_t j = 0; j < n; ++j) {
                const uint32_t e = uint32_t(ids[j]);
                is_fb[e] = (seen[e] ? is_fb[e] : uint8_t(1)) & fb_slot[j];
                seen[e] = 1;
            }
            for (uint32_t e : experts) {
                seen[e] = 0;
                uint8_t & l = lossy[size_t(moe) * h.n_expert + e];
                if (!is_fb[e] && l) {
                    l = 0;
                    if (keeps) ledger->forget(moe, e);
                }
            }
        }
        StageStats ss;
        if (wide) {  // the shared slots; the fixed slots keep their experts and stamps
            Status st = bank->stage(moe, experts, nullptr, &ss);
            if (!st.ok()) return st;
            if (!last_ubatch.empty() && last_ubatch[i]) {
                // The warm start: the experts of the ubatch's last tokens, most recent first,
                // up to the slots; made resident oldest first (SlotCache::warm_slots).
                warm_list.clear();
                for (uint32_t row = r.n_rows; row-- > 0 && warm_list.size() < n_slots;)
                    for (uint32_t j = 0; j < K && warm_list.size() < n_slots; ++j) {
                        const uint32_t e = uint32_t(ids[size_t(row) * K + j]);
                        if (seen[e]) continue;
                        seen[e] = 1;
                        warm_list.push_back(e);
                    }
                for (uint32_t e : warm_list) seen[e] = 0;
                for (size_t q = warm_list.size(); q-- > 0;)
                    if (ledger->warm(moe, warm_list[q]) == -2) break;
            }
        } else {
            Status st = ledger->stage(moe, experts, nu ? nu_of.data() : nullptr, &ss);
            if (!st.ok()) return st;
        }
        // The read-ahead calls made after this routing's stage, as recorded (on the fixed
        // slots, a wide guess's into the shared slots).
        uint64_t ahead = 0;
        for (; ra < t_.read_aheads.size() && t_.read_aheads[ra].routing <= i; ++ra) {
            const TraceReadAhead & a = t_.read_aheads[ra];
            const bool into_bank = n_slots > 0 && (a.flags & kReadAheadShared);
            ExpertLedger & into = into_bank ? *bank : *ledger;
            ra_list.clear();
            for (uint64_t q = a.first; q < a.first + a.n; ++q)
                ra_list.push_back(t_.read_ahead_experts[q] & ~kReadAheadCommitted);
            const size_t got = n_slots > 0 && !into_bank
                                   ? into.prefetch_slots(a.moe_idx, ra_list,
                                                         a.flags & kReadAheadOneToken)
                                   : into.prefetch(a.moe_idx, ra_list);
            // The same experts committed: each recorded one is among the replay's.
            size_t same = 0;
            if (v)
                for (uint32_t e : into.prefetching())
                    for (uint64_t q = a.first; q < a.first + a.n; ++q)
                        same += t_.read_ahead_experts[q] == (e | kReadAheadCommitted);
            into.end_prefetch(a.flags & kReadAheadOk);
            ahead += got * h.moe_layers[a.moe_idx].expert_bytes;
            if (!v) continue;
            ++v->read_aheads;
            v->recorded_read_ahead += a.committed;
            v->replay_read_ahead += got;
            const bool differs = got != a.committed || same != a.committed;
            if (differs && v->ok) {
                v->first_mismatch = "read-ahead after routing #" + std::to_string(i) +
                                    " at offset " + std::to_string(a.offset) + " (layer " +
                                    std::to_string(a.layer) + "): recorded " +
                                    std::to_string(a.committed) + " experts committed, replay " +
                                    std::to_string(got) + " (" + std::to_string(same) +
                                    " of them the recorded ones)";
                v->ok = false;
            }
            if (differs) ++v->mismatches;
        }
        out->bytes_read += ahead;
        if (decode) out->decode_bytes_read += ahead;
        const uint64_t hits = ss.hits, misses = ss.misses;
        out->lookups += ss.lookups;
        const uint64_t eb = h.moe_layers[moe].expert_bytes;
        uint64_t read = misses * eb;
        if (fallback) {  // the misses (staged now) that are low-bit read the companion
            const std::vector<uint32_t> & miss_list = ledger->staged();
            const uint64_t lo = s.fallback_expert_bytes[moe];
            for (uint32_t e : miss_list) {
                if (!is_fb[e]) continue;
                read -= eb - lo;
                ++out->fallbacks;
                out->fallback_bytes_saved += eb - lo;
                if (keeps) lossy[size_t(moe) * h.n_expert + e] = 1;
            }
            for (uint32_t e : experts) is_fb[e] = 0;
        }
        out->routings += 1;
        out->hits += hits;
        out->misses += misses;
        out->bytes_read += read;
        if (decode) {
            out->decode_lookups += hits + misses;
            out->decode_hits += hits;
            out->decode_misses += misses;
            out->decode_bytes_read += read;
        }
        if (v) {
            v->replay_hits += hits;
            v->replay_misses += misses;
        }
    }
    if (keeps) {
        const LedgerStats ls = ledger->stats();
        out->evictions = ls.evictions;
        out->rereads = ls.rereads;
        out->over_budget_stages = ls.over_budget_stages;
        out->peak_committed_bytes = ls.peak_resident_bytes;
    }
    out->decode_hit_pct =
        out->decode_lookups ? 100.0 * double(out->decode_hits) / double(out->decode_lookups) : 0;
    out->bytes_per_token =
        out->decode_tokens ? double(out->decode_bytes_read) / double(out->decode_tokens) : 0;
    out->substitute_score_lost = sc.score_lost;
    out->weight_mass_discarded =
        out->weight_total > 0
            ? (out->weight_cut + out->weight_dropped + out->weight_substituted) / out->weight_total
            : 0;
    if (v && (v->recorded_hits != v->replay_hits || v->recorded_misses != v->replay_misses ||
              v->recorded_drops != v->replay_drops ||
              (from_order && v->recorded_substitutions != v->replay_substitutions))) {
        if (v->ok)
            v->first_mismatch = "totals differ: recorded " + std::to_string(v->recorded_hits) +
                                " hits / " + std::to_string(v->recorded_misses) + " misses / " +
                                std::to_string(v->recorded_drops) + " drops / " +
                                std::to_string(v->recorded_substitutions) +
                                " substitutions, replay " + std::to_string(v->replay_hits) +
                                " / " + std::to_string(v->replay_misses) + " / " +
                                std::to_string(v->replay_drops) + " / " +
                                std::to_string(v->replay_substitutions);
        v->ok = false;
    }
    return Status::Ok();
}

}  // namespace moestream
