#include "policy_drop_cold.h"

namespace moestream {

int drop_cold_row(int k, int32_t * ids, int64_t id_stride, float * w, int64_t w_stride,
                  int k_eff, const DropColdConfig & cfg,
                  const std::function<bool(int32_t)> & resident, DropCounters * counters) {
    if (k <= 0) return 0;
    int top = 0;
    for (int j = 1; j < k; ++j)
        if (w[j * w_stride] > w[top * w_stride]) top = j;
    const double threshold = cfg.frac / double(k_eff > 0 ? k_eff : k);
    const int32_t top_id = ids[top * id_stride];
    double sum_before = 0, sum_after = 0;
    int dropped = 0;
    for (int j = 0; j < k; ++j) {
        float & wj = w[j * w_stride];
        sum_before += wj;
        counters->routed++;
        counters->weight_total += wj;
        if (j != top && double(wj) < threshold && !resident(ids[j * id_stride])) {
            counters->dropped++;
            counters->weight_dropped += wj;
            wj = 0.0f;
            ids[j * id_stride] = top_id;
            ++dropped;
        }
        sum_after += wj;
    }
    if (cfg.renorm && dropped > 0 && sum_after > 0) {
        const float scale = float(sum_before / sum_after);
        for (int j = 0; j < k; ++j) w[j * w_stride] *= scale;
    }
    return dropped;
}

}  // namespace moestream
