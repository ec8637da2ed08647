// residency_slots.cpp — SharedSlots, the cache-off residency store (see residency.h).
#include <cstdlib>
#include <cstring>

#include "residency.h"

namespace moestream {
namespace {

class SharedSlots final : public ResidencyStore {
public:
    explicit SharedSlots(const ModelIndex & index) : index_(index) {}
    ~SharedSlots() override {
        for (void * p : slots_) std::free(p);
    }

    Status init() {
        size_t n_proj = 0;
        for (const auto & L : index_.moe_layers) n_proj = std::max(n_proj, L.tensors.size());
        sizes_.assign(n_proj, 0);
        for (const auto & L : index_.moe_layers)
            for (size_t t = 0; t < L.tensors.size(); ++t)
                sizes_[t] = std::max(sizes_[t], L.tensors[t].tensor_bytes + kPhaseBytes);
        for (size_t t = 0; t < n_proj; ++t) {
            void * p = nullptr;
            if (posix_memalign(&p, 4096, sizes_[t]) != 0)
                return Status::Runtime("cannot allocate " + std::to_string(sizes_[t]) +
                                       " bytes for the shared expert slots");
            slots_.push_back(p);
        }
        return Status::Ok();
    }

    // Each layer's tensor starts at the file offset's phase within a page, so that every
    // slice's destination is congruent to its file offset and O_DIRECT reads land in place.
    uint8_t * tensor_base(size_t moe_idx, size_t t) override {
        const uint64_t phase = index_.moe_layers[moe_idx].tensors[t].file_offset % kPhaseBytes;
        return static_cast<uint8_t *>(slots_[t]) + phase;
    }

    Status stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                 std::vector<ReadRequest> * reads, StageStats * stats) override {
        const MoeLayer & L = index_.moe_layers[moe_idx];
        for (uint32_t e : experts) {
            ++stats->lookups;
            ++stats->misses;
            for (size_t t = 0; t < L.tensors.size(); ++t) {
                const ExpertTensor & et = L.tensors[t];
                reads->push_back({et.slice_offset(e), et.slice_bytes,
                                  tensor_base(moe_idx, t) + uint64_t(e) * et.slice_bytes,
                                  et.proj == Projection::kDown, et.shard});
            }
        }
        return Status::Ok();
    }

    void abandon_stage(size_t) override {}  // nothing is ever considered resident

    uint64_t resident_bytes() const override { return reserved_bytes(); }
    uint64_t reserved_bytes() const override {
        uint64_t s = 0;
        for (uint64_t b : sizes_) s += b;
        return s;
    }

private:
    static constexpr uint64_t kPhaseBytes = 4096;  // any direct-I/O alignment divides it
    const ModelIndex & index_;
    std::vector<uint64_t> sizes_;
    std::vector<void *> slots_;
};

}  // namespace

std::unique_ptr<ResidencyStore> make_shared_slots(const ModelIndex & index, Status * st) {
    auto s = std::make_unique<SharedSlots>(index);
    *st = s->init();
    if (!st->ok()) return nullptr;
    return s;
}

}  // namespace moestream
