// `moestream chat` — a conversation in the terminal (docs/cli.md, "Chat"): each user turn is
// rendered with the model's chat template as `moestream serve` renders it (the template run
// by minja, tools/chat/chat_jinja.h; --chat-template / --chat-template-file replace it), the
// reply streams to stdout as it is generated, split into
// reasoning and answer as serve splits it (ReplyPrinter shows the reasoning apart; the
// conversation keeps what the family's template expects), and a one-line footer per reply
// goes to stderr. The engine keeps
// the previous turn's KV cache (GenerateRequest::reuse_prefix, as the server does), so a turn
// prefills only what follows the longest common token prefix of the conversation.
// Input: a terminal (prompt "> ") or any other stdin, one user turn per line; a line ending
// in '\' continues on the next. /exit or end of input ends (exit 0); /help, /clear, /save FILE,
// /load FILE are commands (never sent; //TEXT sends /TEXT). A conversation longer than the
// context loses its oldest turns after the system prompt, with one line saying so. At a
// terminal, text typed while a reply streams is not echoed and is discarded with a notice
// when the reply ends. Ctrl-C during a reply
// stops it and returns to the prompt; Ctrl-C at the prompt prints the session summary and
// exits 130; a second Ctrl-C before a reply has stopped exits 130 at once.
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_format.h"
#include "chat_jinja.h"
#include "cli.h"
#include "moestream/settings.h"
#include "gguf.h"
#include "moestream/atomic_file.h"
#include "moestream/moestream.h"
#include "moestream/text_file.h"
#include "reply_printer.h"

namespace moestream::cli {
namespace {

struct ChatFlags {
    RunOptions opt;
    GenerateRequest gen;  // the sampling flags and -r; temp and seed come from opt
    ChatOptions chat;  // chat's own flags (registry rows, settings.h)
    int verbose = 0;
    ChatTemplateOptions tmpl;    // --chat-template, --chat-template-file
    std::string color = "auto";  // --color: on | off | auto
    CLI::App * sub = nullptr;
};

// SIGINT: the first sets the flag (a reply stops at its next token; the prompt reader
// returns); a second one while the first is still pending ends the process at once.
volatile std::sig_atomic_t g_sigint = 0;

void on_chat_sigint(int) {
    if (g_sigint) {
        static const char msg[] = "\nmoestream chat: interrupted twice: exiting\n";
        ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        ::_exit(130);
    }
    g_sigint = 1;
}

void install_sigint() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_chat_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // the engine's threads see no EINTR; poll() below always does
    sigaction(SIGINT, &sa, nullptr);
}

// Lines from stdin through poll + read, so that Ctrl-C at the prompt is seen at once (poll is
// never restarted after a signal) and at the latest within the poll timeout (when the signal
// went to another thread).
class LineReader {
public:
    enum Result { kLine, kEof, kInterrupted, kError };

