#include "model_loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"
#include "mmap_guard.h"

namespace moestream {
namespace {

// A failed llama_model_load_from_file, with the reason llama.cpp logged.
Status load_failed(const ModelIndex & index) {
    std::string why = llama_errors_end();
    // llama.cpp prefixes its lines with the logging function's name: drop it.
    size_t k = 0;
    while (k < why.size() && (std::islower(static_cast<unsigned char>(why[k])) || why[k] == '_')) ++k;
    if (k > 0 && why.compare(k, 2, ": ") == 0) why.erase(0, k + 2);
    if (why.empty())
        return Status::BadModel(index.path + ": llama.cpp could not load the model (run with -vv "
                                "for llama.cpp's log)");
    return Status::BadModel(index.path + ": llama.cpp could not load the model: " + why);
}

}  // namespace

Status load_model_resident(const ModelIndex & index, const llama_model_params & params,
                           bool map_file, LoadedModel * out) {
    llama_model_params mp = params;
    mp.load_mode = map_file ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    mp.use_extra_bufts = false;
    mp.lazy_mode = LLAMA_LAZY_MODE_OFF;
    llama_errors_begin();
    out->model = llama_model_load_from_file(index.path.c_str(), mp);
    if (!out->model) return load_failed(index);
    llama_errors_end();
    return Status::Ok();
}

Status load_model_streaming(const ModelIndex & index, const llama_model_params & params,
                            LoadedModel * out) {
    if (!mmap_guard_active())
        return Status::Runtime("the mmap guard is not interposed in this executable (link "
                               "moestream_core into the executable, not a shared library): loading "
                               "would read the whole model file");
    // Every file of the model (a split set: every shard; llama.cpp opens them all from the
    // first) is guarded.
    std::vector<int> fds;
    auto close_all = [&] {
        for (int fd : fds) ::close(fd);
        fds.clear();
    };
    for (const ShardFile & sh : index.shards) {
        int fd = ::open(sh.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            const int e = errno;
            close_all();
            return Status::BadModel(sh.path + ": cannot open: " + std::strerror(e));
        }
        fds.push_back(fd);
    }
    if (!mmap_guard_arm(fds)) {
        close_all();
        return Status::Runtime(index.path + ": cannot guard the model's " +
                               std::to_string(index.shards.size()) + " file(s) (more than " +
                               std::to_string(kMaxGuardedFiles) + "?)");
    }
    llama_model_params mp = params;
    mp.load_mode = LLAMA_LOAD_MODE_MMAP;
    mp.use_extra_bufts = false;
    mp.lazy_mode = LLAMA_LAZY_MODE_OFF;
    mp.check_tensors = false;  // validating rows would read every expert
    llama_errors_begin();
    out->model = llama_model_load_from_file(index.path.c_str(), mp);
    std::vector<GuardedMapping> seen = mmap_guard_disarm();
    close_all();
    if (!out->model) return load_failed(index);
    llama_errors_end();
    out->maps.assign(index.shards.size(), FileMapping{});
    out->resident_after_load.clear();
    for (const ShardFile & sh : index.shards)
        out->resident_after_load.push_back(resident_mapped_bytes_of_file(sh.dev, sh.ino));
    bool populate_removed = false;
    int advice_dropped = 0;
    for (size_t i = 0; i < index.shards.size(); ++i) {
        const GuardedMapping & g = seen[i];
        if (g.addr == nullptr && index.shards[i].n_tensors > 0) {
            llama_model_free(out->model);
            out->model = nullptr;
            return Status::Runtime(index.shards[i].path +
                                   ": llama.cpp did not map the file as expected (the seam "
                                   "changed? see docs/seam.md)");
        }
        out->maps[i] = FileMapping{g.addr, g.len};
        populate_removed = populate_removed || g.populate_removed;
        advice_dropped += g.advice_dropped;
        // No readahead around the few faults that may still hit the mapping.
        if (g.addr) ::madvise(g.addr, g.len, MADV_RANDOM);
    }
    MS_LOG_INFO("mapped %s%s without prefaulting (MAP_POPULATE removed: %s, %d advice calls dropped)",
                index.path.c_str(),
                index.shards.size() > 1
                    ? (" and its " + std::to_string(index.shards.size() - 1) + " other shard(s)").c_str()
                    : "",
                populate_removed ? "yes" : "no", advice_dropped);
    return Status::Ok();
}

}  // namespace moestream
