#include "weight_binder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "huge_pages.h"
#include "moestream/log.h"
#include "router_hook.h"

namespace moestream {

WeightBinder::WeightBinder(const ModelIndex & index, ResidencyStore * store, const LoadedModel & lm)
    : index_(index), store_(store), maps_(lm.maps) {
    expert_bound_.resize(index.moe_layers.size());
    for (size_t sl = 0; sl < index.moe_layers.size(); ++sl) {
        expert_bound_[sl].assign(index.moe_layers[sl].tensors.size(), false);
        for (size_t t = 0; t < index.moe_layers[sl].tensors.size(); ++t)
            experts_.push_back({index.moe_layers[sl].tensors[t].name, {sl, t}});
    }
    std::sort(experts_.begin(), experts_.end());
}

WeightBinder::~WeightBinder() {
    for (auto & [off, c] : dense_) std::free(c.alloc);
}

Status WeightBinder::read_dense(IoLanes * lanes, uint64_t chunk_bytes, uint64_t batch_limit,
                                bool huge_pages,
                                const std::function<void(uint64_t done, uint64_t total)> & progress) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t a = std::max<uint64_t>(lanes->dio_alignment(), 64);
    const uint64_t chunk = std::max<uint64_t>(chunk_bytes / a * a, a);
    std::vector<ReadRequest> reqs;
    uint64_t batch_bytes = 0;
    std::vector<int> fadvise_fds(index_.shards.size(), -1);
    // Reads the requests gathered so far. Buffered lanes (O_DIRECT refused or off) leave the
    // bytes in the page cache too: drop each batch's range once its copies hold it, so the
    // page cache never holds more than one batch of dense weights.
    // The bytes to read (the loop below reads the same tensors), for `progress`.
    auto to_read = [this](const TensorInfo & ti) {
        return !index_.expert_tensor_names.count(ti.name) && ti.nbytes != 0 && !ti.unused &&
               !dense_.count(dense_key(ti));
    };
    uint64_t total = 0, done = 0;
    std::set<DenseKey> counted;  // a weight read once (several names at one offset)
    for (const TensorInfo & ti : index_.tensors)
        if (to_read(ti) && counted.insert(dense_key(ti)).second) total += ti.nbytes;
    if (progress) progress(0, total);
    // With a progress line, batches of about 1/kProgressSteps of the total (not below two
    // chunks per lane, so the lanes still share each batch): the line moves through a model
    // whose dense weights fit one batch.
    if (progress)
        batch_limit = std::min(batch_limit, std::max(total / kProgressSteps, 2 * chunk * uint64_t(lanes->n_lanes())));
    auto flush = [&]() -> Status {
        if (reqs.empty()) return Status::Ok();
        Status st = lanes->read_batch(reqs, &dense_stats_);  // adds to dense_stats_
        for (const ReadRequest & r : reqs) done += r.len;
        if (st.ok() && progress) progress(done, total);
        if (st.ok() && !lanes->direct()) {
            for (size_t f = 0; f < fadvise_fds.size(); ++f) {
                uint64_t first = UINT64_MAX, end = 0;
                for (const ReadRequest & r : reqs) {
                    if (r.file != f) continue;
                    first = std::min(first, r.file_offset);
                    end = std::max(end, r.file_offset + r.len);
                }
                if (end == 0) continue;
                int & fd = fadvise_fds[f];
                if (fd < 0) fd = ::open(index_.shards[f].path.c_str(), O_RDONLY | O_CLOEXEC);
                if (fd >= 0) posix_fadvise(fd, off_t(first), off_t(end - first), POSIX_FADV_DONTNEED);
            }
        }
        reqs.clear();
        batch_bytes = 0;
        return st;
    };
    Status st = Status::Ok();
    for (const TensorInfo & ti : index_.tensors) {
        if (!st.ok()) break;
        if (!to_read(ti)) continue;  // an expert, empty, unused, or read once already
        const uint64_t phase = ti.file_offset % a;
        uint64_t alloc_bytes = 0;
        if (__builtin_add_overflow(ti.nbytes, phase, &alloc_bytes))
            return Status::BadModel(index_.path + ": tensor '" + ti.name + "' is too large");
        DenseCopy c;
        if (posix_memalign(&c.alloc,
                           huge_page_alignment(alloc_bytes, std::max<uint64_t>(a, 4096), huge_pages),
                           alloc_bytes) != 0)
            return Status::Runtime("cannot allocate " + std::to_string(alloc_bytes) +
                                   " bytes for weight '" + ti.name + "'");
        if (huge_pages) dense_huge_bytes_ += advise_huge_pages(c.alloc, alloc_bytes);
        c.data = static_cast<uint8_t *>(c.alloc) + phase;
        c.nbytes = ti.nbytes;
        dense_.emplace(dense_key(ti), c);
        // Split at multiples of `chunk` in the file: every request but a tensor's first starts
        // aligned, so each is read in place (io_lanes.h) and the lanes share the big ones.
        const uint64_t end = ti.file_offset + ti.nbytes;  // validated by the index: no overflow
        for (uint64_t at = ti.file_offset; at < end;) {
            const uint64_t next = std::min<uint64_t>(end, (at / chunk + 1) * chunk);
            ReadRequest r;
            r.file_offset = at;
            r.len = next - at;
            r.dest = c.data + (at - ti.file_offset);
            r.file = ti.shard;
            reqs.push_back(r);
            batch_bytes += r.len;
            at = next;
            if (batch_bytes >= batch_limit) {
                st = flush();
                if (!st.ok()) break;
            }
        }
    }
    if (st.ok()) st = flush();
    for (int fd : fadvise_fds)
        if (fd >= 0) ::close(fd);
    if (!st.ok()) return st;
    dense_read_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MS_LOG_INFO("read %zu dense weights (%.1f MiB) in %.2f s with %d lane(s)%s", dense_.size(),
                double(dense_stats_.bytes_read) / (1 << 20), dense_read_s_, lanes->n_lanes(),
                lanes->direct() ? ", O_DIRECT" : "");
    return Status::Ok();
}

