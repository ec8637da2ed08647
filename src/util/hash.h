// hash.h — FNV-1a 64, the one non-cryptographic hash of the code base (the logits' hash in
// RunStats, the prompt cache's file names and checksums). Every single-byte change of the
// input changes the result. Pure function: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moestream {

constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;

// Continues the hash h over n bytes at data (start with kFnv1a64Basis).
inline uint64_t fnv1a64(uint64_t h, const void * data, size_t n) {
    const uint8_t * p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

}  // namespace moestream
