// stop_strings.cpp — see stop_strings.h.
#include "stop_strings.h"

#include <algorithm>

namespace moestream {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

const std::string & StopMatcher::matched() const {
    static const std::string none;
    return matched_ >= 0 ? stops_[size_t(matched_)] : none;
}

std::string StopMatcher::push(const std::string & piece) {
    if (stopped()) return std::string();
    held_ += piece;
    if (stops_.empty()) {
        std::string out;
        out.swap(held_);
        return out;
    }
    // The earliest match wins (released text never holds the start of one: see below).
    size_t best = std::string::npos;
    for (size_t i = 0; i < stops_.size(); ++i) {
        const size_t at = held_.find(stops_[i]);
        if (at < best) best = at, matched_ = int(i);
    }
    if (best != std::string::npos) {
        std::string out = held_.substr(0, best);
        held_.clear();
        return out;
    }
    // Hold back the longest tail that is a proper prefix of a stop string.
    size_t keep = 0;
    for (const std::string & s : stops_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::flush() {
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace moestream
