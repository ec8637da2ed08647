// residency_cache.cpp — LruCache, the bounded expert cache (see residency.h, docs/cache.md).
//
// Layout: one reservation per (MoE layer, projection tensor) of the tensor's full size,
// rounded up to whole pages. Expert e of that tensor sits at base + e * slice_bytes, its
// canonical offset, so llama.cpp's MUL_MAT_ID finds it where it expects it. Nothing is
// committed until an expert is loaded: a miss commits the pages covering the expert's slice
// in every projection, a release gives back the pages that no other live expert of the same
// tensor also covers (slices need not be page multiples, so neighbours can share a page).
//
// Recycled pages (the default with page protection; page_pool.h): a live expert holds one
// pool chunk per projection, mapped at its canonical address; an eviction hands the chunk
// back and the next miss maps it again, so no page is freed, zero-filled and charged anew.
// A boundary page two live experts share is backed by one of their chunks (its owner); when
// the owner goes first, the page's bytes move into the other's chunk. Budget accounting is
// then in whole chunks per live expert (PageLayout::chunk_pages; the replay does the same).
//
// Moved pages (CacheOptions::move_pages): an expert evicted by stage() or prefetch() does not
// unmap its chunk at once; the chunk is parked, still mapped at the victim's address. A miss
// of the same call that needs the same pages of a chunk of that class takes a parked one
// and moves the mapping to its own address (mremap with MREMAP_DONTUNMAP; the victim's range
// then gets its PROT_NONE reservation back): page-table entries move instead of being torn
// down and faulted in again. Parked chunks are unmapped and handed back to the pool before
// the call returns (and before any commit that would map over one of their pages), so no
// read or matmul ever sees one: outside stage() and prefetch() nothing is parked.
//
// Split staging (stage_split / commit_deferred; recycled pages only): the ledger's stage runs
// as in stage() (every decision and eviction), but the misses' slices of the deferred
// tensors are not mapped yet: a deferred slice has no chunk (chunk[e] == kNoChunk) until
// commit_deferred() maps it. Page ownership follows what is mapped: the pages a commit maps
// and a release frees are computed against the neighbours that hold a chunk in that tensor,
// so a boundary page between a victim and a deferred miss goes with the victim and the miss
// maps it later. Chunks parked by the stage's evictions stay parked (mapped only at the
// victims' addresses, which no read or matmul touches) until the deferred commits are done.
//
// Which expert is absent, pending or resident, what it costs, and which one an eviction takes
// is the ExpertLedger's (expert_ledger.h, with the LRU policy of eviction_policy.h); this file
// is its memory back-end: the ledger calls commit() and release() here, and stage() and
// prefetch() turn the ledger's commits into reads.
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>

#include "expert_ledger.h"
#include "moestream/log.h"
#include "page_layout.h"
#include "page_pool.h"
#include "residency.h"
#include "moestream/sysinfo.h"

namespace moestream {
namespace {

constexpr uint8_t kPoisonByte = 0xFF;
constexpr uint64_t kPoisonWord = ~uint64_t(0);
constexpr uint64_t kNoChunk = ~uint64_t(0);

std::string errno_str(int e) {
    return std::string(std::strerror(e));
}

uint64_t read_max_map_count() {
    uint64_t v = 65530;  // the kernel default
    if (FILE * f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
        unsigned long long x = 0;
        if (std::fscanf(f, "%llu", &x) == 1 && x > 0) v = x;
        std::fclose(f);
    }
    return v;
}

uint64_t count_current_maps() {
    uint64_t n = 0;
    if (FILE * f = std::fopen("/proc/self/maps", "r")) {
        int c;
        while ((c = std::fgetc(f)) != EOF)
            if (c == '\n') ++n;
        std::fclose(f);
    }
    return n;
}

class LruCache final : public ResidencyStore, public SplitStaging, public PagedMemory,
                       private LedgerBackend {
public:
    LruCache(const ModelIndex & index, uint64_t budget, const CacheOptions & opt,
             const CacheDebug & dbg, const CacheTestHooks & test)
        : index_(index), budget_(budget), opt_(opt), dbg_(dbg), test_(test) {}

    ~LruCache() override {
        for (const Reservation & r : res_)
            if (r.base) munmap(r.base, r.map_bytes);
    }

    Status init();

    uint8_t * tensor_base(size_t moe_idx, size_t t) override {
        const Reservation & r = res_[layer_res_[moe_idx] + t];
        return r.base + r.phase;
    }

    Status stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                 std::vector<ReadRequest> * reads, StageStats * stats) override {
        return stage_impl(moe_idx, experts, 0, reads, stats);
    }
    Status stage_split(size_t moe_idx, const std::vector<uint32_t> & experts, uint64_t now_mask,
                       std::vector<ReadRequest> * reads, StageStats * stats,
                       bool * deferred) override;
    Status commit_deferred(size_t moe_idx, uint64_t mask) override;
    SplitStaging * split_staging() override { return this; }
    void abandon_stage(size_t /*moe_idx*/) override {
        ledger_->abandon_stage();  // (deferred slices have no chunk: nothing to release there)
        end_deferred();
    }
    bool forget(size_t moe_idx, uint32_t e) override {
        return ledger_->forget(uint32_t(moe_idx), e);
    }
    size_t prefetch(size_t moe_idx, const std::vector<uint32_t> & experts,
                    std::vector<ReadRequest> * reads) override {
        return prefetch(moe_idx, experts, reads, /*may_evict=*/true);
    }
    // prefetch() and prefetch_free(): the ledger's prefetch, its commits turned into reads.
    size_t prefetch(size_t moe_idx, const std::vector<uint32_t> & experts,
                    std::vector<ReadRequest> * reads, bool may_evict);
    void end_prefetch(bool ok) override { ledger_->end_prefetch(ok); }
    size_t prefetch_free(size_t moe_idx, const std::vector<uint32_t> & experts,
                         std::vector<ReadRequest> * reads) override {
        return prefetch(moe_idx, experts, reads, /*may_evict=*/false);
    }
    void end_prefetch_first(size_t n_read) override { ledger_->end_prefetch_first(n_read); }

