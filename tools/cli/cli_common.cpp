// cli_common.cpp — what every subcommand shares: llama.cpp's spellings (recognised before
// CLI11 reads them), the validators with readable messages, the thread default, the prompt
// reader, escapes, output checks and the one-line error format (docs/cli.md).
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "cli.h"
#include "llama_refused.h"
#include "moestream/atomic_file.h"

namespace moestream::cli {
namespace {

// llama.cpp flags that `run` points elsewhere (the chat flags: `moestream chat` has them).
// The flags moestream does not have at all are llama_refused.h's table. A flag a subcommand
// defines is never refused (the tables only speak for flags CLI11 would otherwise misread).
struct Refusal {
    const char * flag;
    const char * why;
};

constexpr const char * kNoChat =
    "%s: for a chat use `moestream chat -m MODEL` (`run` completes the raw prompt, no chat template)";

const Refusal kRefused[] = {
    {"-cnv", kNoChat}, {"--conversation", kNoChat}, {"-i", kNoChat}, {"--interactive", kNoChat},
    {"-if", kNoChat}, {"--interactive-first", kNoChat}, {"-sys", kNoChat},
    {"--system-prompt", kNoChat}, {"--chat-template", kNoChat}, {"--jinja", kNoChat},
    {"-st", kNoChat}, {"--single-turn", kNoChat},
    {"-no-cnv", "%s is not needed: `moestream run` is always a plain completion (no conversation)"},
    {"--no-conversation", "%s is not needed: `moestream run` is always a plain completion (no conversation)"},
};

// `moestream chat`: llama-cli's flags that mean nothing in a chat, or that chat does anyway
// (looked up before kRefused, whose chat entries speak for `run`).
constexpr const char * kChatTurns =
    "%s: chat reads each user turn from stdin (the terminal, or one line per turn from a pipe); "
    "the system prompt is -sys";
constexpr const char * kChatIsConversation =
    "%s is not needed: `moestream chat` is always a conversation";
constexpr const char * kChatRunOnly = "%s: not available in chat; `moestream run` has it";
constexpr const char * kChatTemplate =
    "not supported by moestream: %s (chat renders the model's own template with minja, as "
    "`moestream serve` does; --chat-template-file replaces it)";
constexpr const char * kChatReasoning =
    "not supported by moestream: %s (chat splits a reply's reasoning where serve does: "
    "--reasoning on|off, --reasoning-effort, --hide-reasoning)";
const Refusal kChatRefused[] = {
    {"-p", kChatTurns}, {"--prompt", kChatTurns}, {"-f", kChatTurns}, {"--file", kChatTurns},
    {"-cnv", kChatIsConversation}, {"--conversation", kChatIsConversation},
    {"-i", kChatIsConversation}, {"--interactive", kChatIsConversation},
    {"-if", kChatIsConversation}, {"--interactive-first", kChatIsConversation},
    {"-no-cnv", "%s: for a plain completion use `moestream run`"},
    {"--no-conversation", "%s: for a plain completion use `moestream run`"},
    {"-st", "%s: not supported by `moestream chat`; for one turn from a script: "
            "echo TEXT | moestream chat -m MODEL"},
    {"--single-turn", "%s: not supported by `moestream chat`; for one turn from a script: "
                      "echo TEXT | moestream chat -m MODEL"},
    {"--jinja", kChatTemplate},
    {"--reasoning-format", kChatReasoning}, {"--reasoning-budget", kChatReasoning},
    {"--chat-template-kwargs", kChatReasoning},
    {"--display-prompt", kChatRunOnly}, {"--no-display-prompt", kChatRunOnly},
    {"--stats-json", kChatRunOnly}, {"--stats-csv", kChatRunOnly},
    {"--dump-logits", kChatRunOnly}, {"--route-trace", kChatRunOnly},
    {"--route-trace-scores", kChatRunOnly},
};

// llama.cpp's other spellings of options moestream has (multi-letter single-dash ones and
// long synonyms).
const std::pair<const char *, const char *> kAliases[] = {
    {"-tb", "--threads-batch"},
    {"-co", "--color"},
    {"-ub", "--ubatch-size"},
    {"-sys", "--system-prompt"},
    {"-sysf", "--system-prompt-file"},
    {"-rea", "--reasoning"},
    {"-fa", "--flash-attn"},
    {"--temperature", "--temp"},
    {"--predict", "--n-predict"},
    {"--usage", "--help"},
    {"-a", "--alias"},
};

// llama.cpp flags that ask for nothing moestream does not already do: taken out of the
// arguments before CLI11 reads them (after a subcommand's own option of that name).
struct Accepted {
    const char * cmd;   // the subcommand, or "" for every one
    const char * flag;
    const char * note;  // printed once on stderr ("" = nothing to say)
};
const Accepted kAccepted[] = {
    {"", "--no-warmup", ""},  // moestream runs no warm-up decode
    {"serve", "--jinja", ""},  // serve always renders the model's chat template
    {"serve", "--metrics", ""},  // GET /metrics is always on
    {"serve", "--slots", ""},    // GET /slots is always on
};

bool g_log_disabled = false;  // --log-disable given

// Why a flag another subcommand has means nothing here (looked up by its long spelling;
// cmd "" = every subcommand that lacks it). Without a row the reason names the subcommands
// that have the flag.
struct Elsewhere {
    const char * cmd;
    const char * flag;
    const char * why;
};
const Elsewhere kElsewhere[] = {
    {"", "--color", "it colours generated text on a terminal; this command prints none"},
};

// "" unless `flag` (or the long option it is llama.cpp's short spelling of) is an option of
// another subcommand: then why it is not one of `cmd`'s.
std::string elsewhere_reason(CLI::App & app, const std::string & cmd, const std::string & flag) {
    std::string name = flag;
    for (const auto & al : kAliases)
        if (flag == al.first) name = al.second;
    std::string have;
    int n_have = 0;
    const auto accepted_by = [&name](const char * n) {
        for (const Accepted & ac : kAccepted)
            if (name == ac.flag && std::string(n) == ac.cmd) return true;
        return false;
    };
    for (const char * n : kSubcommands)
        if (n != cmd && (app.get_subcommand(n)->get_option_no_throw(name) || accepted_by(n))) {
            have += (have.empty() ? "`moestream " : ", `moestream ") + std::string(n) + "`";
            ++n_have;
        }
    if (have.empty()) return "";
    have += n_have == 1 ? " has it" : " have it";
    for (const Elsewhere & e : kElsewhere)
        if (name == e.flag && (e.cmd[0] == 0 || cmd == e.cmd)) return std::string(e.why) + "; " + have;
    return have;
}

std::string fmt1(const char * f, const std::string & a) {
    char buf[512];
    std::snprintf(buf, sizeof buf, f, a.c_str());
    return buf;
}

}  // namespace

bool log_disabled() { return g_log_disabled; }

namespace {
double steady_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressLine::ProgressLine(std::string label, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)),
      on_(::isatty(STDERR_FILENO) != 0 && !log_disabled()), t0_(steady_s()) {}

void ProgressLine::update(int64_t done, int64_t total) {
    if (!on_ || total <= 0 || done >= total) return;
    const int pct = int(100 * done / total);
    if (pct == last_pct_) return;
    last_pct_ = pct;
    const double s = steady_s() - t0_;
    const double rate = s > 0 ? double(done) / s : 0;
    std::fprintf(stderr, "\rmoestream: %s %lld/%lld %s | %.1f %s/s | ETA %.0f s\033[K", label_.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total), unit_.c_str(), rate,
                 unit_ == "tokens" ? "tok" : unit_.c_str(), rate > 0 ? double(total - done) / rate : 0.0);
    shown_ = true;
}

