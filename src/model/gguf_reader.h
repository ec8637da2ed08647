// gguf_reader.h — the GGUF byte format as moestream reads it: the bounds on what a file may
// ask us to hold or walk, the gguf_type table, ParseError, and GgufReader, a buffered,
// bounds-checked sequential reader over a file descriptor with the format's primitives.
//
// Invariants: the reader knows the file size (fstat) and refuses any read past it, so a
// truncated file is reported precisely ("needs N bytes at offset M, file has S") instead of
// being discovered later by O_DIRECT; every count and length read through the primitives is
// checked against the kMax* bounds before it is used, so a hostile file cannot make the
// reader allocate more than a few MiB. Errors are thrown as ParseError (byte offset, what is
// wrong) and turned into one Status at the API boundary (shard_set.cpp).
// Thread-safety: a GgufReader is used by one thread at a time.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace moestream::gguf {

// ---- bounds on what a file may ask us to hold or walk ------------------------------------
// ---- bounds on what a file may ask us to hold or walk ------------------------------------
inline constexpr uint64_t kMaxKeyLen = 65535;                // GGUF keys are short ASCII paths
inline constexpr uint64_t kMaxStringLen = 16ull << 20;       // any one string value (skipped or kept)
inline constexpr uint64_t kMaxStoredStringLen = 1ull << 20;  // a scalar string value we keep in kv
inline constexpr uint64_t kMaxStoredBytes = 8ull << 20;      // all kept strings together
inline constexpr uint64_t kMaxArrayLen = 1ull << 30;         // elements of one array (never stored)
inline constexpr uint32_t kMaxArrayDepth = 2;                // array of arrays ok; deeper rejected
inline constexpr uint64_t kMaxStoredIntArray = 4096;         // integer arrays kept (per-layer hparams)
inline constexpr int64_t kMaxKv = 1 << 16;
inline constexpr int64_t kMaxTensors = 1 << 16;
inline constexpr uint64_t kMaxTensorName = 63;  // GGML_MAX_NAME - 1
inline constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
inline constexpr uint32_t kMaxLayers = 512;       // llama.cpp's LLAMA_MAX_LAYERS (per-layer arrays)
inline constexpr uint64_t kMinAlignment = 32;      // ggml's TENSOR_ALIGNMENT: CPU buffers assert it
inline constexpr uint64_t kMaxAlignment = 1ull << 30;
inline constexpr uint64_t kMaxVocab = 1ull << 22;  // tokens kept as (hash, offset) for the checks

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
inline constexpr GgufType kTypes[kTypeCount] = {
    {"u8", 1, true, false},   {"i8", 1, true, true},    {"u16", 2, true, false},
    {"i16", 2, true, true},   {"u32", 4, true, false},  {"i32", 4, true, true},
    {"f32", 4, false, false}, {"bool", 1, false, false}, {"str", 0, false, false},
    {"arr", 0, false, false}, {"u64", 8, true, false},  {"i64", 8, true, true},
    {"f64", 8, false, false},
};

const char * gguf_type_str(uint32_t t);  // "u8" ... "f64", "invalid"
// Size in bytes of a fixed-size gguf scalar, 0 for string/array/invalid.
uint64_t gguf_scalar_size(uint32_t t);
bool gguf_is_int(uint32_t t);

// The file a ParseError is in: the one being read, or (after the shards of a split set were
// merged) shard `shard` of the set.
inline constexpr uint32_t kThisFile = UINT32_MAX;

struct ParseError {
    uint64_t offset;
    std::string what;
    uint32_t shard = kThisFile;
};

// Throws ParseError{offset, what} in the file being read.
[[noreturn]] void fail(uint64_t offset, std::string what);

// A name from the file, quoted as one printable line ('...', at most 80 characters).
std::string quoted(const std::string & s);

bool is_pow2(uint64_t v);

// Buffered, bounds-checked sequential reader over a file descriptor.
class GgufReader {
public:
    GgufReader(int fd, uint64_t file_size) : fd_(fd), size_(file_size), buf_(kBufSize) {}

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

    // ---- the format's primitives (little-endian, like the whole file) ------------------
    // Reads a string's length and validates it (<= max, the bytes present); the caller
    // reads or skips the bytes.
    uint64_t string_len(uint64_t max, const char * what);
    std::string read_string(uint64_t max, const char * what);
    // An integer of gguf integer type t (u64 saturates at INT64_MAX; signed types are
    // sign-extended from their width).
    int64_t read_int(uint32_t t);
    void skip_string();
    // A value type id (< kTypeCount) of `key`'s value or array element.
    uint32_t read_type(const std::string & key, bool element);
    // Skips the body of an array whose header (element type, count) was read.
    void skip_array(const std::string & key, uint32_t elem, uint64_t n, uint32_t depth);
    // An array length <= kMaxArrayLen (read at `at`).
    void check_array_len(const std::string & key, uint64_t n, uint64_t at);

    template <typename T>
    T get() {
        T v;
        read(&v, sizeof(v));
        return v;
    }

private:
    static constexpr size_t kBufSize = 1 << 16;

    // Refills the buffer at pos_ (up to kBufSize bytes, never past the file size).
    void fill();

    int fd_;
    uint64_t size_;
    uint64_t pos_ = 0;
    std::vector<uint8_t> buf_;
    uint64_t buf_start_ = 0;
    uint64_t buf_len_ = 0;
};

}  // namespace moestream::gguf