    Result next(std::string * line) {
        for (;;) {
            const size_t nl = buf_.find('\n', scanned_);  // what was scanned has none
            if (nl != std::string::npos) {
                *line = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                scanned_ = 0;
                return kLine;
            }
            scanned_ = buf_.size();
            if (eof_) {
                if (buf_.empty()) return kEof;
                *line = std::move(buf_);
                buf_.clear();
                scanned_ = 0;
                return kLine;
            }
            if (buf_.size() > kMaxTextFileBytes) {  // no newline yet: /dev/zero, a binary file
                buf_.clear();
                scanned_ = 0;
                error_ = "stdin: a line longer than " + std::to_string(kMaxTextFileBytes >> 20) +
                         " MiB, the limit of a turn (a device or a stream without newlines?)";
                return kError;
            }
            if (g_sigint) return kInterrupted;
            pollfd p{STDIN_FILENO, POLLIN, 0};
            const int r = ::poll(&p, 1, 200);
            if (r < 0 && errno != EINTR) return fail("poll");
            if (r <= 0) continue;
            char b[1 << 16];
            const ssize_t n = ::read(STDIN_FILENO, b, sizeof b);
            if (n < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                return fail("read");
            }
            if (n == 0) eof_ = true;
            else buf_.append(b, size_t(n));
        }
    }
    const std::string & error() const { return error_; }
    // A turn of joined lines passed the limit: kError with its message.
    Result too_long() {
        error_ = "stdin: a turn longer than " + std::to_string(kMaxTextFileBytes >> 20) +
                 " MiB (lines joined by a final '\\')";
        return kError;
    }

private:
    Result fail(const char * what) {
        error_ = std::string("stdin: ") + what + " failed: " + std::strerror(errno);
        return kError;
    }
    std::string buf_;
    size_t scanned_ = 0;  // bytes of buf_ known to hold no newline
    bool eof_ = false;
    std::string error_;
};

// What the session did, for the summary at the end.
struct Session {
    double load_s = 0;
    int replies = 0;
    long long prefilled = 0, reused = 0, generated = 0, decode_steps = 0;
    double decode_s = 0;
    uint64_t flash_bytes = 0;
    uint64_t peak_rss = 0;
    bool lossy = false;
};

// The opt-in lossy knobs in effect, by name ("" when none is; the registry's, settings.h).
// --n-expert-used only when the engine is lossy (it may equal the model's top-k).
std::string lossy_knobs(const RunOptions & o, bool engine_lossy) {
    RunOptions shown = o;
    if (!engine_lossy) shown.n_expert_used = 0;
    return lossy_knobs_text(shown, 0);
}

std::string quality_label(const RunOptions & o, bool engine_lossy, bool reply_lossy) {
    if (!engine_lossy && !reply_lossy) return "lossless";
    const std::string k = lossy_knobs(o, engine_lossy);
    return k.empty() ? "LOSSY" : "LOSSY (" + k + ")";
}

// The footer of one reply: tokens, decode speed, what was prefilled and reused, cache hits and
// flash reads per token while decoding, lossless or LOSSY.
std::string footer(const ChatFlags & f, const Engine & e, const GenerateResult & g,
                   bool interrupted) {
    const RunStats & s = e.stats();
    char b[512];
    std::snprintf(b, sizeof b, "[%d tok, %.1f tok/s | prefill %d tok (%d reused)", s.n_generated,
                  s.decode_tok_s, s.n_prompt - s.n_prompt_reused, s.n_prompt_reused);
    std::string out = b;
    if (!f.opt.stream) {
        out += " | resident (--no-stream)";
    } else {
        if (s.cache_budget_bytes > 0) {
            uint64_t hits = 0, lookups = 0;
            for (const TokenStats & t : s.tokens) {
                hits += t.cache_hits;
                lookups += t.cache_hits + t.cache_misses;
            }
            if (lookups > 0) std::snprintf(b, sizeof b, " | hit %.1f%%", 100.0 * double(hits) / double(lookups));
            else std::snprintf(b, sizeof b, " | hit -");
            out += b;
        } else {
            out += " | cache off";
        }
        std::snprintf(b, sizeof b, " | %.2f MiB/token", mib(s.bytes_per_token));
        out += b;
    }
    out += " | " + quality_label(f.opt, e.lossy(), g.lossy);
    if (interrupted) out += " | stopped (Ctrl-C)";
    else if (g.finish == FinishReason::kLength && s.n_prompt + s.n_generated >= e.n_ctx())
        out += " | context full";
    return out + "]";
}

void print_summary(const Session & t, const ChatFlags & f, const Engine & e) {
    char b[768];
    int n = std::snprintf(b, sizeof b, "moestream chat: %d repl%s | load %.2f s", t.replies,
                          t.replies == 1 ? "y" : "ies", t.load_s);
    if (t.replies > 0) {
        n += std::snprintf(b + n, sizeof b - size_t(n),
                           " | prefill %lld tok (%lld reused) | decode %lld tok %.2f tok/s",
                           t.prefilled, t.reused, t.generated,
                           t.decode_s > 0 ? double(t.decode_steps) / t.decode_s : 0.0);
        if (f.opt.stream)
            n += std::snprintf(b + n, sizeof b - size_t(n), " | flash read %.1f MiB",
                               mib(double(t.flash_bytes)));
        n += std::snprintf(b + n, sizeof b - size_t(n), " | peak RSS %.1f MiB", mib(double(t.peak_rss)));
    }
    std::fprintf(stderr, "%s | %s\n", b, quality_label(f.opt, e.lossy(), t.lossy).c_str());
}

// The terminal does not echo while a reply streams (typed-ahead text would land inside the
// reply); restored on destruction. No-op when stdin is not a terminal.
class EchoOff {
public:
    explicit EchoOff(bool tty) {
        if (tty && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
            termios t = saved_;
            t.c_lflag &= ~tcflag_t(ECHO);
            active_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
        }
    }
    ~EchoOff() {
        if (active_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    }
    EchoOff(const EchoOff &) = delete;
    EchoOff & operator=(const EchoOff &) = delete;

private:
    termios saved_{};
    bool active_ = false;
};

// Input typed at a terminal while a reply streamed: discarded, with a notice (it was never
// shown, so it is not sent as a turn the screen did not show).
void discard_typed_ahead() {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
        ::tcflush(STDIN_FILENO, TCIFLUSH);
        std::fprintf(stderr,
                     "moestream chat: text typed while the reply streamed was discarded: type "
                     "at the prompt\n");
    }
}

const char kChatHelp[] =
    "moestream chat commands:\n"
    "  /help        this list\n"
    "  /clear       a new conversation (the system prompt stays)\n"
    "  /save FILE   write the conversation as JSON ({\"messages\": [{\"role\", \"content\"}]})\n"
    "  /load FILE   replace the conversation with one /save wrote\n"
    "  /exit        end (also Ctrl-D)\n"
    "  //TEXT       send /TEXT as a turn\n";

// The conversation as /save writes it.
std::string conversation_json(const std::vector<chat::ChatTurn> & messages) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const chat::ChatTurn & m : messages) {
        nlohmann::ordered_json j{{"role", m.role}, {"content", m.content}};
        if (!m.reasoning.empty()) j["reasoning_content"] = m.reasoning;
        a.push_back(j);
    }
    return nlohmann::ordered_json{{"messages", a}}.dump(2, ' ', false,
                                                        nlohmann::json::error_handler_t::replace) +
           "\n";
}

