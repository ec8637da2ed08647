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
// Invariants: held_bytes() = (chunks taken and not punched) x their size >= the RAM the pool
// holds (pages of a chunk never mapped are never allocated). Offsets are chunk-aligned and
// below each memfd's size.
// Thread-safety: none; the cache drives it from the eval callback only.
#pragma once

#include <cstdint>
#include <memory>
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
    bool take(uint32_t cls, uint64_t * off, bool * recycled, int * err);
    // Returns a chunk (its pages stay allocated, ready for the next take()).
    void give_back(uint32_t cls, uint64_t off);
    bool has_free(uint32_t cls) const { return !classes_[cls].free.empty(); }
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

    uint64_t held_bytes() const { return held_bytes_; }  // chunks taken, not punched
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
    };
    uint64_t page_;
    bool eager_;  // allocate a new chunk's pages in take() (strict overcommit)
    std::vector<Class> classes_;
    uint64_t held_bytes_ = 0;
    uint64_t recycled_ = 0;
    uint64_t punched_ = 0;
};

}  // namespace moestream
