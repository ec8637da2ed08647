#include "env_knobs.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "moestream/log.h"

namespace moestream {
namespace {

std::string env(const char * name) {
    const char * v = std::getenv(name);
    return v ? v : "";
}

// "<layer>:<expert>" or "<layer>:*", layer and expert non-negative integers.
bool parse_corrupt(const std::string & s, StreamTestHooks * h) {
    int l = -1, x = -1, n = 0;
    if (std::sscanf(s.c_str(), "%d:*%n", &l, &n) == 1 && n == int(s.size()) && l >= 0) {
        h->corrupt_layer = l;
        h->corrupt_expert = StreamTestHooks::kAllExperts;
        return true;
    }
    n = 0;
    if (std::sscanf(s.c_str(), "%d:%d%n", &l, &x, &n) == 2 && n == int(s.size()) && l >= 0 &&
        x >= 0) {
        h->corrupt_layer = l;
        h->corrupt_expert = x;
        return true;
    }
    return false;
}

// A test-only 0/1 knob: unset or "0" is off, "1" is on (and warned about), anything else an
// error naming it.
Status test_switch(const char * name, const char * warning, bool * on) {
    const std::string v = env(name);
    if (!v.empty() && v != "0" && v != "1")
        return Status::Usage(std::string(name) + "=" + v + ": must be 0 or 1 (tests only)");
    *on = v == "1";
    if (*on) MS_LOG_WARN("%s=1: %s (test negative control)", name, warning);
    return Status::Ok();
}

}  // namespace

Status read_env_knobs(EnvKnobs * k) {
    k->ggml_backend_path = env("GGML_BACKEND_PATH");
    k->ggml_backend_dir = env("MOESTREAM_GGML_BACKEND_DIR");
    const std::string no_clamp = env("MOESTREAM_DEBUG_NO_BUDGET_CLAMP");
    if (!no_clamp.empty() && no_clamp != "0" && no_clamp != "1")
        return Status::Usage("MOESTREAM_DEBUG_NO_BUDGET_CLAMP=" + no_clamp + ": must be 0 or 1");
    k->no_budget_clamp = no_clamp == "1";
    Status sw = test_switch("MOESTREAM_DEBUG_SUBSTITUTE_UNROUTED",
                            "substituting unloaded experts on purpose", &k->substitute_unrouted);
    if (!sw.ok()) return sw;
    sw = test_switch("MOESTREAM_DEBUG_FALLBACK_SKIP_CONVERT",
                     "leaving a fallback slot unwritten on purpose", &k->fallback_skip_convert);
    if (!sw.ok()) return sw;
    sw = test_switch("MOESTREAM_DEBUG_SLOT_MISPLACE",
                     "rewriting the expert ids to the wrong slots on purpose",
                     &k->slot_misplace);
    if (!sw.ok()) return sw;
    sw = test_switch("MOESTREAM_DEBUG_SLOT_WARM_SKIP_COPY",
                     "warming the expert slots without copying on purpose",
                     &k->slot_warm_skip_copy);
    if (!sw.ok()) return sw;
    sw = test_switch("MOESTREAM_DEBUG_SLOT_PREFETCH_SKIP_READ",
                     "prefetching into the expert slots without reading on purpose",
                     &k->slot_prefetch_skip_read);
    if (!sw.ok()) return sw;
    sw = test_switch("MOESTREAM_DEBUG_SKIP_SECOND_WAIT",
                     "not waiting for the second projection's reads on purpose",
                     &k->stream_hooks.skip_second_wait);
    if (!sw.ok()) return sw;
    sw = test_switch("MOESTREAM_DEBUG_POOL_WARM_WAIT",
                     "waiting for the whole page-pool warm-up before the first commit",
                     &k->pool_warm_wait);
    if (!sw.ok()) return sw;
    const std::string warm_tail = env("MOESTREAM_DEBUG_WARM_TAIL");
    if (!warm_tail.empty()) {
        int n = 0, used = 0;
        if (std::sscanf(warm_tail.c_str(), "%d%n", &n, &used) != 1 ||
            used != int(warm_tail.size()) || n < 1)
            return Status::Usage("MOESTREAM_DEBUG_WARM_TAIL=" + warm_tail +
                                 ": expected a count of experts >= 1 (tests only)");
        k->stream_hooks.warm_tail_experts = n;
    }
    const std::string warm_preload = env("MOESTREAM_DEBUG_WARM_PRELOAD");
    if (warm_preload == "wait")
        k->stream_hooks.warm_preload_wait = true;
    else if (warm_preload == "off")
        k->stream_hooks.warm_preload_off = true;
    else if (!warm_preload.empty())
        return Status::Usage("MOESTREAM_DEBUG_WARM_PRELOAD=" + warm_preload +
                             ": expected wait or off (tests only)");
    k->io_fault = env("MOESTREAM_DEBUG_IO_FAULT");
    if (!k->io_fault.empty()) {
        IoFaultPlan plan;
        Status st = parse_io_fault(k->io_fault.c_str(), &plan);
        if (!st.ok()) return st;
    }
    const std::string corrupt = env("MOESTREAM_DEBUG_CORRUPT_EXPERT");
    if (!corrupt.empty()) {
        if (!parse_corrupt(corrupt, &k->stream_hooks))
            return Status::Usage("MOESTREAM_DEBUG_CORRUPT_EXPERT=" + corrupt +
                                 ": expected <layer>:<expert> or <layer>:* (tests only)");
        MS_LOG_WARN("MOESTREAM_DEBUG_CORRUPT_EXPERT=%s: corrupting expert slices on purpose "
                    "(test negative control)",
                    corrupt.c_str());
    }
    return Status::Ok();
}

}  // namespace moestream
