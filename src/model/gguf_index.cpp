// gguf_index.cpp — moestream's own validating GGUF metadata reader (see gguf_index.h).
//
// The file is read once, front to back, through a small buffered reader that knows the file
// size (fstat) and refuses any read past it, so a truncated file is reported precisely
// ("needs N bytes at offset M, file has S") instead of being discovered later by O_DIRECT.
// Every count and size read from the file is bounded (kMax* below) and every sum/product
// is computed with overflow-checked builtins. Errors are raised internally as an exception
// carrying the byte offset and converted into one Status at the API boundary.
#include "moestream/gguf_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <dlfcn.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"
#include "moestream/atomic_file.h"

namespace moestream {

namespace {

// ---- bounds on what a file may ask us to hold or walk ------------------------------------
constexpr uint64_t kMaxKeyLen = 65535;                // GGUF keys are short ASCII paths
constexpr uint64_t kMaxStringLen = 16ull << 20;       // any one string value (skipped or kept)
constexpr uint64_t kMaxStoredStringLen = 1ull << 20;  // a scalar string value we keep in kv
constexpr uint64_t kMaxStoredBytes = 8ull << 20;      // all kept strings together
constexpr uint64_t kMaxArrayLen = 1ull << 30;         // elements of one array (never stored)
constexpr uint32_t kMaxArrayDepth = 2;                // array of arrays ok; deeper rejected
constexpr uint64_t kMaxStoredIntArray = 4096;         // integer arrays kept (per-layer hparams)
constexpr int64_t kMaxKv = 1 << 16;
constexpr int64_t kMaxTensors = 1 << 16;
constexpr uint64_t kMaxTensorName = 63;  // GGML_MAX_NAME - 1
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint32_t kMaxLayers = 512;       // llama.cpp's LLAMA_MAX_LAYERS (per-layer arrays)
constexpr uint64_t kMinAlignment = 32;      // ggml's TENSOR_ALIGNMENT: CPU buffers assert it
constexpr uint64_t kMaxAlignment = 1ull << 30;
constexpr uint64_t kMaxVocab = 1ull << 22;  // tokens kept as (hash, offset) for the checks

// gguf_type ids (stable file-format values; see gguf.h).
enum : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
    kTypeCount = 13,
};

// Each gguf_type, by id: its name in messages, its size in bytes (0: string, array) and, for
// the integer types, whether it is signed.
struct GgufType {
    const char * name;
    uint8_t size;
    bool integer;
    bool is_signed;
};
constexpr GgufType kTypes[kTypeCount] = {
    {"u8", 1, true, false},   {"i8", 1, true, true},    {"u16", 2, true, false},
    {"i16", 2, true, true},   {"u32", 4, true, false},  {"i32", 4, true, true},
    {"f32", 4, false, false}, {"bool", 1, false, false}, {"str", 0, false, false},
    {"arr", 0, false, false}, {"u64", 8, true, false},  {"i64", 8, true, true},
    {"f64", 8, false, false},
};

const char * gguf_type_str(uint32_t t) { return t < kTypeCount ? kTypes[t].name : "invalid"; }

// Size in bytes of a fixed-size gguf scalar, 0 for string/array/invalid.
uint64_t gguf_scalar_size(uint32_t t) { return t < kTypeCount ? kTypes[t].size : 0; }

bool gguf_is_int(uint32_t t) { return t < kTypeCount && kTypes[t].integer; }

// The file a ParseError is in: the one being read, or (after the shards of a split set were
// merged) shard `shard` of the set.
constexpr uint32_t kThisFile = UINT32_MAX;

struct ParseError {
    uint64_t offset;
    std::string what;
    uint32_t shard = kThisFile;
};

[[noreturn]] void fail(uint64_t offset, std::string what) {
    throw ParseError{offset, std::move(what)};
}

// Buffered, bounds-checked sequential reader over a file descriptor.
class Reader {
public:
    Reader(int fd, uint64_t file_size) : fd_(fd), size_(file_size), buf_(kBufSize) {}

    uint64_t pos() const { return pos_; }
    uint64_t size() const { return size_; }
    uint64_t remaining() const { return size_ - pos_; }

    // Throws a "truncated" error unless n bytes are available at the current position.
    void need(uint64_t n) const {
        uint64_t end;
        if (__builtin_add_overflow(pos_, n, &end) || end > size_) {
            fail(pos_, "truncated: needs " + std::to_string(n) + " bytes at offset " +
                           std::to_string(pos_) + ", file has " + std::to_string(size_));
        }
    }

    void read(void * dst, uint64_t n) {
        need(n);
        auto * out = static_cast<uint8_t *>(dst);
        while (n > 0) {
            if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_len_) fill();
            uint64_t off = pos_ - buf_start_;
            uint64_t take = std::min<uint64_t>(n, buf_len_ - off);
            std::memcpy(out, buf_.data() + off, take);
            out += take;
            pos_ += take;
            n -= take;
        }
    }

    void skip(uint64_t n) {
        need(n);
        pos_ += n;
    }

    void seek(uint64_t p) {
        if (p > size_) {
            fail(pos_, "truncated: needs offset " + std::to_string(p) + ", file has " +
                           std::to_string(size_));
        }
        pos_ = p;
    }

    // Reads n bytes at absolute offset `at` (inside the file) without moving pos().
    void read_at(uint64_t at, void * dst, uint64_t n) const {
        auto * out = static_cast<uint8_t *>(dst);
        uint64_t done = 0;
        while (done < n) {
            ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(at + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) fail(at + done, "read error while re-reading the vocabulary");
            done += uint64_t(r);
        }
    }

    template <typename T>
    T get() {
        T v;
        read(&v, sizeof(v));
        return v;
    }

private:
    static constexpr size_t kBufSize = 1 << 16;

    void fill() {
        buf_start_ = pos_;
        buf_len_ = 0;
        uint64_t want = std::min<uint64_t>(kBufSize, size_ - pos_);
        while (buf_len_ < want) {
            ssize_t r = ::pread(fd_, buf_.data() + buf_len_, want - buf_len_,
                                static_cast<off_t>(buf_start_ + buf_len_));
            if (r < 0) {
                if (errno == EINTR) continue;
                fail(buf_start_ + buf_len_, std::string("read error: ") + std::strerror(errno));
            }
            if (r == 0) {
                // The file shrank after fstat.
                fail(buf_start_ + buf_len_,
                     "truncated: needs " + std::to_string(want - buf_len_) + " bytes at offset " +
                         std::to_string(buf_start_ + buf_len_) + ", file has " +
                         std::to_string(buf_start_ + buf_len_) + " (shrank while reading)");
            }
            buf_len_ += static_cast<uint64_t>(r);
        }
    }

    int fd_;
    uint64_t size_;
    uint64_t pos_ = 0;
    std::vector<uint8_t> buf_;
    uint64_t buf_start_ = 0;
    uint64_t buf_len_ = 0;
};

class Fd {
public:
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd &) = delete;
    Fd & operator=(const Fd &) = delete;
    int get() const { return fd_; }

private:
    int fd_;
};

std::string quoted(const std::string & s) {
    // Names come from the file: keep the message one printable line.
    std::string r = "'";
    for (unsigned char c : s.substr(0, 80)) r += (c >= 0x20 && c < 0x7f) ? char(c) : '?';
    if (s.size() > 80) r += "...";
    return r + "'";
}

