// jinja2_helper.h — Python's own Jinja (Debian's python3-jinja2, the engine chat templates are
// written for) as the renderer of the templates minja cannot parse or run: a persistent
// /usr/bin/python3 child process started on first use, fed one JSON request per line over a
// socket pair. docs/server.md, "Chat template".
//
// Invariants: the child gets no file but its socket (and stderr), writes none; its death or a malformed answer is an
// error (*err), never a crash, and the next render starts a new child. Stopped (end of input,
// then SIGTERM) when the helper is destroyed.
// Thread-safety: render() is serialised by an internal mutex.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace moestream::chat {

using ojson = nlohmann::ordered_json;

class Jinja2Helper {
public:
    // Debian's interpreter (python3-jinja2 is a Debian package; setup-deps.sh installs it).
    static constexpr const char * kPython = "/usr/bin/python3";
    ~Jinja2Helper();
    // Renders source with context (the template's variables). False with *err: the
    // template's own error ("TemplateError: ..."), or why the helper could not run.
    bool render(const std::string & source, const ojson & context, std::string * out,
                std::string * err);

private:
    bool start(std::string * err);
    void stop();
    bool read_answer(ojson * out, std::string * err);
    std::mutex m_;
    pid_t pid_ = -1;
    int fd_ = -1;      // our end of the socket pair
    std::string buf_;  // received text not yet a whole line
};

}  // namespace moestream::chat