    uint64_t resident_bytes() const override { return ledger_->committed_bytes(); }
    uint64_t reserved_bytes() const override { return reserved_; }

    bool is_resident(size_t moe_idx, uint32_t e) const override {
        if (moe_idx >= ledger_->n_layers() || e >= ledger_->n_expert(uint32_t(moe_idx)))
            return false;
        return ledger_->live(uint32_t(moe_idx), e);
    }

    LedgerStats ledger_stats() const override { return ledger_->stats(); }
    ReadAheadCall last_read_ahead() const override {
        return {true, false, &ledger_->prefetching()};
    }
    const PagedMemory * paged_memory() const override { return this; }
    PageStats page_stats() const override {
        PageStats s;
        s.reserved_bytes = reserved_;
        s.page_bytes = page_;
        s.page_protect = protect_;
        s.recycle_pages = recycle_;
        s.move_pages = move_;
        s.recycled_commits = recycled_commits_;
        s.moved_commits = moved_commits_;
        s.deferred_commits = deferred_commits_;
        s.pool_bytes = pool_ ? pool_->held_bytes() : 0;
        s.pool_leaked_chunks = leaked_chunks_;
        return s;
    }
    PoolWarmStats pool_warm_stats() const override {
        PoolWarmStats s;
        if (pool_) {
            const PagePool::WarmStats w = pool_->warm_stats();
            s.planned_bytes = w.planned_bytes;
            s.bytes = w.warmed_bytes;
            s.seconds = w.seconds;
            s.error = w.error;
            s.warmed_commits = pool_->warmed_taken();
        }
        return s;
    }

    Status verify_resident(size_t moe_idx, const std::vector<uint32_t> & experts) override;

private:
    struct Reservation {
        uint8_t * base = nullptr;
        uint64_t map_bytes = 0;    // phase + tensor bytes, rounded up to whole pages
        uint64_t slice_bytes = 0;  // bytes of one expert
        // The tensor starts `phase` bytes into the reservation: its file offset modulo the
        // page size, so every slice's address is congruent to its file offset and O_DIRECT
        // reads land in place (io_lanes.h, page_layout.h).
        uint64_t phase = 0;
        PageLayout layout;  // the same numbers, for the page arithmetic
        // Recycled pages only:
        uint32_t cls = 0;            // the pool class of its chunks
        uint64_t chunk_pages = 0;    // pages per chunk (layout.chunk_pages())
        std::vector<uint64_t> chunk; // per expert: its chunk's pool offset, kNoChunk if absent
        // Pages that can be shared by several experts, while mapped: which live expert's
        // chunk backs them. Interior pages are always backed by their only expert's chunk.
        std::unordered_map<uint64_t, uint32_t> owner;
    };

    // LedgerBackend: the memory under the ledger's decisions.
    Status commit(uint32_t moe_idx, uint32_t e, int * err) override;
    void release(uint32_t moe_idx, uint32_t e, bool park) override;
    bool free_uncounted() override {
        return recycle_ && pool_->punch_free_chunk(PagePool::kAnyClass);
    }
    void budget_shrunk(uint64_t was, uint64_t now) override;

    // The stage: defer_mask = tensors whose miss slices wait for commit_deferred() (0: none).
    Status stage_impl(size_t moe_idx, const std::vector<uint32_t> & experts, uint64_t defer_mask,
                      std::vector<ReadRequest> * reads, StageStats * stats);
    // Maps expert e's slice of projection t (see commit()). `committed`: committed expert
    // bytes before it is mapped, or with it when `charged` (the pool's cap is what is
    // committed once it is mapped); check_limit: apply CacheTestHooks::commit_limit_bytes.
    // *cost (if given): the bytes it maps (set on success and failure).
    Status commit_projection(uint32_t moe_idx, size_t t, uint32_t e, uint64_t committed,
                             bool charged, bool check_limit, int * err,
                             uint64_t * cost = nullptr);
    // The error of a refused commit of expert e's slice of projection t: `what` failed with err.
    Status commit_error(uint32_t moe_idx, size_t t, uint32_t e, const char * what, int err) const;
    // The pages [*q0, *q1) of e's slice of projection t that no other expert holding pages
    // there covers: what committing e there maps, or releasing it frees.
    void own_pages(uint32_t moe_idx, size_t t, uint32_t e, uint64_t * q0, uint64_t * q1) const {
        if (!recycle_) {
            ledger_->exclusive_pages(moe_idx, t, e, q0, q1);
            return;
        }
        const Reservation & r = res_[layer_res_[moe_idx] + t];
        r.layout.exclusive_pages(e, [&r](uint32_t x) { return r.chunk[x] != kNoChunk; }, q0, q1);
    }
    // Closes the split stage's deferred work (done or abandoned): parked chunks go back.
    void end_deferred() {
        defer_left_ = 0;
        flush_parked();
    }

    // Pages [*p0, *p1) covering expert e's slice of reservation r.
    static void page_range(const Reservation & r, uint32_t e, uint64_t * p0, uint64_t * p1) {
        r.layout.pages_of(e, p0, p1);
    }
    size_t layers_res_count(size_t moe_idx) const {
        return layer_res_[moe_idx + 1] - layer_res_[moe_idx];
    }