bool is_pow2(uint64_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

class Parser {
public:
    Parser(Reader & r, ModelIndex & m) : r_(r), m_(m) {}

    void parse() {
        parse_file();
        parse_model();
    }

    // The file's own structure: header, metadata, tensor infos, data section.
    void parse_file() {
        header();
        for (int64_t i = 0; i < n_kv_; ++i) kv_pair(i);
        kv_end_ = r_.pos();
        alignment();
        for (int64_t i = 0; i < n_tensors_; ++i) tensor_info(i);
        data_section();
        shard_at_.assign(m_.tensors.size(), 0);
    }

    // The model over every tensor gathered so far (this file's, and other shards' added).
    void parse_model() {
        model_params();
        hparams();
        tokenizer();
        mark_unused();
        expert_map();
        totals();
    }

    // Adds the tensors of shard `shard` (parsed with parse_file by `other`).
    void add_shard(const Parser & other, uint32_t shard) {
        for (size_t i = 0; i < other.m_.tensors.size(); ++i) {
            TensorInfo t = other.m_.tensors[i];
            auto dup = m_.tensor_ids.find(t.name);
            if (dup != m_.tensor_ids.end()) {
                loc_shard_ = shard;
                fail(other.offset_at_[i], "tensor " + quoted(t.name) + " is also in " +
                                              m_.shards[shard_at_[dup->second]].path +
                                              " (a tensor in two shards: shards of different sets?)");
            }
            t.shard = shard;
            m_.tensor_ids.emplace(t.name, m_.tensors.size());
            m_.tensors.push_back(std::move(t));
            offset_at_.push_back(other.offset_at_[i]);
            shard_at_.push_back(shard);
        }
    }

private:
    // Raises a ParseError in the file of the tensor last looked up with tensor_at() (the file
    // being read until then).
    [[noreturn]] void fail(uint64_t offset, std::string what) const {
        throw ParseError{offset, std::move(what), loc_shard_};
    }
    // The offset of tensor i's info record; errors raised next name its shard.
    uint64_t tensor_at(size_t i) {
        if (i < shard_at_.size()) loc_shard_ = shard_at_[i];
        return offset_at_[i];
    }

    // ---- primitives ----------------------------------------------------------------------
    // Reads a string's length and validates it; the caller reads or skips the bytes.
    uint64_t string_len(uint64_t max, const char * what) {
        uint64_t at = r_.pos();
        uint64_t n = r_.get<uint64_t>();
        if (n > max) {
            fail(at, std::string(what) + " length " + std::to_string(n) + " exceeds the maximum " +
                         std::to_string(max));
        }
        r_.need(n);
        return n;
    }

    std::string read_string(uint64_t max, const char * what) {
        uint64_t n = string_len(max, what);
        std::string s(n, '\0');
        r_.read(s.data(), n);
        return s;
    }

    // An integer of gguf integer type t, little-endian like the whole file (u64 saturates at
    // INT64_MAX; signed types are sign-extended from their width).
    int64_t read_int(uint32_t t) {
        const GgufType & ty = kTypes[t];
        uint64_t u = 0;
        r_.read(&u, ty.size);
        if (ty.is_signed) {
            const unsigned shift = 64 - 8 * unsigned(ty.size);
            return int64_t(u << shift) >> shift;
        }
        return u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
    }

    void skip_string() { r_.skip(string_len(kMaxStringLen, "string")); }

    uint32_t read_type(const std::string & key, bool element) {
        uint64_t at = r_.pos();
        uint32_t t = r_.get<uint32_t>();
        if (t >= kTypeCount) {
            fail(at, "key " + quoted(key) + " has invalid " + (element ? "array element " : "") +
                         "value type " + std::to_string(t));
        }
        return t;
    }

    // Skips the body of an array whose header (element type, count) was read.
    void skip_array(const std::string & key, uint32_t elem, uint64_t n, uint32_t depth) {
        if (elem == kString) {
            // Each element is at least its 8-byte length: reject impossible counts up front.
            uint64_t min_bytes;
            if (__builtin_mul_overflow(n, 8ull, &min_bytes)) min_bytes = UINT64_MAX;
            r_.need(min_bytes);
            for (uint64_t i = 0; i < n; ++i) skip_string();
        } else if (elem == kArray) {
            if (depth >= kMaxArrayDepth) {
                fail(r_.pos(), "key " + quoted(key) + " nests arrays deeper than " +
                                   std::to_string(kMaxArrayDepth));
            }
            uint64_t min_bytes;
            if (__builtin_mul_overflow(n, 12ull, &min_bytes)) min_bytes = UINT64_MAX;
            r_.need(min_bytes);
            for (uint64_t i = 0; i < n; ++i) {
                uint32_t t = read_type(key, true);
                uint64_t at = r_.pos();
                uint64_t len = r_.get<uint64_t>();
                check_array_len(key, len, at);
                skip_array(key, t, len, depth + 1);
            }
        } else {
            uint64_t bytes;
            if (__builtin_mul_overflow(n, gguf_scalar_size(elem), &bytes)) bytes = UINT64_MAX;
            r_.skip(bytes);
        }
    }

    void check_array_len(const std::string & key, uint64_t n, uint64_t at) {
        if (n > kMaxArrayLen) {
            fail(at, "key " + quoted(key) + " array length " + std::to_string(n) +
                         " exceeds the maximum " + std::to_string(kMaxArrayLen));
        }
    }

    // ---- sections ------------------------------------------------------------------------
    void header() {
        char magic[4];
        r_.read(magic, 4);
        if (std::memcmp(magic, "GGUF", 4) != 0) {
            std::string shown;
            for (char c : magic) {
                unsigned char u = static_cast<unsigned char>(c);
                shown += (u >= 0x20 && u < 0x7f) ? c : '?';
            }
            fail(0, "not a GGUF file (bad magic '" + shown + "', expected 'GGUF')");
        }
        uint64_t at = r_.pos();
        m_.version = r_.get<uint32_t>();
        if (m_.version == 1) fail(at, "GGUF version 1 is not supported (need 2 or 3)");
        if (m_.version != 2 && m_.version != 3) {
            fail(at, "unsupported GGUF version " + std::to_string(m_.version) +
                         " (need 2 or 3; a huge value means a byte-order mismatch)");
        }
        at = r_.pos();
        n_tensors_ = r_.get<int64_t>();
        if (n_tensors_ < 0 || n_tensors_ > kMaxTensors) {
            fail(at, "tensor count " + std::to_string(n_tensors_) + " is out of range [0, " +
                         std::to_string(kMaxTensors) + "]");
        }
        at = r_.pos();
        n_kv_ = r_.get<int64_t>();
        if (n_kv_ < 0 || n_kv_ > kMaxKv) {
            fail(at, "metadata key count " + std::to_string(n_kv_) + " is out of range [0, " +
                         std::to_string(kMaxKv) + "]");
        }
        // A KV pair takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes, a
        // tensor info 8 (name length) + 1 (name) + 4 (n_dims) + 8 (ne) + 4 (type) + 8 (offset).
        const uint64_t min_meta = uint64_t(n_kv_) * 14 + uint64_t(n_tensors_) * 33;
        if (min_meta > r_.remaining()) {
            fail(r_.pos(), "truncated: " + std::to_string(n_kv_) + " metadata keys and " +
                               std::to_string(n_tensors_) + " tensor infos need at least " +
                               std::to_string(min_meta) + " bytes at offset " +
                               std::to_string(r_.pos()) + ", file has " +
                               std::to_string(r_.size()));
        }
    }

    void kv_pair(int64_t i) {
        uint64_t at = r_.pos();
        std::string key = read_string(kMaxKeyLen, "key");
        if (key.empty()) fail(at, "metadata key #" + std::to_string(i) + " is empty");
        if (key.find('\0') != std::string::npos) {
            fail(at, "metadata key #" + std::to_string(i) + " " + quoted(key) +
                         " contains a NUL byte");
        }
        if (m_.kv.count(key)) fail(at, "duplicate metadata key " + quoted(key));
        KvValue v;
        v.type = read_type(key, false);
        uint64_t vat = r_.pos();
        switch (v.type) {
            case kU8:
            case kI8:
            case kU16:
            case kI16:
            case kU32:
            case kI32:
            case kI64:
                v.i = read_int(v.type);
                break;
            case kU64: {
                uint64_t u = r_.get<uint64_t>();
                // Stored as int64: values above INT64_MAX are kept saturated and flagged.
                v.i = u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
                if (u > uint64_t(INT64_MAX)) huge_u64_.push_back(key);
                break;
            }
            case kBool:
                v.i = r_.get<int8_t>() != 0;
                break;
            case kF32:
                v.f = r_.get<float>();
                break;
            case kF64:
                v.f = r_.get<double>();
                break;
            case kString: {
                uint64_t n = string_len(kMaxStringLen, "string value");
                if (n <= kMaxStoredStringLen && stored_ + n <= kMaxStoredBytes) {
                    v.s.resize(n);
                    r_.read(v.s.data(), n);
                    stored_ += n;
                } else {
                    r_.skip(n);  // too large to keep (e.g. a chat template); never needed
                }
                break;
            }
            case kArray: {
                v.arr_type = read_type(key, true);
                uint64_t lat = r_.pos();
                v.arr_len = r_.get<uint64_t>();
                check_array_len(key, v.arr_len, lat);
                const uint64_t esize = gguf_scalar_size(v.arr_type);
                const bool integer = gguf_is_int(v.arr_type);
                if (key == "tokenizer.ggml.token_type") {
                    // llama.cpp reads it as int32 per token and keeps a type outside its
                    // LLAMA_TOKEN_TYPE_* (0..6) as is: such tokens then print nothing.
                    if (v.arr_type != kI32)
                        fail(lat - 4, "tokenizer.ggml.token_type must be an array of int32, is "
                                      "of " + std::string(gguf_type_str(v.arr_type)));
                    r_.need(v.arr_len * esize);
                    for (uint64_t k = 0; k < v.arr_len; ++k) {
                        const uint64_t eat = r_.pos();
                        const int64_t t = read_int(v.arr_type);
                        if (t < 0 || t > 6)
                            fail(eat, "tokenizer.ggml.token_type[" + std::to_string(k) + "] = " +
                                          std::to_string(t) +
                                          " is not one of llama.cpp's token types (0..6)");
                    }
                } else if (integer && v.arr_len <= kMaxStoredIntArray &&
                    stored_ + v.arr_len * 8 <= kMaxStoredBytes) {
                    r_.need(v.arr_len * esize);
                    v.arr_i.reserve(v.arr_len);
                    for (uint64_t k = 0; k < v.arr_len; ++k)
                        v.arr_i.push_back(read_int(v.arr_type));
                    stored_ += v.arr_len * 8;
                } else if (key == "tokenizer.ggml.tokens" && v.arr_type == kString) {
                    read_vocab(v.arr_len, lat);
                } else {
                    skip_array(key, v.arr_type, v.arr_len, 1);
                }
                break;
            }
            default:
                fail(vat, "key " + quoted(key) + " has invalid value type");
        }
        stored_ += key.size();
        kv_at_[key] = at;
        m_.kv_offsets[key] = at;
        m_.kv.emplace(std::move(key), std::move(v));
    }

    void alignment() {
        auto it = m_.kv.find("general.alignment");
        if (it == m_.kv.end()) {
            m_.alignment = 32;
            return;
        }
        const KvValue & v = it->second;
        uint64_t at = kv_at_["general.alignment"];
        if (v.type != kU32) {
            fail(at, std::string("general.alignment must be u32, is ") + gguf_type_str(v.type));
        }
        if (!is_pow2(uint64_t(v.i)) || uint64_t(v.i) > kMaxAlignment) {
            fail(at,
                 "general.alignment " + std::to_string(v.i) + " is not a power of 2 in [32, 2^30]");
        }
        if (uint64_t(v.i) < kMinAlignment) {
            fail(at, "general.alignment " + std::to_string(v.i) + " is below " +
                         std::to_string(kMinAlignment) +
                         ", the tensor alignment ggml's CPU buffers require");
        }
        m_.alignment = uint64_t(v.i);
    }

    void tensor_info(int64_t i) {
        TensorInfo t;
        uint64_t at = r_.pos();
        t.name = read_string(kMaxTensorName, "tensor name");
        if (t.name.empty()) fail(at, "tensor #" + std::to_string(i) + " has an empty name");
        if (t.name.find('\0') != std::string::npos) {
            fail(at, "tensor #" + std::to_string(i) + " name " + quoted(t.name) +
                         " contains a NUL byte");
        }
        t.info_offset = at;
        if (m_.tensor_ids.count(t.name)) fail(at, "duplicate tensor name " + quoted(t.name));
        const std::string tn = "tensor " + quoted(t.name);

        at = r_.pos();
        t.n_dims = r_.get<uint32_t>();
        if (t.n_dims < 1 || t.n_dims > kMaxDims) {
            fail(at, tn + " has " + std::to_string(t.n_dims) + " dimensions (need 1..4)");
        }
        int64_t nelem = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            at = r_.pos();
            t.ne[d] = r_.get<int64_t>();
            if (t.ne[d] <= 0) {
                fail(at, tn + " dimension " + std::to_string(d) + " has " +
                             std::to_string(t.ne[d]) + " elements (need > 0)");
            }
            if (__builtin_mul_overflow(nelem, t.ne[d], &nelem)) {
                fail(at, tn + " element count overflows (dimension " + std::to_string(d) + ")");
            }
        }

        at = r_.pos();
        t.type = r_.get<int32_t>();
        if (t.type < 0 || t.type >= GGML_TYPE_COUNT) {
            fail(at, tn + " has unknown ggml type " + std::to_string(t.type));
        }
        const auto gt = static_cast<ggml_type>(t.type);
        const uint64_t type_size = ggml_type_size(gt);
        const int64_t blck = ggml_blck_size(gt);
        if (type_size == 0 || blck <= 0) {
            fail(at, tn + " has unsupported ggml type " + std::to_string(t.type) +
                         " (removed from ggml)");
        }
        if (t.ne[0] % blck != 0) {
            fail(at, tn + " row of " + std::to_string(t.ne[0]) + " elements is not a multiple of " +
                         ggml_type_name(gt) + "'s block size " + std::to_string(blck));
        }
        // nb[] as ggml computes them; nbytes = nb[3] * ne[3], all overflow-checked.
        t.nb[0] = type_size;
        bool of = __builtin_mul_overflow(type_size, uint64_t(t.ne[0] / blck), &t.nb[1]);
        of = of || __builtin_mul_overflow(t.nb[1], uint64_t(t.ne[1]), &t.nb[2]);
        of = of || __builtin_mul_overflow(t.nb[2], uint64_t(t.ne[2]), &t.nb[3]);
        of = of || __builtin_mul_overflow(t.nb[3], uint64_t(t.ne[3]), &t.nbytes);
        if (of) fail(at, tn + " byte size overflows");

        at = r_.pos();
        uint64_t rel = r_.get<uint64_t>();
        t.file_offset = rel;  // relative until the data section start is known
        m_.tensor_ids.emplace(t.name, m_.tensors.size());
        m_.tensors.push_back(std::move(t));
        offset_at_.push_back(at);
    }

    void data_section() {
        const uint64_t end_of_infos = r_.pos();
        uint64_t data;
        if (__builtin_add_overflow(end_of_infos, m_.alignment - 1, &data)) {
            fail(end_of_infos, "data section offset overflows");
        }
        data &= ~(m_.alignment - 1);
        m_.data_offset = data;
        if (!m_.tensors.empty() && data > r_.size()) {
            fail(end_of_infos, "truncated: data section starts at offset " + std::to_string(data) +
                                   ", file has " + std::to_string(r_.size()));
        }
        for (size_t i = 0; i < m_.tensors.size(); ++i) {
            TensorInfo & t = m_.tensors[i];
            const uint64_t rel = t.file_offset;
            const std::string tn = "tensor " + quoted(t.name);
            if (rel % m_.alignment != 0) {
                fail(tensor_at(i), tn + " offset " + std::to_string(rel) +
                                        " is not a multiple of the alignment " +
                                        std::to_string(m_.alignment));
            }
            uint64_t abs, end;
            if (__builtin_add_overflow(data, rel, &abs) ||
                __builtin_add_overflow(abs, t.nbytes, &end) || end > r_.size()) {
                fail(tensor_at(i), tn + " data [" + std::to_string(data) + "+" +
                                        std::to_string(rel) + ", +" + std::to_string(t.nbytes) +
                                        " bytes) lies outside the file (size " +
                                        std::to_string(r_.size()) + ")");
            }
            t.file_offset = abs;
        }
        // No two tensors may share bytes.
        std::vector<size_t> order(m_.tensors.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return m_.tensors[a].file_offset < m_.tensors[b].file_offset;
        });
        for (size_t k = 1; k < order.size(); ++k) {
            const TensorInfo & prev = m_.tensors[order[k - 1]];
            const TensorInfo & cur = m_.tensors[order[k]];
            if (cur.file_offset < prev.file_offset + prev.nbytes) {
                fail(tensor_at(order[k]),
                     "tensor " + quoted(cur.name) + " data at offset " +
                         std::to_string(cur.file_offset) + " overlaps tensor " + quoted(prev.name) +
                         " [" + std::to_string(prev.file_offset) + ", " +
                         std::to_string(prev.file_offset + prev.nbytes) + ")");
            }
        }
    }

    // ---- model parameters ----------------------------------------------------------------
    const KvValue * find_kv(const std::string & key) const {
        auto it = m_.kv.find(key);
        return it == m_.kv.end() ? nullptr : &it->second;
    }

    uint64_t kv_offset(const std::string & key) {
        auto it = kv_at_.find(key);
        return it == kv_at_.end() ? 0 : it->second;
    }

    // An integer-typed key in [lo, hi]; `required` false returns 0 when absent.
    uint32_t int_key(const std::string & key, bool required, int64_t lo, int64_t hi,
                     const char * missing_hint = "") {
        const KvValue * v = find_kv(key);
        if (!v) {
            if (!required) return 0;
            fail(kv_end_, "missing metadata key " + quoted(key) + missing_hint);
        }
        const uint64_t at = kv_offset(key);
        if (!gguf_is_int(v->type))
            fail(at, "metadata key " + quoted(key) + " must be an integer, is " +
                         gguf_type_str(v->type));
        bool huge = std::find(huge_u64_.begin(), huge_u64_.end(), key) != huge_u64_.end();
        if (huge || v->i < lo || v->i > hi) {
            fail(at, "metadata key " + quoted(key) + " = " +
                         (huge ? std::string("a value > 2^63") : std::to_string(v->i)) +
                         " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "]");
        }
        return static_cast<uint32_t>(v->i);
    }

    void model_params() {
        const KvValue * a = find_kv("general.architecture");
        if (!a) fail(kv_end_, "missing metadata key 'general.architecture'");
        if (a->type != kString || a->s.empty()) {
            fail(kv_offset("general.architecture"),
                 "general.architecture must be a non-empty string");
        }
        m_.arch = a->s;
        if (const KvValue * n = find_kv("general.name"); n && n->type == kString) m_.name = n->s;
        const std::string & p = m_.arch;
        m_.n_expert =
            int_key(p + ".expert_count", true, 0, 1 << 20, " (not a MoE model: no expert count)");
        if (m_.n_expert < 2) {
            fail(kv_offset(p + ".expert_count"), "not a MoE model: " + p + ".expert_count is " +
                                                     std::to_string(m_.n_expert) + " (need >= 2)");
        }
        m_.n_expert_used = int_key(p + ".expert_used_count", true, 0, INT32_MAX,
                                   " (not a MoE model: no expert_used_count)");
        m_.n_layer = int_key(p + ".block_count", true, 1, kMaxLayers);
        m_.n_embd = int_key(p + ".embedding_length", true, 1, INT32_MAX);
        // The trained context: the default -c and the bound of every context; 0 or none would
        // leave no context at all (a fault of the file, not of the flags).
        if (find_kv(p + ".context_length")) int_key(p + ".context_length", false, 1, INT32_MAX);
        // Expert FFN width: a scalar, or one value per layer; 0 means "not given".
        const std::string ffk = p + ".expert_feed_forward_length";
        const KvValue * ff = find_kv(ffk);
        if (ff && ff->type == kArray) {
            if (ff->arr_i.size() != ff->arr_len || ff->arr_len < m_.n_layer) {
                fail(kv_offset(ffk), "metadata key " + quoted(ffk) +
                                         " must be an integer or an array of >= n_layer integers");
            }
            for (uint64_t k = 0; k < m_.n_layer; ++k) {
                if (ff->arr_i[k] < 0 || ff->arr_i[k] > INT32_MAX) {
                    fail(kv_offset(ffk), "metadata key " + quoted(ffk) + "[" + std::to_string(k) +
                                             "] = " + std::to_string(ff->arr_i[k]) +
                                             " is out of range");
                }
                n_ff_layer_.push_back(uint32_t(ff->arr_i[k]));
            }
        } else {
            m_.n_ff_exp = int_key(ffk, false, 0, INT32_MAX);
            n_ff_layer_.assign(m_.n_layer, m_.n_ff_exp);
        }
        // Latent-MoE archs run the experts on a narrower width than n_embd. These keys only
        // widen what the shape check accepts, so a non-integer value is simply ignored.
        for (const char * k : {".expert_latent_length", ".moe_latent_size"}) {
            const KvValue * v = find_kv(p + k);
            if (v && gguf_scalar_size(v->type) != 0 && v->type != kBool && v->type != kF32 &&
                v->type != kF64 && v->i > 0 && v->i <= INT32_MAX) {
                latent_widths_.push_back(v->i);
            }
        }
        if (const KvValue * tok = find_kv("tokenizer.ggml.tokens")) {
            if (tok->type != kArray || tok->arr_type != kString) {
                fail(kv_offset("tokenizer.ggml.tokens"),
                     "tokenizer.ggml.tokens must be an array of strings");
            }
            if (tok->arr_len > INT32_MAX) {
                fail(kv_offset("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens is too long");
            }
            m_.n_vocab = static_cast<uint32_t>(tok->arr_len);
        }
        if (m_.n_expert_used < 1 || m_.n_expert_used > m_.n_expert) {
            fail(kv_offset(p + ".expert_used_count"),
                 p + ".expert_used_count " + std::to_string(m_.n_expert_used) +
                     " is out of range [1, n_expert=" + std::to_string(m_.n_expert) + "]");
        }
    }

    // ---- hyperparameters llama.cpp asserts on or divides by -------------------------------
    // A float key, if present: must be f32/f64 and finite (and > 0 / >= 0 when asked).
    enum class Sign { kAny, kPositive, kNonNegative };
    void float_key(const std::string & key, Sign sign) {
        const KvValue * v = find_kv(key);
        if (!v) return;
        const uint64_t at = kv_offset(key);
        if (v->type != kF32 && v->type != kF64) {
            fail(at, "metadata key " + quoted(key) + " must be a float, is " +
                         gguf_type_str(v->type));
        }
        const bool bad = !std::isfinite(v->f) || (sign == Sign::kPositive && !(v->f > 0)) ||
                         (sign == Sign::kNonNegative && !(v->f >= 0));
        if (bad) {
            const char * need = sign == Sign::kPositive      ? "finite and > 0"
                                : sign == Sign::kNonNegative ? "finite and >= 0"
                                                             : "finite";
            fail(at, "metadata key " + quoted(key) + " = " + std::to_string(v->f) + " must be " +
                         need);
        }
    }

    // The first value of an integer key that may be a scalar or a per-layer array (0: absent).
    int64_t first_int(const std::string & key) {
        const KvValue * v = find_kv(key);
        if (!v) return 0;
        if (v->type == kArray) {
            if (v->arr_i.empty()) return 0;
            return v->arr_i[0];
        }
        return int_key(key, false, 0, INT32_MAX);
    }

    void hparams() {
        const std::string p = m_.arch + ".";
        // Scales the graph multiplies by: NaN or inf turns every logit into NaN. (Not every
        // float key: some archs store -inf on purpose, e.g. kda.gate_lower_bound.)
        for (const char * k : {"expert_weights_scale", "attention.scale", "logit_scale",
                               "residual_scale", "embedding_scale", "attn_logit_softcapping",
                               "final_logit_softcapping", "rope.scaling.attn_factor",
                               "rope.scaling.yarn_log_multiplier", "rope.freq_base_swa"})
            float_key(p + k, Sign::kAny);
        // The RMS-norm epsilon divides by sqrt(mean(x^2) + eps): > 0, except in architectures
        // whose llama.cpp graph normalises with attention.layer_norm_epsilon instead (the
        // RMS key is then unused, and 0 in real files).
        static const char * const kLayerNormOnly[] = {"dbrx"};
        const bool rms_unused =
            std::find_if(std::begin(kLayerNormOnly), std::end(kLayerNormOnly),
                         [&](const char * a) { return m_.arch == a; }) != std::end(kLayerNormOnly);
        float_key(p + "attention.layer_norm_rms_epsilon",
                  rms_unused ? Sign::kNonNegative : Sign::kPositive);
        float_key(p + "attention.layer_norm_epsilon", Sign::kAny);  // 0 where unused
        float_key(p + "rope.freq_base", Sign::kPositive);
        float_key(p + "rope.scaling.factor", Sign::kNonNegative);
        float_key(p + "rope.freq_scale", Sign::kPositive);

        // Heads: llama.cpp divides n_embd by head_count and head_count by head_count_kv.
        const int64_t n_head = first_int(p + "attention.head_count");
        const int64_t n_head_kv = find_kv(p + "attention.head_count_kv")
                                      ? first_int(p + "attention.head_count_kv")
                                      : n_head;
        if (n_head > 0) {
            const std::string kvk = p + "attention.head_count_kv";
            if (n_head_kv < 1 || n_head % n_head_kv != 0) {
                fail(kv_offset(find_kv(kvk) ? kvk : p + "attention.head_count"),
                     "metadata key " + quoted(kvk) + " = " + std::to_string(n_head_kv) +
                         " must be >= 1 and divide " + p + "attention.head_count = " +
                         std::to_string(n_head));
            }
            int64_t head_k = find_kv(p + "attention.key_length")
                                 ? int_key(p + "attention.key_length", false, 1, 1 << 16)
                                 : int64_t(m_.n_embd) / n_head;
            if (head_k < 1) {
                fail(kv_offset(p + "attention.head_count"),
                     "metadata key " + quoted(p + "attention.head_count") + " = " +
                         std::to_string(n_head) + " exceeds embedding_length " +
                         std::to_string(m_.n_embd) + " (head size 0)");
            }
            const std::string rk = p + "rope.dimension_count";
            if (find_kv(rk)) {
                const int64_t n_rot = int_key(rk, false, 0, INT32_MAX);
                // These architectures rotate the whole head (llama.cpp refuses a mismatch
                // for llama/deci/falcon and its graph assumes it for the MoE ones); the
                // others may rotate a part of it (glm4moe: half) or none (0: no rotary
                // embedding, which llama.cpp accepts).
                static const char * const kFull[] = {"llama",    "deci",     "falcon",
                                                     "qwen2moe", "qwen3moe", "olmoe"};
                const bool full = std::find_if(std::begin(kFull), std::end(kFull),
                                               [&](const char * a) { return m_.arch == a; }) !=
                                  std::end(kFull);
                if (full ? n_rot != head_k : (n_rot > head_k || n_rot % 2 != 0)) {
                    fail(kv_offset(rk),
                         "metadata key " + quoted(rk) + " = " + std::to_string(n_rot) +
                             (full ? " must equal the head size " + std::to_string(head_k)
                                   : " must be even and in [0, head size " +
                                         std::to_string(head_k) + "]"));
                }
            }
        }
        // llama_expert_gating_func_type: 0 (the arch's default), softmax, sigmoid,
        // softmax_weight, sqrt_softplus (deepseek4); anything else llama.cpp refuses.
        if (find_kv(p + "expert_gating_func")) int_key(p + "expert_gating_func", false, 0, 4);
        const std::string nk = p + "nextn_predict_layers";
        if (find_kv(nk)) {
            const int64_t nn = int_key(nk, false, 0, INT32_MAX);
            if (nn >= int64_t(m_.n_layer)) {
                fail(kv_offset(nk), "metadata key " + quoted(nk) + " = " + std::to_string(nn) +
                                        " must be less than block_count " +
                                        std::to_string(m_.n_layer));
            }
        }
        for (const char * k : {"leading_dense_block_count", "expert_shared_count"}) {
            if (find_kv(p + k)) int_key(p + k, false, 0, m_.n_layer);
        }
    }

    // ---- vocabulary ------------------------------------------------------------------------
    // Well-formed UTF-8 in the structural sense llama.cpp's decoder checks (lead byte,
    // continuation bytes, no truncated sequence); returns the offset of the first bad byte or
    // n if none.
    static uint64_t utf8_bad_at(const uint8_t * s, uint64_t n, uint32_t * pending) {
        for (uint64_t i = 0; i < n; ++i) {
            const uint8_t c = s[i];
            if (*pending) {
                if ((c & 0xC0) != 0x80) return i;
                --*pending;
            } else if (c < 0x80) {
            } else if ((c & 0xE0) == 0xC0) {
                *pending = 1;
            } else if ((c & 0xF0) == 0xE0) {
                *pending = 2;
            } else if ((c & 0xF8) == 0xF0) {
                *pending = 3;
            } else {
                return i;
            }
        }
        return n;
    }

    static uint64_t fnv(uint64_t h, const uint8_t * p, uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
        return h;
    }

    // Reads tokenizer.ggml.tokens (header already read): each token must be UTF-8; keeps a
    // hash and the offset of each for the duplicate check, and which bytes have a token.
    void read_vocab(uint64_t n, uint64_t at) {
        uint64_t min_bytes;  // each token is at least its 8-byte length
        if (__builtin_mul_overflow(n, 8ull, &min_bytes)) min_bytes = UINT64_MAX;
        r_.need(min_bytes);
        if (n > kMaxVocab) {
            fail(at, "tokenizer.ggml.tokens has " + std::to_string(n) +
                         " tokens, more than the maximum " + std::to_string(kMaxVocab));
        }
        vocab_.reserve(n);
        uint8_t buf[4096];
        for (uint64_t i = 0; i < n; ++i) {
            const uint64_t sat = r_.pos();
            const uint64_t len = string_len(kMaxStringLen, "token string");
            uint64_t h = 0xcbf29ce484222325ull, left = len;
            uint32_t pending = 0;
            uint8_t first[12] = {0};
            while (left > 0) {
                const uint64_t take = std::min<uint64_t>(left, sizeof buf);
                const uint64_t base = r_.pos();
                r_.read(buf, take);
                if (base - sat - 8 < sizeof first)
                    std::memcpy(first + (base - sat - 8), buf,
                                std::min<uint64_t>(take, sizeof first - (base - sat - 8)));
                const uint64_t bad = utf8_bad_at(buf, take, &pending);
                if (bad < take) {
                    fail(base + bad, "tokenizer.ggml.tokens[" + std::to_string(i) +
                                         "] is not valid UTF-8 (byte " +
                                         std::to_string(base + bad - sat - 8) + ")");
                }
                h = fnv(h, buf, take);
                left -= take;
            }
            if (pending) {
                fail(sat + 8 + len, "tokenizer.ggml.tokens[" + std::to_string(i) +
                                        "] is not valid UTF-8 (truncated sequence at its end)");
            }
            if (len == 0) {
                // llama.cpp stores an empty token as "[EMPTY_<id>]".
                const std::string e = "[EMPTY_" + std::to_string(i) + "]";
                h = fnv(0xcbf29ce484222325ull, reinterpret_cast<const uint8_t *>(e.data()),
                        e.size());
            }
            if (len == 1) byte_single_[first[0]] = true;
            if (len == 6 && first[0] == '<' && first[1] == '0' && first[2] == 'x' &&
                first[5] == '>') {
                auto hex = [](uint8_t c) {
                    return (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
                };
                const int hi = hex(first[3]), lo = hex(first[4]);
                if (hi >= 0 && lo >= 0) byte_hex_[hi * 16 + lo] = true;
            }
            vocab_.push_back({h, sat});
        }
        vocab_at_ = at;
    }

    // Token i's text as llama.cpp keys it (re-read from the file).
    std::string token_text(size_t i) {
        const uint64_t sat = vocab_[i].offset;
        uint64_t len;
        r_.read_at(sat, &len, 8);
        if (len == 0) return "[EMPTY_" + std::to_string(i) + "]";
        std::string s(len, '\0');
        r_.read_at(sat + 8, s.data(), len);
        return s;
    }

    void tokenizer() {
        const KvValue * model = find_kv("tokenizer.ggml.model");
        if (model && model->type != kString) {
            fail(kv_offset("tokenizer.ggml.model"), "tokenizer.ggml.model must be a string, is " +
                                                        std::string(gguf_type_str(model->type)));
        }
        // Duplicates: llama.cpp maps text -> id and asserts that every id got its own entry.
        std::vector<std::pair<uint64_t, uint32_t>> order(vocab_.size());
        for (size_t i = 0; i < vocab_.size(); ++i) order[i] = {vocab_[i].hash, uint32_t(i)};
        std::sort(order.begin(), order.end());
        for (size_t k = 1; k < order.size(); ++k) {
            if (order[k].first != order[k - 1].first) continue;
            // Equal hashes: compare the texts (and every earlier one with the same hash).
            for (size_t j = k; j-- > 0 && order[j].first == order[k].first;) {
                const std::string a = token_text(order[j].second);
                if (a == token_text(order[k].second)) {
                    const uint32_t lo = std::min(order[j].second, order[k].second);
                    const uint32_t hi = std::max(order[j].second, order[k].second);
                    fail(vocab_[hi].offset, "tokenizer.ggml.tokens[" + std::to_string(hi) +
                                                "] duplicates token " + std::to_string(lo) +
                                                " " + quoted(a));
                }
            }
        }
        if (const KvValue * types = find_kv("tokenizer.ggml.token_type")) {
            if (types->type != kArray)
                fail(kv_offset("tokenizer.ggml.token_type"),
                     "tokenizer.ggml.token_type must be an array of int32, is " +
                         std::string(gguf_type_str(types->type)));
            if (types->arr_len != vocab_.size())
                fail(kv_offset("tokenizer.ggml.token_type"),
                     "tokenizer.ggml.token_type has " + std::to_string(types->arr_len) +
                         " entries, tokenizer.ggml.tokens " + std::to_string(vocab_.size()));
        }
        if (!model || vocab_.empty()) return;
        if (model->s == "llama") {
            // SentencePiece: a byte with no piece falls back to "<0xXX>" (or the byte itself);
            // llama.cpp's lookup of a missing byte token throws out of llama_tokenize.
            for (int b = 0; b < 256; ++b) {
                if (byte_hex_[b] || byte_single_[b]) continue;
                char want[8];
                std::snprintf(want, sizeof want, "<0x%02X>", b);
                fail(kv_offset("tokenizer.ggml.model"),
                     "tokenizer.ggml.model is 'llama' (SentencePiece) but the vocabulary has no "
                     "byte token " + std::string(want) + " (a vocabulary of another tokenizer?)");
            }
        }
    }

    // ---- expert map ----------------------------------------------------------------------
    // "blk.<N>." with a canonical decimal N (no leading zeros): the layer index; false otherwise.
    static bool parse_layer(const std::string & name, uint32_t * layer) {
        if (name.compare(0, 4, "blk.") != 0) return false;
        size_t i = 4;
        uint64_t n = 0;
        while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - 4 < 9) {
            n = n * 10 + uint64_t(name[i] - '0');
            ++i;
        }
        if (i == 4 || i >= name.size() || name[i] != '.') return false;
        if (name[4] == '0' && i - 4 > 1) return false;
        *layer = uint32_t(n);
        return true;
    }

    // "blk.<N>.ffn_{gate,up,down,gate_up}_exps.weight"; false otherwise.
    static bool parse_expert_name(const std::string & name, uint32_t * layer, Projection * proj) {
        uint32_t il;
        if (!parse_layer(name, &il)) return false;
        const std::string rest = name.substr(name.find('.', 4) + 1);
        if (rest == "ffn_gate_exps.weight")
            *proj = Projection::kGate;
        else if (rest == "ffn_up_exps.weight")
            *proj = Projection::kUp;
        else if (rest == "ffn_down_exps.weight")
            *proj = Projection::kDown;
        else if (rest == "ffn_gate_up_exps.weight")
            *proj = Projection::kGateUp;
        else
            return false;
        *layer = il;
        return true;
    }

    // NextN/MTP layers: the last <arch>.nextn_predict_layers layers, which llama.cpp loads
    // without building them into the graph (hparams() checked the value < block_count).
    void mark_unused() {
        const std::string nk = m_.arch + ".nextn_predict_layers";
        if (!find_kv(nk)) return;
        m_.n_nextn_layers = int_key(nk, false, 0, INT32_MAX);
        if (m_.n_nextn_layers == 0) return;
        const uint32_t first = m_.n_layer - m_.n_nextn_layers;
        for (TensorInfo & t : m_.tensors) {
            uint32_t il;
            if (parse_layer(t.name, &il) && il >= first && il < m_.n_layer) {
                t.unused = true;
                m_.unused_bytes_total += t.nbytes;  // cannot overflow: tensors do not overlap
            }
        }
    }

    void expert_map() {
        // Per layer: index of each projection's tensor (or -1).
        std::map<uint32_t, std::array<int64_t, 4>> layers;
        for (size_t i = 0; i < m_.tensors.size(); ++i) {
            uint32_t il;
            Projection pj;
            if (m_.tensors[i].unused) continue;
            if (!parse_expert_name(m_.tensors[i].name, &il, &pj)) continue;
            const uint64_t at = tensor_at(i);
            if (il >= m_.n_layer) {
                fail(at, "expert tensor " + quoted(m_.tensors[i].name) + " is in layer " +
                             std::to_string(il) + " but the model has " +
                             std::to_string(m_.n_layer) + " layers");
            }
            auto & slot =
                layers.try_emplace(il, std::array<int64_t, 4>{-1, -1, -1, -1}).first->second;
            slot[int(pj)] = int64_t(i);
        }
        loc_shard_ = kThisFile;
        if (layers.empty()) {
            fail(r_.pos(), "not a MoE model: no blk.N.ffn_{gate,up,down}_exps.weight tensors");
        }
        for (const auto & [il, slot] : layers) m_.moe_layers.push_back(moe_layer(il, slot));
        if (m_.n_ff_exp == 0) {
            // Per-layer (or absent) width: report it when every MoE layer's KV value agrees.
            uint32_t v = n_ff_layer_[m_.moe_layers.front().layer];
            for (const MoeLayer & l : m_.moe_layers) {
                if (n_ff_layer_[l.layer] != v) v = 0;
            }
            m_.n_ff_exp = v;
        }
        for (const MoeLayer & l : m_.moe_layers) {
            for (const ExpertTensor & e : l.tensors) m_.expert_tensor_names.insert(e.name);
        }
    }

    MoeLayer moe_layer(uint32_t il, const std::array<int64_t, 4> & slot) {
        const std::string blk = "blk." + std::to_string(il) + ".";
        const bool gate = slot[int(Projection::kGate)] >= 0;
        const bool up = slot[int(Projection::kUp)] >= 0;
        const bool down = slot[int(Projection::kDown)] >= 0;
        const bool fused = slot[int(Projection::kGateUp)] >= 0;
        const uint64_t at = tensor_at(size_t(*std::max_element(slot.begin(), slot.end())));
        if (!down)
            fail(at, "layer " + std::to_string(il) + ": missing " + blk + "ffn_down_exps.weight");
        if (fused && (gate || up)) {
            fail(at, "layer " + std::to_string(il) +
                         ": has both fused ffn_gate_up_exps and separate gate/up experts");
        }
        // Gate-less experts (up/down only, e.g. nemotron_h_moe) are a layout of their own; a
        // gate without an up is not.
        if (!fused && !up)
            fail(at, "layer " + std::to_string(il) + ": missing " + blk + "ffn_up_exps.weight");

        // n_ff and the input width come from down ([n_ff, n_in, n_expert]); everything else
        // must agree. n_in is n_embd, or one of the arch's declared expert latent widths.
        const TensorInfo & dt = m_.tensors[size_t(slot[int(Projection::kDown)])];
        const int64_t n_ff = dt.ne[0];
        const uint32_t want_ff = n_ff_layer_[il];
        if (want_ff != 0 && n_ff != int64_t(want_ff)) {
            fail(tensor_at(size_t(slot[int(Projection::kDown)])),
                 "tensor " + quoted(dt.name) + " has n_ff " + std::to_string(n_ff) + " but " +
                     m_.arch + ".expert_feed_forward_length is " + std::to_string(want_ff));
        }
        int64_t n_in = m_.n_embd;
        if (dt.n_dims >= 2 && dt.ne[1] != n_in &&
            std::find(latent_widths_.begin(), latent_widths_.end(), dt.ne[1]) !=
                latent_widths_.end()) {
            n_in = dt.ne[1];
        }
        MoeLayer layer;
        layer.layer = il;
        std::vector<Projection> order;
        if (fused)
            order = {Projection::kGateUp, Projection::kDown};
        else if (!gate)
            order = {Projection::kUp, Projection::kDown};
        else
            order = {Projection::kGate, Projection::kUp, Projection::kDown};
        for (Projection pj : order) {
            const size_t ti = size_t(slot[int(pj)]);
            const TensorInfo & t = m_.tensors[ti];
            int64_t want[3];
            if (pj == Projection::kDown) {
                want[0] = n_ff, want[1] = n_in;
            } else {
                want[0] = n_in, want[1] = pj == Projection::kGateUp ? 2 * n_ff : n_ff;
            }
            want[2] = m_.n_expert;
            if (t.n_dims != 3 || t.ne[0] != want[0] || t.ne[1] != want[1] || t.ne[2] != want[2]) {
                std::string got = "[";
                for (uint32_t d = 0; d < t.n_dims; ++d) {
                    got += (d ? ", " : "") + std::to_string(t.ne[d]);
                }
                got += "]";
                fail(tensor_at(ti),
                     "tensor " + quoted(t.name) + " has shape " + got + ", expected [" +
                         std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", " +
                         std::to_string(want[2]) + "] (n_in " + std::to_string(n_in) + ", n_ff " +
                         std::to_string(n_ff) + ", n_expert " + std::to_string(m_.n_expert) + ")");
            }
            ExpertTensor e;
            e.name = t.name;
            e.layer = il;
            e.proj = pj;
            e.type = t.type;
            for (int d = 0; d < 3; ++d) e.ne[d] = t.ne[d];
            e.row_bytes = t.nb[1];
            e.slice_bytes = t.nb[2];
            e.file_offset = t.file_offset;
            e.tensor_bytes = t.nbytes;
            e.shard = t.shard;
            layer.expert_bytes += e.slice_bytes;  // cannot overflow: each is < file size
            layer.tensors.push_back(std::move(e));
        }
        return layer;
    }

    void totals() {
        uint64_t ws = 0;
        for (const MoeLayer & l : m_.moe_layers) {
            for (const ExpertTensor & e : l.tensors) m_.expert_bytes_total += e.tensor_bytes;
            uint64_t per;
            if (__builtin_mul_overflow(l.expert_bytes, uint64_t(m_.n_expert_used), &per) ||
                __builtin_add_overflow(ws, per, &ws)) {
                fail(0, "working set size overflows");
            }
        }
        m_.token_working_set_bytes = ws;
        // Tensors do not overlap and lie inside the file, so these sums cannot overflow.
        uint64_t all = 0;
        for (const TensorInfo & t : m_.tensors)
            if (!t.unused) all += t.nbytes;
        m_.dense_bytes_total = all - m_.expert_bytes_total;
    }

    Reader & r_;
    ModelIndex & m_;
    int64_t n_tensors_ = 0;
    int64_t n_kv_ = 0;
    uint64_t stored_ = 0;
    uint64_t kv_end_ = 0;                    // offset just past the metadata section
    std::map<std::string, uint64_t> kv_at_;  // key -> offset of its record
    std::vector<uint64_t> offset_at_;        // tensor i -> offset of its info record field
    std::vector<uint32_t> shard_at_;         // tensor i -> its shard (0: this file)
    uint32_t loc_shard_ = kThisFile;         // the file the next error is in (tensor_at)
    std::vector<std::string> huge_u64_;      // u64 keys whose value exceeds INT64_MAX
    std::vector<uint32_t> n_ff_layer_;       // expert FFN width per layer from the KV (0 = any)
    std::vector<int64_t> latent_widths_;     // allowed expert input widths besides n_embd
    struct VocabEntry {
        uint64_t hash;    // FNV-1a of the text llama.cpp keys the token by
        uint64_t offset;  // offset of the token's length field
    };
    std::vector<VocabEntry> vocab_;          // tokenizer.ggml.tokens
    uint64_t vocab_at_ = 0;
    std::array<bool, 256> byte_hex_{};       // bytes with a "<0xXX>" token
    std::array<bool, 256> byte_single_{};    // bytes with a one-byte token
};

}  // namespace

