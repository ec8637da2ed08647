// cache_file.h — whole-file reads and atomic writes of the promptcache module's files (the
// prompt cache's KV files, the warm expert set's usage file).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moestream/status.h"

namespace moestream {

// A value of type T at byte offset `at` of a file image (native byte order).
template <typename T>
void put(std::vector<uint8_t> * b, size_t at, T v) {
    std::memcpy(b->data() + at, &v, sizeof v);
}
template <typename T>
T get(const std::vector<uint8_t> & b, size_t at) {
    T v;
    std::memcpy(&v, b.data() + at, sizeof v);
    return v;
}

// Reads the whole regular file at path (at most max_bytes, else refused as larger than the
// cache budget) into *out; false with *why (one phrase) otherwise. Follows no symbolic link.
bool read_whole(const std::string & path, uint64_t max_bytes, std::vector<uint8_t> * out,
                std::string * why);

// Both formats' envelope: `magic` at byte 0, the file's size (u64) at 8, `header` bytes in
// all, and an FNV-1a 64 checksum of everything before it in the last 8 bytes. "" when the
// image `b` holds it, else why (one phrase; `format` names the file: "prompt cache file").
std::string envelope_error(const std::vector<uint8_t> & b, const char (&magic)[8], size_t header,
                           const char * format);

// Writes bytes to path atomically (AtomicFile; `what` names the option in messages).
Status write_atomic(const std::string & path, const std::vector<uint8_t> & bytes,
                    const std::string & what);

}  // namespace moestream
