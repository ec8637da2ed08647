// replay.cpp — the offline cache simulator behind `moestream replay` (see replay.h).
//
// CacheSim mirrors LruCache in residency_cache.cpp decision for decision, without memory:
// states absent / pending / resident, pending promoted at the next stage, lookups deduplicated
// per stage, hits moved to the MRU end, misses evicting (never an expert routed in the layer
// being staged) until committing them fits the budget, commit and release costs counted in
// pages with boundary pages shared between neighbouring live experts of a tensor, or, when
// the cache recycled pool chunks (TraceHeader::cache_chunks), in whole chunks per live expert
// (both use page_layout.h for that arithmetic). Any other change
// to the engine's cache must be made here too; `moestream replay --validate` and the
// CacheSimMatchesLruCache test catch a divergence.
#include "moestream/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "page_layout.h"
#include "policy_drop_cold.h"

namespace moestream {

const char * policy_name(ReplayPolicy p) {
    switch (p) {
        case ReplayPolicy::kLru:
            return "lru";
        case ReplayPolicy::kLfu:
            return "lfu";
        case ReplayPolicy::kBelady:
            return "belady";
    }
    return "?";
}

bool parse_policy(const std::string & s, ReplayPolicy * out) {
    if (s == "lru")
        *out = ReplayPolicy::kLru;
    else if (s == "lfu")
        *out = ReplayPolicy::kLfu;
    else if (s == "belady")
        *out = ReplayPolicy::kBelady;
    else
        return false;
    return true;
}

namespace {

enum : uint8_t { kAbsent = 0, kPending = 1, kResident = 2 };
constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();

class CacheSim {
public:
    CacheSim(const TraceHeader & h, ReplayPolicy pol, uint64_t budget)
        : pol_(pol), budget_(budget), page_(h.page_bytes) {
        layers_.resize(h.moe_layers.size());
        for (size_t i = 0; i < h.moe_layers.size(); ++i) {
            Layer & L = layers_[i];
            L.first_id = n_ids_;
            L.n = h.n_expert;
            L.aligned = true;
            L.aligned_cost = 0;
            const TraceLayerShape & S = h.moe_layers[i];
            for (size_t t = 0; t < S.slice_bytes.size(); ++t) {
                const uint64_t phase = t < S.phase_bytes.size() ? S.phase_bytes[t] : 0;
                L.tensors.push_back(PageLayout{phase, S.slice_bytes[t], page_, h.n_expert});
                if (h.cache_chunks) {  // recycled pages: whole pool chunks per live expert
                    L.aligned_cost += L.tensors.back().chunk_pages() * page_;
                    continue;
                }
                if (!L.tensors.back().page_exclusive()) L.aligned = false;
                L.aligned_cost += S.slice_bytes[t];  // exclusive slices own whole pages
            }
            n_ids_ += h.n_expert;
        }
        if (budget_ == 0) return;
        state_.assign(n_ids_, kAbsent);
        ever_.assign(n_ids_, 0);
        stamp_.assign(n_ids_, 0);
        done_.assign(n_ids_, 0);
        id_layer_.resize(n_ids_);
        for (size_t i = 0; i < layers_.size(); ++i)
            for (uint32_t e = 0; e < layers_[i].n; ++e)
                id_layer_[layers_[i].first_id + e] = uint32_t(i);
        prev_.assign(size_t(n_ids_) + 1, n_ids_);
        next_.assign(size_t(n_ids_) + 1, n_ids_);
        if (pol_ != ReplayPolicy::kLru) {
            key_.assign(n_ids_, 0);
            last_.assign(n_ids_, 0);
            ver_.assign(n_ids_, 0);
            freq_.assign(n_ids_, 0);
        }
    }

    bool is_resident(uint32_t moe, uint32_t e) const {
        return budget_ > 0 && state_[layers_[moe].first_id + e] != kAbsent;
    }

    // Stages the distinct `experts` of MoE layer `moe`; next_use[e] is used by belady.
    void stage(uint32_t moe, const std::vector<uint32_t> & experts, const uint32_t * next_use,
               ReplayResult * r, uint64_t * hits, uint64_t * misses) {
        if (budget_ == 0) {  // cache off: shared slots, every routed expert is read
            r->lookups += experts.size();
            *misses += experts.size();
            return;
        }
        for (uint32_t id : pending_) {
            state_[id] = kResident;
            ever_[id] = 1;
        }
        pending_.clear();
        ++gen_;
        const uint32_t base = layers_[moe].first_id;
        for (uint32_t e : experts) stamp_[base + e] = gen_;
        for (uint32_t e : experts) {
            const uint32_t id = base + e;
            if (done_[id] == gen_) continue;
            done_[id] = gen_;
            ++r->lookups;
            if (state_[id] == kResident) {
                ++*hits;
                touch(id, next_use ? next_use[e] : 0, false);
                continue;
            }
            ++*misses;
            while (committed_ + excl_bytes(moe, e) > budget_ && evict_one(moe)) {
            }
            committed_ += excl_bytes(moe, e);
            r->peak_committed_bytes = std::max(r->peak_committed_bytes, committed_);
            if (ever_[id]) ++r->rereads;
            pending_.push_back(id);
            state_[id] = kPending;
            ++live_;
            touch(id, next_use ? next_use[e] : 0, true);
        }
        if (committed_ > budget_) ++r->over_budget_stages;
        for (uint32_t id : deferred_) push({pack(id), id, ver_[id]});
        deferred_.clear();
    }

private:
    struct Layer {
        uint32_t first_id = 0, n = 0;
        std::vector<PageLayout> tensors;  // per projection: page placement (page_layout.h)
        bool aligned = true;
        uint64_t aligned_cost = 0;
    };
    // Heap entry: key = primary << 32 | last use (both < 2^32: routing counts and stage
    // generations of one trace), smallest first; ties by id.
    struct Entry {
        uint64_t key;
        uint32_t id, ver;
        bool operator>(const Entry & o) const { return key != o.key ? key > o.key : id > o.id; }
    };