const char * projection_name(Projection p) {
    static constexpr const char * kNames[] = {"gate", "up", "down", "gate_up"};  // by value
    const auto i = size_t(p);
    return i < std::size(kNames) ? kNames[i] : "?";
}

const TensorInfo * ModelIndex::find_tensor(const std::string & n) const {
    auto it = tensor_ids.find(n);
    return it == tensor_ids.end() ? nullptr : &tensors[it->second];
}

bool ModelIndex::is_expert_tensor(const std::string & n) const {
    return expert_tensor_names.count(n) != 0;
}

std::vector<std::string> shard_paths(const ModelIndex & m) {
    std::vector<std::string> p;
    for (const ShardFile & f : m.shards) p.push_back(f.path);
    if (p.empty()) p.push_back(m.path);
    return p;
}

namespace {

using CpuTraitsFn = const ggml_type_traits_cpu * (*)(ggml_type);

// ggml_get_type_traits_cpu of the CPU backend this process loaded. The backend is a module
// loaded at run time (one variant per CPU): find the loaded file through one of its functions
// and look the symbol up there; a CPU backend linked in statically is found directly.
CpuTraitsFn cpu_traits_fn(ggml_backend_reg_t reg) {
    void * any = reg ? ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads")
                     : nullptr;
    Dl_info info;
    if (any && ::dladdr(any, &info) && info.dli_fname) {
        if (void * h = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
            auto fn = reinterpret_cast<CpuTraitsFn>(::dlsym(h, "ggml_get_type_traits_cpu"));
            ::dlclose(h);  // NOLOAD took a reference; the backend stays loaded
            if (fn) return fn;
        }
    }
    return reinterpret_cast<CpuTraitsFn>(::dlsym(RTLD_DEFAULT, "ggml_get_type_traits_cpu"));
}

enum class Role { kRows, kMatMul, kMatMulId, kElementwise };

const char * role_op(Role r) {
    switch (r) {
        case Role::kRows: return "GET_ROWS (token embedding)";
        case Role::kMatMul: return "MUL_MAT";
        case Role::kMatMulId: return "MUL_MAT_ID (experts)";
        case Role::kElementwise: return "MUL/ADD with f32 activations (norm, bias)";
    }
    return "?";
}

// Asks the device about a small probe node of the op the role feeds.
bool device_supports(ggml_backend_dev_t dev, Role role, ggml_type t) {
    const size_t mem = 16 * ggml_tensor_overhead() + 4096;
    ggml_init_params ip{mem, nullptr, true};
    ggml_context * c = ggml_init(ip);
    if (!c) return false;
    const int64_t k = std::max<int64_t>(256, ggml_blck_size(t));
    ggml_tensor * node = nullptr;
    switch (role) {
        case Role::kRows:
            node = ggml_get_rows(c, ggml_new_tensor_2d(c, t, k, 2),
                                 ggml_new_tensor_1d(c, GGML_TYPE_I32, 1));
            break;
        case Role::kMatMul:
            node = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, k, 2),
                                ggml_new_tensor_2d(c, GGML_TYPE_F32, k, 1));
            break;
        case Role::kMatMulId:
            node = ggml_mul_mat_id(c, ggml_new_tensor_3d(c, t, k, 2, 2),
                                   ggml_new_tensor_3d(c, GGML_TYPE_F32, k, 1, 1),
                                   ggml_new_tensor_2d(c, GGML_TYPE_I32, 1, 1));
            break;
        case Role::kElementwise:
            node = ggml_mul(c, ggml_new_tensor_2d(c, GGML_TYPE_F32, k, 2),
                            ggml_new_tensor_1d(c, t, k));
            break;
    }
    const bool ok = node && ggml_backend_dev_supports_op(dev, node);
    ggml_free(c);
    return ok;
}