void ProgressLine::clear() {
    if (shown_) std::fputs("\r\033[K", stderr);
    shown_ = false;
    last_pct_ = -1;
}

void show_load_progress(RunOptions * opt) {
    auto line = std::make_shared<ProgressLine>("load", "MiB");
    opt->on_load_progress = [line](uint64_t done, uint64_t total) {
        const int64_t mib = int64_t((total + (1u << 20) - 1) >> 20);  // rounded up: never 0 of 0
        if (done >= total) {
            line->clear();
            return;
        }
        line->update(int64_t(done >> 20), mib);
    };
}

std::string fmt_num(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
}

const char * const kSubcommands[] = {"run",    "chat", "inspect", "synth",
                                     "replay", "eval", "serve",   "make-fallback"};

int usage_error(const std::string & cmd, const std::string & msg) {
    std::fprintf(stderr, "moestream%s%s: %s\nsee `moestream%s%s --help`\n",
                 cmd.empty() ? "" : " ", cmd.c_str(), msg.c_str(), cmd.empty() ? "" : " ",
                 cmd.c_str());
    return 64;
}

int preprocess_args(CLI::App & app, std::vector<std::string> * args) {
    if (args->empty()) return 0;
    const std::string & first = (*args)[0];
    CLI::App * sub = nullptr;
    if (!first.empty() && first[0] != '-') {
        for (const char * n : kSubcommands)
            if (first == n) sub = app.get_subcommand(n);
        if (!sub) {
            std::string list;
            for (const char * n : kSubcommands) list += (list.empty() ? "" : ", ") + std::string(n);
            return usage_error("", "unknown subcommand '" + first + "' (one of: " + list + ")");
        }
    }
    if (!sub) return 0;
    const std::string cmd = sub->get_name();
    for (const std::string & a : *args) {  // before any note is printed
        if (a == "--") break;
        if (a == "--log-disable") g_log_disabled = true;
    }
    bool value_next = false;  // this token is the value of the option before it
    for (size_t i = 1; i < args->size(); ++i) {
        std::string & a = (*args)[i];
        if (value_next) {
            value_next = false;
            continue;
        }
        if (a == "--") break;
        if (a.size() < 2 || a[0] != '-') continue;
        const std::string name = a.substr(0, a.find('='));
        for (const auto & al : kAliases)
            if (name == al.first && sub->get_option_no_throw(al.second))
                a = al.second + a.substr(name.size());
        const std::string n2 = a.substr(0, a.find('='));
        if (const CLI::Option * o = sub->get_option_no_throw(n2)) {
            // A flag (CLI11: expected(0)) takes no value; an option takes the next word.
            value_next = o->get_items_expected_min() > 0 && a.find('=') == std::string::npos;
            continue;
        }
        // llama.cpp's GPU layer count: accepted with one line (a copied command line works).
        if (n2 == "-ngl" || n2 == "--n-gpu-layers" || n2 == "--gpu-layers") {
            size_t take = 1;
            std::string v;
            if (a.find('=') != std::string::npos) {
                v = a.substr(a.find('=') + 1);
            } else if (i + 1 < args->size()) {
                v = (*args)[i + 1];
                take = 2;
            }
            const bool count = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
            if (!(count || v == "-1" || v == "auto" || v == "all"))
                return usage_error(cmd, n2 + " '" + v + "': expected a layer count, auto or all");
            if (!g_log_disabled)
                std::fprintf(stderr, "moestream: %s %s: this build computes on the CPU (GPU layers: none)\n",
                             n2.c_str(), v.c_str());
            args->erase(args->begin() + long(i), args->begin() + long(i + take));
            --i;
            continue;
        }
        if (n2 == "--log-disable") {
            g_log_disabled = true;
            args->erase(args->begin() + long(i));
            --i;
            continue;
        }
        bool accepted = false;
        for (const Accepted & ac : kAccepted)
            if (n2 == ac.flag && (ac.cmd[0] == 0 || cmd == ac.cmd)) {
                if (ac.note[0] && !g_log_disabled) std::fprintf(stderr, "moestream: %s\n", ac.note);
                accepted = true;
            }
        if (accepted) {
            args->erase(args->begin() + long(i));
            --i;
            continue;
        }
        if (cmd == "chat")
            for (const Refusal & r : kChatRefused)
                if (n2 == r.flag) return usage_error(cmd, fmt1(r.why, n2));
        for (const Refusal & r : kRefused)
            if (n2 == r.flag) return usage_error(cmd, fmt1(r.why, n2));
        if (const char * why = refused_flag_reason(n2))
            return usage_error(cmd, "not supported by moestream: " + n2 + " (" + why + ")");
        if (std::string why = elsewhere_reason(app, cmd, n2); !why.empty())
            return usage_error(cmd, n2 + " is not an option of `moestream " + cmd + "` (" + why + ")");
        // Any other multi-letter single-dash word would be read by CLI11 as a bundle of short
        // flags ("-foo" = -f oo) and reported under the wrong name.
        const bool word = n2.size() > 2 && n2[1] != '-' &&
                          n2.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-", 1) ==
                              std::string::npos &&
                          n2.find_first_not_of('v', 1) != std::string::npos;
        if (word)
            return usage_error(cmd, "unknown option '" + n2 +
                                        "' (long options take two dashes; a short option's "
                                        "value goes after a space)");
        // Any other long option: named here, not as CLI11's "arguments were not expected".
        if (n2.size() > 2 && n2[1] == '-' && !app.get_option_no_throw(n2))
            return usage_error(cmd, "unknown option '" + n2 + "' (`moestream " + cmd +
                                        " --help` lists the options; docs/cli.md lists the "
                                        "llama.cpp flags moestream does not have, with reasons)");
    }
    return 0;
}

