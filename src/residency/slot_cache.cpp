// slot_cache.cpp — SlotCache, the fixed-slot expert cache (see residency.h, make_slot_cache).
//
// Why: the LRU cache (residency_cache.cpp) keeps expert e of a layer at its canonical offset,
// so every miss maps new pages at a new address, and the first access through each new
// page-table entry costs (docs/cache.md, "First access through a new page-table entry").
// Here a layer's experts live in K slots whose pages are populated once, from creation on; a miss
// is read (O_DIRECT) into a slot that is already mapped, and the graph's expert ids are
// rewritten to slot indices (stream/slot_rewriter.h) so that MUL_MAT_ID finds them there.
//
// Bookkeeping: an ExpertLedger in slot mode (expert_ledger.h) holds which expert sits in which
// slot, the stamps, the victims and the counters; this file is its memory back-end (the slots'
// mapping, the reads into them, the warm copies) plus the shared slots for wide routings. So
// `moestream replay` runs the same ledger over a trace of this store and reproduces its
// decisions. Invariants (the ledger's): a routed expert is never the victim of its own stage;
// a stage's misses are forgotten by abandon_stage() (their reads failed); a layer only ever
// evicts its own experts.
// Warm start (warm_slots): after a wide routing, its most recent experts are copied from the
// shared slots into the layer's slots, so decode does not start with empty slots.
// Thread-safety: called from the eval callback only (one thread at a time); warm_slots()
// splits its copies with a helper thread it joins before returning.
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

#include "huge_pages.h"
#include "residency.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (older headers)
#endif

namespace moestream {
namespace {

constexpr uint64_t kPage = 4096;  // any direct-I/O alignment divides it

uint64_t round_up(uint64_t v, uint64_t a) {
    return (v + a - 1) / a * a;
}

// Bytes of one expert slot in every MoE layer.
uint64_t one_slot_everywhere(const ModelIndex & index) {
    uint64_t b = 0;
    for (const auto & L : index.moe_layers) b += L.expert_bytes;
    return b;
}

// One mapping for every (layer, tensor) region of k slots, each page-aligned plus the phase of
// its file offset, so that a slice read into slot s is congruent to its file offset when the
// slice size is a multiple of the page (the usual case; else the lanes bounce it). Returns its
// bytes; *offs (optional): per MoE layer, per tensor, the region's offset in the mapping.
uint64_t slot_layout(const ModelIndex & index, uint32_t k,
                     std::vector<std::vector<uint64_t>> * offs) {
    if (offs != nullptr) offs->assign(index.moe_layers.size(), {});
    uint64_t off = 0;
    for (size_t m = 0; m < index.moe_layers.size(); ++m)
        for (const ExpertTensor & t : index.moe_layers[m].tensors) {
            if (offs != nullptr) (*offs)[m].push_back(off + t.file_offset % kPage);
            off = round_up(off + t.file_offset % kPage + uint64_t(k) * t.slice_bytes, kPage);
        }
    return off;
}

std::string mib_text(uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
    return buf;
}

class SlotCache final : public ResidencyStore, public SlotPlacement {
public:
    SlotCache(const ModelIndex & index, uint64_t budget, const SlotTestHooks & test,
              const SlotOptions & opt)
        : index_(index), budget_(budget), test_(test), opt_(opt) {}
    ~SlotCache() override {
        stop_populate_.store(true, std::memory_order_relaxed);
        if (populate_thread_.joinable()) populate_thread_.join();
        if (mem_ != nullptr) munmap(mem_, mem_bytes_);
    }

