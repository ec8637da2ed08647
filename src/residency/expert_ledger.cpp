// expert_ledger.cpp — ExpertLedger (see expert_ledger.h).
#include "expert_ledger.h"

#include <algorithm>
#include <cerrno>
#include <string>

namespace moestream {

namespace {

bool refused(int err) {
    return err == ENOMEM || err == EAGAIN;
}

}  // namespace

ExpertLedger::ExpertLedger(const LedgerShape & shape, uint64_t budget_bytes,
                           std::unique_ptr<EvictionPolicy> policy, LedgerBackend * backend)
    : policy_(std::move(policy)),
      backend_(backend),
      budget_(shape.shared ? UINT64_MAX : budget_bytes),  // shared mode: no budget
      shared_(shape.shared),
      page_bytes_(shape.page_bytes) {
    layers_.resize(shape.layers.size());
    uint32_t max_expert = 0;
    for (size_t i = 0; i < shape.layers.size(); ++i) {
        Layer & L = layers_[i];
        L.tensors = shape.layers[i];
        L.n_expert = L.tensors.empty() ? 0 : L.tensors[0].n_expert;
        L.first_id = n_ids_;
        n_ids_ += L.n_expert;
        max_expert = std::max(max_expert, L.n_expert);
        // Whole chunks, or slices that own whole pages: the cost does not depend on the
        // neighbours.
        L.fixed_cost = true;
        for (const PageLayout & T : L.tensors) {
            if (shape.whole_chunks) {
                L.fixed_bytes += T.chunk_pages() * T.page_bytes;
                continue;
            }
            if (!T.page_exclusive()) L.fixed_cost = false;
            L.fixed_bytes += T.slice_bytes;
        }
    }
    k_slots_ = shape.slots_per_layer;
    if (k_slots_ > 0 || shared_) {  // a slot holds an expert's slices: its cost is their bytes
        for (Layer & L : layers_) {
            L.fixed_cost = true;
            L.fixed_bytes = 0;
            for (const PageLayout & T : L.tensors) L.fixed_bytes += T.slice_bytes;
        }
    }
    if (k_slots_ > 0) {
        occupant_.assign(layers_.size() * k_slots_, -1);
        slot_stamp_.assign(layers_.size() * k_slots_, 0);
    }
    state_.assign(n_ids_, kAbsent);
    slot_of_.assign(k_slots_ > 0 ? n_ids_ : 0, -1);
    ever_.assign(n_ids_, 0);
    prefetched_.assign(n_ids_, 0);
    stamp_.assign(n_ids_, 0);
    done_.assign(n_ids_, 0);
    id_layer_.resize(n_ids_);
    for (size_t i = 0; i < layers_.size(); ++i)
        for (uint32_t e = 0; e < layers_[i].n_expert; ++e)
            id_layer_[layers_[i].first_id + e] = uint32_t(i);
    pending_.reserve(max_expert);
    prefetch_pending_.reserve(max_expert);
    policy_->reset(n_ids_);
}

LedgerStats ExpertLedger::stats() const {
    LedgerStats s = stats_;
    s.resident_experts = live_;
    s.resident_expert_bytes = committed_;
    s.budget_bytes = budget_;
    return s;
}

void ExpertLedger::exclusive_pages(uint32_t moe, size_t t, uint32_t e, uint64_t * q0,
                                   uint64_t * q1) const {
    const Layer & L = layers_[moe];
    L.tensors[t].exclusive_pages(
        e, [&](uint32_t x) { return state_[L.first_id + x] != kAbsent; }, q0, q1);
}

uint64_t ExpertLedger::exclusive_bytes(uint32_t moe, uint32_t e) const {
    const Layer & L = layers_[moe];
    uint64_t total = 0;
    for (size_t t = 0; t < L.tensors.size(); ++t) {
        uint64_t q0, q1;
        exclusive_pages(moe, t, e, &q0, &q1);
        total += (q1 - q0) * L.tensors[t].page_bytes;
    }
    return total;
}

void ExpertLedger::admit(uint32_t moe, uint32_t e, uint64_t bytes) {
    const uint32_t id = id_of(moe, e);
    committed_ += bytes;
    stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, committed_);
    state_[id] = kPending;
    ++live_;
}

