// log.h — moestream's one levelled logger.
//
// Quiet by default: only warnings and errors reach stderr. `-v` raises the level to info,
// `-vv` to debug. llama.cpp/ggml's own log is routed through here too (their info chatter
// shows only at debug). Thread-safety: logging is safe from any thread (one mutex).
// Env knob (read in log.cpp): MOESTREAM_LOG=error|warn|info|debug sets the initial level.
#pragma once

#include <cstdarg>
#include <string>

namespace moestream {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void log_set_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
void log_printf(LogLevel level, const char * fmt, ...) __attribute__((format(printf, 2, 3)));
// Installs the llama.cpp / ggml log callback that forwards into this logger.
void log_capture_llama();
// Capturing llama.cpp's errors around a call that reports them itself: between
// llama_errors_begin() and llama_errors_end(), llama.cpp / ggml error lines are recorded (and
// shown only at -v); llama_errors_end() returns the first one, trimmed (empty if none). Lets a
// failed load say llama.cpp's reason ("error loading model: ...") in the one error line.
void llama_errors_begin();
std::string llama_errors_end();

}  // namespace moestream

#define MS_LOG_ERROR(...) ::moestream::log_printf(::moestream::LogLevel::kError, __VA_ARGS__)
#define MS_LOG_WARN(...)  ::moestream::log_printf(::moestream::LogLevel::kWarn, __VA_ARGS__)
#define MS_LOG_INFO(...)  ::moestream::log_printf(::moestream::LogLevel::kInfo, __VA_ARGS__)
#define MS_LOG_DEBUG(...) ::moestream::log_printf(::moestream::LogLevel::kDebug, __VA_ARGS__)
