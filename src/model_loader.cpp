#include "model_loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <unordered_map>

#include "file_io.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "log.h"

namespace moestream {

Status load_model_resident(const ModelIndex & index, const llama_model_params & params,
                           LoadedModel * out) {
    llama_model_params mp = params;
    mp.load_mode = LLAMA_LOAD_MODE_MMAP;
    mp.use_extra_bufts = false;
    mp.lazy_mode = LLAMA_LAZY_MODE_OFF;
    out->model = llama_model_load_from_file(index.path.c_str(), mp);
    if (!out->model)
        return Status::BadModel(index.path + ": llama.cpp could not load the model (run with -vv "
                                "for llama.cpp's log)");
    return Status::Ok();
}

namespace {

struct InitCtx {
    const ModelIndex * index = nullptr;
    std::unordered_map<std::string, const TensorInfo *> by_name;
    std::unordered_map<std::string, std::pair<size_t, size_t>> expert_pos;  // name -> (slot, t)
    LoadedModel * out = nullptr;
    int fd = -1;
    Status error;
    size_t n_seen = 0;
};

std::string shape_str(const int64_t * ne, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

void set_tensor_data(ggml_tensor * t, void * ud) {
    auto * c = static_cast<InitCtx *>(ud);
    if (!c->error.ok()) return;
    ++c->n_seen;
    const std::string & path = c->index->path;
    auto it = c->by_name.find(t->name);
    if (it == c->by_name.end()) {
        c->error = Status::BadModel(path + ": llama.cpp expects tensor '" + t->name +
                                    "', which the file does not have");
        return;
    }
    const TensorInfo & ti = *it->second;
    if (int32_t(t->type) != ti.type || ggml_nbytes(t) != ti.nbytes ||
        std::memcmp(t->ne, ti.ne, sizeof ti.ne) != 0) {
        c->error = Status::BadModel(path + ": tensor '" + ti.name + "' is " +
                                    ggml_type_name(ggml_type(ti.type)) + " " + shape_str(ti.ne, 4) +
                                    " in the file but llama.cpp made it " +
                                    ggml_type_name(t->type) + " " + shape_str(t->ne, 4));
        return;
    }
    auto ep = c->expert_pos.find(t->name);
    if (ep != c->expert_pos.end()) {
        c->out->expert_tensors[ep->second.first][ep->second.second] = t;
        return;  // expert bytes are streamed later, never read here
    }
    if (t->buffer == nullptr || !ggml_backend_buffer_is_host(t->buffer)) {
        c->error = Status::Runtime("tensor '" + ti.name + "' is not in host memory");
        return;
    }
    c->error = read_exact_at(c->fd, path, t->data, ti.nbytes, ti.file_offset);
    if (c->error.ok()) {
        c->out->dense_bytes_read += ti.nbytes;
        // Dense weights now live in llama.cpp's buffer: drop the page-cache copy.
        posix_fadvise(c->fd, off_t(ti.file_offset), off_t(ti.nbytes), POSIX_FADV_DONTNEED);
    }
}

}  // namespace

Status load_model_streaming(const ModelIndex & index, const llama_model_params & params,
                            LoadedModel * out) {
    InitCtx c;
    c.index = &index;
    c.out = out;
    for (const auto & ti : index.tensors) c.by_name[ti.name] = &ti;
    out->expert_tensors.assign(index.moe_layers.size(), {});
    for (size_t s = 0; s < index.moe_layers.size(); ++s) {
        out->expert_tensors[s].assign(index.moe_layers[s].tensors.size(), nullptr);
        for (size_t t = 0; t < index.moe_layers[s].tensors.size(); ++t)
            c.expert_pos[index.moe_layers[s].tensors[t].name] = {s, t};
    }
    c.fd = ::open(index.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (c.fd < 0) return Status::BadModel(index.path + ": cannot open: " + std::strerror(errno));

    gguf_init_params gp{/*no_alloc=*/true, /*ctx=*/nullptr};
    gguf_context * meta = gguf_init_from_file(index.path.c_str(), gp);
    if (!meta) {
        ::close(c.fd);
        return Status::BadModel(index.path + ": ggml's GGUF reader rejected the file");
    }
    llama_model_params mp = params;
    mp.load_mode = LLAMA_LOAD_MODE_NONE;
    mp.use_extra_bufts = false;
    mp.lazy_mode = LLAMA_LAZY_MODE_OFF;
    out->model = llama_model_init_from_user(meta, set_tensor_data, &c, mp);
    gguf_free(meta);
    ::close(c.fd);
    if (!c.error.ok()) {
        if (out->model) llama_model_free(out->model);
        out->model = nullptr;
        return c.error;
    }
    if (!out->model)
        return Status::BadModel(index.path + ": llama.cpp could not build the model (run with -vv "
                                "for llama.cpp's log)");
    for (size_t s = 0; s < out->expert_tensors.size(); ++s)
        for (size_t t = 0; t < out->expert_tensors[s].size(); ++t)
            if (out->expert_tensors[s][t] == nullptr) {
                llama_model_free(out->model);
                out->model = nullptr;
                return Status::BadModel(index.path + ": llama.cpp does not use expert tensor '" +
                                        index.moe_layers[s].tensors[t].name +
                                        "' (unsupported architecture for streaming?)");
            }
    MS_LOG_INFO("loaded %zu tensors, %.1f MiB dense read, experts untouched", c.n_seen,
                double(out->dense_bytes_read) / (1 << 20));
    return Status::Ok();
}

Status bind_experts(const ModelIndex & index, ResidencyStore * store, LoadedModel * lm) {
    for (size_t s = 0; s < lm->expert_tensors.size(); ++s) {
        for (size_t t = 0; t < lm->expert_tensors[s].size(); ++t) {
            ggml_tensor * g = lm->expert_tensors[s][t];
            const ExpertTensor & et = index.moe_layers[s].tensors[t];
            if (uint64_t(g->nb[2]) != et.slice_bytes || uint64_t(g->nb[1]) != et.row_bytes)
                return Status::Runtime("tensor '" + et.name + "': ggml strides nb[1]=" +
                                       std::to_string(g->nb[1]) + " nb[2]=" +
                                       std::to_string(g->nb[2]) + " disagree with the file's " +
                                       std::to_string(et.row_bytes) + "/" +
                                       std::to_string(et.slice_bytes));
            g->data = store->tensor_base(s, t);
        }
    }
    return Status::Ok();
}

}  // namespace moestream
