// jinja2_helper.cpp — see jinja2_helper.h.
#include "jinja2_helper.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char ** environ;

namespace moestream::chat {
namespace {

// The helper: one JSON request per line on stdin ({"source", "context"}), one JSON answer per
// line on stdout ({"prompt"} or {"error"}). Set up as Hugging Face transformers renders chat
// templates: a sandboxed environment with trim_blocks and lstrip_blocks, loop controls, its
// tojson (keys in order, non-ASCII kept, ensure_ascii / indent / separators / sort_keys
// honoured), raise_exception and strftime_now (local time). One change: `|safe` gives a plain
// string (with autoescape off it only matters as Markup, which HTML-escapes every string added
// to it: functionary v3.1's tool list; minja and llama-server print the text as is).
const char kScript[] = R"PY(
import datetime, json, sys
try:
    import jinja2, jinja2.ext, jinja2.sandbox
except ImportError as e:
    print(json.dumps({"error": "python3-jinja2 is not installed (%s)" % e}), flush=True)
    sys.exit(0)

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.filters["safe"] = str  # autoescape is off: |safe would only make Markup escape what is added to it
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
compiled = {}
print(json.dumps({"ready": jinja2.__version__}), flush=True)
for line in sys.stdin:
    try:
        req = json.loads(line)
        src = req["source"]
        if src not in compiled:
            if len(compiled) >= 16:  # one process serves every template: keep the last few
                compiled.clear()
            compiled[src] = env.from_string(src)
        answer = {"prompt": compiled[src].render(**req["context"])}
    except Exception as e:
        answer = {"error": "%s: %s" % (type(e).__name__, e)}
    print(json.dumps(answer), flush=True)
)PY";

}  // namespace

Jinja2Helper::~Jinja2Helper() {
    stop();
}

void Jinja2Helper::stop() {
    if (fd_ >= 0) ::close(fd_);  // the helper reads end-of-input and exits
    fd_ = -1;
    if (pid_ > 0) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == 0) {
            ::kill(pid_, SIGTERM);
            ::waitpid(pid_, &status, 0);
        }
    }
    pid_ = -1;
    ready_ = false;
    buf_.clear();
}

Jinja2Helper & Jinja2Helper::shared() {
    static Jinja2Helper helper;
    return helper;
}

void Jinja2Helper::prestart() {
    std::lock_guard<std::mutex> lk(m_);
    std::string err;
    if (fd_ < 0) spawn(&err);  // a failure is reported by the first render
}

bool Jinja2Helper::spawn(std::string * err) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        *err = std::string("python3-jinja2 helper: socketpair: ") + std::strerror(errno);
        return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);  // none of the server's sockets or files
    // -I: isolated from PYTHON* variables and the user's site packages (Debian's jinja2 only);
    // -B: no bytecode files written.
    const char * argv[] = {kPython, "-I", "-B", "-c", kScript, nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, kPython, &fa, nullptr, const_cast<char * const *>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(sv[1]);
    if (rc != 0) {
        ::close(sv[0]);
        *err = std::string("python3-jinja2 helper: cannot run ") + kPython + ": " + std::strerror(rc);
        return false;
    }
    pid_ = pid;
    fd_ = sv[0];
    ready_ = false;
    return true;
}

bool Jinja2Helper::start(std::string * err) {
    if (fd_ < 0 && !spawn(err)) return false;
    if (ready_) return true;
    ojson hello;
    if (!read_answer(&hello, err)) return false;
    if (!hello.contains("ready")) {
        *err = hello.value("error", std::string("python3-jinja2 helper did not start"));
        stop();
        return false;
    }
    ready_ = true;
    return true;
}

bool Jinja2Helper::read_answer(ojson * out, std::string * err) {
    for (;;) {
        const size_t nl = buf_.find('\n');
        if (nl != std::string::npos) {
            *out = ojson::parse(buf_.substr(0, nl), nullptr, false);
            buf_.erase(0, nl + 1);
            if (out->is_discarded() || !out->is_object()) {
                *err = "python3-jinja2 helper: an answer that is not JSON";
                stop();
                return false;
            }
            return true;
        }
        char b[65536];
        const ssize_t n = ::read(fd_, b, sizeof b);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *err = "python3-jinja2 helper: it stopped";
            stop();
            return false;
        }
        buf_.append(b, size_t(n));
    }
}

bool Jinja2Helper::render(const std::string & source, const ojson & context, std::string * out,
                          std::string * err) {
    std::lock_guard<std::mutex> lk(m_);
    if (!start(err)) return false;
    const std::string line =
        ojson{{"source", source}, {"context", context}}.dump(-1, ' ', false,
                                                              ojson::error_handler_t::replace) +
        "\n";
    for (size_t off = 0; off < line.size();) {
        const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *err = "python3-jinja2 helper: it stopped";
            stop();
            return false;
        }
        off += size_t(n);
    }
    ojson a;
    if (!read_answer(&a, err)) return false;
    if (a.contains("prompt") && a["prompt"].is_string()) {
        *out = a["prompt"].get<std::string>();
        return true;
    }
    *err = a.value("error", std::string("python3-jinja2 helper: no prompt"));
    return false;
}

}  // namespace moestream::chat
