// miss_fallback.cpp — the companion file of --miss-fallback: validation, reads and the
// conversion into the bank's type (see miss_fallback.h).
#include "miss_fallback.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "ggml.h"
#include "gguf.h"

namespace moestream {

namespace {

struct Fnv {
    uint64_t h = 1469598103934665603ull;
    void add(const void * p, size_t n) {
        const auto * b = static_cast<const uint8_t *>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
    void add(const std::string & s) { add(s.data(), s.size() + 1); }
    void add_u64(uint64_t v) { add(&v, sizeof v); }
};

}  // namespace

uint64_t fallback_slice_hash(const void * data, size_t n) {
    Fnv f;
    f.add(data, n);
    return f.h;
}

namespace {

Status read_exact(int fd, const std::string & path, uint64_t off, void * dst, uint64_t len) {
    auto * p = static_cast<uint8_t *>(dst);
    while (len > 0) {
        const ssize_t n = pread(fd, p, len, off_t(off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return Status::BadInput(path + ": cannot read " + std::to_string(len) +
                                    " bytes at offset " + std::to_string(off) +
                                    (n < 0 ? std::string(": ") + std::strerror(errno)
                                           : std::string(": end of file")));
        p += n;
        off += uint64_t(n);
        len -= uint64_t(n);
    }
    return Status::Ok();
}

// Bank types the conversion writes: ggml_quantize_chunk handles them without an importance
// matrix (F32 is a copy of the floats).
bool writable_bank_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS:
            return true;
        default:
            return false;
    }
}

std::string shape_str(const int64_t * ne) {
    return "[" + std::to_string(ne[0]) + ", " + std::to_string(ne[1]) + ", " +
           std::to_string(ne[2]) + "]";
}

}  // namespace

Status model_fingerprint(const ModelIndex & m, std::string * out) {
    Fnv f;
    f.add_u64(m.set_bytes);
    for (const MoeLayer & L : m.moe_layers)
        for (const ExpertTensor & t : L.tensors) {
            f.add(t.name);
            f.add_u64(uint64_t(t.type));
            for (int64_t v : t.ne) f.add_u64(uint64_t(v));
        }
    if (!m.moe_layers.empty()) {
        const ExpertTensor * ends[2] = {&m.moe_layers.front().tensors.front(),
                                        &m.moe_layers.back().tensors.back()};
        std::vector<uint8_t> buf(4096);
        for (const ExpertTensor * t : ends) {
            const std::string & path = m.shards.empty() ? m.path : m.shards[t->shard].path;
            const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                return Status::BadInput(path + ": cannot open: " + std::strerror(errno));
            const uint64_t n = std::min<uint64_t>(buf.size(), t->tensor_bytes);
            Status st = read_exact(fd, path, t->file_offset, buf.data(), n);
            if (st.ok()) f.add(buf.data(), n);
            if (st.ok())
                st = read_exact(fd, path, t->file_offset + t->tensor_bytes - n, buf.data(), n);
            if (st.ok()) f.add(buf.data(), n);
            ::close(fd);
            if (!st.ok()) return st;
        }
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, f.h);
    *out = hex;
    return Status::Ok();
}

MissFallback::~MissFallback() {
    if (fd_ >= 0) ::close(fd_);
}

Status MissFallback::open(const std::string & path, const ModelIndex & main,
                          std::unique_ptr<MissFallback> * out) {
    std::unique_ptr<MissFallback> fb(new MissFallback());
    fb->path_ = path;
    fb->main_ = &main;
    const std::string where = "RunOptions::miss_fallback " + path;
    Status st = load_model_index(path, &fb->lo_);
    if (!st.ok()) return Status::BadModel(where + ": " + st.message());
    const auto fp = fb->lo_.kv.find(kFallbackFingerprintKey);
    if (fp == fb->lo_.kv.end())
        return Status::BadModel(where + ": not a companion file (no key " +
                                std::string(kFallbackFingerprintKey) +
                                "; make one with `moestream make-fallback`)");
    std::string mine;
    st = model_fingerprint(main, &mine);
    if (!st.ok()) return st;
    if (fp->second.s != mine) {
        const auto src = fb->lo_.kv.find(kFallbackSourceNameKey);
        const auto sz = fb->lo_.kv.find(kFallbackSourceSizeKey);
        return Status::BadModel(
            where + ": made from another model (source fingerprint " + fp->second.s + " of '" +
            (src != fb->lo_.kv.end() ? src->second.s : std::string("?")) + "', " +
            (sz != fb->lo_.kv.end() ? std::to_string(sz->second.i) : std::string("?")) +
            " bytes; this model " + main.path + " has fingerprint " + mine + ", " +
            std::to_string(main.set_bytes) + " bytes)");
    }
    const auto ty = fb->lo_.kv.find(kFallbackTypeKey);
    fb->type_name_ = ty != fb->lo_.kv.end() ? ty->second.s : std::string("?");
    if (fb->lo_.moe_layers.size() != main.moe_layers.size())
        return Status::BadModel(where + ": " + std::to_string(fb->lo_.moe_layers.size()) +
                                " MoE layers, the model has " +
                                std::to_string(main.moe_layers.size()));
    for (size_t s = 0; s < main.moe_layers.size(); ++s) {
        const MoeLayer & L = main.moe_layers[s];
        const MoeLayer & C = fb->lo_.moe_layers[s];
        if (C.layer != L.layer || C.tensors.size() != L.tensors.size())
            return Status::BadModel(where + ": MoE layer " + std::to_string(C.layer) +
                                    " does not match the model's layer " +
                                    std::to_string(L.layer));
        std::vector<const ExpertTensor *> ts;
        uint64_t eb = 0;
        for (size_t t = 0; t < L.tensors.size(); ++t) {
            const ExpertTensor & a = L.tensors[t];
            const ExpertTensor & b = C.tensors[t];
            if (b.name != a.name || b.ne[0] != a.ne[0] || b.ne[1] != a.ne[1] || b.ne[2] != a.ne[2])
                return Status::BadModel(where + ": tensor '" + b.name + "' " + shape_str(b.ne) +
                                        " does not match the model's '" + a.name + "' " +
                                        shape_str(a.ne));
            const auto * tr = ggml_get_type_traits(ggml_type(b.type));
            if (!tr || !tr->to_float)
                return Status::BadModel(where + ": tensor '" + b.name + "' has type " +
                                        ggml_type_name(ggml_type(b.type)) +
                                        ", which cannot be dequantized");
            if (!writable_bank_type(ggml_type(a.type)))
                return Status::BadModel(where + ": the model's tensor '" + a.name + "' has type " +
                                        ggml_type_name(ggml_type(a.type)) +
                                        ", which a low-bit copy cannot be converted into");
            ts.push_back(&b);
            eb += b.slice_bytes;
        }
        fb->lo_tensors_.push_back(std::move(ts));
        fb->lo_expert_bytes_.push_back(eb);
        fb->lossy_.emplace_back(size_t(main.n_expert), 0);
    }
    // The slice hashes (an array too large for the index's KV budget: read from the header).
    size_t n_slices = 0;
    for (size_t s = 0; s < main.moe_layers.size(); ++s) {
        fb->hash_base_.push_back(n_slices);
        n_slices += main.moe_layers[s].tensors.size() * size_t(main.n_expert);
    }
    {
        gguf_init_params ip{/*no_alloc=*/true, nullptr};
        gguf_context * g = gguf_init_from_file(path.c_str(), ip);
        const int64_t k = g ? gguf_find_key(g, kFallbackSliceHashKey) : -1;
        const bool ok = k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_ARRAY &&
                        gguf_get_arr_type(g, k) == GGUF_TYPE_UINT64 &&
                        gguf_get_arr_n(g, k) == n_slices;
        if (ok) {
            const auto * h = static_cast<const uint64_t *>(gguf_get_arr_data(g, k));
            fb->slice_hash_.assign(h, h + n_slices);
        }
        if (g) gguf_free(g);
        if (!ok)
            return Status::BadModel(where + ": no hash of its data (key " +
                                    std::string(kFallbackSliceHashKey) + ", " +
                                    std::to_string(n_slices) +
                                    " u64 entries); make it again with `moestream make-fallback`");
    }
    fb->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fb->fd_ < 0) return Status::BadInput(where + ": cannot open: " + std::strerror(errno));
    *out = std::move(fb);
    return Status::Ok();
}

void MissFallback::flags(const Routing & r, const std::vector<uint32_t> & experts,
                         std::vector<uint8_t> * fb) {
    fb->assign(experts.size(), 0);
    if (r.fallback.size() != r.ids.size()) return;
    for (size_t i = 0; i < experts.size(); ++i) {
        bool any = false, all = true;
        for (size_t s = 0; s < r.ids.size(); ++s)
            if (uint32_t(r.ids[s]) == experts[i]) {
                any = any || r.fallback[s];
                all = all && r.fallback[s];
            }
        (*fb)[i] = any && all ? 1 : 0;
    }
}

void MissFallback::before_stage(size_t slot, const std::vector<uint32_t> & experts,
                                const std::vector<uint8_t> & fb, ResidencyStore * store) {
    for (size_t i = 0; i < experts.size(); ++i) {
        const uint32_t e = experts[i];
        if (fb[i]) {
            if (lossy_[slot][e] && store->is_resident(slot, e)) {
                c_.fallbacks++;  // served by the lossy copy already in its slot
                c_.lossy_hits++;
                c_.bytes_saved += main_->moe_layers[slot].expert_bytes;
            }
            continue;
        }
        if (lossy_[slot][e]) {
            lossy_[slot][e] = 0;
            if (store->forget(slot, e)) c_.forgotten++;
        }
    }
}

void MissFallback::take_reads(size_t slot, const std::vector<uint32_t> & experts,
                              const std::vector<uint8_t> & fb, ResidencyStore * store,
                              std::vector<ReadRequest> * reads) {
    jobs_.clear();
    const MoeLayer & L = main_->moe_layers[slot];
    size_t kept = 0;
    for (size_t q = 0; q < reads->size(); ++q) {
        ReadRequest & r = (*reads)[q];
        bool taken = false;
        for (size_t i = 0; i < experts.size() && !taken; ++i) {
            const uint32_t e = experts[i];
            for (size_t t = 0; t < L.tensors.size(); ++t) {
                if (r.dest != store->tensor_base(slot, t) + uint64_t(e) * L.tensors[t].slice_bytes)
                    continue;
                if (fb[i]) {
                    jobs_.push_back({e, t, r.dest});
                    taken = true;
                } else {
                    lossy_[slot][e] = 0;  // the full slices are read
                }
                break;
            }
        }
        if (!taken) (*reads)[kept++] = r;
    }
    reads->resize(kept);
}

Status MissFallback::convert(size_t slot, const Job & j) {
    const ExpertTensor & hi = main_->moe_layers[slot].tensors[j.t];
    const ExpertTensor & lo = *lo_tensors_[slot][j.t];
    const auto t0 = std::chrono::steady_clock::now();
    scratch_.resize(lo.slice_bytes);
    Status st = read_exact(fd_, path_, lo.slice_offset(j.e), scratch_.data(), lo.slice_bytes);
    if (!st.ok()) return st;
    const auto t1 = std::chrono::steady_clock::now();
    c_.bytes_read += lo.slice_bytes;
    const int64_t n = lo.ne[0] * lo.ne[1];
    floats_.resize(size_t(n));
    ggml_get_type_traits(ggml_type(lo.type))->to_float(scratch_.data(), floats_.data(), n);
    // The companion's own data: a non-finite scale or weight would quietly spoil every token
    // computed from it (its fingerprint identifies the source model, not these bytes).
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(floats_[size_t(i)]))
            return Status::BadModel("RunOptions::miss_fallback " + path_ + ": tensor '" + lo.name +
                                    "', expert " + std::to_string(j.e) +
                                    ": a weight is not finite (element " + std::to_string(i) +
                                    "); the companion's data is damaged: make it again");
    // Its identity: the bytes make-fallback wrote (a finite but altered slice, or a slice of
    // another companion of the same shape, is not this companion's data).
    const size_t hi_idx = hash_base_[slot] + j.t * size_t(main_->n_expert) + j.e;
    if (fallback_slice_hash(scratch_.data(), lo.slice_bytes) != slice_hash_[hi_idx])
        return Status::BadModel("RunOptions::miss_fallback " + path_ + ": tensor '" + lo.name +
                                "', expert " + std::to_string(j.e) +
                                ": the data differs from what make-fallback wrote (hash "
                                "mismatch); the companion's data is damaged: make it again");
    if (plant_skip_) {  // tests only: the slot keeps what it was committed with
        plant_skip_ = false;
    } else if (hi.type == GGML_TYPE_F32) {
        std::memcpy(j.dest, floats_.data(), size_t(n) * sizeof(float));
    } else {
        ggml_quantize_chunk(ggml_type(hi.type), floats_.data(), j.dest, 0, hi.ne[1], hi.ne[0],
                            nullptr);
    }
    const auto t2 = std::chrono::steady_clock::now();
    c_.read_s += std::chrono::duration<double>(t1 - t0).count();
    c_.convert_s += std::chrono::duration<double>(t2 - t1).count();
    return Status::Ok();
}

Status MissFallback::run(size_t slot, bool mark) {
    const MoeLayer & L = main_->moe_layers[slot];
    uint32_t last = UINT32_MAX;
    for (const Job & j : jobs_) {
        Status st = convert(slot, j);
        if (!st.ok()) return st;
        if (j.e != last) {
            c_.fallbacks++;
            c_.bytes_saved += L.expert_bytes - lo_expert_bytes_[slot];
            last = j.e;
        }
        if (mark) lossy_[slot][j.e] = 1;
    }
    jobs_.clear();
    return Status::Ok();
}

}  // namespace moestream