CLI::Validator int_range(long long lo, long long hi) {
    return CLI::Validator(
        [lo, hi](std::string & v) -> std::string {
            size_t pos = 0;
            long long n = 0;
            try {
                n = std::stoll(v, &pos);
            } catch (...) {
                pos = 0;
            }
            if (pos == 0 || pos != v.size()) return "'" + v + "' is not a whole number";
            if (n < lo || n > hi)
                return v + " is not in " + std::to_string(lo) + ".." + std::to_string(hi);
            return "";
        },
        std::to_string(lo) + ".." + std::to_string(hi));
}

CLI::Validator real_range(double lo, double hi, bool lo_open) {
    const std::string desc = (lo_open ? "(" : "[") + fmt_num(lo) + ", " + fmt_num(hi) + "]";
    return CLI::Validator(
        [lo, hi, lo_open, desc](std::string & v) -> std::string {
            size_t pos = 0;
            double d = NAN;
            try {
                d = std::stod(v, &pos);
            } catch (...) {
                pos = 0;
            }
            if (pos == 0 || pos != v.size() || !std::isfinite(d)) return "'" + v + "' is not a number";
            if ((lo_open ? !(d > lo) : !(d >= lo)) || !(d <= hi)) return v + " is not in " + desc;
            return "";
        },
        desc);
}

