// residency_slots.cpp — SharedSlots, the cache-off residency store (see residency.h).
//
// Bookkeeping: an ExpertLedger in shared mode (expert_ledger.h: nothing stays resident beyond
// the staged layer) holds which experts a stage reads and which read-ahead it finds; this file
// is its memory back-end (the slot buffers and the reads into them). So `moestream replay`
// runs the same ledger over a cache-off trace and reproduces its decisions.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "huge_pages.h"
#include "residency.h"

namespace moestream {
namespace {

constexpr uint64_t kPhaseBytes = 4096;  // any direct-I/O alignment divides it

// Per projection, the bytes of one shared slot: the largest layer's tensor plus its phase.
std::vector<uint64_t> shared_slot_sizes(const ModelIndex & index) {
    size_t n_proj = 0;
    for (const auto & L : index.moe_layers) n_proj = std::max(n_proj, L.tensors.size());
    std::vector<uint64_t> sizes(n_proj, 0);
    for (const auto & L : index.moe_layers)
        for (size_t t = 0; t < L.tensors.size(); ++t)
            sizes[t] = std::max(sizes[t], L.tensors[t].tensor_bytes + kPhaseBytes);
    return sizes;
}

// With two sets (prefill read-ahead and decode prefetch, streamer.h): MoE layer m uses set
// m % 2, so the next layer's experts can be read into the other set while layer m's matmuls
// read theirs. prefetch() reads whole experts into the next layer's set; stage() of that layer
// then finds them (hits) and reads only the rest. prefetch() refuses a layer whose set is the
// one the last stage() handed out: its matmuls may still read it.
class SharedSlots final : public ResidencyStore {
public:
    SharedSlots(const ModelIndex & index, bool two_sets, bool huge_pages)
        : index_(index), n_sets_(two_sets ? 2 : 1), huge_pages_(huge_pages),
          ledger_(shared_ledger_shape(index), 1, make_lru_policy(), /*backend=*/nullptr) {}
    ~SharedSlots() override {
        for (void * p : slots_) std::free(p);
    }

    Status init() {
        sizes_ = shared_slot_sizes(index_);
        const size_t n_proj = sizes_.size();
        for (size_t i = 0; i < n_proj * n_sets_; ++i) {
            const uint64_t t = i % n_proj;
            void * p = nullptr;
            if (posix_memalign(&p, huge_page_alignment(sizes_[t], 4096, huge_pages_), sizes_[t]) != 0)
                return Status::Runtime("cannot allocate " + std::to_string(sizes_[t]) +
                                       " bytes for the shared expert slots");
            slots_.push_back(p);
            if (huge_pages_) huge_bytes_ += advise_huge_pages(p, sizes_[t]);
        }
        return Status::Ok();
    }

    // Each layer's tensor starts at the file offset's phase within a page, so that every
    // slice's destination is congruent to its file offset and O_DIRECT reads land in place.
    uint8_t * tensor_base(size_t moe_idx, size_t t) override {
        const uint64_t phase = index_.moe_layers[moe_idx].tensors[t].file_offset % kPhaseBytes;
        return static_cast<uint8_t *>(slots_[(moe_idx % n_sets_) * sizes_.size() + t]) + phase;
    }

    // Hits: read ahead into this layer's set, complete; the rest is read. The set is this
    // layer's now: the next stage of it reads again.
    Status stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                 std::vector<ReadRequest> * reads, StageStats * stats) override {
        if (open_) return Status::Runtime("shared slots: stage() while read-ahead is in flight");
        Status st = ledger_.stage(uint32_t(moe_idx), experts, nullptr, stats);
        if (!st.ok()) return st;
        const MoeLayer & L = index_.moe_layers[moe_idx];
        for (uint32_t e : ledger_.staged()) push_reads(moe_idx, L, e, reads);
        staged_set_ = int64_t(moe_idx % n_sets_);
        return Status::Ok();
    }

    void abandon_stage(size_t moe_idx) override {  // nothing staged counts as resident
        if (ledger_.staged_layer() == moe_idx) ledger_.abandon_stage();
    }

