#include "streamer.h"

#include <algorithm>
#include <string>

#include "log.h"

namespace moestream {

Streamer::Streamer(const ModelIndex & index, ResidencyStore * store, IoLanes * lanes)
    : index_(index), store_(store), lanes_(lanes) {
    uint32_t max_layer = index.n_layer;
    for (const auto & L : index.moe_layers) max_layer = std::max(max_layer, L.layer + 1);
    layer_to_moe_.assign(max_layer, -1);
    for (size_t i = 0; i < index.moe_layers.size(); ++i)
        layer_to_moe_[index.moe_layers[i].layer] = static_cast<int>(i);
    seen_.assign(index.n_expert, 0);
}

Status Streamer::on_routing(const Routing & r) {
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

    const uint64_t demand = uint64_t(experts_.size()) * L.expert_bytes;
    auto account = [&](StepCounters & c, const IoBatchStats & io, const StageStats & ss) {
        c.bytes_read += io.bytes_read;
        c.reads += io.reads;
        c.io_s += io.seconds;
        c.demand_bytes += demand;
        c.layer_demand_bytes = std::max(c.layer_demand_bytes, demand);
        c.lookups += ss.lookups;
        c.hits += ss.hits;
        c.misses += ss.misses;
        c.routings += 1;
    };

    reads_.clear();
    StageStats ss;
    Status st = store_->stage(size_t(slot), experts_, &reads_, &ss);
    if (!st.ok()) return st;
    IoBatchStats io;
    st = lanes_->read_batch(reads_, &io);
    account(step_, io, ss);
    account(total_, io, ss);
    if (!st.ok()) {
        store_->abandon_stage(size_t(slot));
        return st;
    }
    MS_LOG_DEBUG("layer %u: %zu distinct experts over %d row(s), %zu reads, %llu bytes",
                 r.layer, experts_.size(), r.n_rows, reads_.size(),
                 (unsigned long long)io.bytes_read);
    return Status::Ok();
}

}  // namespace moestream