const void * WeightBinder::dense_copy(const std::string & name) const {
    const TensorInfo * ti = index_.find_tensor(name);
    if (ti == nullptr) return nullptr;
    auto it = dense_.find(dense_key(*ti));
    return it == dense_.end() ? nullptr : it->second.data;
}

bool WeightBinder::in_map(const void * p) const {
    auto a = static_cast<const uint8_t *>(p);
    for (const FileMapping & m : maps_)
        if (m.addr && a >= m.addr && a < m.addr + m.len) return true;
    return false;
}

Status WeightBinder::bind(ggml_tensor * t) {
    if (t == nullptr) return Status::Ok();
    ggml_tensor * root = t->view_src ? t->view_src : t;
    if (!bound_.count(root)) {
        bool file_weight = false;
        Status st = bind_root(root, &file_weight);
        if (!st.ok()) return st;
        if (!file_weight) return Status::Ok();
        bound_.insert(root);
    }
    // A view made before its weight was rebound still points where the weight was.
    if (t != root) t->data = static_cast<uint8_t *>(root->data) + t->view_offs;
    return Status::Ok();
}

bool WeightBinder::on_ask(ggml_tensor * t, RouterHook & hook) {
    if (!active()) return false;
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        Status st = bind(t->src[i]);
        if (!st.ok()) {
            hook.fail(st);  // the abort callback stops the graph
            return false;
        }
    }
    return false;
}