void ExpertLedger::release(uint32_t moe, uint32_t e, bool park) {
    const uint32_t id = id_of(moe, e);
    if (prefetched_[id]) {
        prefetched_[id] = 0;
        ++stats_.prefetch_unused;
    }
    const uint64_t bytes = cost(moe, e);  // its exclusive pages while it is still live
    if (backend_) backend_->release(moe, e, park);
    committed_ -= bytes;
    state_[id] = kAbsent;
    if (k_slots_ > 0 && slot_of_[id] >= 0) {
        const size_t at = size_t(moe) * k_slots_ + size_t(slot_of_[id]);
        occupant_[at] = -1;
        slot_stamp_[at] = 0;
        slot_of_[id] = -1;
    }
    policy_->remove(id);
    --live_;
}

bool ExpertLedger::evict_one() {
    const uint32_t id = policy_->victim(*this);
    if (id == EvictionPolicy::kNone) return false;
    const uint32_t moe = id_layer_[id];
    const uint32_t e = id - layers_[moe].first_id;
    if (observer_) observer_->evicted(moe, e);
    release(moe, e, /*park=*/true);
    ++stats_.evictions;
    return true;
}

Status ExpertLedger::commit_miss(uint32_t moe, uint32_t e) {
    // Make room first: the budget bounds what is committed, not just what is kept.
    while (committed_ + cost(moe, e) > budget_ && evict_one()) {
    }
    int err = 0;
    uint64_t bytes = cost(moe, e);
    if (!backend_) {  // simulated: the commit succeeds
        admit(moe, e, bytes);
        return Status::Ok();
    }
    Status st = backend_->commit(moe, e, &err);
    if (!st.ok() && refused(err)) {
        // The system refused memory the budget allowed: free more (memory the ledger does not
        // count first, then the policy's victims, never this layer's routed set) until the
        // commit goes through, and keep the budget at what could be committed.
        const uint64_t was = budget_;
        while (!st.ok() && refused(err)) {
            ++stats_.commit_failures;
            if (!backend_->free_uncounted() && !evict_one()) break;
            bytes = cost(moe, e);
            st = backend_->commit(moe, e, &err);
        }
        if (st.ok() && committed_ + bytes < budget_) {
            budget_ = std::max<uint64_t>(committed_ + bytes, page_bytes_);
            ++stats_.budget_shrinks;
            backend_->budget_shrunk(was, budget_);
        }
    }
    if (!st.ok()) {
        abandon_stage();
        if (refused(err))
            return Status::Runtime(st.message() + "; nothing left to evict, the request fails");
        return st;
    }
    admit(moe, e, bytes);
    return Status::Ok();
}

Status ExpertLedger::stage(uint32_t moe, const std::vector<uint32_t> & experts,
                           const uint32_t * next_use, StageStats * stats) {
    if (!prefetch_pending_.empty())
        return Status::Runtime("expert cache: internal: stage() while prefetch reads are open");
    // The previous stage's reads succeeded (else abandon_stage() would have been called).
    // Shared mode: nothing stays but this layer's read-ahead.
    if (shared_) {
        shared_release(moe);
        pending_.clear();
    }
    for (uint32_t e : pending_) {
        const uint32_t id = id_of(pending_moe_, e);
        state_[id] = kResident;
        ever_[id] = 1;
    }
    pending_.clear();
    pending_moe_ = moe;

    ++gen_;
    const uint32_t base = layers_[moe].first_id;
    for (uint32_t e : experts) stamp_[base + e] = gen_;
    // Slot mode: every routed expert of the stage shares one stamp; hits first, so a routed
    // expert keeps its slot.
    const uint64_t now = k_slots_ > 0 ? ++slot_clock_ : 0;
    if (k_slots_ > 0)
        for (uint32_t e : experts)
            if (slot_of_[base + e] >= 0)
                slot_stamp_[size_t(moe) * k_slots_ + size_t(slot_of_[base + e])] = now;

    for (uint32_t e : experts) {
        const uint32_t id = base + e;
        if (done_[id] == gen_) continue;  // duplicate id in this routing
        done_[id] = gen_;
        ++stats_.lookups;
        ++stats->lookups;
        const uint32_t nu = next_use ? next_use[e] : EvictionPolicy::kNever;
        if (state_[id] == kResident) {
            ++stats_.hits;
            ++stats->hits;
            if (observer_) observer_->lookup(moe, e, true);
            policy_->hit(id, gen_, nu);
            if (prefetched_[id]) {
                prefetched_[id] = 0;
                ++stats_.prefetch_used;
            }
            continue;
        }
        ++stats_.misses;
        ++stats->misses;
        if (observer_) observer_->lookup(moe, e, false);
        Status st = k_slots_ > 0 ? commit_slot(moe, e, now) : commit_miss(moe, e);
        if (!st.ok()) return st;
        if (ever_[id]) ++stats_.rereads;
        pending_.push_back(e);
        policy_->admit(id, gen_, nu);
    }
    if (k_slots_ == 0 && committed_ > budget_) ++stats_.over_budget_stages;
    if (shared_)  // the read-ahead this stage did not route: dropped, unused
        for (uint32_t e = 0; e < layers_[moe].n_expert; ++e)
            if (prefetched_[base + e] && state_[base + e] != kAbsent) release(moe, e, false);
    policy_->end_stage();
    if (observer_) observer_->stage_done(moe, committed_);
    return Status::Ok();
}