    Status init(bool two_sets) {
        const size_t n_moe = index_.moe_layers.size();
        const uint64_t per_slot_all = one_slot_everywhere(index_);
        if (per_slot_all == 0) return Status::Runtime("slot cache: the model has no expert bytes");
        k_ = slot_cache_slots(index_, budget_, two_sets);
        if (k_ < index_.n_expert_used)
            return Status::Usage(
                "the fixed-slot cache needs at least " + std::to_string(index_.n_expert_used) +
                " slots per MoE layer (the routing width) besides the shared slots for prompt "
                "batches: " +
                mib_text(index_.n_expert_used * per_slot_all +
                         shared_slot_set_bytes(index_) * (two_sets ? 2 : 1)) +
                " or more of cache budget, " + mib_text(budget_) + " given");
        // Every expert slotted: no routing is wider than the slots, and the shared slots are
        // made (address space, never touched) only so that tensor_base() has a home.
        wide_ = k_ < index_.n_expert;
        const bool bank_two_sets = two_sets && wide_;
        Status st;
        bank_ = make_shared_slots(index_, &st, bank_two_sets, opt_.huge_pages);
        if (!st.ok()) return st;
        std::vector<std::vector<uint64_t>> offs;
        mem_bytes_ = slot_layout(index_, k_, &offs);
        base_.assign(n_moe, {});
        mem_ = opt_.huge_pages ? map_huge_aligned(mem_bytes_) : map_plain(mem_bytes_);
        if (mem_ == nullptr)
            return Status::Runtime("slot cache: cannot map " + std::to_string(mem_bytes_ >> 20) +
                                   " MiB for the expert slots: " + std::strerror(errno));
        if (opt_.huge_pages) huge_bytes_ = advise_huge_pages(mem_, mem_bytes_);
        populate();
        for (size_t m = 0; m < n_moe; ++m)
            for (uint64_t o : offs[m]) base_[m].push_back(mem_ + o);
        ledger_ = std::make_unique<ExpertLedger>(slot_ledger_shape(index_, k_), budget_,
                                                 make_lru_policy(), /*backend=*/nullptr);
        slotted_.assign(n_moe, 0);
        bank_holds_.assign(bank_two_sets ? 2 : 1, -1);
        bank_routed_.assign(bank_holds_.size(), std::vector<uint8_t>(index_.n_expert, 0));
        return Status::Ok();
    }

    uint8_t * tensor_base(size_t moe_idx, size_t t) override {
        return bank_->tensor_base(moe_idx, t);
    }

    Status stage(size_t m, const std::vector<uint32_t> & experts, std::vector<ReadRequest> * reads,
                 StageStats * stats) override {
        if (experts.size() > k_) {  // wider than the slots: canonical offsets, shared slots
            slotted_[m] = 0;
            StageStats bs;
            Status st = bank_->stage(m, experts, reads, &bs);
            add(stats, bs);
            const size_t set = m % bank_holds_.size();
            bank_holds_[set] = st.ok() ? int64_t(m) : -1;
            std::fill(bank_routed_[set].begin(), bank_routed_[set].end(), 0);
            for (uint32_t e : experts) bank_routed_[set][e] = 1;
            return st;
        }
        slotted_[m] = 1;
        StageStats one;
        Status st = ledger_->stage(uint32_t(m), experts, nullptr, &one);
        stats->lookups += one.lookups;
        stats->hits += one.hits;
        stats->misses += one.misses;
        if (!st.ok()) return st;
        const int32_t * slot = ledger_->slot_map(uint32_t(m));
        for (uint32_t e : ledger_->staged()) push_reads(m, e, size_t(slot[e]), reads);
        return Status::Ok();
    }

    void abandon_stage(size_t m) override {
        if (!slotted_[m]) {
            bank_holds_[m % bank_holds_.size()] = -1;  // its reads failed: nothing to warm from
            return bank_->abandon_stage(m);
        }
        if (ledger_->staged_layer() == m) ledger_->abandon_stage();
    }

    SlotPlacement * slot_placement() override { return this; }
    const int32_t * slot_map(size_t m) const override {
        return slotted_[m] ? ledger_->slot_map(uint32_t(m)) : nullptr;
    }
    uint8_t * placement_base(size_t m, size_t t) override {
        return slotted_[m] ? base_[m][t] : bank_->tensor_base(m, t);
    }