    // Gives back expert e's memory in projection t (the ledger still says live).
    // park: leave the chunk mapped where it is, in parked_, for a commit of the same call.
    void release_projection(size_t moe_idx, size_t t, uint32_t e, bool park);
    // Moved pages: a chunk taken from an evicted expert and still mapped at its address.
    struct Parked {
        uint32_t cls;    // pool class
        uint64_t off;    // chunk offset in the class's memfd
        uint8_t * addr;  // where pages [first, first + n) of the chunk are mapped now
        uint64_t first;
        uint64_t n;
    };
    // Unmaps parked_[i] (a PROT_NONE reservation again) and gives its chunk to the pool.
    void unpark(size_t i);
    void flush_parked() {
        while (!parked_.empty()) unpark(parked_.size() - 1);
    }
    // Moves a parked chunk of class cls mapped as chunk pages [first, first + n) to dst.
    // Returns the chunk's offset, or kNoChunk when none fits (or the move failed; then
    // dst's reservation is intact and the caller maps a chunk the usual way).
    uint64_t move_parked(uint32_t cls, uint64_t first, uint64_t n, uint8_t * dst);
    // Flushes the parked chunks when the enclosing stage() or prefetch() returns (unless a
    // split stage keeps them for its deferred commits).
    struct ParkScope {
        LruCache * c;
        bool keep = false;
        ~ParkScope() {
            if (!keep) c->flush_parked();
        }
    };
    // Frees pages [q0, q1) of a reservation (anonymous: MADV_DONTNEED; recycled: replaced by
    // a PROT_NONE reservation again). False if the pages could not be taken away.
    bool release_pages(uint8_t * base, uint64_t q0, uint64_t q1);
    // Recycled pages: whether page p of r can be touched by more than one expert.
    static bool shareable(const Reservation & r, uint64_t p) {
        uint64_t lo, hi;
        r.layout.experts_on(p, &lo, &hi);
        return lo < hi;
    }
    // Appends the reads of the ledger's `experts` of MoE layer moe_idx (all projections).
    void push_reads(size_t moe_idx, const std::vector<uint32_t> & experts,
                    std::vector<ReadRequest> * reads);
    // Logs (-v) how the pool's warm-up ended, once, when it has ended.
    void log_warm_end();
    // Planted bugs (CacheTestHooks::fault); each fires once.
    void plant_fault_after_stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                                 std::vector<ReadRequest> * reads);

    const ModelIndex & index_;
    const uint64_t budget_;  // as built (the ledger's may shrink)
    const CacheOptions opt_;
    const CacheDebug dbg_;
    const CacheTestHooks test_;
    uint64_t page_ = 4096;      // the cache's page (CacheTestHooks::page_bytes)
    uint64_t sys_page_ = 4096;  // the system's (mincore reports in these)
    bool protect_ = true;
    bool recycle_ = false;            // pages from pool_ (implies protect_)
    bool move_ = false;               // move parked chunks (implies recycle_)
    std::vector<Parked> parked_;      // non-empty only inside stage() and prefetch(), or
                                      // while a split stage's deferred commits are open
    uint64_t defer_mask_ = 0;         // inside stage_impl: tensors commit() leaves out
    uint64_t defer_left_ = 0;         // split stage: tensors commit_deferred() still owes
    uint32_t defer_moe_ = 0;          // its layer
    std::unique_ptr<PagePool> pool_;
    uint64_t leaked_chunks_ = 0;      // chunks kept out of the pool after a failed release
    uint64_t recycled_commits_ = 0;   // PageStats::recycled_commits
    uint64_t moved_commits_ = 0;      // PageStats::moved_commits
    uint64_t deferred_commits_ = 0;   // PageStats::deferred_commits
    bool warm_running_ = false;       // the pool's warm-up ran and its end is not logged yet

    std::vector<size_t> layer_res_;  // layer i's reservations: res_[layer_res_[i] .. [i+1])
    std::vector<Reservation> res_;
    uint64_t reserved_ = 0;
    std::unique_ptr<ExpertLedger> ledger_;  // built by init(), once the page costs are known

    bool fault_fired_ = false;
    bool warned_protect_ = false;
    std::vector<unsigned char> mincore_buf_;
};