void ExpertLedger::abandon_stage() {
    // They never count as resident: ever_ is set only when a pending expert is promoted.
    for (uint32_t e : pending_) {
        release(pending_moe_, e, /*park=*/false);
        ++stats_.abandoned;
    }
    pending_.clear();
}

bool ExpertLedger::forget(uint32_t moe, uint32_t e) {
    if (moe >= layers_.size() || e >= layers_[moe].n_expert) return false;
    const uint32_t id = id_of(moe, e);
    if (state_[id] == kPending) {  // of the last stage, whose reads are done (see the header)
        if (moe != pending_moe_) return false;
        const auto it = std::find(pending_.begin(), pending_.end(), e);
        if (it == pending_.end()) return false;  // a prefetch's: its reads are still open
        pending_.erase(it);
        ever_[id] = 1;
        state_[id] = kResident;
    }
    if (state_[id] != kResident) return false;
    release(moe, e, /*park=*/false);
    return true;
}

size_t ExpertLedger::prefetch(uint32_t moe, const std::vector<uint32_t> & experts,
                              bool may_evict) {
    if (moe >= layers_.size() || !prefetch_pending_.empty()) return 0;
    if (shared_)  // the earlier read-ahead is dropped; the staged layer's experts stay
        for (uint32_t e = 0; e < layers_[prefetch_moe_].n_expert; ++e)
            if (prefetched_[id_of(prefetch_moe_, e)] && live(prefetch_moe_, e))
                release(prefetch_moe_, e, false);
    prefetch_moe_ = moe;
    const Layer & L = layers_[moe];
    for (uint32_t e : experts) {
        if (e >= L.n_expert) continue;
        const uint32_t id = id_of(moe, e);
        if (state_[id] != kAbsent) continue;
        // Room within the budget (evict_one spares the routed set and every expert whose
        // reads are outstanding, this call's included).
        while (may_evict && committed_ + cost(moe, e) > budget_ && evict_one()) {
        }
        const uint64_t bytes = cost(moe, e);
        int err = 0;
        if (committed_ + bytes > budget_ || (backend_ && !backend_->commit(moe, e, &err).ok())) {
            ++stats_.prefetch_skipped;  // (a refused commit: no budget shrink for a guess)
            continue;
        }
        admit(moe, e, bytes);
        prefetched_[id] = 1;
        prefetch_pending_.push_back(e);
        policy_->admit(id, gen_, EvictionPolicy::kNever);
        ++stats_.prefetched;
    }
    policy_->end_stage();
    return prefetch_pending_.size();
}

void ExpertLedger::end_prefetch(bool ok) {
    for (uint32_t e : prefetch_pending_) {
        const uint32_t id = id_of(prefetch_moe_, e);
        if (ok) {
            state_[id] = kResident;
            if (ever_[id]) ++stats_.rereads;
            ever_[id] = !shared_;  // (shared mode keeps nothing: no reread)
        } else {
            release(prefetch_moe_, e, /*park=*/false);
            ++stats_.abandoned;
        }
    }
    prefetch_pending_.clear();
}

void ExpertLedger::shared_release(int64_t keep_moe) {
    for (const uint32_t moe : {pending_moe_, prefetch_moe_}) {
        if (moe >= layers_.size()) continue;
        for (uint32_t e = 0; e < layers_[moe].n_expert; ++e) {
            const uint32_t id = id_of(moe, e);
            if (state_[id] == kAbsent || (int64_t(moe) == keep_moe && prefetched_[id])) continue;
            release(moe, e, /*park=*/false);
        }
    }
}

void ExpertLedger::end_prefetch_first(size_t n_read) {
    for (size_t i = n_read; i < prefetch_pending_.size(); ++i) {  // never read: not prefetched
        const uint32_t e = prefetch_pending_[i];
        prefetched_[id_of(prefetch_moe_, e)] = 0;
        --stats_.prefetched;
        release(prefetch_moe_, e, /*park=*/false);
    }
    if (n_read < prefetch_pending_.size()) prefetch_pending_.resize(n_read);
    end_prefetch(true);
}