    bool is_resident(size_t m, uint32_t e) const override {
        // The slots only: what a routing of one token (decode) would hit. A wide routing reads
        // every expert into the shared slots, but for their read-ahead.
        return ledger_->live(uint32_t(m), e);
    }
    void stage_hits(size_t m, const std::vector<uint32_t> & experts,
                    std::vector<uint8_t> * hit) const override {
        if (experts.size() > k_) return bank_->stage_hits(m, experts, hit);  // as stage()
        ResidencyStore::stage_hits(m, experts, hit);
    }
    size_t prefetch(size_t m, const std::vector<uint32_t> & experts,
                    std::vector<ReadRequest> * reads) override {
        // A guess of one token's routing goes into the layer's slots, where its stage looks;
        // a wider one (a prompt ubatch's) into the other set of shared slots while a
        // routing can be wider than the slots.
        const bool one_token = experts.size() <= index_.n_expert_used;
        ra_ = RaCall::kNone;
        if (wide_ && !one_token) {
            const size_t n = bank_->prefetch(m, experts, reads);
            if (bank_->last_read_ahead().ledger) ra_ = RaCall::kBank;
            if (n > 0) bank_holds_[m % bank_holds_.size()] = -1;  // that set is overwritten
            bank_ahead_ = n > 0;  // (no reads: no tail, and no end_prefetch)
            return n;
        }
        // Into slots: every expert of the guess is protected from this call's evictions (one
        // stamp); one token's guess may evict the layer's least recently used slots, a wide
        // guess only fills free ones. end_prefetch(false) forgets what it placed.
        return prefetch_slots(m, experts, one_token, reads);
    }
    // A guess into the layer's slots (may_evict false: free slots only; warm: the warm set's,
    // ExpertLedger::prefetch_slots), its reads appended.
    size_t prefetch_slots(size_t m, const std::vector<uint32_t> & experts, bool may_evict,
                          std::vector<ReadRequest> * reads, bool warm = false) {
        if (!ledger_->prefetching().empty() || m >= index_.moe_layers.size()) return 0;
        const size_t n = ledger_->prefetch_slots(uint32_t(m), experts, may_evict, warm);
        if (!warm) ra_ = RaCall::kSlots;
        const int32_t * slot = ledger_->slot_map(uint32_t(m));
        if (test_.prefetch_skip_read) {  // recorded as slotted, nothing read (no tail to end)
            ledger_->end_prefetch(true);
            return n;
        }
        for (uint32_t e : ledger_->prefetching()) push_reads(m, e, size_t(slot[e]), reads);
        return n;
    }

    size_t prefetch_free(size_t m, const std::vector<uint32_t> & experts,
                         std::vector<ReadRequest> * reads) override {
        return prefetch_slots(m, experts, /*may_evict=*/false, reads, /*warm=*/true);
    }
    void end_prefetch_first(size_t n_read) override {
        bank_ahead_ = false;  // (prefetch_free never reads into the shared slots)
        ledger_->end_prefetch_first(n_read);
    }

    size_t warm_slots(size_t m, const std::vector<uint32_t> & recent_first) override {
        const size_t set = m % bank_holds_.size();
        if (slotted_[m] || bank_holds_[set] != int64_t(m)) return 0;
        const size_t n = std::min<size_t>(recent_first.size(), k_);
        const MoeLayer & L = index_.moe_layers[m];
        size_t copied = 0;
        std::vector<Copy> copies;
        for (size_t i = n; i-- > 0;) {  // oldest first: the most recent gets the newest stamp
            const uint32_t e = recent_first[i];
            if (e >= index_.n_expert || !bank_routed_[set][e]) continue;
            const int32_t v = ledger_->warm(uint32_t(m), e);
            if (v == -1) continue;  // slotted already: now the most recent
            if (v < 0) break;
            if (!test_.warm_skip_copy)
                for (size_t t = 0; t < L.tensors.size(); ++t) {
                    const uint64_t sb = L.tensors[t].slice_bytes;
                    copies.push_back({base_[m][t] + uint64_t(v) * sb,
                                      bank_->tensor_base(m, t) + uint64_t(e) * sb, sb});
                }
            ++copied;
        }
        const auto t0 = std::chrono::steady_clock::now();
        run_copies(copies);
        warm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stats_warm_ += copied;
        return copied;
    }
    ReadAheadCall last_read_ahead() const override {
        if (ra_ == RaCall::kBank) return {true, true, bank_->last_read_ahead().experts};
        return {ra_ == RaCall::kSlots, false, &ledger_->prefetching()};
    }
    void end_prefetch(bool ok) override {
        if (bank_ahead_) bank_->end_prefetch(ok);
        bank_ahead_ = false;
        ledger_->end_prefetch(ok);  // failed reads: the slots are free again, the experts absent
    }

    bool forget(size_t m, uint32_t e) override { return ledger_->forget(uint32_t(m), e); }

