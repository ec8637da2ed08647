// reply_printer.h — how `moestream chat` shows a reply that the chat format splits (docs/cli.md,
// "Reasoning"): the answer streams to stdout as it is generated, the reasoning apart from it:
// on a terminal dimmed on stdout before the answer, otherwise on stderr with every line
// prefixed "thinking: ", or not at all (--hide-reasoning). Text is written as it arrives.
#pragma once

#include <cstdio>
#include <string>

namespace moestream::cli {

class ReplyPrinter {
public:
    enum class Reasoning { kDim, kStderr, kHidden };
    ReplyPrinter(Reasoning mode, std::FILE * out, std::FILE * err)
        : mode_(mode), out_(out), err_(err) {}
    void reasoning(const std::string & text);
    void content(const std::string & text);
    // The reply ended (or was stopped): the reasoning's style or line is closed.
    void finish();

private:
    void close_reasoning(bool answer_follows);
    Reasoning mode_;
    std::FILE * out_;
    std::FILE * err_;
    bool dimmed_ = false;      // kDim: the dim style is on
    bool mid_line_ = false;    // kStderr: a reasoning line is being written
};

}  // namespace moestream::cli