Status LruCache::init() {
    if (budget_ == 0)
        return Status::Usage("expert cache budget must be > 0 (use the shared slots for 0)");
    if (index_.moe_layers.empty())
        return Status::BadModel(index_.path + ": no MoE layers to cache");
    sys_page_ = system_page_bytes();
    page_ = sys_page_;
    if (test_.page_bytes != 0) {
        if (test_.page_bytes % sys_page_ != 0 || (test_.page_bytes & (test_.page_bytes - 1)) != 0)
            return Status::Usage("expert cache: page size " + std::to_string(test_.page_bytes) +
                                 " is not a power-of-two multiple of the system page size " +
                                 std::to_string(sys_page_));
        page_ = test_.page_bytes;
    }

    // Shapes: one expert count per layer, slices consistent with the tensor size.
    uint64_t max_experts = 0, min_expert_bytes = UINT64_MAX;
    size_t n_res = 0;
    uint32_t n_ids = 0;  // (layer, expert) pairs
    std::vector<uint32_t> n_expert(index_.moe_layers.size());
    layer_res_.assign(index_.moe_layers.size() + 1, 0);
    for (size_t i = 0; i < index_.moe_layers.size(); ++i) {
        const MoeLayer & ML = index_.moe_layers[i];
        if (ML.tensors.empty())
            return Status::BadModel(index_.path + ": MoE layer " + std::to_string(ML.layer) +
                                    " has no expert tensors");
        const int64_t n = ML.tensors[0].ne[2];
        uint64_t eb = 0;
        for (const ExpertTensor & et : ML.tensors) {
            if (et.ne[2] != n || n <= 0 || n > (int64_t(1) << 24) || et.slice_bytes == 0 ||
                et.tensor_bytes != uint64_t(n) * et.slice_bytes)
                return Status::BadModel(index_.path + ": expert tensor '" + et.name +
                                        "' has an inconsistent expert count or slice size");
            eb += et.slice_bytes;
        }
        if (uint64_t(n_ids) + uint64_t(n) > UINT32_MAX - 1)
            return Status::BadModel(index_.path + ": too many experts to cache");
        n_expert[i] = uint32_t(n);
        n_ids += uint32_t(n);
        layer_res_[i] = n_res;
        n_res += ML.tensors.size();
        max_experts = std::max<uint64_t>(max_experts, uint64_t(n));
        min_expert_bytes = std::min(min_expert_bytes, eb);
    }
    layer_res_.back() = n_res;

    // Mapping mode. Page protection splits a reservation into one mapping per run of
    // committed / uncommitted pages; in the worst case (no two live experts adjacent) that is
    // two per live slice. Stay well inside vm.max_map_count or mprotect would fail with
    // ENOMEM mid-generation.
    const uint64_t n_proj_max = [&] {
        uint64_t m = 0;
        for (const MoeLayer & ML : index_.moe_layers) m = std::max<uint64_t>(m, ML.tensors.size());
        return m;
    }();
    const uint64_t max_live = std::min<uint64_t>(
        n_ids, budget_ / std::max<uint64_t>(1, min_expert_bytes) + 1 + max_experts);
    const uint64_t worst_maps = 2 * max_live * n_proj_max + n_res;
    const uint64_t map_limit = read_max_map_count();
    const uint64_t in_use = count_current_maps();
    const uint64_t headroom = 4096;  // llama.cpp, ggml, threads, malloc arenas, ...
    const bool fits = in_use + headroom + worst_maps <= map_limit;
    switch (dbg_.mapping) {
        case CacheDebug::Mapping::kProtect:
            protect_ = true;
            break;
        case CacheDebug::Mapping::kFlat:
            protect_ = false;
            break;
        case CacheDebug::Mapping::kAuto:
            protect_ = fits || dbg_.poison || dbg_.check_residency;
            break;
    }
    if (!fits && protect_)
        MS_LOG_WARN(
            "expert cache: page protection may need up to %llu mappings, "
            "vm.max_map_count is %llu (%llu in use); commits may fail",
            (unsigned long long)worst_maps, (unsigned long long)map_limit,
            (unsigned long long)in_use);
    else if (!protect_ && dbg_.mapping == CacheDebug::Mapping::kAuto)
        MS_LOG_INFO(
            "expert cache: flat mapping (page protection could need %llu mappings, "
            "vm.max_map_count is %llu)",
            (unsigned long long)worst_maps, (unsigned long long)map_limit);

    if (protect_ && opt_.recycle_pages) {
        Status pst;
        pool_ = PagePool::create(page_, &pst);
        if (pool_) {
            recycle_ = true;
            move_ = opt_.move_pages;
        } else {
            MS_LOG_WARN("%s: committing fresh pages for every miss instead of recycling",
                        pst.message().c_str());
        }
    }

    // Reservations.
    Status pool_error;
    res_.resize(n_res);
    LedgerShape shape;
    shape.page_bytes = page_;
    shape.layers.resize(index_.moe_layers.size());
    for (size_t i = 0; i < index_.moe_layers.size(); ++i) {
        const MoeLayer & ML = index_.moe_layers[i];
        for (size_t t = 0; t < ML.tensors.size(); ++t) {
            const ExpertTensor & et = ML.tensors[t];
            Reservation & r = res_[layer_res_[i] + t];
            r.slice_bytes = et.slice_bytes;
            r.phase = et.file_offset % page_;
            r.map_bytes = (r.phase + et.tensor_bytes + page_ - 1) / page_ * page_;
            r.layout = PageLayout{r.phase, et.slice_bytes, page_, n_expert[i]};
            shape.layers[i].push_back(r.layout);
            const int prot = protect_ ? PROT_NONE : (PROT_READ | PROT_WRITE);
            // Page aligned: with a cache page above the system's (CacheTestHooks::page_bytes), the
            // reservation is cut out of a larger one, as the kernel would align it.
            const uint64_t slack = page_ - sys_page_;
            void * p = mmap(nullptr, r.map_bytes + slack, prot,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED)
                return Status::Runtime(
                    "expert cache: cannot reserve " + std::to_string(r.map_bytes) +
                    " bytes of address space for '" + et.name + "': " + errno_str(errno));
            if (slack) {
                const uintptr_t a = reinterpret_cast<uintptr_t>(p);
                const uintptr_t at = (a + page_ - 1) / page_ * page_;
                if (at > a) munmap(p, at - a);
                if (a + slack > at) munmap(reinterpret_cast<void *>(at + r.map_bytes), a + slack - at);
                p = reinterpret_cast<void *>(at);
            }
            r.base = static_cast<uint8_t *>(p);
            reserved_ += r.map_bytes;
            // Whole huge pages would commit neighbours' bytes and break the page accounting.
            madvise(p, r.map_bytes, MADV_NOHUGEPAGE);
            if (recycle_) {
                r.chunk_pages = r.layout.chunk_pages();
                Status cst;
                r.cls = pool_->class_for(r.chunk_pages, n_expert[i], &cst);
                if (!cst.ok() && pool_error.ok()) pool_error = cst;
                r.chunk.assign(n_expert[i], kNoChunk);
            }
        }
    }

    if (recycle_ && pool_error.ok()) pool_error = pool_->size_files(budget_, max_experts + 1);
    if (recycle_ && !pool_error.ok()) {
        MS_LOG_WARN("%s: committing fresh pages for every miss instead of recycling",
                    pool_error.message().c_str());
        recycle_ = false;
        move_ = false;
        pool_.reset();
        for (Reservation & r : res_) r.chunk.clear();
    }
    if (recycle_ && opt_.warm_pool) {
        // Never more than the budget across classes (page_pool.h); the files are sized for
        // more than that together.
        pool_->start_warm(budget_);
        if (test_.warm_pool_wait) pool_->finish_warm(/*cancel=*/false);
        const PagePool::WarmStats w = pool_->warm_stats();
        warm_running_ = w.planned_bytes > 0 && w.error == 0;
        if (warm_running_)
            MS_LOG_INFO("expert cache: warming the page pool: %.0f MiB of new chunks in the "
                        "background",
                        double(w.planned_bytes) / (1 << 20));
        else if (w.error != 0)
            MS_LOG_INFO("expert cache: page pool warm-up not started: %s",
                        errno_str(w.error).c_str());
    }
    shape.whole_chunks = recycle_;  // a live expert then holds one chunk per projection
    LedgerBackend * backend = this;
    ledger_ = std::make_unique<ExpertLedger>(shape, budget_, make_lru_policy(), backend);
    ledger_->set_observer(test_.observer);
    return Status::Ok();
}