    // The slot ledger's, with the routings staged to the shared slots and their read-ahead;
    // resident bytes: the slots' memory (allocated once).
    LedgerStats ledger_stats() const override {
        LedgerStats c = ledger_->stats();
        const LedgerStats bank = bank_->ledger_stats();  // the shared slots' read-ahead counters
        c.prefetched += bank.prefetched;
        c.prefetch_used += bank.prefetch_used;
        c.prefetch_unused += bank.prefetch_unused;
        c.budget_bytes = budget_;
        c.lookups += wide_stats_.lookups;
        c.hits += wide_stats_.hits;
        c.misses += wide_stats_.misses;
        c.resident_expert_bytes = resident_bytes();
        c.peak_resident_bytes = c.resident_expert_bytes;
        return c;
    }
    SlotStats slot_stats() const override {
        SlotStats s;
        s.slots_per_layer = k_;
        s.warm_copies = stats_warm_;
        s.warm_s = warm_s_;
        return s;
    }
    uint64_t huge_page_bytes() const override {
        return huge_bytes_ + (wide_ ? bank_->huge_page_bytes() : 0);
    }

    uint64_t resident_bytes() const override {
        return mem_bytes_ + (wide_ ? bank_->resident_bytes() : 0);
    }
    uint64_t reserved_bytes() const override {
        return mem_bytes_ + (wide_ ? bank_->reserved_bytes() : 0);
    }

private:
    // `bytes` of anonymous memory (nullptr, errno set, when it cannot be mapped).
    static uint8_t * map_plain(uint64_t bytes) {
        void * p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
    }

    // Every page of the slots gets its page-table entry once, so the matmuls never meet a new
    // one later. With MADV_POPULATE_WRITE (Linux 5.14+) a background thread does it from the
    // dense read on: under SCHED_IDLE (SlotOptions::populate, the default) it runs only on
    // cores nothing else wants, so it takes no CPU time from the dense read, the prompt or a
    // decode (where SCHED_IDLE is refused, or with kNice, at nice +10; a host that backs guest
    // memory lazily can still hold the vCPU while it faults a page in). It never changes a page's bytes, so
    // the reads and copies that may already land in the slots are safe. Without
    // MADV_POPULATE_WRITE, every page is touched here, before any read can start.
    void populate() {
        if (opt_.populate == SlotOptions::Populate::kOff) return;
        if (madvise(mem_, kPage, MADV_POPULATE_WRITE) != 0) {
            for (uint64_t i = 0; i < mem_bytes_; i += kPage) mem_[i] = 0;
            return;
        }
        try {
            populate_thread_ = std::thread([this] {
                const pid_t tid = pid_t(syscall(SYS_gettid));
                struct sched_param sp {};
                if (opt_.populate != SlotOptions::Populate::kIdle ||
                    sched_setscheduler(tid, SCHED_IDLE, &sp) != 0) {
                    errno = 0;
                    const int nice_now = getpriority(PRIO_PROCESS, id_t(tid));
                    if (errno == 0)
                        setpriority(PRIO_PROCESS, id_t(tid), std::min(19, nice_now + 10));
                }
                constexpr uint64_t kStep = 64ull << 20;  // checks for the destructor between steps
                for (uint64_t o = 0; o < mem_bytes_; o += kStep) {
                    if (stop_populate_.load(std::memory_order_relaxed)) return;
                    // An error (ENOMEM under a cap) leaves the rest to fault on first use.
                    if (madvise(mem_ + o, std::min(kStep, mem_bytes_ - o), MADV_POPULATE_WRITE) != 0)
                        return;
                }
            });
        } catch (const std::system_error &) {  // no thread: touch here
            for (uint64_t i = 0; i < mem_bytes_; i += kPage) mem_[i] = 0;
        }
    }

    struct Copy {
        uint8_t * dst;
        const uint8_t * src;
        uint64_t len;
    };
    // The copies, split over up to kCopyThreads threads (this one included): the eval
    // callback runs while the compute threads wait, so their cores are free.
    static void run_copies(const std::vector<Copy> & copies) {
        constexpr size_t kCopyThreads = 2;
        constexpr uint64_t kSmall = 4ull << 20;  // below this, one thread
        uint64_t total = 0;
        for (const Copy & c : copies) total += c.len;
        const auto copy_part = [&copies](size_t part, size_t parts) {
            for (size_t i = part; i < copies.size(); i += parts)
                std::memcpy(copies[i].dst, copies[i].src, copies[i].len);
        };
        if (total < kSmall || copies.size() < 2) return copy_part(0, 1);
        std::vector<std::thread> helpers;
        for (size_t p = 1; p < kCopyThreads; ++p) {
            try {
                helpers.emplace_back(copy_part, p, kCopyThreads);
            } catch (const std::system_error &) {  // no thread: this one copies that part
                copy_part(p, kCopyThreads);
            }
        }
        copy_part(0, kCopyThreads);
        for (std::thread & h : helpers) h.join();
    }

