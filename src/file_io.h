// file_io.h — checked whole reads for everything that is not an expert slice (dense
// weights at load time). Completes short reads, retries EINTR, and reports file, offset,
// length and errno on failure. Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace moestream {

Status read_exact_at(int fd, const std::string & path, void * buf, uint64_t len, uint64_t off);

}  // namespace moestream