// Commits expert e's pages in every projection (but those of defer_mask_). On failure
// nothing is committed.
Status LruCache::commit(uint32_t moe_idx, uint32_t e, int * err_out) {
    const size_t n_t = layers_res_count(moe_idx);
    const uint64_t committed = ledger_->committed_bytes();
    if (defer_mask_ != 0 && test_.commit_limit_bytes > 0) {
        // The deferred slices count now (the ledger charges the whole expert): a refusal of
        // the hook comes here, where the ledger can evict and retry, as without the split.
        uint64_t all = 0;
        for (size_t t = 0; t < n_t; ++t) all += res_[layer_res_[moe_idx] + t].chunk_pages * page_;
        if (committed + all > test_.commit_limit_bytes) {
            *err_out = ENOMEM;
            return commit_error(moe_idx, 0, e, "mmap", ENOMEM);
        }
    }
    uint64_t added = 0;
    for (size_t t = 0; t < n_t; ++t) {
        if (defer_mask_ >> t & 1) continue;
        uint64_t cost = 0;
        Status st = commit_projection(moe_idx, t, e, committed + added, false, defer_mask_ == 0,
                                      err_out, &cost);
        if (!st.ok()) {
            // Undo the projections committed so far (state is still absent).
            for (size_t u = 0; u < t; ++u) release_projection(moe_idx, u, e, false);
            return st;
        }
        added += cost;
    }
    return Status::Ok();
}

Status LruCache::commit_error(uint32_t moe_idx, size_t t, uint32_t e, const char * what,
                              int err) const {
    return Status::Runtime(
        "expert cache: cannot commit expert " + std::to_string(e) + " of '" +
        index_.moe_layers[moe_idx].tensors[t].name + "': " + what + ": " + errno_str(err) +
        (err == ENOMEM ? " (vm.max_map_count exhausted? see docs/cache.md)" : ""));
}

Status LruCache::commit_projection(uint32_t moe_idx, size_t t, uint32_t e, uint64_t committed,
                                   bool charged, bool check_limit, int * err_out,
                                   uint64_t * cost_out) {
    Reservation & r = res_[layer_res_[moe_idx] + t];
    uint64_t p0, p1, q0, q1;
    page_range(r, e, &p0, &p1);
    own_pages(moe_idx, t, e, &q0, &q1);
    const uint64_t cost = recycle_ ? r.chunk_pages * page_ : (q1 - q0) * page_;
    if (cost_out) *cost_out = cost;
    const uint64_t after = charged ? committed : committed + cost;
    const bool refused =
        check_limit && test_.commit_limit_bytes > 0 && after > test_.commit_limit_bytes;
    const char * what = recycle_ ? "mmap" : "mprotect";
    int err = refused ? ENOMEM : 0;
    if (!refused && recycle_) {
        // Room in the pool: live chunks are within the budget (stage() evicted for this
        // one); free chunks of other sizes give their memory back if needed.
        uint64_t off = kNoChunk;
        bool warmed = false;
        if (!parked_.empty() && q1 > q0)
            off = move_parked(r.cls, q0 - p0, q1 - q0, r.base + q0 * page_);
        bool recycled = off != kNoChunk;  // moved: an evicted expert's pages
        if (recycled) {
            ++moved_commits_;
        } else {
            flush_parked();  // none fits: they are free chunks again, for take() or a punch
            const uint64_t cap = std::max(ledger_->budget_bytes(), after);
            if (!pool_->has_free(r.cls))
                while (pool_->held_bytes() + cost > cap && pool_->punch_free_chunk(r.cls)) {
                }
            if (!pool_->take(r.cls, &off, &recycled, &err, &warmed)) {
                what = "page pool";
                if (err == ENOSPC || err == EFBIG) err = ENOMEM;  // refused: evict, shrink
            } else if ((err = pool_->map(r.cls, off, q0 - p0, q1 - q0, r.base + q0 * page_,
                                         recycled)) != 0) {
                pool_->give_back(r.cls, off);
                // MAP_FIXED may have taken the old reservation away: put it back.
                release_pages(r.base, q0, q1);
            }
        }
        if (err == 0) {
            r.chunk[e] = off;
            if (recycled && !warmed) ++recycled_commits_;
            if (q1 > q0 && shareable(r, q0)) r.owner[q0] = e;
            if (q1 > q0 && shareable(r, q1 - 1)) r.owner[q1 - 1] = e;
        }
    } else if (!refused && protect_ && q1 > q0 &&
               mprotect(r.base + q0 * page_, (q1 - q0) * page_, PROT_READ | PROT_WRITE) != 0) {
        err = errno;
    }
    if (err != 0) {
        *err_out = err;
        return commit_error(moe_idx, t, e, what, err);
    }
    if (dbg_.poison) {
        // The slice itself, plus the parts of newly committed boundary pages outside it
        // (they belong to absent neighbours). Bytes of live neighbours stay untouched.
        const uint64_t begin = r.layout.slice_begin(e), end = begin + r.slice_bytes;
        std::memset(r.base + begin, kPoisonByte, r.slice_bytes);
        if (q0 == p0 && q1 > q0) std::memset(r.base + p0 * page_, kPoisonByte, begin - p0 * page_);
        if (q1 == p1 && q1 > q0) std::memset(r.base + end, kPoisonByte, p1 * page_ - end);
    }
    return Status::Ok();
}

