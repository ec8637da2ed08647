// shard_set.cpp — load_model_index: the given file, or every shard of its split set
// (llama.cpp's gguf-split layout), opened, parsed and merged into one ModelIndex
// (gguf_index.h states what is refused). Each file is parsed on its own (gguf_parser.h); the
// first shard holds the model's metadata, and the later shards' tensors join its index before
// the model rules run. A ParseError becomes one Status naming the file it is in.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "gguf_parser.h"
#include "gguf_reader.h"
#include "llama.h"
#include "moestream/atomic_file.h"
#include "moestream/gguf_index.h"

namespace moestream {

namespace {

// One file of the model, opened and parsed (parse_file) or fully parsed (parse).
struct OpenFile {
    std::string path;
    int fd = -1;
    ShardFile info;
    ModelIndex m;
    std::unique_ptr<gguf::GgufReader> reader;
    std::unique_ptr<gguf::GgufParser> parser;
    ~OpenFile() {
        if (fd >= 0) ::close(fd);
    }
};

Status open_file(const std::string & path, std::unique_ptr<OpenFile> * out) {
    auto f = std::make_unique<OpenFile>();
    f->path = path;
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below); it
    // changes nothing for the regular file that is read.
    f->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0) return Status::BadModel(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (::fstat(f->fd, &st) != 0) {
        return Status::BadModel(path + ": cannot stat: " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return Status::BadModel(path + ": not a regular file (" + file_kind(st.st_mode) +
                                "): a model is read from a file");
    ShardFile & i = f->info;
    i.path = path;
    i.file_size = static_cast<uint64_t>(st.st_size);
    i.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    i.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    i.dev = uint64_t(st.st_dev);
    i.ino = uint64_t(st.st_ino);
    f->m.path = path;
    f->m.file_size = i.file_size;
    f->m.mtime_ns = i.mtime_ns;
    f->m.ctime_ns = i.ctime_ns;
    f->m.dev = i.dev;
    f->m.ino = i.ino;
    f->reader = std::make_unique<gguf::GgufReader>(f->fd, i.file_size);
    f->parser = std::make_unique<gguf::GgufParser>(*f->reader, f->m);
    *out = std::move(f);
    return Status::Ok();
}

// Runs fn, turning a ParseError into one Status naming the file it is in.
template <typename Fn>
Status guarded(const std::vector<std::string> & shard_paths, const std::string & path, Fn fn) {
    try {
        fn();
    } catch (const gguf::ParseError & e) {
        const std::string & where =
            e.shard != gguf::kThisFile && e.shard < shard_paths.size() ? shard_paths[e.shard] : path;
        return Status::BadModel(where + ": " + e.what + " at byte offset " +
                                std::to_string(e.offset));
    } catch (const std::bad_alloc &) {
        return Status::BadModel(path + ": out of memory while reading the metadata");
    }
    return Status::Ok();
}

// A split key (split.no / split.count / split.tensors.count) of a parsed file: -1 when absent.
Status split_key(const OpenFile & f, const char * key, int64_t hi, int64_t * out) {
    *out = -1;
    auto it = f.m.kv.find(key);
    if (it == f.m.kv.end()) return Status::Ok();
    const KvValue & v = it->second;
    const bool integer = gguf::gguf_scalar_size(v.type) != 0 && v.type != gguf::kBool &&
                         v.type != gguf::kF32 && v.type != gguf::kF64;
    if (!integer || v.i < 0 || v.i > hi)
        return Status::BadModel(f.path + ": metadata key '" + key + "' must be an integer in [0, " +
                                std::to_string(hi) + "] at byte offset " +
                                std::to_string(f.m.kv_offsets.at(key)));
    *out = v.i;
    return Status::Ok();
}

struct SplitKeys {
    int64_t no = -1, count = -1, tensors = -1;
};

Status split_keys(const OpenFile & f, SplitKeys * k) {
    Status st = split_key(f, "split.no", 65535, &k->no);
    if (st.ok()) st = split_key(f, "split.count", 65535, &k->count);
    if (st.ok()) st = split_key(f, "split.tensors.count", gguf::kMaxTensors * 65535ll, &k->tensors);
    return st;
}

}  // namespace

Status load_model_index(const std::string & path, ModelIndex * out) {
    std::unique_ptr<OpenFile> given;
    Status st = open_file(path, &given);
    if (!st.ok()) return st;
    st = guarded({}, path, [&] { given->parser->parse_file(); });
    if (!st.ok()) return st;
    SplitKeys k;
    st = split_keys(*given, &k);
    if (!st.ok()) return st;
    if (k.count <= 1 && k.no <= 0) {
        // A single file (or a "set" of one).
        st = guarded({}, path, [&] { given->parser->parse_model(); });
        if (!st.ok()) return st;
        ModelIndex m = std::move(given->m);
        ShardFile info = given->info;
        info.data_offset = m.data_offset;
        info.n_tensors = uint32_t(m.tensors.size());
        for (const TensorInfo & t : m.tensors) info.tensor_bytes += t.nbytes;
        m.shards = {info};
        m.set_bytes = info.file_size;
        *out = std::move(m);
        return Status::Ok();
    }
    // A shard of a split set: llama.cpp's naming gives the other files.
    if (k.count < 1 || k.no < 0 || k.no >= k.count)
        return Status::BadModel(path + ": split.no " + std::to_string(k.no) + " is not below split.count " +
                                std::to_string(k.count) + " (split.no counts from 0)");
    char prefix[4096];
    const int n = llama_split_prefix(prefix, sizeof prefix, path.c_str(), int(k.no), int(k.count));
    if (n <= 0) {
        char want[64];
        std::snprintf(want, sizeof want, "-%05d-of-%05d.gguf", int(k.no) + 1, int(k.count));
        return Status::BadModel(path + ": shard " + std::to_string(k.no + 1) + " of a " +
                                std::to_string(k.count) + "-shard split set, but its name does not end in '" +
                                want + "' (llama.cpp finds the other shards by that name)");
    }
    std::vector<std::string> paths;
    for (int64_t i = 0; i < k.count; ++i) {
        char p[4096 + 64];
        llama_split_path(p, sizeof p, prefix, int(i), int(k.count));
        paths.push_back(p);
    }
    std::vector<std::unique_ptr<OpenFile>> files(paths.size());
    const std::string set_name = "the " + std::to_string(k.count) + "-shard set of " + paths[0];
    for (size_t i = 0; i < paths.size(); ++i) {
        if (int64_t(i) == k.no) {
            files[i] = std::move(given);
        } else {
            struct stat st_probe;
            if (::stat(paths[i].c_str(), &st_probe) != 0 && errno == ENOENT)
                return Status::BadModel(paths[i] + ": missing shard " + std::to_string(i + 1) +
                                        " of " + set_name);
            st = open_file(paths[i], &files[i]);
            if (!st.ok()) return st;
            st = guarded({}, paths[i], [&] { files[i]->parser->parse_file(); });
            if (!st.ok()) return st;
        }
        SplitKeys ki;
        st = split_keys(*files[i], &ki);
        if (!st.ok()) return st;
        if (ki.count != k.count || ki.no != int64_t(i) || ki.tensors != k.tensors) {
            auto shown = [](int64_t v) { return v < 0 ? std::string("absent") : std::to_string(v); };
            return Status::BadModel(
                paths[i] + ": not shard " + std::to_string(i + 1) + " of " + set_name +
                " (its split.no " + shown(ki.no) + ", split.count " + shown(ki.count) +
                ", split.tensors.count " + shown(ki.tensors) + "; the set has split.no " +
                std::to_string(i) + ", split.count " + std::to_string(k.count) +
                ", split.tensors.count " + shown(k.tensors) + "): a shard of another model or set?");
        }
    }
    // Shard 0 holds the model's metadata; the other shards' tensors join its index.
    OpenFile & first = *files[0];
    for (size_t i = 0; i < files.size(); ++i) {
        ShardFile info = files[i]->info;
        info.data_offset = files[i]->m.data_offset;
        info.n_tensors = uint32_t(files[i]->m.tensors.size());
        for (const TensorInfo & t : files[i]->m.tensors) info.tensor_bytes += t.nbytes;
        first.m.shards.push_back(info);
        first.m.set_bytes += info.file_size;
    }
    for (size_t i = 1; i < files.size(); ++i) {
        st = guarded(paths, paths[i], [&] { first.parser->add_shard(*files[i]->parser, uint32_t(i)); });
        if (!st.ok()) return st;
    }
    if (k.tensors >= 0 && uint64_t(k.tensors) != first.m.tensors.size())
        return Status::BadModel(paths.back() + ": the " + std::to_string(k.count) +
                                " shards hold " + std::to_string(first.m.tensors.size()) +
                                " tensors, but split.tensors.count is " +
                                std::to_string(k.tensors) + " (a shard of another set?)");
    st = guarded(paths, paths[0], [&] { first.parser->parse_model(); });
    if (!st.ok()) return st;
    *out = std::move(first.m);
    return Status::Ok();
}

}  // namespace moestream
