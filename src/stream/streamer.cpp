#include "streamer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "miss_fallback.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"
#include "route_tracer.h"
#include "uring_tail.h"

namespace moestream {

Streamer::Streamer(const ModelIndex & index, ResidencyStore * store, IoLanes * lanes, bool overlap)
    : index_(index), store_(store), lanes_(lanes), overlap_(overlap && lanes->n_lanes() > 1) {
    uint32_t max_layer = index.n_layer;
    for (const auto & L : index.moe_layers) max_layer = std::max(max_layer, L.layer + 1);
    layer_to_moe_.assign(max_layer, -1);
    for (size_t i = 0; i < index.moe_layers.size(); ++i)
        layer_to_moe_[index.moe_layers[i].layer] = static_cast<int>(i);
    seen_.assign(index.n_expert, 0);
}

Streamer::~Streamer() { stop_preload(); }

void Streamer::corrupt_for_test(int slot) {
    for (uint32_t e : experts_) {
        if (int(e) != hooks_.corrupt_expert && hooks_.corrupt_expert != StreamTestHooks::kAllExperts)
            continue;
        const size_t t = early_tensor_;
        const ExpertTensor & et = index_.moe_layers[size_t(slot)].tensors[t];
        uint8_t * p = store_->slice_addr(size_t(slot), t, e, et.slice_bytes);
        for (uint64_t i = 0; i < et.slice_bytes; i += 7) p[i] ^= 0x5a;
    }
}

void Streamer::flush_abandon() {
    if (abandon_slot_ < 0) return;
    const double t0 = now_s();
    store_->abandon_stage(size_t(abandon_slot_));
    add_stage_s(now_s() - t0);
    abandon_slot_ = -1;
}

void Streamer::end_prefetch(bool ok) {
    const double t0 = now_s();
    store_->end_prefetch(ok);
    warm_open_ = false;
    add_stage_s(now_s() - t0);
    if (tracer_) tracer_->on_read_ahead_end(ok);
}

size_t Streamer::read_ahead(size_t m, const std::vector<uint32_t> & experts) {
    const size_t n = store_->prefetch(m, experts, &reads_);
    if (tracer_ && tracer_->active() && m < index_.moe_layers.size()) {
        const ResidencyStore::ReadAheadCall c = store_->last_read_ahead();
        if (c.ledger && c.experts)
            tracer_->on_read_ahead(index_.moe_layers[m].layer, experts, *c.experts, c.shared,
                                   experts.size() <= index_.n_expert_used);
    }
    return n;
}

bool Streamer::is_resident(uint32_t il, int32_t e) const {
    const int slot = moe_slot(il);
    return slot >= 0 && store_->is_resident(size_t(slot), uint32_t(e));
}

uint64_t Streamer::expert_bytes(uint32_t il) const {
    const int slot = moe_slot(il);
    return slot >= 0 ? index_.moe_layers[size_t(slot)].expert_bytes : 0;
}

void Streamer::set_prefetch(uint32_t il, const std::vector<uint32_t> & experts) {
    hint_layer_ = il;
    hint_ = experts;
}

void Streamer::set_warm(std::vector<std::vector<uint32_t>> lists) {
    warm_.clear();
    warm_pos_.clear();
    warm_left_ = 0;
    warm_ask_ = std::max<size_t>(index_.n_expert_used, 1);
    if (lists.size() != index_.moe_layers.size()) return;
    warm_ = std::move(lists);
    warm_pos_.assign(warm_.size(), 0);
    for (const auto & l : warm_) warm_left_ += l.empty() ? 0 : 1;
    warm_in_.assign(warm_.size() * index_.n_expert, 0);
}

void Streamer::mark_warm_in(size_t m, const std::vector<uint32_t> & experts) {
    for (uint32_t e : experts)
        if (store_->is_resident(m, e)) warm_in_[m * index_.n_expert + e] = 1;
}

uint64_t Streamer::warm_not_read() const {
    uint64_t n = 0;
    for (size_t m = 0; m < warm_.size(); ++m)
        for (uint32_t e : warm_[m]) n += warm_in_[m * index_.n_expert + e] ? 0 : 1;
    return n;
}

void Streamer::start_preload() {
    IoLanes * const lanes = preload_lanes_ ? preload_lanes_ : lanes_;
    if (warm_left_ == 0 || lanes->n_lanes() < 2 || hooks_.warm_preload_off || preload_.joinable())
        return;
    preload_stop_ = false;
    preload_ = std::thread([this] { preload_run(); });
    if (hooks_.warm_preload_wait) {  // test only: the whole preload, never stopped
        preload_.join();
        stop_preload();  // (merges its counters)
    }
}

void Streamer::stop_preload() {
    if (preload_.joinable()) {
        {
            std::lock_guard<std::mutex> lk(preload_mu_);
            preload_stop_ = true;
            // The batch on the lanes, if any: no more claims.
            (void)(preload_lanes_ ? preload_lanes_ : lanes_)->stop_claims();
        }
        preload_.join();
    }
    if (preload_count_ == 0) return;
    // Into the totals only (no step read them), and read, not waited for: no io_s.
    total_.bytes_read += preload_bytes_;
    total_.reads += preload_count_;
    total_.prefetch_bytes += preload_bytes_;
    total_.max_read_s = std::max(total_.max_read_s, preload_max_read_s_);
    preload_bytes_ = preload_count_ = 0;
    preload_max_read_s_ = 0;
}

// The preload thread: in rounds over the MoE layers, each round the next n_expert_used absent
// experts of every list (the hottest of every layer first), each layer's as one batch (above,
// "Warm preload"). It owns the store until stop_preload() joins it.
void Streamer::preload_run() {
    IoLanes * const lanes = preload_lanes_ ? preload_lanes_ : lanes_;
    const size_t per_round = std::max<size_t>(index_.n_expert_used, 1);
    // The store is touched only under preload_mu_ (let go while the lanes read), so that
    // with_store_quiet() may read its figures from another thread meanwhile.
    std::unique_lock<std::mutex> lk(preload_mu_);
    while (warm_left_ > 0) {  // every round reads from each list left or finishes it
        for (size_t m = 0; m < warm_.size(); ++m) {
            const std::vector<uint32_t> & l = warm_[m];
            size_t & pos = warm_pos_[m];
            if (pos >= l.size()) continue;
            while (pos < l.size() && store_->is_resident(m, l[pos])) ++pos;
            preload_chunk_.clear();
            for (size_t p = pos; p < l.size() && preload_chunk_.size() < per_round; ++p)
                if (!store_->is_resident(m, l[p])) preload_chunk_.push_back(l[p]);
            preload_reads_.clear();
            const size_t n = preload_chunk_.empty()
                                 ? 0
                                 : store_->prefetch_free(m, preload_chunk_, &preload_reads_);
            if (n == 0) {  // the list is read, or no room for it in this layer (or the store)
                pos = l.size();
                --warm_left_;
                continue;
            }
            if (preload_stop_) {  // stopped before this batch started: none of it was read
                store_->end_prefetch_first(0);
                return;
            }
            lanes->start(preload_reads_, 0, 0);  // all of it a tail: the worker lanes and us
            lk.unlock();  // a stop now finds the batch on the lanes
            IoBatchStats io;
            const Status st = lanes->finish(&io);
            lk.lock();
            const size_t taken = lanes->last_stopped_at();
            preload_bytes_ += io.bytes_read;
            preload_count_ += io.reads;
            preload_max_read_s_ = std::max(preload_max_read_s_, io.max_read_s);
            if (!st.ok()) {  // released: a routing reads them again and reports the error
                store_->end_prefetch(false);
                MS_LOG_WARN("a warm-set read failed (%s); those experts are read again when "
                            "routed",
                            st.message().c_str());
                return;
            }
            const size_t per = std::max<size_t>(preload_reads_.size() / n, 1);
            const size_t read = taken == SIZE_MAX ? n : std::min(n, taken / per);
            store_->end_prefetch_first(read);
            mark_warm_in(m, preload_chunk_);
            warm_experts_ += read;
            warm_preloaded_ += read;
            if (read < n) return;  // stopped: the tails go on from pos
            // The store takes no more of this list (or did not keep it: never read it again).
            if (n < preload_chunk_.size() || !store_->is_resident(m, preload_chunk_[0])) {
                pos = l.size();
                --warm_left_;
            }
        }
    }
}

void Streamer::set_record_usage(bool on) {
    usage_.assign(on ? index_.moe_layers.size() * index_.n_expert : 0, 0);
    usage_routings_ = 0;
}

void Streamer::warm_tail(int slot, int rows) {
    const size_t n_layers = warm_.size();
    for (size_t i = 1; i < n_layers; ++i) {  // the next layer whose list is not done
        const size_t m = (size_t(slot) + i) % n_layers;
        const std::vector<uint32_t> & l = warm_[m];
        size_t & pos = warm_pos_[m];
        if (pos >= l.size()) continue;
        while (pos < l.size() && store_->is_resident(m, l[pos])) ++pos;  // read (or routed)
        if (pos >= l.size()) {
            --warm_left_;
            continue;
        }
        // A stopped tail's unread experts stay in the list (pos moves past resident ones only).
        const size_t want = hooks_.warm_tail_experts > 0 ? size_t(hooks_.warm_tail_experts)
                            : rows > 1                   ? l.size() - pos
                                                         : warm_ask_;
        warm_chunk_.clear();
        for (size_t p = pos; p < l.size() && warm_chunk_.size() < want; ++p)
            if (!store_->is_resident(m, l[p])) warm_chunk_.push_back(l[p]);
        const size_t at = reads_.size();
        const size_t n = store_->prefetch_free(m, warm_chunk_, &reads_);
        if (n < warm_chunk_.size()) {  // the store takes no more of it (free room is gone)
            pos = l.size();
            --warm_left_;
        }
        warm_open_ = n > 0;
        warm_issued_ = n;
        warm_tail_at_ = at;
        warm_tail_m_ = m;
        warm_reads_per_ = n > 0 ? std::max<size_t>((reads_.size() - at) / n, 1) : 1;
        return;
    }
}

void Streamer::add_tail_io(const IoBatchStats & io) {
    for (StepCounters * c : {&step_, &total_}) {
        c->bytes_read += io.bytes_read;
        c->reads += io.reads;
        c->io_s += io.seconds;
        c->prefetch_bytes += io.bytes_read;
        c->prefetch_wait_s += io.seconds;
        c->max_read_s = std::max(c->max_read_s, io.max_read_s);
    }
}

void Streamer::stop_warm_tail() {
    // A fixed tail (the test hook) is read in full; else stop where the lanes are.
    const bool stop = hooks_.warm_tail_experts <= 0;
    const size_t taken = stop ? lanes_->stop_claims() : SIZE_MAX;
    IoBatchStats io;
    Status st = lanes_->finish(&io);
    tail_ = false;
    add_tail_io(io);
    if (!st.ok()) {
        end_prefetch(false);
        MS_LOG_WARN("a warm-set read failed (%s); those experts are read again when routed",
                    st.message().c_str());
        return;
    }
    // Experts whose reads were all taken (they were appended expert by expert).
    const size_t read = taken == SIZE_MAX ? warm_issued_
                        : taken <= warm_tail_at_
                            ? 0
                            : std::min(warm_issued_, (taken - warm_tail_at_) / warm_reads_per_);
    const double t0 = now_s();
    store_->end_prefetch_first(read);
    mark_warm_in(warm_tail_m_, warm_chunk_);
    add_stage_s(now_s() - t0);
    warm_open_ = false;
    warm_experts_ += read;
    if (stop)  // the next decode tail: half as many again after a full one, else what fitted
        warm_ask_ = read == warm_issued_ ? read + std::max<size_t>(read / 2, 1)
                                         : std::max<size_t>(read, 1);
}

void Streamer::finish_tail() {
    if (!tail_ && !uring_tail_) return;
    if (warm_open_) return stop_warm_tail();
    IoBatchStats io;
    Status st = uring_tail_ ? uring_->reap(&io) : lanes_->finish(&io);
    tail_ = uring_tail_ = false;
    pf_reads_.clear();
    add_tail_io(io);
    end_prefetch(st.ok());
    if (!st.ok())
        MS_LOG_WARN("a prefetch read failed (%s); those experts are read again when routed",
                    st.message().c_str());
}

Status Streamer::drain() {
    Status st = finish_pending();
    finish_tail();
    hint_layer_ = -1;
    return st;
}

Status Streamer::on_routing(const Routing & r) {
    Status st = finish_pending();  // (never pending here: the hook finishes every layer)
    if (!st.ok()) return st;
    finish_tail();
    flush_abandon();
    const int64_t hint_layer = hint_layer_;
    hint_layer_ = -1;
    const int slot = moe_slot(r.layer);
    if (slot < 0)
        return Status::Runtime("routing node for layer " + std::to_string(r.layer) +
                               ", which has no expert tensors in the file");
    const MoeLayer & L = index_.moe_layers[size_t(slot)];

    // Distinct experts over all rows, in first-seen order (rank order for one token).
    experts_.clear();
    for (int32_t id : r.ids) {
        if (!seen_[size_t(id)]) {
            seen_[size_t(id)] = 1;
            experts_.push_back(uint32_t(id));
        }
    }
    for (uint32_t e : experts_) seen_[e] = 0;
    if (!usage_.empty() && r.n_rows == 1) {  // the warm set's usage: decode routings
        uint32_t * u = usage_.data() + size_t(slot) * index_.n_expert;
        for (uint32_t e : experts_) ++u[e];
        ++usage_routings_;
    }
    if (!warm_in_.empty())  // a routed expert is read (or resident) by the stage below
        for (uint32_t e : experts_) warm_in_[size_t(slot) * index_.n_expert + e] = 1;

    if (tracer_ && tracer_->active()) {
        // Residency before the stage = hit or miss (routed experts are never evicted).
        store_->stage_hits(size_t(slot), experts_, &was_resident_);
    }
    reads_.clear();
    pending_ss_ = StageStats{};
    if (fallback_) {
        MissFallback::flags(r, experts_, &fb_flags_);
        fallback_->before_stage(size_t(slot), experts_, fb_flags_, store_);
    }
    const double t_stage0 = now_s();
    // Split staging: only the first stage's slices are committed before the reads start.
    uint64_t early_mask = 0, mid_mask = 0;
    bool deferred = false;
    SplitStaging * const splitter = store_->split_staging();
    if (split_ && splitter && lanes_->n_lanes() > 1 && !fallback_ && L.tensors.size() < 64) {
        stage_masks(L, &early_mask, &mid_mask);
        st = splitter->stage_split(size_t(slot), experts_, early_mask, &reads_, &pending_ss_,
                                   &deferred);
    } else {
        st = store_->stage(size_t(slot), experts_, &reads_, &pending_ss_);
    }
    if (!st.ok()) return st;
    if (fallback_) fallback_->take_reads(size_t(slot), experts_, fb_flags_, store_, &reads_);
    // Gate/up reads first (or only the first projection's): the prefix the first matmul needs.
    const size_t n_own = reads_.size();
    size_t n_early = n_own, n_mid = n_own;
    early_tensor_ = 0;
    if (overlap_) order_stages(L, n_own, &n_early, &n_mid);
    // Where the deferred slices' reads begin (the same partition; without the overlap the
    // whole own batch is still the prefix waited for).
    size_t rel_early = n_early, rel_mid = n_mid;
    if (deferred && !overlap_) {
        order_stages(L, n_own, &rel_early, &rel_mid);
        early_tensor_ = 0;
    }
    second_pending_ = n_early < n_mid;
    // Then the next layer's predicted experts, as a tail read meanwhile (io_uring or lanes).
    if (hint_layer >= 0 && lanes_->n_lanes() > 1 && r.n_rows == 1) {
        const int next = moe_slot(uint32_t(hint_layer));
        if (next >= 0 && next != slot) read_ahead(size_t(next), hint_);
    } else if (prefill_ra_ && r.n_rows > 1 && lanes_->n_lanes() > 1 &&
               size_t(slot) + 2 < index_.moe_layers.size()) {
        // Prefill read-ahead: a ubatch routes (nearly) every expert, so the guess for the
        // next MoE layer is its whole bank; the store reads only what it does not hold. Not
        // into the last MoE layer: llama.cpp computes only the ubatch's output rows there
        // (one token of a prompt batch), so its bank would be read for k experts.
        // With per-row guesses (the predictor's set_prefill_rows) the hint for the next MoE
        // layer is the union of the rows' guesses instead.
        if (hint_layer == int64_t(index_.moe_layers[size_t(slot) + 1].layer)) {
            read_ahead(size_t(slot) + 1, hint_);
        } else {
            const uint32_t n = index_.n_expert;
            if (bank_.size() != n) {
                bank_.resize(n);
                for (uint32_t e = 0; e < n; ++e) bank_[e] = e;
            }
            read_ahead(size_t(slot) + 1, bank_);
        }
    } else if (warm_left_ > 0 && lanes_->n_lanes() > 1) {
        warm_tail(slot, r.n_rows);  // the warm set: no other speculative read this routing
    }
    add_stage_s(now_s() - t_stage0);
    if (uring_ && reads_.size() > n_own && !warm_open_) {  // the ring reads the tail, after
                                                            // the own reads (a warm tail: no)
        pf_reads_.assign(reads_.begin() + std::ptrdiff_t(n_own), reads_.end());
        reads_.resize(n_own);
    }
    tail_ = reads_.size() > n_own;
    pending_slot_ = slot;
    pending_layer_ = r.layer;
    pending_rows_ = r.n_rows;
    pending_demand_ = uint64_t(experts_.size()) * L.expert_bytes;
    pending_io_ = IoBatchStats{};
    if (!reads_.empty())
        lanes_->start(reads_, n_early, n_own, n_mid, deferred ? rel_early : SIZE_MAX);
    if (deferred) {  // commit the rest while the lanes read the first stage, releasing as we go
        const double t0 = now_s();
        st = splitter->commit_deferred(size_t(slot), mid_mask);
        if (st.ok()) {
            lanes_->release(rel_mid);
            st = splitter->commit_deferred(size_t(slot), ~(early_mask | mid_mask));
        }
        if (st.ok()) lanes_->release(SIZE_MAX);
        add_stage_s(now_s() - t0);
        if (!st.ok()) {  // no read past the watermark ran: stop the batch, report, abandon
            lanes_->cancel_unreleased(st);
            (void)lanes_->finish(&pending_io_);
            pending_err_ = st;
            return finish_pending();
        }
    }
    if (fallback_) {  // the low-bit slices, converted on this thread while the lanes read
        const FallbackCounters before = fallback_->counters();
        st = fallback_->run(size_t(slot), store_->is_resident(size_t(slot), experts_[0]));
        for (StepCounters * c : {&step_, &total_}) {
            c->bytes_read += fallback_->counters().bytes_read - before.bytes_read;
            c->io_s += fallback_->counters().read_s - before.read_s;
        }
        if (!st.ok()) {  // stop the batch, then report and abandon like a failed read
            if (!reads_.empty()) (void)lanes_->finish(&pending_io_);
            pending_err_ = st;
            return finish_pending();
        }
    }
    if (!reads_.empty()) {
        st = lanes_->wait_prefix(&pending_io_);
        if (!st.ok()) {  // the batch has stopped (no lane touches it): report and abandon
            pending_err_ = st;
            return finish_pending();
        }
    }
    // Gate/up are in place: the negative control corrupts them before their matmul.
    if (hooks_.corrupt_layer >= 0 && uint32_t(hooks_.corrupt_layer) == r.layer) corrupt_for_test(slot);
    if (n_early < n_own) return Status::Ok();  // second/down reads continue meanwhile
    return finish_pending();
}

bool Streamer::three_stages(const MoeLayer & L, int * t_first, int * t_second) const {
    const int gate = int(Projection::kGate), up = int(Projection::kUp);
    if (stages_ < 3 || (first_proj_ != gate && first_proj_ != up)) return false;
    const Projection second = first_proj_ == gate ? Projection::kUp : Projection::kGate;
    *t_first = *t_second = -1;
    for (size_t t = 0; t < L.tensors.size(); ++t) {
        if (int(L.tensors[t].proj) == first_proj_) *t_first = int(t);
        if (L.tensors[t].proj == second) *t_second = int(t);
    }
    return *t_first >= 0 && *t_second >= 0;  // not for merged gate_up (or no gate): two stages
}

void Streamer::stage_masks(const MoeLayer & L, uint64_t * early, uint64_t * mid) const {
    int t_first = -1, t_second = -1;
    const bool three = three_stages(L, &t_first, &t_second);
    *early = *mid = 0;
    for (size_t t = 0; t < L.tensors.size(); ++t) {
        if (L.tensors[t].proj == Projection::kDown) continue;  // late
        if (three && int(t) == t_second)
            *mid |= uint64_t(1) << t;
        else
            *early |= uint64_t(1) << t;
    }
}

void Streamer::order_stages(const MoeLayer & L, size_t n, size_t * n_early, size_t * n_mid) {
    const auto begin = reads_.begin(), end = reads_.begin() + std::ptrdiff_t(n);
    const auto late_begin =
        std::stable_partition(begin, end, [](const ReadRequest & q) { return !q.late; });
    *n_early = *n_mid = size_t(late_begin - begin);
    int t_first = -1, t_second = -1;
    if (!three_stages(L, &t_first, &t_second)) return;
    const ExpertTensor & et = L.tensors[size_t(t_second)];
    // A read of the second projection's tensor (by file range: fallback reads never match).
    const auto is_second = [&et](const ReadRequest & q) {
        return q.file == et.shard && q.file_offset >= et.file_offset &&
               q.file_offset - et.file_offset < et.tensor_bytes;
    };
    const auto mid_begin = std::stable_partition(
        begin, late_begin, [&](const ReadRequest & q) { return !is_second(q); });
    *n_early = size_t(mid_begin - begin);
    early_tensor_ = size_t(t_first);
}

Status Streamer::finish_second() {
    if (!has_pending_second()) return Status::Ok();
    second_pending_ = false;
    if (hooks_.skip_second_wait) return Status::Ok();  // test only: the reads go on in flight
    Status st = pending_err_.ok() ? lanes_->wait_mid(&pending_io_) : pending_err_;
    if (!st.ok()) {  // the batch has stopped (no lane touches it): report and abandon
        pending_err_ = st;
        return finish_pending();
    }
    return Status::Ok();
}

Status Streamer::finish_pending() {
    if (pending_slot_ < 0) return Status::Ok();
    const int slot = pending_slot_;
    const bool overlapped =
        lanes_->in_flight() && overlap_ && !reads_.empty() && reads_.back().late;
    Status st = !pending_err_.ok() ? pending_err_
                : tail_            ? lanes_->wait_own(&pending_io_)  // the tail reads on
                                   : lanes_->finish(&pending_io_);
    pending_err_ = Status::Ok();
    if (!st.ok() && tail_) {  // the batch has stopped, tail included: drop what it prefetched
        tail_ = false;
        end_prefetch(false);
    }
    if (!pf_reads_.empty() && !tail_ && !uring_tail_) {  // a tail for the ring, not started
        if (!st.ok()) {
            pf_reads_.clear();
            end_prefetch(false);
        } else if (uring_->submit(pf_reads_, 0)) {
            uring_tail_ = true;
        } else {
            lanes_->start(pf_reads_, 0, 0);  // the ring refused: the worker lanes read it
            tail_ = true;
        }
    }
    pending_slot_ = -1;
    second_pending_ = false;
    const IoBatchStats & io = pending_io_;
    const StageStats & ss = pending_ss_;
    for (StepCounters * c : {&step_, &total_}) {
        c->bytes_read += io.bytes_read;
        c->reads += io.reads;
        c->io_s += io.seconds;
        c->max_read_s = std::max(c->max_read_s, io.max_read_s);
        c->demand_bytes += pending_demand_;
        c->layer_demand_bytes = std::max(c->layer_demand_bytes, pending_demand_);
        c->lookups += ss.lookups;
        c->hits += ss.hits;
        c->misses += ss.misses;
        c->routings += 1;
    }
    if (tracer_ && tracer_->active())
        tracer_->on_stage(pending_layer_, experts_, was_resident_, io.bytes_read);
    if (!st.ok()) {
        // The failed slices were zero-filled and their memory stays committed until the graph
        // is gone: a matmul already scheduled reads zeros, never released pages. They stop
        // counting as resident at the next step (begin_step / the next routing).
        abandon_slot_ = slot;
        return st;
    }
    st = store_->verify_resident(size_t(slot), experts_);  // no-op unless --cache-debug
    if (!st.ok()) return st;
    MS_LOG_DEBUG(
        "layer %u: %zu distinct experts over %d row(s), %zu reads (%llu in place), "
        "%llu bytes, %.2f ms blocked%s",
        pending_layer_, experts_.size(), pending_rows_, reads_.size(),
        (unsigned long long)io.direct_reads, (unsigned long long)io.bytes_read, io.seconds * 1e3,
        overlapped ? " (down overlapped)" : "");
    return Status::Ok();
}

}  // namespace moestream
