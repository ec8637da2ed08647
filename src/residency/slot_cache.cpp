// slot_cache.cpp — SlotCache, the fixed-slot expert cache (see residency.h, make_slot_cache).
//
// Why: the LRU cache (residency_cache.cpp) keeps expert e of a layer at its canonical offset,
// so every miss maps new pages at a new address, and the first access through each new
// page-table entry costs (docs/cache.md, "First access through a new page-table entry").
// Here a layer's experts live in K slots that are mapped and touched once, at creation; a miss
// is read (O_DIRECT) into a slot that is already mapped, and the graph's expert ids are
// rewritten to slot indices (stream/slot_rewriter.h) so that MUL_MAT_ID finds them there.
//
// Invariants: slot_of_[m][e] == s  <=>  occupant_[m][s] == e; a routed expert is never the
// victim of its own stage; a stage's misses are forgotten by abandon_stage() (their reads
// failed). Bookkeeping is per layer: a layer only ever evicts its own experts.
// Thread-safety: called from the eval callback only (one thread at a time).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "residency.h"

namespace moestream {
namespace {

constexpr uint64_t kPage = 4096;  // any direct-I/O alignment divides it

uint64_t round_up(uint64_t v, uint64_t a) {
    return (v + a - 1) / a * a;
}

std::string mib_text(uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
    return buf;
}

class SlotCache final : public ResidencyStore {
public:
    SlotCache(const ModelIndex & index, uint64_t budget) : index_(index), budget_(budget) {}
    ~SlotCache() override {
        if (mem_ != nullptr) munmap(mem_, mem_bytes_);
    }

