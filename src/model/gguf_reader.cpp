// gguf_reader.cpp — the GGUF byte format's reader (see gguf_reader.h).
#include "gguf_reader.h"

#include <string>
#include <utility>

namespace moestream::gguf {

const char * gguf_type_str(uint32_t t) { return t < kTypeCount ? kTypes[t].name : "invalid"; }

uint64_t gguf_scalar_size(uint32_t t) { return t < kTypeCount ? kTypes[t].size : 0; }

bool gguf_is_int(uint32_t t) { return t < kTypeCount && kTypes[t].integer; }

[[noreturn]] void fail(uint64_t offset, std::string what) {
    throw ParseError{offset, std::move(what)};
}

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

void GgufReader::fill() {
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

// Reads a string's length and validates it; the caller reads or skips the bytes.
uint64_t GgufReader::string_len(uint64_t max, const char * what) {
    uint64_t at = pos();
    uint64_t n = get<uint64_t>();
    if (n > max) {
        fail(at, std::string(what) + " length " + std::to_string(n) + " exceeds the maximum " +
                     std::to_string(max));
    }
    need(n);
    return n;
}

std::string GgufReader::read_string(uint64_t max, const char * what) {
    uint64_t n = string_len(max, what);
    std::string s(n, '\0');
    read(s.data(), n);
    return s;
}

// An integer of gguf integer type t, little-endian like the whole file (u64 saturates at
// INT64_MAX; signed types are sign-extended from their width).
int64_t GgufReader::read_int(uint32_t t) {
    const GgufType & ty = kTypes[t];
    uint64_t u = 0;
    read(&u, ty.size);
    if (ty.is_signed) {
        const unsigned shift = 64 - 8 * unsigned(ty.size);
        return int64_t(u << shift) >> shift;
    }
    return u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
}

void GgufReader::skip_string() { skip(string_len(kMaxStringLen, "string")); }

uint32_t GgufReader::read_type(const std::string & key, bool element) {
    uint64_t at = pos();
    uint32_t t = get<uint32_t>();
    if (t >= kTypeCount) {
        fail(at, "key " + quoted(key) + " has invalid " + (element ? "array element " : "") +
                     "value type " + std::to_string(t));
    }
    return t;
}

// Skips the body of an array whose header (element type, count) was read.
void GgufReader::skip_array(const std::string & key, uint32_t elem, uint64_t n, uint32_t depth) {
    if (elem == kString) {
        // Each element is at least its 8-byte length: reject impossible counts up front.
        uint64_t min_bytes;
        if (__builtin_mul_overflow(n, 8ull, &min_bytes)) min_bytes = UINT64_MAX;
        need(min_bytes);
        for (uint64_t i = 0; i < n; ++i) skip_string();
    } else if (elem == kArray) {
        if (depth >= kMaxArrayDepth) {
            fail(pos(), "key " + quoted(key) + " nests arrays deeper than " +
                               std::to_string(kMaxArrayDepth));
        }
        uint64_t min_bytes;
        if (__builtin_mul_overflow(n, 12ull, &min_bytes)) min_bytes = UINT64_MAX;
        need(min_bytes);
        for (uint64_t i = 0; i < n; ++i) {
            uint32_t t = read_type(key, true);
            uint64_t at = pos();
            uint64_t len = get<uint64_t>();
            check_array_len(key, len, at);
            skip_array(key, t, len, depth + 1);
        }
    } else {
        uint64_t bytes;
        if (__builtin_mul_overflow(n, gguf_scalar_size(elem), &bytes)) bytes = UINT64_MAX;
        skip(bytes);
    }
}

void GgufReader::check_array_len(const std::string & key, uint64_t n, uint64_t at) {
    if (n > kMaxArrayLen) {
        fail(at, "key " + quoted(key) + " array length " + std::to_string(n) +
                     " exceeds the maximum " + std::to_string(kMaxArrayLen));
    }
}

}  // namespace moestream::gguf
