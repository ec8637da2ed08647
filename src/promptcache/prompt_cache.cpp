// prompt_cache.cpp — see prompt_cache.h.
//
// File layout (native byte order; the magic fixes it and the format version):
//   0   "MSKVC001"
//   8   u64 file size
//   16  u32 lossy, u32 n_tokens
//   24  u32 model identity bytes, u32 settings bytes
//   32  u64 state bytes
//   40  u64 logits (floats; the whole prompt's last logits, else 0)
//   48  model identity, settings, tokens (int32 each), logits, llama.cpp state
//   end u64 FNV-1a 64 of every byte before it
#include "prompt_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cache_file.h"
#include "hash.h"
#include "llama.h"
#include "moestream/atomic_file.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"

namespace moestream {
namespace {

constexpr char kMagic[8] = {'M', 'S', 'K', 'V', 'C', '0', '0', '2'};
constexpr size_t kHeader = 48;
constexpr size_t kTrailer = 8;
constexpr const char * kPrefix = "prompt-";
constexpr const char * kSuffix = ".kv";

// The hash that names a prefix: the key, then the tokens.
uint64_t key_hash(const PromptCacheKey & key) {
    uint64_t h = fnv1a64(kFnv1a64Basis, key.model.data(), key.model.size());
    h = fnv1a64(h, "\n", 1);
    h = fnv1a64(h, key.settings.data(), key.settings.size());
    return fnv1a64(h, key.lossy ? "L" : "-", 1);
}

std::string name_of(uint64_t h) {
    char b[40];
    std::snprintf(b, sizeof b, "%s%016llx%s", kPrefix, (unsigned long long)h, kSuffix);
    return b;
}

bool is_cache_name(const std::string & n) {
    const size_t p = std::strlen(kPrefix), s = std::strlen(kSuffix);
    return n.size() == p + 16 + s && n.compare(0, p, kPrefix) == 0 &&
           n.compare(n.size() - s, s, kSuffix) == 0 &&
           n.find_first_not_of("0123456789abcdef", p) == p + 16;
}

}  // namespace

std::string prompt_cache_model_identity(const ModelIndex & index) {
    std::string s;
    for (const ShardFile & f : index.shards)
        s += f.path + " size=" + std::to_string(f.file_size) +
             " mtime_ns=" + std::to_string(f.mtime_ns) + " ctime_ns=" + std::to_string(f.ctime_ns) +
             " dev=" + std::to_string(f.dev) + " ino=" + std::to_string(f.ino) + "\n";
    return s;
}

Status PromptCache::open(const std::string & dir, uint64_t budget_bytes,
                         std::unique_ptr<PromptCache> * out) {
    if (dir.empty()) return Status::Usage("RunOptions::prompt_cache: the directory is empty");
    if (budget_bytes == 0)
        return Status::Usage("RunOptions::prompt_cache_mb must be > 0 with a prompt cache");
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
        if (errno != ENOENT || ::mkdir(dir.c_str(), 0755) != 0 || ::stat(dir.c_str(), &st) != 0)
            return Status::BadInput(dir + ": the prompt cache directory cannot be made: " +
                                    std::strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return Status::BadInput(dir + ": the prompt cache directory is " + file_kind(st.st_mode) +
                                ", not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
        return Status::BadInput(dir + ": the prompt cache directory is not writable: " +
                                std::strerror(errno));
    auto pc = std::unique_ptr<PromptCache>(new PromptCache());
    pc->dir_ = dir;
    pc->budget_ = budget_bytes;
    *out = std::move(pc);
    return Status::Ok();
}

std::string PromptCache::file_path(const PromptCacheKey & key, const int32_t * tokens,
                                   size_t n) const {
    return dir_ + "/" + name_of(fnv1a64(key_hash(key), tokens, n * sizeof(int32_t)));
}

size_t PromptCache::lookup(const PromptCacheKey & key, const std::vector<int32_t> & tokens,
                           int n_batch) const {
    const size_t n = tokens.size();
    if (n == 0 || n_batch <= 0) return 0;
    // Candidates, longest first: the whole prompt, then multiples of n_batch below it.
    std::vector<size_t> cand{n};
    for (size_t p = ((n - 1) / size_t(n_batch)) * size_t(n_batch); p > 0; p -= size_t(n_batch))
        cand.push_back(p);
    for (size_t p : cand) {
        struct stat st;
        if (::stat(file_path(key, tokens.data(), p).c_str(), &st) == 0 && S_ISREG(st.st_mode))
            return p;
    }
    return 0;
}

namespace {

// Where the parts of a checked file are.
struct Parsed {
    bool lossy = false;
    size_t tokens_at = 0, n_tokens = 0, logits_at = 0, n_logits = 0, state_at = 0, state = 0;
};

// Checks a whole file's format, checksum, model identity, lossiness and settings against key;
// false with *why otherwise.
bool parse(const std::vector<uint8_t> & b, const PromptCacheKey & key, Parsed * p,
           std::string * why) {
    auto no = [&](const std::string & w) {
        *why = w;
        return false;
    };
    if (std::string e = envelope_error(b, kMagic, kHeader, "prompt cache file"); !e.empty())
        return no(e);
    p->lossy = get<uint32_t>(b, 16) != 0;
    const uint64_t nt = get<uint32_t>(b, 20), ml = get<uint32_t>(b, 24), sl = get<uint32_t>(b, 28);
    const uint64_t state = get<uint64_t>(b, 32), nl = get<uint64_t>(b, 40);
    if (nl > b.size() || state > b.size() ||
        kHeader + ml + sl + nt * 4 + nl * 4 + state + kTrailer != b.size())
        return no("inconsistent lengths in the header");
    const char * m = reinterpret_cast<const char *>(b.data() + kHeader);
    if (std::string(m, ml) != key.model)
        return no("written for another model file (or the file changed since)");
    if (p->lossy && !key.lossy) return no("lossy KV is never restored into a lossless run");
    if (std::string(m + ml, sl) != key.settings)
        return no("written with other settings (" + std::string(m + ml, sl) + ")");
    if (p->lossy != key.lossy) return no("written by a lossless run, this run is lossy");
    p->tokens_at = kHeader + ml + sl;
    p->n_tokens = nt;
    p->logits_at = p->tokens_at + nt * 4;
    p->n_logits = nl;
    p->state_at = p->logits_at + nl * 4;
    p->state = state;
    return true;
}

// Hands a parsed file's state to llama.cpp; false with *why when it refuses it.
bool set_state(llama_context * ctx, const std::vector<uint8_t> & b, const Parsed & p,
               std::string * why) {
    llama_errors_begin();
    const size_t used = llama_state_set_data(ctx, b.data() + p.state_at, p.state);
    const std::string lwhy = llama_errors_end();
    if (used == p.state) return true;
    *why = "llama.cpp refused the state" + (lwhy.empty() ? "" : ": " + lwhy);
    return false;
}

// The whole file of tokens[0, n) (and n_logits logits) with ctx's state; false with *why.
bool serialize(llama_context * ctx, const PromptCacheKey & key, const int32_t * tokens, size_t n,
               const float * logits, size_t n_logits, uint64_t max_bytes,
               std::vector<uint8_t> * out, std::string * why) {
    const size_t state = llama_state_get_size(ctx);
    const uint64_t size = kHeader + key.model.size() + key.settings.size() + n * 4 +
                          n_logits * 4 + state + kTrailer;
    if (state == 0) {
        *why = "llama.cpp gives no state";
        return false;
    }
    if (size > max_bytes) {
        *why = "the state (" + std::to_string(size) + " bytes) exceeds the budget";
        return false;
    }
    out->assign(size, 0);
    std::vector<uint8_t> & b = *out;
    std::memcpy(b.data(), kMagic, sizeof kMagic);
    put<uint64_t>(&b, 8, size);
    put<uint32_t>(&b, 16, key.lossy ? 1 : 0);
    put<uint32_t>(&b, 20, uint32_t(n));
    put<uint32_t>(&b, 24, uint32_t(key.model.size()));
    put<uint32_t>(&b, 28, uint32_t(key.settings.size()));
    put<uint64_t>(&b, 32, uint64_t(state));
    put<uint64_t>(&b, 40, uint64_t(n_logits));
    size_t at = kHeader;
    std::memcpy(b.data() + at, key.model.data(), key.model.size());
    at += key.model.size();
    std::memcpy(b.data() + at, key.settings.data(), key.settings.size());
    at += key.settings.size();
    if (n) std::memcpy(b.data() + at, tokens, n * 4);
    at += n * 4;
    if (n_logits) std::memcpy(b.data() + at, logits, n_logits * 4);
    at += n_logits * 4;
    if (llama_state_get_data(ctx, b.data() + at, state) != state) {
        *why = "llama.cpp wrote less state than it announced";
        out->clear();
        return false;
    }
    put<uint64_t>(&b, size - kTrailer, fnv1a64(kFnv1a64Basis, b.data(), size - kTrailer));
    return true;
}

}  // namespace

bool PromptCache::restore(llama_context * ctx, const PromptCacheKey & key,
                          const std::vector<int32_t> & tokens, size_t n, int n_vocab,
                          PromptCacheRestore * out) {
    *out = PromptCacheRestore{};
    const double t0 = now_s();
    const std::string path = file_path(key, tokens.data(), n);
    std::vector<uint8_t> b;
    std::string why;
    auto refuse = [&](const std::string & w) {
        out->refused = path + ": prompt cache file ignored and removed: " + w;
        out->logits.clear();
        MS_LOG_WARN("%s", out->refused.c_str());
        ::unlink(path.c_str());  // the cold prefill that follows writes it afresh
        return false;
    };
    if (!read_whole(path, budget_, &b, &why)) return refuse(why);
    out->bytes = b.size();
    Parsed p;
    if (!parse(b, key, &p, &why)) return refuse(why);
    if (p.n_tokens != n || std::memcmp(b.data() + p.tokens_at, tokens.data(), n * 4) != 0)
        return refuse("written for another prompt");
    const size_t want = n == tokens.size() ? size_t(n_vocab) : 0;
    if (p.n_logits != want)
        return refuse("holds " + std::to_string(p.n_logits) + " logits, expected " +
                      std::to_string(want));
    out->logits.resize(p.n_logits);
    if (p.n_logits) std::memcpy(out->logits.data(), b.data() + p.logits_at, p.n_logits * 4);
    if (!set_state(ctx, b, p, &why)) return refuse(why);
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // most recently used
    out->n_tokens = int(n);
    out->seconds = now_s() - t0;
    return true;
}

PromptCache::File PromptCache::capture(llama_context * ctx, const PromptCacheKey & key,
                                       const std::vector<int32_t> & tokens, size_t n,
                                       const float * logits, size_t n_logits,
                                       std::string * why) const {
    File f;
    std::string w;
    const std::string path = file_path(key, tokens.data(), n);
    struct stat st;
    if (::stat(path.c_str(), &st) == 0)
        w = "a file for this prefix exists";
    else if (serialize(ctx, key, tokens.data(), n, logits, n_logits, budget_, &f.bytes, &w))
        f.path = path;
    if (why) *why = w;
    return f;
}

Status PromptCache::write(const File & file, uint64_t * evicted) {
    if (evicted) *evicted = 0;
    Status st = write_atomic(file.path, file.bytes, "--prompt-cache");
    if (!st.ok()) return st;

    // Least recently used first, until the rest fits the budget.
    struct Entry {
        int64_t mtime_ns;
        uint64_t bytes;
        std::string path;
    };
    std::vector<Entry> files;
    uint64_t total = 0;
    if (DIR * d = ::opendir(dir_.c_str())) {
        while (const dirent * e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (!is_cache_name(n)) continue;
            struct stat fs;
            const std::string p = dir_ + "/" + n;
            if (::lstat(p.c_str(), &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
            files.push_back({int64_t(fs.st_mtim.tv_sec) * 1000000000 + fs.st_mtim.tv_nsec,
                             uint64_t(fs.st_size), p});
            total += uint64_t(fs.st_size);
        }
        ::closedir(d);
    }
    std::sort(files.begin(), files.end(),
              [](const Entry & a, const Entry & b) { return a.mtime_ns < b.mtime_ns; });
    for (const Entry & e : files) {
        if (total <= budget_) break;
        if (e.path == file.path) continue;  // the file just written stays
        if (::unlink(e.path.c_str()) == 0) {
            total -= e.bytes;
            if (evicted) ++*evicted;
        }
    }
    return Status::Ok();
}

Status save_state_file(llama_context * ctx, const PromptCacheKey & key,
                       const std::vector<int32_t> & tokens, const std::string & path,
                       uint64_t * bytes) {
    std::vector<uint8_t> b;
    std::string why;
    if (!serialize(ctx, key, tokens.data(), tokens.size(), nullptr, 0, UINT64_MAX, &b, &why))
        return Status::Runtime(path + ": KV not saved: " + why);
    Status st = write_atomic(path, b, "the slot file");
    if (st.ok() && bytes) *bytes = b.size();
    return st;
}

Status load_state_file(llama_context * ctx, const PromptCacheKey & key, const std::string & path,
                       std::vector<int32_t> * tokens, uint64_t * bytes) {
    std::vector<uint8_t> b;
    std::string why;
    Parsed p;
    if (!read_whole(path, UINT64_MAX, &b, &why) || !parse(b, key, &p, &why))
        return Status::BadInput(path + ": KV not restored: " + why);
    if (!set_state(ctx, b, p, &why)) return Status::BadInput(path + ": KV not restored: " + why);
    tokens->resize(p.n_tokens);
    if (p.n_tokens) std::memcpy(tokens->data(), b.data() + p.tokens_at, p.n_tokens * 4);
    if (bytes) *bytes = b.size();
    return Status::Ok();
}

}  // namespace moestream