uint64_t LruCache::move_parked(uint32_t cls, uint64_t first, uint64_t n, uint8_t * dst) {
    const uint64_t len = n * page_;
    // A parked range that overlaps dst (a boundary page the victim shared with this expert)
    // is unmapped first: it cannot move onto itself, and must not stay mapped over dst.
    for (size_t i = parked_.size(); i-- > 0;) {
        const Parked & pk = parked_[i];
        if (pk.addr < dst + len && dst < pk.addr + pk.n * page_) unpark(i);
    }
    // The best parked chunk of the class: the same chunk pages (all move), else the most in
    // common (slices that straddle pages: whether a boundary page is in a range depends on
    // the neighbours, so ranges differ by a page at either end). Pages this slice needs that
    // did not move are mapped from the chunk as usual; the victim's pages that did not move
    // go with its range.
    size_t best = SIZE_MAX;
    uint64_t best_common = 0;
    for (size_t i = 0; i < parked_.size(); ++i) {
        const Parked & pk = parked_[i];
        if (pk.cls != cls) continue;
        const uint64_t c = std::max(first, pk.first), d = std::min(first + n, pk.first + pk.n);
        const uint64_t common = d > c ? d - c : 0;
        const bool exact = pk.first == first && pk.n == n;
        if (exact || common > best_common) {
            best = i;
            best_common = common;
            if (exact) break;
        }
    }
    if (best == SIZE_MAX || best_common * 2 < n) return kNoChunk;
    const Parked pk = parked_[best];
    const uint64_t c = std::max(first, pk.first), d = std::min(first + n, pk.first + pk.n);
    uint8_t * const to = dst + (c - first) * page_;
    void * m = mremap(pk.addr + (c - pk.first) * page_, (d - c) * page_, (d - c) * page_,
                      MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to);
    if (m == MAP_FAILED) {
        const int err = errno;
        // The target may have been unmapped before the failure: reserve it again.
        release_pages(to, 0, d - c);
        unpark(best);
        if (err == EINVAL) {  // the kernel has no MREMAP_DONTUNMAP for shared mappings
            move_ = false;
            MS_LOG_INFO(
                "expert cache: mremap(MREMAP_DONTUNMAP) refused (%s): recycled "
                "pages are unmapped and mapped again instead of moved",
                std::strerror(err));
            flush_parked();
        }
        return kNoChunk;
    }
    int err = 0;
    if (c > first) err = pool_->map(cls, pk.off, first, c - first, dst, true);
    if (err == 0 && first + n > d)
        err = pool_->map(cls, pk.off, d, first + n - d, dst + (d - first) * page_, true);
    // The victim's range: what moved left a mapping without page-table entries there, what
    // did not move is unmapped with it; the PROT_NONE reservation comes back.
    bool old_released = true;
    if (test_.fault == CacheTestHooks::Fault::kLeaveParked && !fault_fired_)
        fault_fired_ = true;  // planted bug: the victim's range keeps the chunk's mapping
    else
        old_released = release_pages(pk.addr, 0, pk.n);
    parked_[best] = parked_.back();
    parked_.pop_back();
    if (err != 0 || !old_released) {
        // A refused page, or the victim's range still maps the chunk: the chunk is not used
        // here (and never again if any mapping of it is left); the caller maps a chunk the
        // usual way and reports what fails.
        if (release_pages(dst, 0, n) && old_released)
            pool_->give_back(cls, pk.off);
        else
            ++leaked_chunks_;
        return kNoChunk;
    }
    return pk.off;
}

void LruCache::unpark(size_t i) {
    const Parked pk = parked_[i];
    parked_[i] = parked_.back();
    parked_.pop_back();
    if (release_pages(pk.addr, 0, pk.n))
        pool_->give_back(pk.cls, pk.off);
    else
        ++leaked_chunks_;
}

bool LruCache::release_pages(uint8_t * base, uint64_t q0, uint64_t q1) {
    if (q1 <= q0) return true;
    uint8_t * p = base + q0 * page_;
    const uint64_t len = (q1 - q0) * page_;
    if (recycle_) {
        // Unmap the pool pages: a fresh PROT_NONE reservation over them.
        void * m = mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                        -1, 0);
        if (m == MAP_FAILED) {
            if (!warned_protect_) {
                warned_protect_ = true;
                MS_LOG_WARN("expert cache: cannot unmap pool pages: %s (vm.max_map_count?)",
                            std::strerror(errno));
            }
            return false;
        }
        madvise(p, len, MADV_NOHUGEPAGE);
        return true;
    }
    if (madvise(p, len, MADV_DONTNEED) != 0 && !warned_protect_) {
        warned_protect_ = true;
        MS_LOG_WARN("expert cache: madvise(MADV_DONTNEED) failed: %s", std::strerror(errno));
    }
    if (protect_ && mprotect(p, len, PROT_NONE) != 0 && !warned_protect_) {
        // The pages are freed already; only the fault-on-stray-access protection is lost.
        warned_protect_ = true;
        MS_LOG_WARN("expert cache: mprotect(PROT_NONE) failed: %s (vm.max_map_count?)",
                    std::strerror(errno));
    }
    return true;
}

void LruCache::release_projection(size_t moe_idx, size_t t, uint32_t e, bool park) {
    Reservation & r = res_[layer_res_[moe_idx] + t];
    uint64_t q0, q1;
    own_pages(uint32_t(moe_idx), t, e, &q0, &q1);
    if (!recycle_) {
        release_pages(r.base, q0, q1);
        return;
    }
    const uint64_t off = r.chunk[e];
    if (off == kNoChunk) return;
    uint64_t p0, p1;
    page_range(r, e, &p0, &p1);
    bool keep_chunk = false;  // a page of it stays mapped: never reuse it
    for (uint64_t p : {p0, p1 - 1}) {
        auto it = r.owner.find(p);
        if (it == r.owner.end() || it->second != e) continue;
        if (p >= q0 && p < q1) {  // only e touches it: it goes with e
            r.owner.erase(it);
            continue;
        }
        // A live neighbour shares it: move the page's bytes into that neighbour's chunk.
        uint64_t lo, hi;
        r.layout.experts_on(p, &lo, &hi);
        uint32_t x = e;
        for (uint64_t v = lo; v <= hi && x == e; ++v)
            if (v != e && ledger_->live(uint32_t(moe_idx), uint32_t(v)) && r.chunk[v] != kNoChunk)
                x = uint32_t(v);
        int err = EINVAL;
        if (x != e) {
            uint64_t x0, x1;
            page_range(r, x, &x0, &x1);
            err = pool_->write_page(r.cls, r.chunk[x], p - x0, r.base + p * page_);
            if (err == 0)
                err = pool_->map(r.cls, r.chunk[x], p - x0, 1, r.base + p * page_, true);
        }
        if (err == 0) {
            it->second = x;
        } else {
            // The page keeps e's chunk under it (x's bytes are there); a failed MAP_FIXED may
            // have unmapped it, so map e's page back. e's chunk is never reused.
            keep_chunk = true;
            if (x != e) {
                if (pool_->map(r.cls, off, p - p0, 1, r.base + p * page_, true) != 0)
                    MS_LOG_ERROR("expert cache: a shared page of '%s' could not be restored",
                                 index_.moe_layers[moe_idx].tensors[t].name.c_str());
                it->second = x;
            }
            MS_LOG_WARN("expert cache: cannot move a shared page to its neighbour (%s); "
                        "one pool chunk is kept out of use",
                        errno_str(err).c_str());
        }
    }
    r.chunk[e] = kNoChunk;
    if (park && move_ && !keep_chunk && q1 > q0) {  // for a commit of this stage (see top)
        parked_.push_back({r.cls, off, r.base + q0 * page_, q0 - p0, q1 - q0});
        return;
    }
    if (!release_pages(r.base, q0, q1)) keep_chunk = true;
    if (keep_chunk)
        ++leaked_chunks_;
    else
        pool_->give_back(r.cls, off);
}