    // Bytes of the pages of expert e (over all projections) that no OTHER live expert covers:
    // what committing it adds (absent now) or releasing it frees (live now). residency_cache's
    // commit_cost / exclusive_range: the same PageLayout functions.
    uint64_t excl_bytes(uint32_t moe, uint32_t e) const {
        const Layer & L = layers_[moe];
        if (L.aligned) return L.aligned_cost;
        uint64_t total = 0;
        for (const PageLayout & T : L.tensors) {
            uint64_t q0, q1;
            T.exclusive_pages(
                e, [&](uint32_t x) { return state_[L.first_id + x] != kAbsent; }, &q0, &q1);
            total += (q1 - q0) * page_;
        }
        return total;
    }

    void lru_unlink(uint32_t id) {
        next_[prev_[id]] = next_[id];
        prev_[next_[id]] = prev_[id];
    }
    void lru_push_front(uint32_t id) {
        const uint32_t s = n_ids_;
        next_[id] = next_[s];
        prev_[id] = s;
        prev_[next_[s]] = id;
        next_[s] = id;
    }

    // A routing of a live expert (hit) or its admission (miss).
    void touch(uint32_t id, uint32_t next_use, bool admitted) {
        if (pol_ == ReplayPolicy::kLru) {
            if (!admitted) lru_unlink(id);
            lru_push_front(id);
            return;
        }
        last_[id] = gen_;
        if (pol_ == ReplayPolicy::kLfu) {
            ++freq_[id];
            key_[id] = freq_[id];  // lowest count first
        } else {
            key_[id] = uint64_t(kNever) - next_use;  // farthest next use first
        }
        ++ver_[id];               // its old heap entry is stale now
        deferred_.push_back(id);  // pushed after the stage's evictions: it is pinned until then
    }

    uint64_t pack(uint32_t id) const { return key_[id] << 32 | (last_[id] & 0xFFFFFFFFu); }

    void push(const Entry & en) {
        heap_.push_back(en);
        std::push_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
        if (heap_.size() > 4 * live_ + 4096) rebuild();
    }
    void rebuild() {
        heap_.clear();
        for (uint32_t id = 0; id < n_ids_; ++id)
            if (state_[id] != kAbsent) heap_.push_back({pack(id), id, ver_[id]});
        std::make_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
    }

    void release(uint32_t id) {
        const uint32_t L = id_layer_[id];
        committed_ -= excl_bytes(L, id - layers_[L].first_id);
        state_[id] = kAbsent;
        if (pol_ == ReplayPolicy::kLru)
            lru_unlink(id);
        else
            ++ver_[id];
        --live_;
    }

    bool evict_one(uint32_t moe) {
        if (pol_ == ReplayPolicy::kLru) {
            for (uint32_t id = prev_[n_ids_]; id != n_ids_; id = prev_[id]) {
                if (id_layer_[id] == moe && stamp_[id] == gen_) continue;  // routed now
                release(id);
                ++*evictions_out_;
                return true;
            }
            return false;
        }
        stash_.clear();
        bool found = false;
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
            const Entry en = heap_.back();
            heap_.pop_back();
            if (state_[en.id] == kAbsent || en.ver != ver_[en.id]) continue;  // stale
            if (id_layer_[en.id] == moe && stamp_[en.id] == gen_) {
                stash_.push_back(en);  // routed now: never a victim
                continue;
            }
            release(en.id);
            ++*evictions_out_;
            found = true;
            break;
        }
        for (const Entry & en : stash_) {
            heap_.push_back(en);
            std::push_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
        }
        return found;
    }

public:
    void set_eviction_counter(uint64_t * c) { evictions_out_ = c; }

private:
    ReplayPolicy pol_;
    uint64_t budget_, page_;
    std::vector<Layer> layers_;
    uint32_t n_ids_ = 0;
    std::vector<uint8_t> state_, ever_;
    std::vector<uint64_t> stamp_, done_;
    std::vector<uint32_t> prev_, next_, id_layer_;
    uint64_t gen_ = 0, committed_ = 0, live_ = 0;
    std::vector<uint32_t> pending_;
    // lfu / belady
    std::vector<uint64_t> key_, last_, freq_;
    std::vector<uint32_t> ver_;
    std::vector<Entry> heap_, stash_;
    std::vector<uint32_t> deferred_;  // touched in this stage, not yet in the heap
    uint64_t evictions_ = 0;
    uint64_t * evictions_out_ = &evictions_;
};

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