Status save_conversation(const std::string & path, const std::vector<chat::ChatTurn> & messages) {
    AtomicFile f;
    Status st = f.create(path, "/save");
    if (!st.ok()) return st;
    const std::string text = conversation_json(messages);
    for (size_t off = 0; off < text.size();) {
        const ssize_t n = ::write(f.fd(), text.data() + off, text.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return Status::Runtime("/save " + path + ": write failed: " + std::strerror(errno));
        off += size_t(n);
    }
    return f.commit();
}

// A conversation /save wrote (or any {"messages": [{"role", "content"}]}): roles system, user,
// assistant; content a string; reasoning_content optional.
Status load_conversation(const std::string & path, std::vector<chat::ChatTurn> * out) {
    std::string text;
    Status st = read_text_file(path, "conversation", &text);
    if (!st.ok()) return st;
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    auto bad = [&](const std::string & why) { return Status::BadInput("/load " + path + ": " + why); };
    if (j.is_discarded()) return bad("not JSON");
    const nlohmann::json & msgs = j.is_object() && j.contains("messages") ? j["messages"] : j;
    if (!msgs.is_array()) return bad("expected {\"messages\": [...]}");
    std::vector<chat::ChatTurn> v;
    for (size_t i = 0; i < msgs.size(); ++i) {
        const nlohmann::json & m = msgs[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            return bad(at + ": an object with a \"role\" is expected");
        const std::string role = m["role"];
        if (role != "system" && role != "user" && role != "assistant")
            return bad(at + ": role '" + role + "' (system, user or assistant)");
        if (!m.contains("content") || !m["content"].is_string())
            return bad(at + ": \"content\" must be a string");
        chat::ChatTurn t;
        t.role = role;
        t.content = m["content"];
        if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
            t.reasoning = m["reasoning_content"];
        if (t.content.find('\0') != std::string::npos) return bad(at + ": a NUL character");
        v.push_back(std::move(t));
    }
    *out = std::move(v);
    return Status::Ok();
}

// Reads one user turn: a line, joined with the next while it ends in '\'.
LineReader::Result read_turn(LineReader & in, std::string * turn) {
    turn->clear();
    for (;;) {
        std::string line;
        const LineReader::Result r = in.next(&line);
        if (r != LineReader::kLine) return turn->empty() || r != LineReader::kEof ? r : LineReader::kLine;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty() && line.back() == '\\') {
            line.pop_back();
            *turn += line + "\n";
            if (turn->size() > kMaxTextFileBytes) return in.too_long();
            continue;
        }
        *turn += line;
        return LineReader::kLine;
    }
}

// The prompt of the conversation so far, ending with the assistant's opener: by the model's
// template (as serve renders it).
Status render_prompt(const chat::ChatFormat & fmt, const chat::ThinkingRequest & think,
                     const std::vector<chat::ChatTurn> & messages, std::string * prompt) {
    chat::RenderInput in;
    in.messages = messages;
    in.enable_thinking = think.enable_thinking.value_or(fmt.thinking_default);
    in.reasoning_effort = think.reasoning_effort;
    std::string shown, err;
    if (!chat::render_chat_format(fmt, in, &shown, &err)) return Status::BadInput(err);
    *prompt = chat::engine_prompt(fmt, shown);
    return Status::Ok();
}

int do_chat(ChatFlags & f) {
    apply_verbosity(f.verbose);
    if (int rc = check_engine_flags(f.sub, f.opt)) return rc;
    if (int rc = check_sampling_flags(f.sub, f.opt)) return rc;
    Status st = process_reverse_prompts(f.chat.escape, &f.gen.stop);
    if (!st.ok()) return report(st);
    if (!f.chat.system_prompt_file.empty()) {
        st = read_text_file(f.chat.system_prompt_file, "system prompt", &f.chat.system_prompt);
        if (!st.ok()) return report(st);
    }

    f.gen.sampling.grammar = f.chat.grammar;
    if (!f.chat.grammar_file.empty()) {
        st = read_text_file(f.chat.grammar_file, "grammar", &f.gen.sampling.grammar);
        if (!st.ok()) return report(st);
    }

    {  // Python's Jinja, when the template needs it, starts while the model loads
        std::string text, from;
        if (resolve_chat_template(f.tmpl, &text, &from).ok())
            prestart_template_check(f.opt.model_path, text);
    }
    std::unique_ptr<Engine> engine;
    show_load_progress(&f.opt);
    st = Engine::open(f.opt, &engine);
    // The library names RunOptions fields; chat says the flags that set them.
    if (!st.ok()) return report(Status::Error(st.code(), flag_words(st.message())));
    // The template as serve takes it: the model's own (or --chat-template's), run by minja;
    // replies of a family whose calls moestream parses are split into reasoning and calls.
    chat::ChatFormat fmt;
    std::string tmpl;
    {
        std::string text, from, bos, eos, err;
        bool bos_added = false;
        st = resolve_chat_template(f.tmpl, &text, &from);
        if (!st.ok()) return report(st);
        engine->special_texts(&bos, &eos, &bos_added);
        if (!chat::load_chat_format(text.empty() ? engine->chat_template() : text, bos, eos,
                                    bos_added, &fmt, &err)) {
            std::fprintf(stderr,
                         "moestream: error: %s: the chat template (%s) cannot be rendered "
                         "(%s); give one that renders with --chat-template-file\n",
                         f.opt.model_path.c_str(), from.empty() ? "the model's" : from.c_str(),
                         err.c_str());
            return 2;
        }
        tmpl = fmt.name + (from.empty() ? "" : " from " + from);
    }
    if (tmpl.find("no chat template") != std::string::npos)
        std::fprintf(stderr, "moestream chat: warning: using %s\n",
                     tmpl.c_str());
    chat::ThinkingRequest think;
    think.thinking_name = "--reasoning";
    think.effort_name = "--reasoning-effort";
    if (f.chat.reasoning != "auto") think.enable_thinking = f.chat.reasoning == "on";
    think.reasoning_effort = f.chat.reasoning_effort;
    {
        std::string param;
        const std::string why = chat::check_thinking(fmt, tmpl, think, &param);
        if (!why.empty()) return usage_error("chat", param + ": " + why);
    }
    // Whether a reply starts in the thinking block (serve's ChatPlan::thinking).
    const bool thinking = fmt.thinking && think.enable_thinking.value_or(fmt.thinking_default);
    {  // the sampling settings (a grammar llama.cpp cannot parse...) before the first turn
        GenerateRequest probe;
        probe.prompt = "hi";
        probe.n_predict = f.chat.n_predict;
        probe.clamp_to_context = true;
        probe.sampling = f.gen.sampling;
        probe.sampling.temp = f.opt.temp;
        probe.stop = f.gen.stop;
        int n = 0;
        st = engine->check_request(probe, &n);
        if (!st.ok()) return report(st);
    }
    const bool tty = ::isatty(STDIN_FILENO) != 0;
    Session t;
    t.load_s = engine->stats().load_s;
    if (f.verbose > 0)
        std::fprintf(stderr,
                     "moestream chat: template %s | renderer %s | reasoning %s | context %d "
                     "tokens | KV reuse %s\n",
                     tmpl.c_str(), "minja",
                     !fmt.thinking ? "none (the template has no thinking)"
                     : !thinking     ? "off"
                     : f.chat.show_reasoning ? "split, shown" : "split, hidden",
                     engine->n_ctx(), f.chat.cache_prompt ? "on" : "off (--no-cache-prompt)");
    if (tty)
        std::fprintf(stderr, "moestream chat: /exit or Ctrl-D ends; Ctrl-C stops a reply; /help lists the commands\n");

    // The conversation: each assistant turn keeps its content and reasoning apart; the
    // renderer decides what of it the next prompt shows (as for serve's messages).
    std::vector<chat::ChatTurn> messages;
    auto add_turn = [&messages](const std::string & role, const std::string & content,
                                const std::string & reasoning) {
        chat::ChatTurn m;
        m.role = role;
        m.content = content;
        m.reasoning = reasoning;
        messages.push_back(std::move(m));
    };
    if (!f.chat.system_prompt.empty()) add_turn("system", f.chat.system_prompt, "");
    // Dimmed only on a terminal that takes colour (no-color.org's NO_COLOR, TERM=dumb): else the
    // reasoning goes to stderr as `thinking: ` lines.
    const char * no_color = std::getenv("NO_COLOR");
    const char * term = std::getenv("TERM");
    const bool colour = ::isatty(STDOUT_FILENO) != 0 && !(no_color && *no_color) &&
                        !(term && std::string(term) == "dumb");
    const ReplyPrinter::Reasoning shown = !f.chat.show_reasoning ? ReplyPrinter::Reasoning::kHidden
                                          : colour          ? ReplyPrinter::Reasoning::kDim
                                                            : ReplyPrinter::Reasoning::kStderr;
    LineReader in;
    g_sigint = 0;
    install_sigint();
    for (;;) {
        if (tty) {
            std::fputs("> ", stdout);
            std::fflush(stdout);
        }
        std::string turn;
        // With --color on a terminal the typed input shows in its own colour (set before the
        // line is read, reset after), apart from the reply.
        const bool colour_input = tty && colour_stdout(f.color);
        if (colour_input) {
            std::fputs(kColourInput, stdout);
            std::fflush(stdout);
        }
        const LineReader::Result r = read_turn(in, &turn);
        if (colour_input) {
            std::fputs(kColourReset, stdout);
            std::fflush(stdout);
        }
        if (r == LineReader::kInterrupted) {
            std::fprintf(stderr, "\nmoestream chat: interrupted (Ctrl-C)\n");
            print_summary(t, f, *engine);
            return 130;
        }
        if (r == LineReader::kError) {
            print_summary(t, f, *engine);
            return report(Status::BadInput(in.error()));
        }
        if (r == LineReader::kEof) {
            if (tty) std::fputc('\n', stdout);
            break;
        }
        if (turn == "/exit") break;
        if (turn.find_first_not_of(" \t\n") == std::string::npos) continue;
        if (turn[0] == '/' && turn.rfind("//", 0) != 0) {  // a command, never sent to the model
            const size_t sp = turn.find(' ');
            const std::string cmd = turn.substr(0, sp);
            std::string arg = sp == std::string::npos ? "" : turn.substr(sp + 1);
            while (!arg.empty() && (arg.back() == ' ' || arg.back() == '\t')) arg.pop_back();
            Status cs = Status::Ok();
            if (cmd == "/help") {
                std::fputs(kChatHelp, stderr);
            } else if (cmd == "/clear") {
                messages.erase(std::remove_if(messages.begin(), messages.end(),
                                              [](const chat::ChatTurn & m) { return m.role != "system"; }),
                               messages.end());
                std::fprintf(stderr, "moestream chat: a new conversation (the system prompt stays)\n");
            } else if ((cmd == "/save" || cmd == "/load") && arg.empty()) {
                cs = Status::Usage(cmd + " needs a file name: " + cmd + " FILE");
            } else if (cmd == "/save") {
                cs = save_conversation(arg, messages);
                if (cs.ok())
                    std::fprintf(stderr, "moestream chat: saved %zu messages to %s\n", messages.size(), arg.c_str());
            } else if (cmd == "/load") {
                std::vector<chat::ChatTurn> loaded;
                cs = load_conversation(arg, &loaded);
                if (cs.ok()) {
                    messages = std::move(loaded);
                    std::fprintf(stderr, "moestream chat: loaded %zu messages from %s\n", messages.size(), arg.c_str());
                }
            } else {
                cs = Status::Usage("unknown command '" + cmd + "' (/help lists them; //TEXT sends /TEXT)");
            }
            if (!cs.ok()) {
                std::fprintf(stderr, "moestream chat: %s\n", cs.message().c_str());
                if (tty) continue;  // in a terminal the conversation goes on
                print_summary(t, f, *engine);
                return cs.exit_code();
            }
            continue;
        }
        if (turn.rfind("//", 0) == 0) turn.erase(0, 1);
        if (f.chat.escape) {
            Status es = process_escapes("input", &turn);
            if (!es.ok()) {
                std::fprintf(stderr, "moestream chat: %s\n", es.message().c_str());
                if (tty) continue;
                print_summary(t, f, *engine);
                return es.exit_code();
            }
        }

        add_turn("user", turn, "");
        GenerateRequest req;
        req.n_predict = f.chat.n_predict;
        req.clamp_to_context = true;
        req.sampling = f.gen.sampling;
        req.sampling.temp = f.opt.temp;
        // One draw per reply, not the same draw again: reply i is seeded with seed + i, so a
        // session replays exactly with the same --seed and inputs.
        req.sampling.seed = f.opt.seed + uint32_t(t.replies);
        req.stop = f.gen.stop;
        req.reuse_prefix = f.chat.cache_prompt;
        req.on_prefill = [](int, int) { return g_sigint == 0; };  // Ctrl-C between micro-batches
        // A full context drops the oldest turns after the system prompt (as llama.cpp's
        // context shift does), leaving room for a reply: a quarter of the context, or -n.
        const int room = f.chat.n_predict > 0 ? std::min(f.chat.n_predict, engine->n_ctx() / 4) : engine->n_ctx() / 4;
        int n_prompt = 0, dropped = 0;
        for (;;) {
            st = render_prompt(fmt, think, messages, &req.prompt);
            n_prompt = 0;
            if (st.ok()) st = engine->check_request(req, &n_prompt);
            if (st.ok() && n_prompt + room <= engine->n_ctx()) break;
            if (!st.ok() && n_prompt < engine->n_ctx()) break;  // not a length problem
            size_t first = 0;  // the oldest turn after the system prompt
            while (first < messages.size() && messages[first].role == "system") ++first;
            if (first + 1 >= messages.size()) break;  // only this turn is left
            size_t end = first + 1;  // up to the next user turn
            while (end + 1 < messages.size() && messages[end].role != "user") ++end;
            messages.erase(messages.begin() + long(first), messages.begin() + long(end));
            ++dropped;
        }
        if (dropped > 0)
            std::fprintf(stderr,
                         "moestream chat: the context (%d tokens) was full: dropped the %d "
                         "oldest turn%s (the system prompt stays)\n",
                         engine->n_ctx(), dropped, dropped == 1 ? "" : "s");
        if (st.ok() && f.chat.verbose_prompt)
            std::fprintf(stderr, "moestream chat: prompt of turn %d (%zu bytes):\n%s\nmoestream chat: end of prompt\n",
                         t.replies + 1, req.prompt.size(), req.prompt.c_str());
        if (!st.ok()) {  // this turn is not taken
            messages.pop_back();
            if (n_prompt >= engine->n_ctx())
                std::fprintf(stderr,
                             "moestream chat: this turn alone is %d tokens, more than the "
                             "context (%d tokens): shorten it, or start with a larger -c\n",
                             n_prompt, engine->n_ctx());
            else
                std::fprintf(stderr, "moestream chat: %s\n", st.message().c_str());
            if (tty) continue;  // in a terminal the conversation goes on without it
            print_summary(t, f, *engine);
            return st.exit_code();  // a script sees that a turn went unanswered
        }
        GenerateResult g;
        // Split as it streams (serve's worker does the same): reasoning and answer are shown
        // token by token, each as ReplyPrinter shows it.
        std::unique_ptr<chat::ReplyParser> parser;
        parser = std::make_unique<chat::ReplyParser>(fmt, false, thinking);
        ReplyPrinter out(shown, stdout, stderr);
        std::string content, reasoning;
        auto show = [&](const chat::ReplyDelta & d) {
            out.reasoning(d.reasoning);
            out.content(d.content);
            reasoning += d.reasoning;
            content += d.content;
        };
        std::optional<EchoOff> echo_off;
        echo_off.emplace(tty);
        st = engine->generate(req,
                              [&](const std::string & piece) {
                                  if (parser) {
                                      show(parser->push(piece));
                                  } else {
                                      out.content(piece);
                                      content += piece;
                                  }
                                  return g_sigint == 0;
                              },
                              &g);
        echo_off.reset();
        if (tty) discard_typed_ahead();
        if (parser) show(parser->finish());
        out.finish();
        const bool interrupted = g.finish == FinishReason::kCancelled;
        g_sigint = 0;
        std::fputc('\n', stdout);
        std::fflush(stdout);
        if (!st.ok()) {
            print_summary(t, f, *engine);
            return report(Status::Error(st.code(), flag_words(st.message())));
        }
        // The reply as shown (also when stopped) joins the conversation, its reasoning apart
        // (the family's renderer leaves it out of later prompts, as the template does); a NUL
        // byte, which a chat template cannot carry (a model may emit one), is left out of it.
        for (std::string * s : {&content, &reasoning}) s->erase(std::remove(s->begin(), s->end(), '\0'), s->end());
        add_turn("assistant", content, reasoning);
        const RunStats & s = engine->stats();
        t.replies++;
        t.prefilled += s.n_prompt - s.n_prompt_reused;
        t.reused += s.n_prompt_reused;
        t.generated += s.n_generated;
        t.decode_steps += (long long)s.tokens.size();
        t.decode_s += s.decode_s;
        t.flash_bytes += s.flash_bytes_read;
        t.peak_rss = std::max(t.peak_rss, s.peak_rss_bytes);
        t.lossy = t.lossy || g.lossy;
        std::fprintf(stderr, "%s\n", footer(f, *engine, g, interrupted).c_str());
        if (f.verbose > 0)
            std::fprintf(stderr,
                         "moestream chat: prefill %.3f s (%.1f tok/s) | flash read %.2f MiB in %llu "
                         "reads (io %.3f s) | finish %s | context %d of %d tokens\n",
                         s.prefill_s, s.prefill_tok_s, mib(double(s.flash_bytes_read)),
                         (unsigned long long)s.flash_reads, s.io_s, finish_reason_name(g.finish),
                         s.n_prompt + s.n_generated, engine->n_ctx());
    }
    print_summary(t, f, *engine);
    return 0;
}

}  // namespace

