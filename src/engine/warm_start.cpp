// warm_start.cpp — the engine's side of --warm-experts (warm_experts.h, docs/prompt-cache.md,
// "Warm expert set"): at open, the usage file's hottest experts that fit the cache become the
// streamer's warm set (streamer.h, "Warm set" and "Warm preload": read in the background from
// before the dense read, on lanes of their own, then as prefetch tails);
// after every generation the file is rewritten with this engine's decode routings added.
// Thread-safety: the engine's (one generation at a time).
#include <algorithm>

#include "engine_impl.h"
#include "moestream/atomic_file.h"
#include "moestream/log.h"

namespace moestream {

Status EngineImpl::init_warm_experts() {
    if (opt_.warm_experts.empty()) return Status::Ok();
    if (!streamer_ || !store_ || stats_.cache_budget_bytes <= 0)
        return Status::Usage(
            "--warm-experts needs streaming with an expert cache (it reads experts into the "
            "cache; the cache is off here: --cache-mb 0, --no-stream or a plan without one)");
    if (lanes_.n_lanes() < 2)
        return Status::Usage("--warm-experts needs 2 or more read lanes (--io-threads): its reads "
                             "run on a worker lane while the layers compute");
    std::string path = opt_.warm_experts;
    if (path == "auto") {
        std::string why;
        path = warm_usage_auto_path(opt_.model_path, &why);
        if (path.empty()) return Status::Usage(why);
        Status st = warm_usage_make_dirs(path);
        if (!st.ok()) return st;
    } else if (Status st = check_output_path(path, "--warm-experts"); !st.ok()) {
        return st;
    }
    const uint32_t n_layers = uint32_t(index_.moe_layers.size());
    const std::string identity = prompt_cache_model_identity(index_);
    std::string why;
    switch (warm_usage_read(path, identity, n_layers, index_.n_expert, &warm_base_, &why)) {
    case WarmRead::kOk:
        break;
    case WarmRead::kMissing:
        warm_base_ = warm_usage_empty(n_layers, index_.n_expert);
        break;
    case WarmRead::kRefused:
        MS_LOG_WARN("--warm-experts %s: ignored (%s); this run starts cold and the file is "
                    "replaced after it",
                    path.c_str(), why.c_str());
        stats_.warm_experts_refused = why;
        warm_base_ = warm_usage_empty(n_layers, index_.n_expert);
        break;
    }
    // As many experts per MoE layer as the cache holds: the fixed slots' count, else the
    // budget over one expert of every layer.
    uint64_t one_everywhere = 0;
    for (const MoeLayer & L : index_.moe_layers) one_everywhere += L.expert_bytes;
    const SlotPlacement * slots = store_->slot_placement();
    const uint32_t slots_per_layer = slots ? slots->slot_stats().slots_per_layer : 0;
    const uint64_t per_layer =
        slots_per_layer > 0 ? slots_per_layer
        : one_everywhere > 0   ? uint64_t(stats_.cache_budget_bytes) / one_everywhere
                               : 0;
    std::vector<std::vector<uint32_t>> lists =
        warm_usage_hottest(warm_base_, uint32_t(std::min<uint64_t>(per_layer, index_.n_expert)));
    uint64_t listed = 0;
    for (const auto & l : lists) listed += l.size();
    streamer_->set_warm(std::move(lists));
    streamer_->set_record_usage(true);
    warm_path_ = path;
    stats_.warm_experts_file = path;
    stats_.warm_experts_listed = listed;
    MS_LOG_INFO("--warm-experts %s: %llu experts to read in the background (%llu per MoE layer "
                "at most)",
                path.c_str(), (unsigned long long)listed, (unsigned long long)per_layer);
    // The preload's own lanes (as many as the engine's): it reads while open goes on.
    if (listed > 0) {
        Status st = warm_lanes_.open(shard_paths(index_), lanes_.n_lanes(), opt_.odirect, max_slice_);
        if (!st.ok()) return st;
        streamer_->set_preload_lanes(&warm_lanes_);
        streamer_->start_preload();
    }
    return Status::Ok();
}

void EngineImpl::write_warm_usage() {
    if (warm_path_.empty() || !streamer_) return;
    WarmUsage u = warm_base_;
    warm_usage_add(&u, streamer_->usage(), streamer_->usage_routings());
    Status st = warm_usage_write(warm_path_, u, prompt_cache_model_identity(index_));
    if (!st.ok()) MS_LOG_WARN("--warm-experts: %s", st.message().c_str());
}

}  // namespace moestream