// Releases a live expert's exclusively covered pages in every projection.
void LruCache::release(uint32_t moe_idx, uint32_t e, bool park) {
    for (size_t t = 0; t < layers_res_count(moe_idx); ++t) release_projection(moe_idx, t, e, park);
}

void LruCache::budget_shrunk(uint64_t was, uint64_t now) {
    flush_parked();  // evicted chunks are free chunks again: punch them too
    if (recycle_) pool_->finish_warm(true);  // its chunks are free chunks too
    while (recycle_ && pool_->held_bytes() > now && pool_->punch_free_chunk(PagePool::kAnyClass)) {
    }
    MS_LOG_WARN("expert cache: the system refused to commit memory (%s); budget shrunk from "
                "%llu to %llu MiB",
                errno_str(ENOMEM).c_str(), (unsigned long long)(was >> 20),
                (unsigned long long)(now >> 20));
}

Status LruCache::stage_split(size_t moe_idx, const std::vector<uint32_t> & experts,
                             uint64_t now_mask, std::vector<ReadRequest> * reads,
                             StageStats * stats, bool * deferred) {
    *deferred = false;
    if (!recycle_ || moe_idx >= ledger_->n_layers())  // (fresh pages: staged at once)
        return stage_impl(moe_idx, experts, 0, reads, stats);
    const size_t n_t = layers_res_count(moe_idx);
    const uint64_t all = n_t >= 64 ? ~uint64_t(0) : (uint64_t(1) << n_t) - 1;
    const uint64_t defer = all & ~now_mask;
    Status st = stage_impl(moe_idx, experts, defer, reads, stats);
    if (st.ok() && defer != 0 && !ledger_->staged().empty()) {
        defer_left_ = defer;
        defer_moe_ = uint32_t(moe_idx);
        *deferred = true;
    }
    return st;
}

Status LruCache::commit_deferred(size_t moe_idx, uint64_t mask) {
    mask &= defer_left_;
    if (mask == 0) return Status::Ok();
    if (moe_idx != defer_moe_)
        return Status::Runtime("expert cache: internal: deferred commits of MoE layer slot " +
                               std::to_string(moe_idx) + " while slot " +
                               std::to_string(defer_moe_) + " is staged");
    // In the order stage() would have committed them: misses in commit order, per tensor.
    const uint64_t committed = ledger_->committed_bytes();  // the deferred slices included
    for (size_t t = 0; t < layers_res_count(moe_idx); ++t) {
        if (!(mask >> t & 1)) continue;
        for (uint32_t e : ledger_->staged()) {
            int err = 0;
            Status st = commit_projection(defer_moe_, t, e, committed, true, false, &err);
            if (!st.ok()) {
                end_deferred();
                return st;
            }
            ++deferred_commits_;
        }
        defer_left_ &= ~(uint64_t(1) << t);
    }
    if (defer_left_ == 0) end_deferred();
    return Status::Ok();
}

Status LruCache::stage_impl(size_t moe_idx, const std::vector<uint32_t> & experts,
                            uint64_t defer_mask, std::vector<ReadRequest> * reads,
                            StageStats * stats) {
    if (defer_left_ != 0) {
        // A split stage whose deferred slices were never committed (the caller failed to
        // finish it): its experts must not become resident.
        MS_LOG_ERROR("expert cache: internal: a split stage was left unfinished; abandoned");
        ledger_->abandon_stage();
        end_deferred();
    }
    if (moe_idx >= ledger_->n_layers())
        return Status::Runtime("expert cache: MoE layer slot " + std::to_string(moe_idx) +
                               " out of range");
    const uint32_t n_expert = ledger_->n_expert(uint32_t(moe_idx));
    for (uint32_t e : experts)
        if (e >= n_expert)
            return Status::Runtime("expert cache: expert id " + std::to_string(e) +
                                   " out of range for layer " +
                                   std::to_string(index_.moe_layers[moe_idx].layer));
    ParkScope park_scope{this};  // evictions park their chunks until this returns
    defer_mask_ = defer_mask;
    Status st = ledger_->stage(uint32_t(moe_idx), experts, nullptr, stats);
    defer_mask_ = 0;
    log_warm_end();
    if (!st.ok()) return st;
    // Split: parked chunks wait for the deferred commits (commit_deferred ends them).
    park_scope.keep = defer_mask != 0 && !ledger_->staged().empty();
    if (test_.fault == CacheTestHooks::Fault::kNone || fault_fired_)
        push_reads(moe_idx, ledger_->staged(), reads);
    else
        plant_fault_after_stage(moe_idx, experts, reads);
    return Status::Ok();
}

void LruCache::plant_fault_after_stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                                       std::vector<ReadRequest> * reads) {
    std::vector<uint32_t> misses = ledger_->staged();
    if (test_.fault == CacheTestHooks::Fault::kForgetRead && !misses.empty()) {
        fault_fired_ = true;  // the first miss gets no reads
        misses.erase(misses.begin());
    }
    push_reads(moe_idx, misses, reads);
    if (test_.fault != CacheTestHooks::Fault::kDropRouted) return;
    // The first hit's pages go away; its state says resident. Hits are the routed experts
    // the stage did not commit.
    for (uint32_t e : experts) {
        if (std::find(misses.begin(), misses.end(), e) != misses.end()) continue;
        fault_fired_ = true;
        for (size_t t = 0; t < layers_res_count(moe_idx); ++t) {
            const Reservation & r = res_[layer_res_[moe_idx] + t];
            uint64_t q0, q1;
            ledger_->exclusive_pages(uint32_t(moe_idx), t, e, &q0, &q1);
            release_pages(r.base, q0, q1);
        }
        return;
    }
}