void prestart_template_check(const std::string & model_path, const std::string & flag_text) {
    std::string src = flag_text;
    if (src.empty()) {  // the model's own template
        gguf_init_params gp{};
        gp.no_alloc = true;
        gguf_context * g = gguf_init_from_file(model_path.c_str(), gp);
        if (g == nullptr) return;  // the load reports it
        const int64_t k = gguf_find_key(g, "tokenizer.chat_template");
        if (k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_STRING) src = gguf_get_val_str(g, k);
        gguf_free(g);
    }
    if (!src.empty() && src != chat::kChatmlTemplate) chat::JinjaTemplate::prestart_python();
}

nlohmann::ordered_json inspect_chat_template(const std::string & path) {
    nlohmann::ordered_json j;
    gguf_init_params gp{};
    gp.no_alloc = true;
    gguf_context * g = gguf_init_from_file(path.c_str(), gp);
    if (g == nullptr) {
        j["renders"] = false;
        j["error"] = "the file's metadata cannot be read";
        return j;
    }
    auto str = [g](const char * key) {
        const int64_t k = gguf_find_key(g, key);
        return k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_STRING ? std::string(gguf_get_val_str(g, k))
                                                                   : std::string();
    };
    auto token = [g](const char * id_key) {  // the text of the token a *_token_id key names
        const int64_t k = gguf_find_key(g, id_key), t = gguf_find_key(g, "tokenizer.ggml.tokens");
        if (k < 0 || t < 0 || gguf_get_kv_type(g, k) != GGUF_TYPE_UINT32 ||
            gguf_get_arr_type(g, t) != GGUF_TYPE_STRING)
            return std::string();
        const uint32_t id = gguf_get_val_u32(g, k);
        return id < gguf_get_arr_n(g, t) ? std::string(gguf_get_arr_str(g, t, id)) : std::string();
    };
    const std::string src = str("tokenizer.chat_template");
    const std::string bos = token("tokenizer.ggml.bos_token_id");
    const std::string eos = token("tokenizer.ggml.eos_token_id");
    gguf_free(g);
    chat::ChatFormat f;
    std::string err;
    j["present"] = !src.empty();
    j["bytes"] = src.size();
    j["renders"] = chat::load_chat_format(src, bos, eos, false, &f, &err);
    if (j["renders"]) {
        j["name"] = f.name;
        j["renderer"] = f.jinja->renderer();
        j["thinking"] = f.thinking;
    } else {
        j["error"] = err;
    }
    return j;
}

