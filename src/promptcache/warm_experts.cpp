// warm_experts.cpp — see warm_experts.h.
#include "warm_experts.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cache_file.h"
#include "hash.h"

namespace moestream {
namespace {

constexpr char kWarmMagic[8] = {'M', 'S', 'W', 'A', 'R', 'M', '0', '1'};
constexpr size_t kWarmHeader = 40;
constexpr size_t kWarmTrailer = 8;
constexpr uint32_t kHalveAbove = 1u << 31;

uint64_t identity_hash(const std::string & id) {
    return fnv1a64(kFnv1a64Basis, id.data(), id.size());
}

}  // namespace

WarmUsage warm_usage_empty(uint32_t n_layers, uint32_t n_expert) {
    WarmUsage u;
    u.n_layers = n_layers;
    u.n_expert = n_expert;
    u.counts.assign(size_t(n_layers) * n_expert, 0);
    return u;
}

void warm_usage_add(WarmUsage * u, const std::vector<uint32_t> & counts, uint64_t routings) {
    if (counts.size() != u->counts.size()) return;
    bool halve = false;
    for (size_t i = 0; i < counts.size(); ++i)
        halve = halve || uint64_t(u->counts[i]) + counts[i] >= kHalveAbove;
    if (halve)
        for (uint32_t & c : u->counts) c /= 2;
    for (size_t i = 0; i < counts.size(); ++i)
        u->counts[i] = uint32_t(std::min<uint64_t>(uint64_t(u->counts[i]) + counts[i], kHalveAbove - 1));
    u->routings += routings;
}

std::string warm_usage_auto_path(const std::string & model_path, std::string * why) {
    std::string home;
    if (const char * x = std::getenv("XDG_CACHE_HOME"); x && x[0] == '/')
        home = x;
    else if (const char * h = std::getenv("HOME"); h && h[0] == '/')
        home = std::string(h) + "/.cache";
    if (home.empty()) {
        *why = "--warm-experts auto: neither $XDG_CACHE_HOME nor $HOME is set (give a FILE)";
        return "";
    }
    std::string abs = model_path;
    if (char * r = ::realpath(model_path.c_str(), nullptr)) {
        abs = r;
        std::free(r);
    }
    char name[48];
    std::snprintf(name, sizeof name, "warm-%016llx.usage",
                  (unsigned long long)fnv1a64(kFnv1a64Basis, abs.data(), abs.size()));
    return home + "/moestream/warm/" + name;
}

Status warm_usage_make_dirs(const std::string & path) {
    // The last three directories of the path: <cache home>/moestream/warm (the cache home
    // itself, ~/.cache, may be missing on a fresh system).
    std::vector<std::string> dirs;
    std::string d = path.substr(0, path.rfind('/'));
    for (int i = 0; i < 3 && d.size() > 1; ++i) {
        dirs.push_back(d);
        d = d.substr(0, d.rfind('/'));
    }
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
        struct stat st;
        if (::stat(it->c_str(), &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return Status::BadInput(*it + ": --warm-experts auto: not a directory");
            continue;
        }
        if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST)
            return Status::BadInput(*it + ": --warm-experts auto: cannot make the directory: " +
                                    std::strerror(errno));
    }
    return Status::Ok();
}

std::vector<uint8_t> warm_usage_bytes(const WarmUsage & u, const std::string & model_identity) {
    const size_t size = kWarmHeader + u.counts.size() * 4 + kWarmTrailer;
    std::vector<uint8_t> b(size, 0);
    std::memcpy(b.data(), kWarmMagic, sizeof kWarmMagic);
    put<uint64_t>(&b, 8, size);
    put<uint32_t>(&b, 16, u.n_layers);
    put<uint32_t>(&b, 20, u.n_expert);
    put<uint64_t>(&b, 24, identity_hash(model_identity));
    put<uint64_t>(&b, 32, u.routings);
    if (!u.counts.empty()) std::memcpy(b.data() + kWarmHeader, u.counts.data(), u.counts.size() * 4);
    put<uint64_t>(&b, size - kWarmTrailer, fnv1a64(kFnv1a64Basis, b.data(), size - kWarmTrailer));
    return b;
}

WarmRead warm_usage_read(const std::string & path, const std::string & model_identity,
                         uint32_t n_layers, uint32_t n_expert, WarmUsage * out, std::string * why) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return WarmRead::kMissing;
    const size_t want = kWarmHeader + size_t(n_layers) * n_expert * 4 + kWarmTrailer;
    std::vector<uint8_t> b;
    // A file of another shape is refused below by its header; nothing larger than this
    // model's file (plus a page) is read.
    if (!read_whole(path, want + 4096, &b, why)) {
        if (why->rfind("larger", 0) == 0) *why = "not a usage file of this model (too large)";
        return WarmRead::kRefused;
    }
    auto no = [&](const std::string & w) {
        *why = w;
        return WarmRead::kRefused;
    };
    if (std::string e = envelope_error(b, kWarmMagic, kWarmHeader, "warm expert usage file");
        !e.empty())
        return no(e);
    const uint32_t L = get<uint32_t>(b, 16), E = get<uint32_t>(b, 20);
    if (L != n_layers || E != n_expert || b.size() != want)
        return no("written for a model of another shape (" + std::to_string(L) + " MoE layers x " +
                  std::to_string(E) + " experts, this model has " + std::to_string(n_layers) +
                  " x " + std::to_string(n_expert) + ")");
    if (get<uint64_t>(b, 24) != identity_hash(model_identity))
        return no("written for another model file (or the file changed since)");
    *out = warm_usage_empty(L, E);
    out->routings = get<uint64_t>(b, 32);
    std::memcpy(out->counts.data(), b.data() + kWarmHeader, out->counts.size() * 4);
    return WarmRead::kOk;
}

Status warm_usage_write(const std::string & path, const WarmUsage & u,
                        const std::string & model_identity) {
    return write_atomic(path, warm_usage_bytes(u, model_identity), "--warm-experts");
}

std::vector<std::vector<uint32_t>> warm_usage_hottest(const WarmUsage & u, uint32_t per_layer) {
    std::vector<std::vector<uint32_t>> out(u.n_layers);
    for (uint32_t m = 0; m < u.n_layers; ++m) {
        const uint32_t * c = u.counts.data() + size_t(m) * u.n_expert;
        std::vector<uint32_t> & l = out[m];
        for (uint32_t e = 0; e < u.n_expert; ++e)
            if (c[e] > 0) l.push_back(e);
        std::stable_sort(l.begin(), l.end(), [c](uint32_t a, uint32_t b) { return c[a] > c[b]; });
        if (l.size() > per_layer) l.resize(per_layer);
    }
    return out;
}

}  // namespace moestream