    Status init(bool two_sets) {
        Status st;
        bank_ = make_shared_slots(index_, &st, two_sets);
        if (!st.ok()) return st;
        const size_t n_moe = index_.moe_layers.size();
        uint64_t per_slot_all = 0;  // one slot in every layer
        for (const auto & L : index_.moe_layers) per_slot_all += L.expert_bytes;
        if (per_slot_all == 0) return Status::Runtime("slot cache: the model has no expert bytes");
        k_ = uint32_t(std::min<uint64_t>(budget_ / per_slot_all, index_.n_expert));
        if (k_ < index_.n_expert_used)
            return Status::Usage("the fixed-slot cache needs at least " +
                                 std::to_string(index_.n_expert_used) +
                                 " slots per MoE layer (the routing width): " +
                                 mib_text(index_.n_expert_used * per_slot_all) +
                                 " or more of cache budget, " + mib_text(budget_) + " given");
        // One mapping for every (layer, tensor) region, each page-aligned plus the phase of its
        // file offset, so that a slice read into slot s is congruent to its file offset when
        // the slice size is a multiple of the page (the usual case; else the lanes bounce it).
        base_.assign(n_moe, {});
        uint64_t off = 0;
        std::vector<std::vector<uint64_t>> offs(n_moe);
        for (size_t m = 0; m < n_moe; ++m) {
            for (const ExpertTensor & t : index_.moe_layers[m].tensors) {
                offs[m].push_back(off + t.file_offset % kPage);
                off = round_up(off + t.file_offset % kPage + uint64_t(k_) * t.slice_bytes, kPage);
            }
        }
        mem_bytes_ = off;
        void * p =
            mmap(nullptr, mem_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return Status::Runtime("slot cache: cannot map " + std::to_string(mem_bytes_ >> 20) +
                                   " MiB for the expert slots: " + std::strerror(errno));
        mem_ = static_cast<uint8_t *>(p);
        // Touch every page now, once: the matmuls never meet a new page-table entry later.
        for (uint64_t i = 0; i < mem_bytes_; i += kPage) mem_[i] = 0;
        for (size_t m = 0; m < n_moe; ++m)
            for (uint64_t o : offs[m]) base_[m].push_back(mem_ + o);
        slot_of_.assign(n_moe, std::vector<int32_t>(index_.n_expert, -1));
        occupant_.assign(n_moe, std::vector<int32_t>(k_, -1));
        stamp_.assign(n_moe, std::vector<uint64_t>(k_, 0));
        slotted_.assign(n_moe, 0);
        staged_.assign(n_moe, {});
        ever_.assign(n_moe, std::vector<uint8_t>(index_.n_expert, 0));
        stats_.budget_bytes = budget_;
        return Status::Ok();
    }

    uint8_t * tensor_base(size_t moe_idx, size_t t) override {
        return bank_->tensor_base(moe_idx, t);
    }

    Status stage(size_t m, const std::vector<uint32_t> & experts, std::vector<ReadRequest> * reads,
                 StageStats * stats) override {
        staged_[m].clear();
        if (experts.size() > k_) {  // wider than the slots: canonical offsets, shared slots
            slotted_[m] = 0;
            StageStats bs;
            Status st = bank_->stage(m, experts, reads, &bs);
            add(stats, bs);
            return st;
        }
        slotted_[m] = 1;
        const MoeLayer & L = index_.moe_layers[m];
        std::vector<int32_t> & slot_of = slot_of_[m];
        std::vector<int32_t> & occ = occupant_[m];
        std::vector<uint64_t> & stamp = stamp_[m];
        const uint64_t now = ++clock_;
        for (uint32_t e : experts)  // hits first: a routed expert keeps its slot
            if (slot_of[e] >= 0) stamp[size_t(slot_of[e])] = now;
        for (uint32_t e : experts) {
            StageStats one;
            one.lookups = 1;
            (slot_of[e] >= 0 ? one.hits : one.misses) = 1;
            add(stats, one);
            if (slot_of[e] >= 0) continue;
            // Victim: a free slot, else the least recently used slot not routed now.
            size_t v = SIZE_MAX;
            for (size_t i = 0; i < k_; ++i) {
                if (stamp[i] == now) continue;
                if (occ[i] < 0) {
                    v = i;
                    break;
                }
                if (v == SIZE_MAX || stamp[i] < stamp[v]) v = i;
            }
            if (v == SIZE_MAX)
                return Status::Runtime("slot cache: no free slot (routing wider than K)");
            if (occ[v] >= 0) {
                slot_of[size_t(occ[v])] = -1;
                ++stats_.evictions;
            }
            if (ever_[m][e]) ++stats_.rereads;
            ever_[m][e] = 1;
            occ[v] = int32_t(e);
            slot_of[e] = int32_t(v);
            stamp[v] = now;
            staged_[m].push_back(e);
            for (size_t t = 0; t < L.tensors.size(); ++t) {
                const ExpertTensor & et = L.tensors[t];
                reads->push_back({et.slice_offset(e), et.slice_bytes,
                                  base_[m][t] + uint64_t(v) * et.slice_bytes,
                                  et.proj == Projection::kDown, et.shard});
            }
        }
        return Status::Ok();
    }

    void abandon_stage(size_t m) override {
        if (!slotted_[m]) return bank_->abandon_stage(m);
        for (uint32_t e : staged_[m]) {
            const int32_t s = slot_of_[m][e];
            if (s < 0) continue;
            occupant_[m][size_t(s)] = -1;
            stamp_[m][size_t(s)] = 0;
            slot_of_[m][e] = -1;
            ++stats_.abandoned;
        }
        staged_[m].clear();
    }

    const int32_t * slot_map(size_t m) const override {
        return slotted_[m] ? slot_of_[m].data() : nullptr;
    }
    uint8_t * placement_base(size_t m, size_t t) override {
        return slotted_[m] ? base_[m][t] : bank_->tensor_base(m, t);
    }

    bool is_resident(size_t m, uint32_t e) const override {
        return slot_of_[m][e] >= 0 || bank_->is_resident(m, e);
    }
    size_t prefetch(size_t m, const std::vector<uint32_t> & experts,
                    std::vector<ReadRequest> * reads) override {
        return bank_->prefetch(m, experts, reads);
    }
    void end_prefetch(bool ok) override { bank_->end_prefetch(ok); }

    CacheStats cache_stats() const override {
        CacheStats c;
        static_cast<LedgerStats &>(c) = stats_;
        const CacheStats bank = bank_->cache_stats();  // the shared slots' read-ahead counters
        c.prefetched = bank.prefetched;
        c.prefetch_used = bank.prefetch_used;
        c.prefetch_unused = bank.prefetch_unused;
        uint64_t live = 0;
        for (const auto & occ : occupant_)
            for (int32_t e : occ) live += e >= 0;
        c.resident_experts = live;
        c.resident_expert_bytes = mem_bytes_;
        c.peak_resident_bytes = mem_bytes_;
        c.reserved_bytes = mem_bytes_;
        c.page_bytes = kPage;
        c.slots_per_layer = k_;
        return c;
    }

    uint64_t resident_bytes() const override { return mem_bytes_ + bank_->resident_bytes(); }
    uint64_t reserved_bytes() const override { return mem_bytes_ + bank_->reserved_bytes(); }

private:
    void add(StageStats * s, const StageStats & d) {
        s->lookups += d.lookups;
        s->hits += d.hits;
        s->misses += d.misses;
        stats_.lookups += d.lookups;
        stats_.hits += d.hits;
        stats_.misses += d.misses;
    }

    const ModelIndex & index_;
    const uint64_t budget_;
    std::unique_ptr<ResidencyStore> bank_;  // canonical offsets, for routings wider than K
    uint32_t k_ = 0;                        // slots per MoE layer
    uint8_t * mem_ = nullptr;               // every slot of every layer, one mapping
    uint64_t mem_bytes_ = 0;
    std::vector<std::vector<uint8_t *>> base_;    // [moe layer][tensor]: slot 0's address
    std::vector<std::vector<int32_t>> slot_of_;   // [moe layer][expert]: its slot, -1 none
    std::vector<std::vector<int32_t>> occupant_;  // [moe layer][slot]: its expert, -1 free
    std::vector<std::vector<uint64_t>> stamp_;    // [moe layer][slot]: last stage that routed it
    std::vector<std::vector<uint8_t>> ever_;      // [moe layer][expert]: ever read (rereads)
    std::vector<uint8_t> slotted_;                // [moe layer]: the last stage used slots
    std::vector<std::vector<uint32_t>> staged_;   // [moe layer]: misses of the last stage
    uint64_t clock_ = 0;
    LedgerStats stats_;
};

}  // namespace

std::unique_ptr<ResidencyStore> make_slot_cache(const ModelIndex & index, uint64_t budget_bytes,
                                                bool two_sets, Status * st) {
    auto s = std::make_unique<SlotCache>(index, budget_bytes);
    *st = s->init(two_sets);
    if (!st->ok()) return nullptr;
    return s;
}

}  // namespace moestream
