// text_file.h — reading a prompt or text file (`run -f`, `eval -f`) without trusting it.
//
// read_text_file reads at most max_bytes (+1 to tell that there was more) from PATH, or from
// standard input when PATH is "-". A directory is refused; FIFOs, pipes and devices are read
// with the same limit, so one that never ends (/dev/zero, `yes |`) fails as soon as the limit
// is passed instead of exhausting memory. Errors (kBadInput) name the path and what: "PATH: is
// a directory", "PATH: more than N MiB (the limit of a WHAT file)", "PATH: the WHAT file is
// empty", or the system's reason for open/read.
// Thread-safety: reentrant (reading "-" from several threads at once shares stdin).
#pragma once

#include <cstdint>
#include <string>

#include "moestream/status.h"

namespace moestream {

constexpr uint64_t kMaxTextFileBytes = 64ull << 20;  // default limit: 64 MiB

// what: the kind of file for messages ("prompt", "text").
Status read_text_file(const std::string & path, const std::string & what, std::string * out,
                      uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace moestream
