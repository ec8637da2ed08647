// make_fallback.cpp — `moestream make-fallback` (include/moestream/fallback.h).
#include "moestream/fallback.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <strings.h>
#include <map>

#include "ggml.h"
#include "gguf.h"
#include "miss_fallback.h"
#include "moestream/atomic_file.h"
#include "moestream/gguf_index.h"

namespace moestream {

namespace {

// Runs argv with its output in log_path; returns the exit status, 256 + the signal that
// ended it, or -1 with *err.
int run_tool(const std::vector<std::string> & argv, const std::string & log_path,
             std::string * err) {
    std::vector<char *> a;
    for (const std::string & s : argv) a.push_back(const_cast<char *>(s.c_str()));
    a.push_back(nullptr);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log < 0) {
        *err = log_path + ": " + std::strerror(errno);
        return -1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
        *err = std::string("fork: ") + std::strerror(errno);
        ::close(log);
        return -1;
    }
    if (pid == 0) {
        // The tool must not outlive make-fallback (killed, or interrupted while the tool
        // ignores it): its output is a temporary file nobody would remove.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(128 + SIGTERM);  // the parent is already gone
        dup2(log, 1);
        dup2(log, 2);
        execvp(a[0], a.data());
        dprintf(2, "cannot run %s: %s\n", a[0], std::strerror(errno));
        _exit(127);
    }
    ::close(log);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 256 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
}

std::string tail_of(const std::string & path, size_t n) {
    std::string s;
    if (FILE * f = std::fopen(path.c_str(), "rb")) {
        char buf[4096];
        size_t k;
        while ((k = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, k);
        std::fclose(f);
    }
    return s.size() > n ? s.substr(s.size() - n) : s;
}

Status write_all(int fd, const std::string & path, const void * p, size_t n) {
    const auto * b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        const ssize_t w = ::write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return Status::BadInput(path + ": write failed: " + std::strerror(errno));
        b += w;
        n -= size_t(w);
    }
    return Status::Ok();
}

// Writes `out` from the quantized file `full`: the metadata, the fallback keys and the
// expert tensors only.
Status strip(const ModelIndex & m, const std::string & full, const std::string & out,
             const MakeFallbackOptions & opt, MakeFallbackResult * res) {
    ggml_context * meta = nullptr;
    gguf_init_params ip{/*no_alloc=*/true, &meta};
    gguf_context * src = gguf_init_from_file(full.c_str(), ip);
    if (!src) return Status::Runtime(full + ": llama-quantize's output does not parse as GGUF");
    gguf_context * dst = gguf_init_empty();
    gguf_set_kv(dst, src);
    gguf_set_val_str(dst, kFallbackFingerprintKey, res->fingerprint.c_str());
    gguf_set_val_u64(dst, kFallbackSourceSizeKey, m.set_bytes);
    const std::string base = m.path.substr(m.path.find_last_of('/') + 1);
    gguf_set_val_str(dst, kFallbackSourceNameKey, base.c_str());
    gguf_set_val_str(dst, kFallbackTypeKey, opt.type.c_str());
    Status st;
    std::vector<int64_t> ids;
    std::map<std::string, int> type_count;
    for (const std::string & name : m.expert_tensor_names) {
        const int64_t id = gguf_find_tensor(src, name.c_str());
        ggml_tensor * t = meta ? ggml_get_tensor(meta, name.c_str()) : nullptr;
        if (id < 0 || !t) {
            st = Status::Runtime(full + ": llama-quantize's output has no tensor '" + name + "'");
            break;
        }
        gguf_add_tensor(dst, t);
        ids.push_back(id);
        type_count[ggml_type_name(t->type)]++;
        res->expert_bytes_fallback += ggml_nbytes(t);
    }
    for (const auto & [ty, n] : type_count)
        res->types += (res->types.empty() ? "" : ", ") + ty + " x " + std::to_string(n);
    const int in = st.ok() ? ::open(full.c_str(), O_RDONLY | O_CLOEXEC) : -1;
    if (st.ok() && in < 0) st = Status::BadInput(full + ": " + std::strerror(errno));
    // The hash of every expert slice of the data written (kFallbackSliceHashKey's order: MoE
    // layer, the model's expert tensors, expert), in the header before the data.
    std::vector<uint64_t> hashes;
    std::vector<uint8_t> slice;
    for (size_t s = 0; st.ok() && s < m.moe_layers.size(); ++s)
        for (const ExpertTensor & t : m.moe_layers[s].tensors) {
            const int64_t id = gguf_find_tensor(src, t.name.c_str());
            if (id < 0) {
                st = Status::Runtime(full + ": llama-quantize's output has no tensor '" + t.name + "'");
                break;
            }
            const uint64_t n = gguf_get_tensor_size(src, id) / uint64_t(m.n_expert);
            slice.resize(size_t(n));
            const uint64_t base = gguf_get_data_offset(src) + gguf_get_tensor_offset(src, id);
            for (uint32_t e = 0; st.ok() && e < m.n_expert; ++e) {
                if (pread(in, slice.data(), size_t(n), off_t(base + e * n)) != ssize_t(n))
                    st = Status::BadInput(full + ": read failed");
                else
                    hashes.push_back(fallback_slice_hash(slice.data(), size_t(n)));
            }
        }
    if (st.ok())
        gguf_set_arr_data(dst, kFallbackSliceHashKey, GGUF_TYPE_UINT64, hashes.data(), hashes.size());
    AtomicFile af;
    if (st.ok()) st = af.create(out, "MakeFallbackOptions::out_path");
    if (st.ok()) {
        std::vector<uint8_t> head(gguf_get_meta_size(dst));
        gguf_get_meta_data(dst, head.data());
        st = write_all(af.fd(), af.temp_path(), head.data(), head.size());
        uint64_t pos = head.size();
        std::vector<uint8_t> buf(8u << 20);
        for (size_t i = 0; st.ok() && i < ids.size(); ++i) {
            const uint64_t at = head.size() + gguf_get_tensor_offset(dst, int64_t(i));
            static const uint8_t zeros[64] = {};
            while (st.ok() && pos < at) {  // alignment padding
                const size_t n = size_t(std::min<uint64_t>(sizeof zeros, at - pos));
                st = write_all(af.fd(), af.temp_path(), zeros, n);
                pos += n;
            }
            uint64_t off = gguf_get_data_offset(src) + gguf_get_tensor_offset(src, ids[i]);
            uint64_t left = gguf_get_tensor_size(src, ids[i]);
            while (st.ok() && left > 0) {
                const size_t n = size_t(std::min<uint64_t>(buf.size(), left));
                const ssize_t r = pread(in, buf.data(), n, off_t(off));
                if (r <= 0) {
                    st = Status::BadInput(full + ": read failed");
                    break;
                }
                st = write_all(af.fd(), af.temp_path(), buf.data(), size_t(r));
                off += uint64_t(r);
                left -= uint64_t(r);
                pos += uint64_t(r);
            }
        }
    }
    if (in >= 0) ::close(in);
    if (st.ok()) st = af.commit();
    gguf_free(dst);
    gguf_free(src);
    if (meta) ggml_free(meta);
    return st;
}

}  // namespace

