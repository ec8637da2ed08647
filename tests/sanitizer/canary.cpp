// canary.cpp — negative controls of the sanitizer builds (docs/reliability.md). Each mode
// plants one bug the build's sanitizer must report; tests/CMakeLists.txt runs every mode and
// passes only when the sanitizer's report appears. This proves the runtime is active in
// moestream's own code, linked exactly like the unit tests (llama.cpp prefix, its glibc).
//   canary trace-overread  ASan: parse_route_trace told a buffer is 64 bytes longer than it is
//   canary leak            LSan (ASan build): a route trace parsed into a heap object never freed
//   canary signed-overflow UBSan: signed integer overflow
//   canary lane-race       TSan: a pread hook with an unsynchronized counter, called from
//                          every IoLanes lane at once
//   canary clean           the same code paths without the bugs: exit 0, no report
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io_lanes.h"
#include "moestream/route_trace.h"
#include "route_tracer.h"

using namespace moestream;

namespace {

std::string tmp_file(const char * tag) {
    return std::string("/tmp/moestream-canary-") + tag + "-" + std::to_string(getpid());
}

// A small valid trace, written by RouteTracer.
std::string make_trace() {
    TraceHeader h;
    h.n_layer = 1;
    h.n_expert = 8;
    h.k_model = h.k = 2;
    TraceLayerShape s;
    s.layer = 0;
    s.slice_bytes = {4096, 4096, 4096};
    s.expert_bytes = 3 * 4096;
    h.moe_layers.push_back(s);
    const std::string path = tmp_file("trace");
    {
        auto t = RouteTracer::open(path, h);
        t->begin_graph(true, 0, 1);
        const int32_t ids[2] = {3, 5};
        t->routing_start(0, 2, 1, ids);
        t->on_stage(0, {3, 5}, {0, 0}, 2 * 3 * 4096);
        t->end_graph();
        t->finish();
    }
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::remove(path.c_str());
    return ss.str();
}

int trace_overread() {
    const std::string t = make_trace();
    // The real bytes in an exact-size heap block, the size claimed 64 bytes larger: the parser
    // reads past the block (the end marker is not where it looks for it).
    std::vector<uint8_t> * v = new std::vector<uint8_t>(t.begin(), t.end() - 8);
    RouteTrace out;
    Status st = parse_route_trace(v->data(), v->size() + 64, "canary", &out);
    std::printf("parse returned: %s\n", st.ok() ? "ok" : st.message().c_str());
    delete v;
    return 0;
}

long g_calls = 0;  // deliberately not atomic
// Lanes that reached the hook, counted with relaxed atomics only: they order nothing, so TSan
// sees no happens-before between the lanes' increments of g_calls.
std::atomic<int> g_arrived{0};
long racy_pread(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int, void *) {
    ++g_calls;
    // A lane's first call waits (up to 10 s) until a second lane has also incremented. Without
    // this rendezvous a busy machine may run the lanes one after another, each handing over
    // through the lanes' own atomics, and the race would be reported only by chance.
    thread_local bool met = false;
    if (!met) {
        met = true;
        g_arrived.fetch_add(1, std::memory_order_relaxed);
        for (int i = 0; i < 10000 && g_arrived.load(std::memory_order_relaxed) < 2; ++i) usleep(1000);
    }
    return ::preadv(fd, iov, iovcnt, off_t(off));
}
std::atomic<long> g_calls_atomic{0};
long atomic_pread(int fd, const struct iovec * iov, int iovcnt, uint64_t off, int, void *) {
    ++g_calls_atomic;
    return ::preadv(fd, iov, iovcnt, off_t(off));
}

int lanes_run(bool racy) {
    const std::string path = tmp_file("lanes");
    {
        std::ofstream f(path, std::ios::binary);
        std::vector<char> data(1 << 20, 'x');
        f.write(data.data(), std::streamsize(data.size()));
    }
    IoLanes lanes;
    Status st = lanes.open(path, 4, false, 64 << 10);
    if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        return 1;
    }
    lanes.set_pread_hook(racy ? &racy_pread : &atomic_pread, nullptr);
    std::vector<uint8_t> dst(1 << 20);
    std::vector<ReadRequest> reqs;
    for (uint64_t o = 0; o < (1 << 20); o += 64 << 10) reqs.push_back({o, 64 << 10, dst.data() + o});
    for (int i = 0; i < 20; ++i) {
        IoBatchStats s;
        st = lanes.read_batch(reqs, &s);
        if (!st.ok()) break;
    }
    std::remove(path.c_str());
    std::printf("calls %ld\n", racy ? g_calls : g_calls_atomic.load());
    return st.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char ** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "trace-overread") return trace_overread();
    if (mode == "leak") {
        const std::string t = make_trace();
        auto * out = new RouteTrace();  // never deleted
        Status st = parse_route_trace(reinterpret_cast<const uint8_t *>(t.data()), t.size(), "canary", out);
        std::printf("parsed %zu routings\n", st.ok() ? out->routings.size() : size_t(0));
        out = nullptr;
        return 0;
    }
    if (mode == "signed-overflow") {
        volatile int x = INT_MAX;
        int y = x + argc;  // argc >= 2: overflows
        std::printf("%d\n", y);
        return 0;
    }
    if (mode == "lane-race") return lanes_run(true);
    if (mode == "clean") {
        RouteTrace out;
        const std::string t = make_trace();
        Status st = parse_route_trace(reinterpret_cast<const uint8_t *>(t.data()), t.size(), "canary", &out);
        if (!st.ok()) {
            std::fprintf(stderr, "%s\n", st.message().c_str());
            return 1;
        }
        return lanes_run(false);
    }
    std::fprintf(stderr, "usage: canary trace-overread|signed-overflow|lane-race|clean\n");
    return 64;
}
