#include "moestream/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "llama.h"

namespace moestream {
namespace {

LogLevel initial_level() {
    // MOESTREAM_LOG: initial log level (error|warn|info|debug); -v flags override it.
    const char * e = std::getenv("MOESTREAM_LOG");
    if (e == nullptr) return LogLevel::kWarn;
    if (!std::strcmp(e, "error")) return LogLevel::kError;
    if (!std::strcmp(e, "info")) return LogLevel::kInfo;
    if (!std::strcmp(e, "debug")) return LogLevel::kDebug;
    return LogLevel::kWarn;
}

std::atomic<int> g_level{static_cast<int>(initial_level())};
std::mutex g_mu;
std::mutex g_err_mu;
std::string g_first_error;    // first error line captured
bool g_error_done = false;    // that line ended
std::atomic<bool> g_capturing{false};  // between llama_errors_begin() and _end()
std::atomic<bool> g_last_was_error{false};  // a CONT fragment continues an error line

void record_error(const char * text) {
    std::lock_guard<std::mutex> lk(g_err_mu);
    if (g_error_done) return;
    for (const char * p = text; *p; ++p) {
        if (*p == '\n') {
            if (!g_first_error.empty()) {
                g_error_done = true;
                return;
            }
            continue;
        }
        if (g_first_error.size() < 1024) g_first_error += *p;
    }
}

const char * prefix(LogLevel l) {
    switch (l) {
        case LogLevel::kError: return "moestream: error: ";
        case LogLevel::kWarn: return "moestream: warning: ";
        case LogLevel::kInfo: return "moestream: ";
        case LogLevel::kDebug: return "moestream: debug: ";
    }
    return "";
}

}  // namespace

void log_set_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

void log_printf(LogLevel level, const char * fmt, ...) {
    if (!log_enabled(level)) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lk(g_mu);
    std::fputs(prefix(level), stderr);
    std::fputs(buf, stderr);
    size_t n = std::strlen(buf);
    if (n == 0 || buf[n - 1] != '\n') std::fputc('\n', stderr);
}

void log_capture_llama() {
    llama_log_set(
        [](ggml_log_level level, const char * text, void *) {
            // llama.cpp's warnings are shown at -v (they are mostly benign on our path),
            // its errors always; everything else only at debug.
            LogLevel l = LogLevel::kDebug;
            const bool err =
                level == GGML_LOG_LEVEL_ERROR ||
                (level == GGML_LOG_LEVEL_CONT && g_last_was_error.load());
            if (level != GGML_LOG_LEVEL_CONT) g_last_was_error.store(level == GGML_LOG_LEVEL_ERROR);
            const bool captured = err && g_capturing.load();
            if (captured) record_error(text);
            if (level == GGML_LOG_LEVEL_ERROR) l = captured ? LogLevel::kInfo : LogLevel::kError;
            else if (level == GGML_LOG_LEVEL_WARN) l = LogLevel::kInfo;
            if (!log_enabled(l)) return;
            std::lock_guard<std::mutex> lk(g_mu);
            std::fputs(text, stderr);
        },
        nullptr);
}

void llama_errors_begin() {
    std::lock_guard<std::mutex> lk(g_err_mu);
    g_first_error.clear();
    g_error_done = false;
    g_capturing.store(true);
}

std::string llama_errors_end() {
    std::lock_guard<std::mutex> lk(g_err_mu);
    g_capturing.store(false);
    size_t b = 0, e = g_first_error.size();
    while (b < e && (g_first_error[b] == ' ' || g_first_error[b] == '\t')) ++b;
    while (e > b && (g_first_error[e - 1] == ' ' || g_first_error[e - 1] == '\r')) --e;
    return g_first_error.substr(b, e - b);
}

}  // namespace moestream