Status check_fallback_type(const std::string & type) {
    static const ggml_type kWritable[] = {
        GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,  GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,  GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,
        GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,  GGML_TYPE_IQ3_S,  GGML_TYPE_IQ4_NL,
        GGML_TYPE_IQ4_XS, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_MXFP4};
    // llama-quantize refuses these without --imatrix ("this quantization requires an imatrix").
    static const ggml_type kNeedImatrix[] = {GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S,
                                             GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ1_S,  GGML_TYPE_IQ1_M};
    auto same = [&](ggml_type t) { return strcasecmp(ggml_type_name(t), type.c_str()) == 0; };
    std::string names;
    for (ggml_type t : kWritable) {
        if (same(t)) return Status::Ok();
        names += (names.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    }
    for (ggml_type t : kNeedImatrix)
        if (same(t))
            return Status::Usage("type " + type +
                                 " needs an importance matrix, which make-fallback does not take; "
                                 "one of " + names);
    return Status::Usage("type '" + type + "' is not a ggml type llama-quantize writes; one of " +
                         names);
}

namespace {

// The output must not be a file of the model (itself, a link or a hard link to it, a shard).
Status check_not_the_model(const ModelIndex & m, const std::string & out) {
    struct stat st;
    if (::stat(out.c_str(), &st) != 0) return Status::Ok();  // not there yet
    for (const ShardFile & f : m.shards)
        if (uint64_t(st.st_dev) == f.dev && uint64_t(st.st_ino) == f.ino)
            return Status::Usage("the output " + out + " is the model file " + f.path +
                                 "; the companion must be another file");
    return Status::Ok();
}

std::string command_text(const std::vector<std::string> & argv) {
    std::string s;
    for (const std::string & a : argv) s += (s.empty() ? "" : " ") + a;
    return s;
}

// The lines of a tool log worth showing: the last `n`, without ggml's backend-search noise.
std::string log_tail(const std::string & path, size_t n) {
    const std::string all = tail_of(path, 64 * 1024);
    std::vector<std::string> keep;
    size_t at = 0;
    while (at < all.size()) {
        size_t e = all.find('\n', at);
        if (e == std::string::npos) e = all.size();
        const std::string line = all.substr(at, e - at);
        if (!line.empty() && line.rfind("ggml_backend_load_best:", 0) != 0) keep.push_back(line);
        at = e + 1;
    }
    std::string s;
    for (size_t i = keep.size() > n ? keep.size() - n : 0; i < keep.size(); ++i)
        s += (s.empty() ? "" : "\n") + keep[i];
    return s;
}

}  // namespace

std::vector<std::string> make_fallback_temp_paths(const MakeFallbackOptions & opt) {
    const std::string tmp = opt.out_path + ".quantize-" + std::to_string(getpid());
    return {tmp + ".gguf", tmp + ".log", opt.out_path + ".tmp." + std::to_string(getpid())};
}

Status make_fallback(const MakeFallbackOptions & opt, MakeFallbackResult * out) {
    *out = MakeFallbackResult{};
    Status tst = check_fallback_type(opt.type);
    if (!tst.ok()) return Status::Usage("MakeFallbackOptions::" + tst.message());
    ModelIndex m;
    Status st = load_model_index(opt.model_path, &m);
    if (!st.ok()) return st;
    if (m.moe_layers.empty())
        return Status::BadModel(opt.model_path + ": no expert tensors (not a MoE model)");
    st = check_output_path(opt.out_path, "MakeFallbackOptions::out_path");
    if (st.ok()) st = check_not_the_model(m, opt.out_path);
    if (!st.ok()) return st;
    st = model_fingerprint(m, &out->fingerprint);
    if (!st.ok()) return st;
    out->expert_bytes_model = m.expert_bytes_total;
    if (opt.quantize_cmd.empty()) return Status::Usage("make_fallback: no llama-quantize command");
    const std::vector<std::string> temps = make_fallback_temp_paths(opt);
    const std::string & full = temps[0];
    const std::string & log = temps[1];
    std::vector<std::string> argv = opt.quantize_cmd;
    argv.push_back("--allow-requantize");
    for (const char * p : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"}) {
        argv.push_back("--tensor-type");
        argv.push_back(std::string(p) + "=" + opt.type);
    }
    // The other tensors are thrown away: the cheapest base type keeps them as they are.
    // llama-quantize loads a split set from its first shard only (m.path), whichever was given.
    argv.push_back(m.path);
    argv.push_back(full);
    argv.push_back("Q8_0");
    if (opt.n_threads > 0) argv.push_back(std::to_string(opt.n_threads));
    std::string err;
    const int rc = run_tool(argv, log, &err);
    if (rc != 0) {
        const std::string t = rc < 0 ? err : log_tail(log, 12);
        ::unlink(full.c_str());
        ::unlink(log.c_str());
        return Status::Runtime(command_text(opt.quantize_cmd) + " failed (" +
                               (rc < 0 ? std::string("not run")
                                : rc >= 256 ? "killed by signal " + std::to_string(rc - 256)
                                           : "exit " + std::to_string(rc)) +
                               ") on " + opt.model_path + ":\n" + t);
    }
    st = strip(m, full, opt.out_path, opt, out);
    ::unlink(full.c_str());
    ::unlink(log.c_str());
    return st;
}

}  // namespace moestream
