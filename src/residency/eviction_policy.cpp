// eviction_policy.cpp — lru, lfu and belady (see eviction_policy.h).
#include "eviction_policy.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "expert_ledger.h"

namespace moestream {
namespace {

// A doubly linked list over the live ids, most recently used first; sentinel at index n_ids.
class LruPolicy final : public EvictionPolicy {
public:
    void reset(uint32_t n_ids) override {
        n_ids_ = n_ids;
        prev_.assign(size_t(n_ids) + 1, n_ids);
        next_.assign(size_t(n_ids) + 1, n_ids);
    }
    void admit(uint32_t id, uint64_t, uint32_t) override { push_front(id); }
    void hit(uint32_t id, uint64_t, uint32_t) override {
        unlink(id);
        push_front(id);
    }
    void remove(uint32_t id) override { unlink(id); }
    uint32_t victim(const ExpertLedger & ledger) override {
        for (uint32_t id = prev_[n_ids_]; id != n_ids_; id = prev_[id])
            if (ledger.evictable(id)) return id;
        return kNone;
    }

private:
    void unlink(uint32_t id) {
        next_[prev_[id]] = next_[id];
        prev_[next_[id]] = prev_[id];
    }
    void push_front(uint32_t id) {
        const uint32_t s = n_ids_;
        next_[id] = next_[s];
        prev_[id] = s;
        prev_[next_[s]] = id;
        next_[s] = id;
    }

    uint32_t n_ids_ = 0;
    std::vector<uint32_t> prev_, next_;
};

// A min-heap of (key, last stage, id) with lazy deletion: an entry is stale once its id was
// routed again or released (its version moved on). Ids routed in a stage are pushed when the
// stage ends: until then they are never victims anyway. Key: lfu, the routing count (fewest
// first); belady, kNever - next use (farthest first).
class KeyedPolicy final : public EvictionPolicy {
public:
    explicit KeyedPolicy(bool lfu) : lfu_(lfu) {}
    void reset(uint32_t n_ids) override {
        if (lfu_) freq_.assign(n_ids, 0);
        key_.assign(n_ids, 0);
        last_.assign(n_ids, 0);
        ver_.assign(n_ids, 0);
        live_.assign(n_ids, 0);
        n_live_ = 0;
        heap_.clear();
        stash_.clear();
        deferred_.clear();
    }
    void admit(uint32_t id, uint64_t gen, uint32_t next_use) override {
        live_[id] = 1;
        ++n_live_;
        touch(id, gen, next_use);
    }
    void hit(uint32_t id, uint64_t gen, uint32_t next_use) override { touch(id, gen, next_use); }
    void remove(uint32_t id) override {
        live_[id] = 0;
        --n_live_;
        ++ver_[id];
    }
    void end_stage() override {
        for (uint32_t id : deferred_) push({pack(id), id, ver_[id]});
        deferred_.clear();
    }
    uint32_t victim(const ExpertLedger & ledger) override {
        stash_.clear();
        uint32_t found = kNone;
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
            const Entry en = heap_.back();
            heap_.pop_back();
            if (!live_[en.id] || en.ver != ver_[en.id]) continue;  // stale
            if (!ledger.evictable(en.id)) {
                stash_.push_back(en);  // routed now: back into the heap afterwards
                continue;
            }
            found = en.id;
            break;
        }
        for (const Entry & en : stash_) {
            heap_.push_back(en);
            std::push_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
        }
        return found;
    }

private:
    // Heap entry: key = primary << 32 | last stage (both < 2^32 for one replay), smallest
    // first; ties by id.
    struct Entry {
        uint64_t key;
        uint32_t id, ver;
        bool operator>(const Entry & o) const { return key != o.key ? key > o.key : id > o.id; }
    };

    void touch(uint32_t id, uint64_t gen, uint32_t next_use) {
        last_[id] = gen;
        key_[id] = lfu_ ? ++freq_[id] : uint64_t(kNever) - next_use;
        ++ver_[id];               // its old heap entry is stale now
        deferred_.push_back(id);
    }
    uint64_t pack(uint32_t id) const { return key_[id] << 32 | (last_[id] & 0xFFFFFFFFu); }
    void push(const Entry & en) {
        heap_.push_back(en);
        std::push_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
        if (heap_.size() > 4 * n_live_ + 4096) rebuild();
    }
    void rebuild() {
        heap_.clear();
        for (uint32_t id = 0; id < uint32_t(live_.size()); ++id)
            if (live_[id]) heap_.push_back({pack(id), id, ver_[id]});
        std::make_heap(heap_.begin(), heap_.end(), std::greater<Entry>());
    }

    const bool lfu_;
    std::vector<uint64_t> freq_;  // lfu: routings since reset, across evictions
    std::vector<uint64_t> key_, last_;
    std::vector<uint32_t> ver_;
    std::vector<uint8_t> live_;
    uint64_t n_live_ = 0;
    std::vector<Entry> heap_, stash_;
    std::vector<uint32_t> deferred_;  // routed in this stage, not yet in the heap
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lru_policy() {
    return std::make_unique<LruPolicy>();
}
std::unique_ptr<EvictionPolicy> make_lfu_policy() {
    return std::make_unique<KeyedPolicy>(/*lfu=*/true);
}
std::unique_ptr<EvictionPolicy> make_belady_policy() {
    return std::make_unique<KeyedPolicy>(/*lfu=*/false);
}

}  // namespace moestream