int default_threads() {
    cpu_set_t set;
    CPU_ZERO(&set);
    const bool have_set = sched_getaffinity(0, sizeof set, &set) == 0;
    std::set<std::pair<std::string, std::string>> cores;
    int logical = 0;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (have_set && !CPU_ISSET(c, &set)) continue;
        const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        std::ifstream pk(base + "physical_package_id"), co(base + "core_id");
        std::string p, k;
        if (!(pk >> p) || !(co >> k)) {
            if (have_set) ++logical;
            continue;
        }
        ++logical;
        cores.emplace(p, k);
    }
    int n = !cores.empty() ? int(cores.size()) : logical;
    if (n <= 0) n = int(std::thread::hardware_concurrency());
    return std::clamp(n, 1, 512);
}

Status process_escapes(const std::string & flag, std::string * s) {
    std::string r;
    r.reserve(s->size());
    for (size_t i = 0; i < s->size(); ++i) {
        const char c = (*s)[i];
        if (c != '\\' || i + 1 == s->size()) {
            r += c;
            continue;
        }
        const char e = (*s)[++i];
        switch (e) {
            case 'n': r += '\n'; break;
            case 't': r += '\t'; break;
            case 'r': r += '\r'; break;
            case 'a': r += '\a'; break;
            case 'f': r += '\f'; break;
            case 'v': r += '\v'; break;
            case '\\': r += '\\'; break;
            case '\'': r += '\''; break;
            case '"': r += '"'; break;
            case '?': r += '?'; break;
            case 'x': {
                int v = 0, n = 0;
                while (n < 2 && i + 1 < s->size() && std::isxdigit((unsigned char)(*s)[i + 1])) {
                    const char h = (*s)[++i];
                    v = v * 16 + (std::isdigit((unsigned char)h) ? h - '0' : (std::tolower(h) - 'a' + 10));
                    ++n;
                }
                if (n == 0)
                    return Status::Usage(flag + ": '\\x' without hex digits (or add --no-escape)");
                r += char(v);
                break;
            }
            default:
                r += '\\';
                r += e;
        }
    }
    *s = std::move(r);
    return Status::Ok();
}

Status check_output_path(const std::string & flag, const std::string & path) {
    namespace fs = std::filesystem;
    if (path.empty()) return Status::Ok();
    std::error_code ec;
    // An existing device, FIFO, socket or directory: the library's rule and words (kUsage).
    Status st = moestream::check_output_path(path, flag);
    if (!st.ok()) return st;
    const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
    if (!fs::is_directory(parent, ec))
        return Status::BadInput(flag + " " + path + ": the directory " + parent.string() +
                                " does not exist");
    if (::access(parent.c_str(), W_OK | X_OK) != 0)
        return Status::BadInput(flag + " " + path + ": cannot write in " + parent.string() + ": " +
                                std::strerror(errno));
    if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
        return Status::BadInput(flag + " " + path + ": cannot write: " + std::strerror(errno));
    return Status::Ok();
}