// What the CPU kernels themselves can do with the type (supports_op of ggml 0.27's CPU
// backend answers yes for every type, so the kernels' presence decides). Empty: computable.
std::string kernel_missing(CpuTraitsFn traits, Role role, ggml_type t) {
    switch (role) {
        case Role::kRows:
            if (t == GGML_TYPE_F32 || ggml_get_type_traits(t)->to_float) return "";
            return "no conversion to f32";
        case Role::kMatMul:
        case Role::kMatMulId: {
            const ggml_type_traits_cpu * tr = traits(t);
            if (!tr || !tr->vec_dot) return "no dot-product kernel";
            const ggml_type_traits_cpu * in = traits(tr->vec_dot_type);
            if (!in || !in->from_float) return "no conversion of the activations";
            return "";
        }
        case Role::kElementwise:
            // The CPU's binary ops take an f32 activation with an f32 operand only.
            return t == GGML_TYPE_F32 ? "" : "element-wise ops need f32";
    }
    return "unknown role";
}

}  // namespace

Status check_cpu_computable(const ModelIndex & m) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) return Status::Runtime("no ggml CPU backend is loaded");
    CpuTraitsFn traits = cpu_traits_fn(ggml_backend_dev_backend_reg(dev));
    if (!traits)
        return Status::Runtime("cannot find ggml_get_type_traits_cpu in the loaded CPU backend");
    const size_t need_align = ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(dev));
    if (m.alignment < need_align) {
        auto it = m.kv_offsets.find("general.alignment");
        return Status::BadModel(m.path + ": general.alignment " + std::to_string(m.alignment) +
                                " is below the CPU buffer alignment " +
                                std::to_string(need_align) + " at byte offset " +
                                std::to_string(it == m.kv_offsets.end() ? 0 : it->second));
    }
    const bool tied = m.find_tensor("output.weight") == nullptr;
    for (const TensorInfo & t : m.tensors) {
        if (t.unused) continue;  // llama.cpp does not compute it
        std::vector<Role> roles;
        if (t.name == "token_embd.weight") {
            roles.push_back(Role::kRows);
            if (tied) roles.push_back(Role::kMatMul);  // also the output projection
        } else if (t.n_dims == 1) {
            roles.push_back(Role::kElementwise);
        } else {
            roles.push_back(m.is_expert_tensor(t.name) ? Role::kMatMulId : Role::kMatMul);
        }
        const auto gt = static_cast<ggml_type>(t.type);
        for (Role r : roles) {
            std::string why = device_supports(dev, r, gt) ? kernel_missing(traits, r, gt)
                                                           : "the device's supports_op says no";
            if (!why.empty())
                return Status::BadModel(m.path + ": tensor '" + t.name + "' has type " +
                                        ggml_type_name(gt) + ", which the CPU backend cannot compute in " +
                                        role_op(r) + " (" + why + ") at byte offset " +
                                        std::to_string(t.info_offset));
        }
    }
    return Status::Ok();
}

namespace {

// One file of the model, opened and parsed (parse_file) or fully parsed (parse).
struct OpenFile {
    std::string path;
    int fd = -1;
    ShardFile info;
    ModelIndex m;
    std::unique_ptr<Reader> reader;
    std::unique_ptr<Parser> parser;
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
    f->reader = std::make_unique<Reader>(f->fd, i.file_size);
    f->parser = std::make_unique<Parser>(*f->reader, f->m);
    *out = std::move(f);
    return Status::Ok();
}

// Runs fn, turning a ParseError into one Status naming the file it is in.
template <typename Fn>
Status guarded(const std::vector<std::string> & shard_paths, const std::string & path, Fn fn) {
    try {
        fn();
    } catch (const ParseError & e) {
        const std::string & where =
            e.shard != kThisFile && e.shard < shard_paths.size() ? shard_paths[e.shard] : path;
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
    const bool integer = gguf_scalar_size(v.type) != 0 && v.type != kBool && v.type != kF32 &&
                         v.type != kF64;
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
    if (st.ok()) st = split_key(f, "split.tensors.count", kMaxTensors * 65535ll, &k->tensors);
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
