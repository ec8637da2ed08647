// utf8.h — UTF-8 validity (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF), for the grammar's output (the engine's sampler) and text sent as JSON (the server).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>

namespace moestream {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), 0 if invalid, -1 if it is a
// valid start that the string ends before completing. i < s.size().
int utf8_sequence(const std::string & s, size_t i);

// -1 if s is not valid UTF-8 up to an unfinished last sequence; else where that unfinished
// sequence starts (s.size() when there is none).
long utf8_valid_upto(const std::string & s);

}  // namespace moestream
