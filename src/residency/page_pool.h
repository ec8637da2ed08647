// page_pool.h — recycled RAM for the expert cache: chunks of memfd pages that move between
// experts instead of being freed and zero-filled again.
//
// Why: the cache commits the pages of every miss and releases the pages of every eviction.
// With anonymous memory each commit is a fresh page the kernel must allocate, zero and charge
// to the memory cgroup, and each release hands it back; on the 30B preset that was 32 % of
// all CPU samples in clear_page alone and made a 4000 MiB cache decode slower than no cache
// (docs/cache.md, "Recycled pages"). A pool chunk keeps its physical pages when an expert
// leaves: the next expert's slice is mapped onto the same pages (MAP_SHARED | MAP_FIXED of
// the memfd at the expert's canonical address) and its read overwrites them.
//
// A chunk holds one expert slice of one projection tensor: `chunk_pages` pages, the most
// pages any slice of that tensor can touch (PageLayout::chunk_pages). Chunks of one size form
// a class with its own memfd; a class's free chunks are reused first, a new chunk is taken
// only while the caller's accounting allows it, and punch_free_chunk() gives a free chunk's
// memory back to the system (fallocate PUNCH_HOLE) when another class needs room.
//
// Warm-up (start_warm): a background thread at a low CPU priority allocates and zero-fills
// the pages of new chunks up front (pwrite of zeros into the memfds), so the first fill of the
// pool does not fault and zero pages one at a time on the read lanes while the compute
// threads need the cores. Each class is warmed in proportion to its share of a full cache's
// bytes, the total never above the budget given, from offset 0 up. take() hands out completed
// warm chunks as populated (*recycled = true, *warmed = true) while the thread runs; the
// first take() that finds none ready in its class (demand overtook the warm-up, or the plan is
// done), any punch, and finish_warm() stop and join the thread, and what it completed becomes
// warmed free chunks.
//
// Invariants: held_bytes() = (chunks taken and not punched, plus warmed chunks not taken and
// not punched) x their size >= the RAM the pool holds (pages of a chunk never mapped or
// warmed are never allocated). While the warm-up thread runs, the completed warm chunks not
// taken yet and the one being written are held but not counted; no new (unwarmed) chunk is
// taken and nothing is punched meanwhile, so the pool holds at most the warm-up's plan
// (<= its budget). Offsets are chunk-aligned and below each memfd's size.
// Thread-safety: none, except for the warm-up thread, which touches only the pages of warm
// chunks not handed out yet and its progress counters (WarmClass::done); the cache drives
// everything else from the eval callback only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "status.h"

namespace moestream {

class PagePool {
public:
    // One memfd per class is created lazily. Returns null with *st set (kRuntime) when the
    // system has no memfd_create (the cache then commits anonymous pages instead).
    static std::unique_ptr<PagePool> create(uint64_t page_bytes, Status * st);
    ~PagePool();
    PagePool(const PagePool &) = delete;
    PagePool & operator=(const PagePool &) = delete;

    // The class of chunks of `chunk_pages` pages (> 0), created on first use, for `slices`
    // more expert slices. *st is set when the class's memfd cannot be created.
    uint32_t class_for(uint64_t chunk_pages, uint64_t slices, Status * st);
    // Sizes every class's (sparse) memfd for the chunks a cache of `budget_bytes` can hold
    // at once, plus `spare` chunks (the staged layer's routed set may exceed the budget).
    // Fails (kRuntime, naming the cause) when a file cannot be sized, e.g. above RLIMIT_FSIZE
    // (checked first: growing past it would raise SIGXFSZ and kill the process).
    Status size_files(uint64_t budget_bytes, uint64_t spare);
    uint64_t chunk_bytes(uint32_t cls) const { return classes_[cls].chunk_pages * page_; }

    // A chunk of class `cls`: a free one if there is one (*recycled = true: its pages hold an
    // earlier expert's bytes), else a new one (*recycled = false). A new chunk's pages are
    // allocated by the reads that fill it (the read lanes fault and zero-fill them in
    // parallel; allocating them here, on the compute thread, made the 30B preset's first
    // token 12 s slower). Under strict overcommit (vm.overcommit_memory = 2) a shared page
    // the system refuses would be a SIGBUS at that fault, so there they are allocated here
    // (fallocate) and a refusal is an error (*err = ENOMEM or ENOSPC) the cache handles.
    // Returns false with *err = errno.
    // Warmed chunks (see the top) come after free ones: *recycled = true (map them populated),
    // and *warmed = true when warmed is given.
    bool take(uint32_t cls, uint64_t * off, bool * recycled, int * err, bool * warmed = nullptr);
    // Returns a chunk (its pages stay allocated, ready for the next take()).
    void give_back(uint32_t cls, uint64_t off);
    // A free, warmed or (while the warm-up runs) completed warm chunk is ready to take.
    bool has_free(uint32_t cls) const;
    // Frees the memory of one free chunk of a class other than `keep_cls` (kAnyClass: of any
    // class); false if none.
    static constexpr uint32_t kAnyClass = UINT32_MAX;
    bool punch_free_chunk(uint32_t keep_cls);

