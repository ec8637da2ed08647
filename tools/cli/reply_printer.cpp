// reply_printer.cpp — see reply_printer.h.
#include "reply_printer.h"

namespace moestream::cli {

void ReplyPrinter::reasoning(const std::string & text) {
    if (text.empty() || mode_ == Reasoning::kHidden) return;
    if (mode_ == Reasoning::kDim) {
        if (!dimmed_) std::fputs("\033[2m", out_);  // SGR 2: faint
        dimmed_ = true;
        std::fwrite(text.data(), 1, text.size(), out_);
        std::fflush(out_);
        return;
    }
    for (char c : text) {
        if (!mid_line_) std::fputs("thinking: ", err_);
        std::fputc(c, err_);
        mid_line_ = c != '\n';
    }
    std::fflush(err_);
}

void ReplyPrinter::content(const std::string & text) {
    if (text.empty()) return;
    close_reasoning(true);
    std::fwrite(text.data(), 1, text.size(), out_);
    std::fflush(out_);
}

void ReplyPrinter::finish() {
    close_reasoning(false);
}

void ReplyPrinter::close_reasoning(bool answer_follows) {
    if (dimmed_) {
        std::fputs(answer_follows ? "\033[0m\n" : "\033[0m", out_);  // the answer on its own line
        std::fflush(out_);
        dimmed_ = false;
    }
    if (mid_line_) {
        std::fputc('\n', err_);
        std::fflush(err_);
        mid_line_ = false;
    }
}

}  // namespace moestream::cli
