// jinja2_helper.h — Python's own Jinja (Debian's python3-jinja2, the engine chat templates are
// written for) as the renderer of the templates minja cannot parse or run: a persistent
// /usr/bin/python3 child process started on first use, fed one JSON request per line over a
// socket pair. docs/server.md, "Chat template".
//
// One child serves every template of a process (shared()): Python and Jinja start once, not
// once per template.
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
    // The process's helper (every JinjaTemplate renders and cross-checks through it).
    static Jinja2Helper & shared();
    ~Jinja2Helper();
    // Starts the child without waiting for it (Python's start and jinja2's import then
    // overlap with whatever the caller does next, e.g. loading the model); the first render
    // waits for it. A child that cannot start is reported by that render.
    void prestart();
    // Renders source with context (the template's variables). False with *err: the
    // template's own error ("TemplateError: ..."), or why the helper could not run.
    bool render(const std::string & source, const ojson & context, std::string * out,
                std::string * err);

private:
    bool spawn(std::string * err);  // the child, without waiting for it
    bool start(std::string * err);  // spawned if need be, and ready
    void stop();
    bool read_answer(ojson * out, std::string * err);
    std::mutex m_;
    pid_t pid_ = -1;
    int fd_ = -1;      // our end of the socket pair
    bool ready_ = false;  // the child said it is ready
    std::string buf_;  // received text not yet a whole line
};

}  // namespace moestream::chat
