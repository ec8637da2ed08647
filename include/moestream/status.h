// status.h — the error type of the moestream library.
//
// The library never aborts or exits on anything derived from input (model files, flags,
// traces, requests): every fallible function returns a Status (or fills one) whose message
// names what and where ("model.gguf: tensor 'blk.3.ffn_up_exps.weight' data [a, b) lies
// outside the file (size N)"). `code` is the CLI exit code the error maps to.
// Thread-safety: a value type.
#pragma once

#include <string>
#include <utility>

namespace moestream {

enum class ErrorCode : int {
    kOk = 0,
    kRuntime = 1,    // I/O failure during generation, llama.cpp refusing, out of memory
    kBadModel = 2,   // missing, unreadable, non-GGUF, truncated, corrupt or non-MoE model file
    kBadInput = 3,   // bad prompt file, trace, request; a file to write that cannot be written
    kUsage = 64,     // bad flags (EX_USAGE)
};

class Status {
public:
    Status() = default;
    static Status Ok() { return Status(); }
    static Status Error(ErrorCode code, std::string msg) { return Status(code, std::move(msg)); }
    static Status BadModel(std::string msg) { return Status(ErrorCode::kBadModel, std::move(msg)); }
    static Status Runtime(std::string msg) { return Status(ErrorCode::kRuntime, std::move(msg)); }
    static Status Usage(std::string msg) { return Status(ErrorCode::kUsage, std::move(msg)); }
    static Status BadInput(std::string msg) { return Status(ErrorCode::kBadInput, std::move(msg)); }

    bool ok() const { return code_ == ErrorCode::kOk; }
    ErrorCode code() const { return code_; }
    int exit_code() const { return static_cast<int>(code_); }
    const std::string & message() const { return msg_; }

private:
    Status(ErrorCode c, std::string m) : code_(c), msg_(std::move(m)) {}
    ErrorCode code_ = ErrorCode::kOk;
    std::string msg_;
};

}  // namespace moestream