void LruCache::push_reads(size_t moe_idx, const std::vector<uint32_t> & experts,
                          std::vector<ReadRequest> * reads) {
    const MoeLayer & ML = index_.moe_layers[moe_idx];
    for (uint32_t e : experts)
        for (size_t t = 0; t < ML.tensors.size(); ++t) {
            const ExpertTensor & et = ML.tensors[t];
            reads->push_back({et.slice_offset(e), et.slice_bytes,
                              tensor_base(moe_idx, t) + uint64_t(e) * et.slice_bytes,
                              et.proj == Projection::kDown, et.shard});
        }
}

size_t LruCache::prefetch(size_t moe_idx, const std::vector<uint32_t> & experts,
                          std::vector<ReadRequest> * reads, bool may_evict) {
    ParkScope park_scope{this};
    const size_t n = ledger_->prefetch(uint32_t(moe_idx), experts, may_evict);
    log_warm_end();
    if (n > 0) push_reads(ledger_->prefetch_layer(), ledger_->prefetching(), reads);
    return n;
}

void LruCache::log_warm_end() {
    if (!warm_running_) return;
    const PagePool::WarmStats w = pool_->warm_stats();
    if (!w.ended) return;
    warm_running_ = false;
    MS_LOG_INFO("expert cache: page pool warm-up %s: %.0f of %.0f MiB zero-filled in %.2f s%s%s",
                w.error ? "failed" : w.cancelled ? "overtaken by the reads" : "done",
                double(w.warmed_bytes) / (1 << 20), double(w.planned_bytes) / (1 << 20),
                w.seconds, w.error ? ": " : "", w.error ? errno_str(w.error).c_str() : "");
}

Status LruCache::verify_resident(size_t moe_idx, const std::vector<uint32_t> & experts) {
    if (!dbg_.check_residency) return Status::Ok();
    if (moe_idx >= ledger_->n_layers())
        return Status::Runtime("verify_resident: MoE layer slot " + std::to_string(moe_idx) +
                               " out of range");
    const MoeLayer & ML = index_.moe_layers[moe_idx];
    const uint32_t n_expert = ledger_->n_expert(uint32_t(moe_idx));
    auto where = [&](uint32_t e, size_t t) {
        return "expert " + std::to_string(e) + " of layer " + std::to_string(ML.layer) + " ('" +
               ML.tensors[t].name + "')";
    };
    for (uint32_t e : experts) {
        if (e >= n_expert)
            return Status::Runtime("verify_resident: expert id " + std::to_string(e) +
                                   " out of range for layer " + std::to_string(ML.layer));
        if (!ledger_->live(uint32_t(moe_idx), e))
            return Status::Runtime("verify_resident: " + where(e, 0) +
                                   " is routed but the cache does not hold it");
        for (size_t t = 0; t < ML.tensors.size(); ++t) {
            const Reservation & r = res_[layer_res_[moe_idx] + t];
            const uint64_t begin = r.layout.slice_begin(e);
            // 1) Every page of the slice is in RAM (a released or never written page is not).
            // mincore reports per system page: those under the slice's bytes (a cache page
            // larger than the system's, CacheTestHooks::page_bytes, covers bytes no read wrote).
            const uint64_t b0 = begin / sys_page_ * sys_page_;
            const uint64_t b1 = (begin + r.slice_bytes + sys_page_ - 1) / sys_page_ * sys_page_;
            mincore_buf_.assign(size_t((b1 - b0) / sys_page_), 0);
            if (mincore(r.base + b0, b1 - b0, mincore_buf_.data()) != 0)
                return Status::Runtime("verify_resident: mincore failed for " + where(e, t) + ": " +
                                       errno_str(errno));
            for (size_t i = 0; i < mincore_buf_.size(); ++i)
                if (!(mincore_buf_[i] & 1))
                    return Status::Runtime("verify_resident: page " +
                                           std::to_string((b0 + i * sys_page_) / page_) + " of " +
                                           where(e, t) + " is not in RAM");
            // 2) Readable and not still the poison pattern. Read through process_vm_readv so a
            // page left PROT_NONE is reported (EFAULT) rather than crashing the process.
            const uint64_t n_words = r.slice_bytes / 8;
            if (n_words == 0) continue;
            constexpr uint64_t kSamples = 32;
            uint64_t buf[kSamples];
            iovec local[kSamples], remote[kSamples];
            const uint64_t n = std::min(kSamples, n_words);
            for (uint64_t k = 0; k < n; ++k) {
                const uint64_t w = n == 1 ? 0 : k * (n_words - 1) / (n - 1);
                local[k] = {&buf[k], 8};
                remote[k] = {r.base + begin + w * 8, 8};
            }
            const ssize_t got = process_vm_readv(getpid(), local, n, remote, n, 0);
            if (got < 0 && errno == EFAULT)
                return Status::Runtime("verify_resident: " + where(e, t) +
                                       " is not readable (page protected)");
            if (got != ssize_t(n * 8)) continue;  // cannot sample here (EPERM, ENOSYS)
            if (dbg_.poison) {
                bool all_poison = true;
                for (uint64_t k = 0; k < n && all_poison; ++k) all_poison = buf[k] == kPoisonWord;
                if (all_poison)
                    return Status::Runtime("verify_resident: " + where(e, t) +
                                           " still holds the poison pattern (never read)");
            }
        }
    }
    return Status::Ok();
}

}  // namespace

std::unique_ptr<ResidencyStore> make_lru_cache(const ModelIndex & index, uint64_t budget_bytes,
                                               const CacheOptions & opt, const CacheDebug & dbg,
                                               Status * st, const CacheTestHooks & test) {
    auto s = std::make_unique<LruCache>(index, budget_bytes, opt, dbg, test);
    *st = s->init();
    if (!st->ok()) return nullptr;
    return s;
}

}  // namespace moestream