    bool is_resident(size_t moe_idx, uint32_t e) const override {
        return moe_idx < ledger_.n_layers() && e < ledger_.n_expert(uint32_t(moe_idx)) &&
               ledger_.would_hit(uint32_t(moe_idx), e);
    }

    // Reads whole experts of moe_idx into its set (two sets only: with one, the set is the
    // layer computing now).
    size_t prefetch(size_t moe_idx, const std::vector<uint32_t> & experts,
                    std::vector<ReadRequest> * reads) override {
        if (n_sets_ < 2 || open_ || moe_idx >= index_.moe_layers.size() ||
            int64_t(moe_idx % n_sets_) == staged_set_) {
            ra_called_ = false;
            return 0;
        }
        const size_t n = ledger_.prefetch(uint32_t(moe_idx), experts);
        ra_called_ = true;
        const MoeLayer & L = index_.moe_layers[moe_idx];
        for (uint32_t e : ledger_.prefetching()) push_reads(moe_idx, L, e, reads);
        open_ = n > 0;
        return n;
    }

    ReadAheadCall last_read_ahead() const override {
        return {ra_called_, false, &ledger_.prefetching()};
    }

    void end_prefetch(bool ok) override {
        open_ = false;
        ledger_.end_prefetch(ok);  // failed reads: released (counted unused)
    }

    // Only the prefetch counters: prefetched, used (routed: a hit), unused (read ahead and
    // dropped unrouted: the layer's stage did not route it, a later stage or prefetch reused
    // the set first, or its read failed).
    LedgerStats ledger_stats() const override {
        LedgerStats c;
        const LedgerStats ls = ledger_.stats();
        c.prefetched = ls.prefetched;
        c.prefetch_used = ls.prefetch_used;
        c.prefetch_unused = ls.prefetch_unused;
        return c;
    }
    uint64_t huge_page_bytes() const override { return huge_bytes_; }

    uint64_t resident_bytes() const override { return reserved_bytes(); }
    uint64_t reserved_bytes() const override {
        uint64_t s = 0;
        for (uint64_t b : sizes_) s += b;
        return s * n_sets_;
    }

private:
    void push_reads(size_t moe_idx, const MoeLayer & L, uint32_t e, std::vector<ReadRequest> * reads) {
        for (size_t t = 0; t < L.tensors.size(); ++t) {
            const ExpertTensor & et = L.tensors[t];
            reads->push_back({et.slice_offset(e), et.slice_bytes,
                              tensor_base(moe_idx, t) + uint64_t(e) * et.slice_bytes,
                              et.proj == Projection::kDown, et.shard});
        }
    }

    const ModelIndex & index_;
    std::vector<uint64_t> sizes_;
    std::vector<void *> slots_;  // set-major: slots_[set * n_proj + t]
    size_t n_sets_;
    bool huge_pages_;  // slots advised for transparent huge pages (huge_pages.h)
    // Which experts the last stage read and which read-ahead is in the sets (shared mode).
    ExpertLedger ledger_;
    bool open_ = false;           // the read-ahead's reads are in flight
    bool ra_called_ = false;      // the last prefetch() called the ledger
    int64_t staged_set_ = -1;     // the set the last stage() handed out (-1: none yet)
    uint64_t huge_bytes_ = 0;     // bytes advised for transparent huge pages
};

}  // namespace

LedgerShape shared_ledger_shape(const ModelIndex & index) {
    LedgerShape shape = slot_ledger_shape(index, 0);
    shape.shared = true;
    return shape;
}

uint64_t shared_slot_set_bytes(const ModelIndex & index) {
    uint64_t set = 0;
    for (uint64_t b : shared_slot_sizes(index)) set += b;
    return set;
}

std::unique_ptr<ResidencyStore> make_shared_slots(const ModelIndex & index, Status * st,
                                                  bool two_sets, bool huge_pages) {
    auto s = std::make_unique<SharedSlots>(index, two_sets, huge_pages);
    *st = s->init();
    if (!st->ok()) return nullptr;
    return s;
}

}  // namespace moestream