Status resolve_chat_template(const ChatTemplateOptions & f, std::string * text, std::string * from) {
    text->clear();
    from->clear();
    if (!f.file.empty()) {
        *from = "--chat-template-file " + f.file;
        return read_text_file(f.file, "chat template", text);
    }
    if (f.value.empty()) return Status::Ok();
    if (f.value == "chatml") {
        *text = chat::kChatmlTemplate;
        *from = "--chat-template chatml";
        return Status::Ok();
    }
    if (f.value.find("{{") != std::string::npos || f.value.find("{%") != std::string::npos) {
        *text = f.value;
        *from = "--chat-template (its text)";
        return Status::Ok();
    }
    *from = "--chat-template " + f.value;
    Status st = read_text_file(f.value, "chat template", text);
    if (!st.ok())
        return Status::BadInput("--chat-template '" + f.value +
                                "': not the name chatml, not Jinja text, and not a file (" +
                                st.message() + ")");
    return st;
}

void add_chat_command(CLI::App & app, Action * action) {
    auto f = std::make_shared<ChatFlags>();
    auto * sub = app.add_subcommand(
        "chat", "a conversation with the model's chat template (/exit ends; from a pipe: a turn per line)");
    f->sub = sub;
    add_chat_flags(sub, &f->chat);
    add_chat_template_flags(sub, &f->tmpl);
    add_color_flag(sub, &f->color);
    add_engine_flags(sub, &f->opt);
    add_sampling_flags(sub, &f->gen);
    sub->add_flag("-v,--verbose", f->verbose,
                  "more detail: the template, a second line per reply (-vv: debug, llama.cpp's log too)");
    sub->callback([f, action] { *action = [f] { return do_chat(*f); }; });
}

}  // namespace moestream::cli
