// stop_strings.h — stop strings over a stream of token pieces: the text before the first
// match is released, the match and everything after it are not, and text that could still
// grow into a match is held back until the next piece decides.
//
// Invariants: the concatenation of everything push() and flush() return is the input text
// up to (not including) the first occurrence of any stop string, or all of it when none
// occurs; push() never releases a byte that a later piece could make part of a match.
// Thread-safety: a value type, used by one thread at a time.
#pragma once

#include <string>
#include <vector>

namespace moestream {

class StopMatcher {
public:
    StopMatcher() = default;
    explicit StopMatcher(std::vector<std::string> stops);  // no stop string may be empty

    // Appends a piece; returns the text released by it ("" while a match is pending).
    // After a match, stopped() is true and further pieces release nothing.
    std::string push(const std::string & piece);
    // The end of the stream without a match: the held-back text.
    std::string flush();

    bool stopped() const { return matched_ >= 0; }
    const std::string & matched() const;  // the stop string that matched ("" if none)

private:
    std::vector<std::string> stops_;
    std::string held_;
    int matched_ = -1;
};

}  // namespace moestream
