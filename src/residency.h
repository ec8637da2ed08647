// residency.h — where expert bytes live in RAM, and which routed experts need a read.
//
// The streamer binds every expert tensor (layer, projection) to an address range owned by a
// ResidencyStore, with expert e at its canonical offset e * slice_bytes, so llama.cpp's
// MUL_MAT_ID finds routed experts where it expects them. stage() is called for a layer with
// the experts routed to it (distinct, validated ids) and returns the reads that must happen
// before the layer's expert matmul may run.
//
// SharedSlots (cache off, --cache-mb 0): one buffer per projection, sized for the largest
// layer's tensor, shared by all layers (one layer computes at a time). Every routed slice is
// re-read every time. RAM for experts = one layer's expert tensors.
//
// Thread-safety: called from the eval callback only (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gguf_index.h"
#include "io_lanes.h"
#include "status.h"

namespace moestream {

struct StageStats {
    uint64_t lookups = 0;  // (layer, expert) routings looked up
    uint64_t hits = 0;     // already resident: no read
    uint64_t misses = 0;   // read from the file
};

class ResidencyStore {
public:
    virtual ~ResidencyStore() = default;
    // Base address that expert tensor `t` of MoE layer `moe_idx` is bound to.
    virtual uint8_t * tensor_base(size_t moe_idx, size_t t) = 0;
    // Appends the reads needed to make `experts` of MoE layer `moe_idx` resident.
    virtual Status stage(size_t moe_idx, const std::vector<uint32_t> & experts,
                         std::vector<ReadRequest> * reads, StageStats * stats) = 0;
    // Reports that the reads of the last stage() failed: nothing staged may count as
    // resident afterwards.
    virtual void abandon_stage(size_t moe_idx) = 0;
    // Bytes of RAM the store holds for expert data now.
    virtual uint64_t resident_bytes() const = 0;
    virtual uint64_t reserved_bytes() const = 0;
};

// Cache off: shared per-projection slots, re-read on every routing.
std::unique_ptr<ResidencyStore> make_shared_slots(const ModelIndex & index, Status * st);

}  // namespace moestream