int32_t ExpertLedger::slot_victim(uint32_t moe, uint64_t now) const {
    const size_t at = size_t(moe) * k_slots_;
    int32_t v = -1;
    for (uint32_t i = 0; i < k_slots_; ++i) {
        if (slot_stamp_[at + i] == now) continue;
        const int32_t occ = occupant_[at + i];
        if (occ < 0) return int32_t(i);
        if (state_[id_of(moe, uint32_t(occ))] == kPending) continue;  // its reads are due
        // The least recent; among equals the lowest expert id (not the slot: where an expert
        // sits must not decide which one goes).
        const uint64_t si = slot_stamp_[at + i];
        if (v < 0 || si < slot_stamp_[at + size_t(v)] ||
            (si == slot_stamp_[at + size_t(v)] && occ < occupant_[at + size_t(v)]))
            v = int32_t(i);
    }
    return v;
}

void ExpertLedger::slot_place(uint32_t moe, uint32_t e, int32_t s, uint64_t now) {
    const size_t at = size_t(moe) * k_slots_ + size_t(s);
    if (occupant_[at] >= 0) {
        const uint32_t victim = uint32_t(occupant_[at]);
        if (observer_) observer_->evicted(moe, victim);
        release(moe, victim, /*park=*/true);
        ++stats_.evictions;
    }
    admit(moe, e, cost(moe, e));
    occupant_[at] = int32_t(e);
    slot_stamp_[at] = now;
    slot_of_[id_of(moe, e)] = s;
}

Status ExpertLedger::commit_slot(uint32_t moe, uint32_t e, uint64_t now) {
    const int32_t v = slot_victim(moe, now);
    if (v < 0) {
        abandon_stage();
        return Status::Runtime("slot cache: no free slot (routing wider than " +
                               std::to_string(k_slots_) + " slots)");
    }
    slot_place(moe, e, v, now);
    return Status::Ok();
}

size_t ExpertLedger::prefetch_slots(uint32_t moe, const std::vector<uint32_t> & experts,
                                    bool may_evict, bool warm) {
    if (k_slots_ == 0 || moe >= layers_.size() || !prefetch_pending_.empty()) return 0;
    prefetch_moe_ = moe;
    const Layer & L = layers_[moe];
    const uint64_t now = ++slot_clock_;
    for (uint32_t e : experts)  // the whole guess is protected from this call's evictions
        if (!warm && e < L.n_expert && slot_of_[L.first_id + e] >= 0)
            slot_stamp_[size_t(moe) * k_slots_ + size_t(slot_of_[L.first_id + e])] = now;
    for (uint32_t e : experts) {
        if (e >= L.n_expert || state_[L.first_id + e] != kAbsent) continue;
        int32_t v = -1;
        if (!warm) {
            v = slot_victim(moe, now);
            if (v >= 0 && !may_evict && occupant_[size_t(moe) * k_slots_ + size_t(v)] >= 0) v = -1;
        } else {  // a free slot only
            for (uint32_t i = 0; i < k_slots_ && v < 0; ++i)
                if (occupant_[size_t(moe) * k_slots_ + i] < 0) v = int32_t(i);
        }
        if (v < 0) break;
        slot_place(moe, e, v, now);
        prefetched_[L.first_id + e] = 1;
        prefetch_pending_.push_back(e);
        policy_->admit(L.first_id + e, gen_, EvictionPolicy::kNever);
        ++stats_.prefetched;
    }
    policy_->end_stage();
    return prefetch_pending_.size();
}

int32_t ExpertLedger::warm(uint32_t moe, uint32_t e) {
    if (k_slots_ == 0 || moe >= layers_.size() || e >= layers_[moe].n_expert) return -2;
    const uint32_t id = id_of(moe, e);
    const uint64_t now = ++slot_clock_;
    if (slot_of_[id] >= 0) {
        slot_stamp_[size_t(moe) * k_slots_ + size_t(slot_of_[id])] = now;
        return -1;
    }
    const int32_t v = slot_victim(moe, now);
    if (v < 0) return -2;
    slot_place(moe, e, v, now);
    state_[id] = kResident;  // copied in by the caller: nothing to read
    ever_[id] = 1;
    policy_->admit(id, gen_, EvictionPolicy::kNever);
    policy_->end_stage();
    return v;
}

}  // namespace moestream