    // The reads of expert e of layer m into slot v, one per projection.
    void push_reads(size_t m, uint32_t e, size_t v, std::vector<ReadRequest> * reads) const {
        const MoeLayer & L = index_.moe_layers[m];
        for (size_t t = 0; t < L.tensors.size(); ++t) {
            const ExpertTensor & et = L.tensors[t];
            reads->push_back({et.slice_offset(e), et.slice_bytes,
                              base_[m][t] + uint64_t(v) * et.slice_bytes,
                              et.proj == Projection::kDown, et.shard});
        }
    }
    // A wide routing's lookups (staged to the shared slots), into *s and the store's counters.
    void add(StageStats * s, const StageStats & d) {
        s->lookups += d.lookups;
        s->hits += d.hits;
        s->misses += d.misses;
        wide_stats_.lookups += d.lookups;
        wide_stats_.hits += d.hits;
        wide_stats_.misses += d.misses;
    }

    const ModelIndex & index_;
    const uint64_t budget_;
    std::unique_ptr<ResidencyStore> bank_;  // canonical offsets, for routings wider than K
    bool wide_ = true;                      // K < n_expert: a routing may be wider than K
    bool bank_ahead_ = false;  // the open prefetch went to the shared slots
    // Which ledger the last prefetch() called (last_read_ahead()).
    enum class RaCall { kNone, kSlots, kBank } ra_ = RaCall::kNone;
    // Which expert sits in which slot, the stamps, victims and counters (slot mode).
    std::unique_ptr<ExpertLedger> ledger_;
    uint32_t k_ = 0;                        // slots per MoE layer
    uint8_t * mem_ = nullptr;               // every slot of every layer, one mapping
    uint64_t mem_bytes_ = 0;
    std::vector<std::vector<uint8_t *>> base_;    // [moe layer][tensor]: slot 0's address
    std::vector<uint8_t> slotted_;                // [moe layer]: the last stage used slots
    // [set]: the MoE layer whose wide stage the shared slots' set holds intact (-1: none, or
    // reused since by a prefetch or a failed read) and, per expert, whether it was routed there.
    std::vector<int64_t> bank_holds_;
    std::vector<std::vector<uint8_t>> bank_routed_;
    const SlotTestHooks test_;
    const SlotOptions opt_;
    uint64_t huge_bytes_ = 0;  // bytes of the slots advised for transparent huge pages
    std::thread populate_thread_;  // populate(): the slots' page-table entries
    std::atomic<bool> stop_populate_{false};
    StageStats wide_stats_;  // lookups of the routings staged to the shared slots
    uint64_t stats_warm_ = 0;
    double warm_s_ = 0;
};

}  // namespace

LedgerShape slot_ledger_shape(const ModelIndex & index, uint32_t slots_per_layer) {
    LedgerShape shape;
    shape.slots_per_layer = slots_per_layer;
    shape.page_bytes = kPage;
    for (const MoeLayer & L : index.moe_layers) {
        shape.layers.emplace_back();
        for (const ExpertTensor & t : L.tensors)
            shape.layers.back().push_back(
                PageLayout{t.file_offset % kPage, t.slice_bytes, kPage, index.n_expert});
    }
    return shape;
}

uint32_t slot_cache_slots(const ModelIndex & index, uint64_t budget_bytes, bool two_sets) {
    const uint64_t per = one_slot_everywhere(index);
    if (per == 0) return 0;
    if (slot_layout(index, index.n_expert, nullptr) <= budget_bytes) return index.n_expert;
    const uint64_t bank = shared_slot_set_bytes(index) * (two_sets ? 2 : 1);
    if (budget_bytes <= bank) return 0;
    const uint64_t left = budget_bytes - bank;
    auto k = uint32_t(std::min<uint64_t>(left / per, index.n_expert));
    while (k > 0 && slot_layout(index, k, nullptr) > left) --k;  // the regions' page rounding
    return k;
}

std::unique_ptr<ResidencyStore> make_slot_cache(const ModelIndex & index, uint64_t budget_bytes,
                                                bool two_sets, Status * st,
                                                const SlotTestHooks & test,
                                                const SlotOptions & opt) {
    auto s = std::make_unique<SlotCache>(index, budget_bytes, test, opt);
    *st = s->init(two_sets);
    if (!st->ok()) return nullptr;
    return s;
}

}  // namespace moestream