// A weight of the file is recognised by its name and by where it sits: exactly at its file
// offset in its shard's mapping (never by the address range alone: llama.cpp unmaps unused
// fragments of the mapping after load, and later allocations — the KV cache, a heap copy this
// binder made — can land in those holes). Each weight is bound once (bind() remembers it).
Status WeightBinder::bind_root(ggml_tensor * g, bool * file_weight) {
    *file_weight = false;
    if (g->data == nullptr) return Status::Ok();
    const TensorInfo * ti = index_.find_tensor(g->name);
    if (ti == nullptr) return Status::Ok();  // not a weight of the file
    const FileMapping m = ti->shard < maps_.size() ? maps_[ti->shard] : FileMapping{};
    const uint8_t * at = static_cast<const uint8_t *>(g->data);
    if (m.addr == nullptr || at != m.addr + ti->file_offset) {
        // Elsewhere: not llama.cpp's file-backed tensor (already moved, or memory of its own),
        // unless it points into a mapping of the model, at the wrong place.
        if (!in_map(at)) return Status::Ok();
        const bool same = m.addr && at >= m.addr && at < m.addr + m.len;
        return Status::Runtime(std::string("weight '") + g->name + "' at " +
                               (same ? "file offset " + std::to_string(at - m.addr)
                                     : std::string("an address in another file's mapping")) +
                               " does not match the validated index (file offset " +
                               std::to_string(ti->file_offset) + " in " +
                               index_.shards[ti->shard].path + "; the seam changed? docs/seam.md)");
    }
    *file_weight = true;
    const uint64_t off = ti->file_offset;
    const size_t nbytes = ggml_nbytes(g);
    if (off + nbytes > m.len)
        return Status::Runtime(std::string("weight '") + g->name + "' extends past the mapping of " +
                               index_.shards[ti->shard].path);
    if (ti->nbytes != nbytes || ti->type != int32_t(g->type))
        return Status::Runtime(std::string("weight '") + g->name + "' at file offset " + std::to_string(off) +
                               " does not match the validated index (the seam changed? docs/seam.md)");
    if (ti->unused)
        return Status::Runtime(std::string("weight '") + g->name +
                               "' of a NextN layer (" + index_.arch +
                               ".nextn_predict_layers) is used by llama.cpp's graph: this "
                               "architecture builds its NextN layers, which streaming does not "
                               "support");
    auto it = std::lower_bound(experts_.begin(), experts_.end(),
                               std::make_pair(std::string(g->name), std::make_pair(size_t(0), size_t(0))));
    if (it != experts_.end() && it->first == g->name) {
        auto [sl, t] = it->second;
        const ExpertTensor & et = index_.moe_layers[sl].tensors[t];
        if (g->ne[0] != et.ne[0] || g->ne[1] != et.ne[1] || g->ne[2] != et.ne[2] ||
            uint64_t(g->nb[1]) != et.row_bytes || uint64_t(g->nb[2]) != et.slice_bytes)
            return Status::Runtime("expert tensor '" + et.name + "': ggml's shape/strides disagree with "
                                   "the file's expert map");
        g->data = store_->tensor_base(sl, t);
        if (!expert_bound_[sl][t]) ++n_expert_bound_;
        expert_bound_[sl][t] = true;
        MS_LOG_DEBUG("bound expert tensor %s", g->name);
        return Status::Ok();
    }
    // A dense weight: its heap copy from read_dense (never read through the mapping).
    if (nbytes == 0) {  // nothing to read or copy; any valid address will do
        static uint64_t empty_weight[8];
        g->data = empty_weight;
        return Status::Ok();
    }
    auto d = dense_.find(dense_key(*ti));
    if (d == dense_.end())
        return Status::Runtime(std::string("weight '") + g->name +
                               "' was not read at load (read_dense not called?)");
    g->data = d->second.data;
    if (!d->second.bound) dense_bytes_ += nbytes;
    d->second.bound = true;
    return Status::Ok();
}

Status WeightBinder::finish() {
    if (finished_) return Status::Ok();
    finished_ = true;
    for (size_t sl = 0; sl < expert_bound_.size(); ++sl)
        for (size_t t = 0; t < expert_bound_[sl].size(); ++t)
            if (!expert_bound_[sl][t])
                return Status::Runtime("expert tensor '" + index_.moe_layers[sl].tensors[t].name +
                                       "' was not used by llama.cpp's graph (unsupported architecture "
                                       "for streaming?)");
    // Copies of weights no node used (none on the supported architectures) go.
    for (auto it = dense_.begin(); it != dense_.end();) {
        if (it->second.bound) {
            ++it;
            continue;
        }
        MS_LOG_DEBUG("dense weight at file offset %llu of shard %u unused by the graph: freed",
                     (unsigned long long)it->first.second, it->first.first);
        std::free(it->second.alloc);
        it = dense_.erase(it);
    }
    // Nothing points into the mapping any more, and nothing was read through it (dense weights
    // were read by the lanes). No madvise on the mapping's range: llama.cpp unmaps unused
    // fragments after load and other allocations (the KV cache) can live in those holes.
    MS_LOG_INFO("bound %zu expert tensors; %.1f MiB of dense weights copied to RAM", n_expert_bound_,
                double(dense_bytes_) / (1 << 20));
    return Status::Ok();
}

}  // namespace moestream