    CacheSim sim(h, s.policy, s.budget_bytes);
    sim.set_eviction_counter(&out->evictions);
    const uint32_t * nu = s.policy == ReplayPolicy::kBelady ? next_use(K).data() : nullptr;

    DropColdConfig cfg;
    cfg.frac = s.drop_cold;
    cfg.in_prefill = s.drop_in_prefill;
    std::vector<int32_t> ids;
    std::vector<float> w(K);
    std::vector<uint8_t> dropped, seen(h.n_expert, 0);
    std::vector<uint32_t> experts, nu_of(h.n_expert, kNever);
    DropCounters dc;
    uint32_t last_decode_graph = kNever;

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
        for (uint32_t row = 0; row < r.n_rows; ++row) {
            const uint64_t src = r.first_slot + uint64_t(row) * kk;
            int32_t * rid = ids.data() + size_t(row) * K;
            for (uint32_t j = 0; j < K; ++j) rid[j] = t_.expert[src + j];
            const float * rw = t_.weight.data() + src;
            const bool known = all_finite(rw, kk);
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
            // The engine drops only where it observed the weights (docs/route-trace.md).
            if (policy && known) {
                std::copy(rw, rw + K, w.begin());
                const uint64_t before = dc.dropped;
                const double wd_before = dc.weight_dropped;
                drop_cold_row(
                    int(K), rid, 1, w.data(), 1, int(K), cfg,
                    [&](int32_t e) { return sim.is_resident(moe, uint32_t(e)); }, &dc);
                for (uint32_t j = 0; j < K; ++j)
                    if (rid[j] != t_.expert[src + j]) dropped[size_t(row) * K + j] = 1;
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
                    const uint8_t rec = t_.flags[src];
                    const bool d = dropped[size_t(row) * K + j];
                    const uint8_t got =
                        d ? kSlotDropped
                          : (sim.is_resident(moe, uint32_t(t_.expert[src])) ? kSlotResident : 0);
                    ++v->slots_checked;
                    if (rec != got) {
                        ++v->mismatches;
                        if (v->ok) {
                            auto name = [](uint8_t f) {
                                return std::string(f & kSlotDropped    ? "dropped"
                                                   : f & kSlotResident ? "hit"
                                                                       : "miss");
                            };
                            v->first_mismatch =
                                "routing #" + std::to_string(i) + " at offset " +
                                std::to_string(r.offset) + " (layer " + std::to_string(r.layer) +
                                ", graph " + std::to_string(r.graph) + ", position " +
                                std::to_string(r.pos + row) + "), slot " + std::to_string(j) +
                                " expert " + std::to_string(t_.expert[src]) + ": recorded " +
                                name(rec) + ", replay " + name(got);
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

        uint64_t hits = 0, misses = 0;
        sim.stage(moe, experts, nu ? nu_of.data() : nullptr, out, &hits, &misses);
        const uint64_t eb = h.moe_layers[moe].expert_bytes;
        out->routings += 1;
        out->hits += hits;
        out->misses += misses;
        out->bytes_read += misses * eb;
        if (decode) {
            out->decode_lookups += hits + misses;
            out->decode_hits += hits;
            out->decode_misses += misses;
            out->decode_bytes_read += misses * eb;
        }
        if (v) {
            v->replay_hits += hits;
            v->replay_misses += misses;
        }
    }
    out->decode_hit_pct =
        out->decode_lookups ? 100.0 * double(out->decode_hits) / double(out->decode_lookups) : 0;
    out->bytes_per_token =
        out->decode_tokens ? double(out->decode_bytes_read) / double(out->decode_tokens) : 0;
    out->weight_mass_discarded =
        out->weight_total > 0 ? (out->weight_cut + out->weight_dropped) / out->weight_total : 0;
    if (v && (v->recorded_hits != v->replay_hits || v->recorded_misses != v->replay_misses ||
              v->recorded_drops != v->replay_drops)) {
        if (v->ok)
            v->first_mismatch = "totals differ: recorded " + std::to_string(v->recorded_hits) +
                                " hits / " + std::to_string(v->recorded_misses) + " misses / " +
                                std::to_string(v->recorded_drops) + " drops, replay " +
                                std::to_string(v->replay_hits) + " / " +
                                std::to_string(v->replay_misses) + " / " +
                                std::to_string(v->replay_drops);
        v->ok = false;
    }
    return Status::Ok();
}

}  // namespace moestream