    // Maps pages [first, first + n) of chunk (cls, off) read-write at `addr` (page aligned),
    // replacing whatever was mapped there. Returns 0 or an errno. `populate`: fill the page
    // table now (MAP_POPULATE). Measured on the 30B preset: for recycled chunks one populate
    // per slice beats the reads faulting each 4 KiB page in (1.11 vs 0.95 tok/s at a
    // 4000 MiB cache); new chunks are left to the reads (see take()).
    int map(uint32_t cls, uint64_t off, uint64_t first, uint64_t n, void * addr, bool populate);
    // Writes one page of bytes into page `idx` of chunk (cls, off). Returns 0 or an errno.
    int write_page(uint32_t cls, uint64_t off, uint64_t idx, const void * src);

    // Starts the warm-up thread (after size_files, before any take). Plans, for each class,
    // floor(budget_bytes x share / chunk) chunks, share = the class's bytes in a cache that
    // holds every slice (slices x chunk) over all classes', capped by the class's memfd: the
    // plan never exceeds budget_bytes. A plan of nothing starts no thread.
    void start_warm(uint64_t budget_bytes);
    // Stops the warm-up (cancel: after the step in progress; else when the plan is done),
    // joins it, and makes the chunks it completed and take() did not hand out warmed free
    // chunks (held_bytes() counts them). A no-op without a running warm-up. The destructor
    // cancels one still running.
    void finish_warm(bool cancel);
    bool warm_running() const { return warm_thread_.joinable(); }  // the thread not joined yet
    struct WarmStats {
        uint64_t planned_bytes = 0;  // what start_warm() planned
        uint64_t warmed_bytes = 0;   // allocated and zero-filled by the warm-up (so far)
        int error = 0;               // errno that stopped it (ENOMEM, ENOSPC, ...), or 0
        bool cancelled = false;      // finish_warm(true) stopped it before the plan was done
        double seconds = 0;          // the thread's wall time (set once it has ended)
        bool ended = false;          // the thread has ended (or never started)
    };
    // While the thread runs, warmed_bytes is read from its progress counter; error,
    // cancelled and seconds are set once it has ended (it may end before it is joined).
    WarmStats warm_stats() const;
    uint64_t warmed_taken() const { return warmed_taken_; }  // take()s served by a warmed chunk

    uint64_t held_bytes() const { return held_bytes_; }  // see the invariants at the top
    uint64_t recycled() const { return recycled_; }      // take()s served by a free chunk
    uint64_t punched() const { return punched_; }        // chunks given back to the system

private:
    PagePool(uint64_t page_bytes, bool eager) : page_(page_bytes), eager_(eager) {}
    struct Class {
        uint64_t chunk_pages = 0;
        uint64_t slices = 0;         // expert slices that may use this class
        int fd = -1;
        uint64_t file_bytes = 0;     // memfd size (sparse)
        uint64_t next_off = 0;       // first offset never handed out
        std::vector<uint64_t> free;  // chunks with pages, ready to reuse (LIFO)
        std::vector<uint64_t> holes; // punched chunks: offsets to reuse, no pages
        std::vector<uint64_t> warm;  // warmed chunks never taken (zeroed pages, LIFO)
    };
    // One class's part of the warm-up (the thread reads fd, chunk and planned; done is its
    // progress, in chunks from offset 0; handed: chunks [0, handed) were taken while it ran,
    // main thread only).
    struct WarmClass {
        int fd = -1;
        uint64_t chunk = 0;
        uint64_t planned = 0;
        std::atomic<uint64_t> done{0};
        uint64_t handed = 0;
    };
    void warm_main();
    uint64_t page_;
    bool eager_;  // allocate a new chunk's pages in take() (strict overcommit)
    std::vector<Class> classes_;
    uint64_t held_bytes_ = 0;
    uint64_t recycled_ = 0;
    uint64_t punched_ = 0;
    uint64_t warmed_taken_ = 0;
    // Warm-up state: warm_ is written by start_warm() before the thread starts and read by it;
    // the thread writes warm_error_, warm_cancelled_ and warm_seconds_, then warm_ended_.
    std::unique_ptr<WarmClass[]> warm_;
    size_t n_warm_ = 0;
    std::thread warm_thread_;
    std::atomic<bool> warm_cancel_{false};
    int warm_error_ = 0;
    double warm_seconds_ = 0;
    bool warm_cancelled_ = false;
    std::atomic<bool> warm_ended_{false};  // the thread has set the three above
};

}  // namespace moestream
