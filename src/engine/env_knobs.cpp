#include "env_knobs.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

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
    const std::string no_uring = env("MOESTREAM_PREFETCH_NO_URING");
    if (!no_uring.empty() && no_uring != "0" && no_uring != "1")
        return Status::Usage("MOESTREAM_PREFETCH_NO_URING=" + no_uring + ": must be 0 or 1");
    k->prefetch_no_uring = no_uring == "1";
    const std::string stages = env("MOESTREAM_OVERLAP_STAGES");
    if (!stages.empty() && stages != "2" && stages != "3")
        return Status::Usage("MOESTREAM_OVERLAP_STAGES=" + stages + ": must be 2 or 3");
    if (!stages.empty()) k->overlap_stages = stages[0] - '0';
    const std::string staged = env("MOESTREAM_STAGED_READS");
    if (!staged.empty() && staged != "0" && staged != "1")
        return Status::Usage("MOESTREAM_STAGED_READS=" + staged + ": must be 0 or 1");
    if (!staged.empty()) k->staged_reads = staged == "1";
    const std::string split = env("MOESTREAM_STAGE_SPLIT");
    if (!split.empty() && split != "0" && split != "1")
        return Status::Usage("MOESTREAM_STAGE_SPLIT=" + split + ": must be 0 or 1");
    if (!split.empty()) k->stage_split = split == "1";
    const std::string guess = env("MOESTREAM_PREFILL_GUESS");
    if (!guess.empty() && guess != "bank" && guess != "rows")
        return Status::Usage("MOESTREAM_PREFILL_GUESS=" + guess + ": must be bank or rows");
    if (!guess.empty()) k->prefill_guess_rows = guess == "rows";
    const std::string warm = env("MOESTREAM_POOL_WARM");
    if (!warm.empty() && warm != "0" && warm != "1")
        return Status::Usage("MOESTREAM_POOL_WARM=" + warm + ": must be 0 or 1");
    if (!warm.empty()) k->pool_warm = warm == "1";
    const std::string slots = env("MOESTREAM_SLOT_CACHE");
    if (!slots.empty() && slots != "0" && slots != "1")
        return Status::Usage("MOESTREAM_SLOT_CACHE=" + slots + ": must be 0 or 1");
    if (!slots.empty())
        k->slot_cache = slots == "1" ? EnvKnobs::SlotCacheMode::kOn : EnvKnobs::SlotCacheMode::kOff;
    const std::string slot_warm = env("MOESTREAM_SLOT_WARM");
    if (!slot_warm.empty() && slot_warm != "0" && slot_warm != "1")
        return Status::Usage("MOESTREAM_SLOT_WARM=" + slot_warm + ": must be 0 or 1");
    if (!slot_warm.empty()) k->slot_warm = slot_warm == "1";
    const std::string huge = env("MOESTREAM_HUGEPAGES");
    if (!huge.empty() && huge != "0" && huge != "1")
        return Status::Usage("MOESTREAM_HUGEPAGES=" + huge + ": must be 0 or 1");
    if (!huge.empty()) k->huge_pages = huge == "1";
    if (const std::string pop = env("MOESTREAM_SLOT_POPULATE"); !pop.empty()) {
        using P = SlotOptions::Populate;
        const P modes[] = {P::kIdle, P::kNice, P::kOff};
        const P * m = std::find_if(std::begin(modes), std::end(modes),
                                   [&](P p) { return pop == SlotOptions::name(p); });
        if (m == std::end(modes))
            return Status::Usage("MOESTREAM_SLOT_POPULATE=" + pop + ": must be " +
                                 SlotOptions::name(modes[0]) + ", " + SlotOptions::name(modes[1]) +
                                 " or " + SlotOptions::name(modes[2]));
        k->slot_populate = *m;
    }
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