std::vector<std::pair<std::string, std::string>> model_inputs(const std::string & flag,
                                                              const std::string & path) {
    std::vector<std::pair<std::string, std::string>> v;
    if (path.empty()) return v;
    v.push_back({flag, path});
    // llama.cpp's split names, NAME-0000K-of-0000N.gguf: every shard is read.
    static const std::regex kShard(R"(^(.*)-(\d{5})-of-(\d{5})\.gguf$)");
    std::smatch m;
    if (!std::regex_match(path, m, kShard)) return v;
    const int n = std::stoi(m[3].str());
    for (int k = 1; k <= n && k <= 99999; ++k) {
        char tail[32];
        std::snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", k, n);
        const std::string shard = m[1].str() + tail;
        if (shard != path) v.push_back({flag + " (shard " + std::to_string(k) + ")", shard});
    }
    return v;
}

Status check_output_paths(const std::vector<std::pair<std::string, std::string>> & outs,
                          const std::vector<std::pair<std::string, std::string>> & inputs) {
    std::set<std::string> seen;
    // Inputs by identity (device + inode: symbolic and hard links are the same file).
    std::vector<std::pair<std::pair<dev_t, ino_t>, const std::pair<std::string, std::string> *>> ids;
    for (const auto & in : inputs) {
        struct stat st;
        if (!in.second.empty() && in.second != "-" && ::stat(in.second.c_str(), &st) == 0)
            ids.push_back({{st.st_dev, st.st_ino}, &in});
    }
    for (const auto & [flag, path] : outs) {
        if (path.empty()) continue;
        Status st = check_output_path(flag, path);
        if (!st.ok()) return st;
        if (!seen.insert(std::filesystem::weakly_canonical(path).string()).second)
            return Status::Usage(flag + " " + path + ": the same file is named by two output flags");
        struct stat os;
        if (::stat(path.c_str(), &os) != 0) continue;  // not there yet: no input is
        for (const auto & [id, in] : ids)
            if (id.first == os.st_dev && id.second == os.st_ino)
                return Status::BadInput(flag + " " + path + ": is the input " + in->first + " " +
                                        in->second + " (the same file); refusing to overwrite "
                                        "an input");
    }
    return Status::Ok();
}

Status write_output_file(const std::string & flag, const std::string & path, const std::string & data) {
    // Through a temporary file renamed over `path`: a full disk or a file size limit
    // (SIGXFSZ is ignored: the write fails with EFBIG) leaves the old file, never a part.
    moestream::AtomicFile out;
    Status st = out.create(path, flag);
    if (!st.ok()) return Status::BadInput(st.message());
    for (size_t at = 0; at < data.size();) {
        const ssize_t n = ::write(out.fd(), data.data() + at, data.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return Status::BadInput(flag + " " + path + ": write failed: " +
                                    std::strerror(n < 0 ? errno : ENOSPC));
        at += size_t(n);
    }
    st = out.commit();
    return st.ok() ? st : Status::BadInput(st.message());
}

namespace {

// The files remove_on_signals() removes: fixed buffers, as the handler may only call
// async-signal-safe functions.
char g_signal_paths[4][4096];

void on_signal_remove(int sig) {
    for (const char * p : g_signal_paths)
        if (p[0]) ::unlink(p);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

}  // namespace

void remove_on_signals(const std::vector<std::string> & paths) {
    size_t n = 0;
    for (const std::string & p : paths)
        if (n < 4 && p.size() < sizeof g_signal_paths[0])
            std::memcpy(g_signal_paths[n++], p.c_str(), p.size() + 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, on_signal_remove);
}

int report(const Status & st) {
    std::fprintf(stderr, "moestream: error: %s\n", st.message().c_str());
    return st.exit_code();
}

int refuse_given(CLI::App * sub, const std::vector<std::string> & flags, const std::string & why) {
    for (const std::string & fl : flags) {
        const CLI::Option * o = sub->get_option_no_throw(fl);
        if (o && o->count() > 0) return usage_error(sub->get_name(), fl + " " + why);
    }
    return 0;
}

}  // namespace moestream::cli
