// test_chat_cli.cpp — `moestream chat` end to end (docs/cli.md, "Chat"): the real binary in a
// pseudo-terminal (forkpty: the terminal's own echo, line discipline and Ctrl-C), with a
// synth model that carries a chat template (llama3's shape, added with gguf_mutate.py).
// Two turns where the second reuses the first's KV, with --no-cache-prompt as the negative
// control (the whole conversation prefilled); Ctrl-C during a reply stops it and the chat
// answers the next turn; Ctrl-C at the prompt exits 130 with the summary; /exit and Ctrl-D
// exit 0; a pipe is read one turn per line; bad input exits 2 / 3 / 64 with one line.
// Reasoning (the hermes-qwen3 and harmony templates of tests/api/templates/, replies fixed by
// --grammar): split from the answer as serve splits it (stderr, dimmed on a terminal, or
// hidden), the history of turn 2 as the family's template has it (--verbose-prompt), harmony
// rendered by moestream with its reasoning effort, and the refusals of what a template cannot
// do; the controls are a template llama.cpp renders (nothing split) and thinking turned off;
// endless replies stopped with Ctrl-C show that the split output streams token by token.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

using namespace moestream::test;

namespace {

// The shape of Llama 3's template: llama.cpp recognises it (not chatml, the fallback for a
// model without a template).
const char * kLlama3Template =
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>"
    "\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}";

// The tiny synth model with tokenizer.chat_template set to `tmpl`, in dir.
std::string model_with_template(const TempDir & dir, const std::string & tmpl, const std::string & name) {
    const std::string out = dir.path(name);
    CmdResult r = run_cmd(gguf_mutate_cmd() + " " +
                          sh_quote(synth_model("tiny", "qwen3moe", "q8_0")) + " " + sh_quote(out) +
                          " set " + sh_quote("tokenizer.chat_template=str:" + tmpl));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
}

// A template of tests/api/templates/ (the families moestream renders).
std::string family_template(const std::string & name) {
    return slurp(src_dir() + "/tests/api/templates/" + name + ".jinja");
}

// `printf INPUT | moestream chat -m MODEL -t 1 FLAGS`.
CmdResult chat_pipe(const std::string & model, const std::string & input, const std::string & flags) {
    return run_cmd("printf '%s' " + sh_quote(input) + " | " + sh_quote(cli_bin()) + " chat -m " +
                   sh_quote(model) + " -t 1 -c 2048 " + flags);
}

// The prompts --verbose-prompt printed, in turn order.
std::vector<std::string> turn_prompts(const std::string & err) {
    std::vector<std::string> v;
    const std::regex head(R"(moestream chat: prompt of turn (\d+) \((\d+) bytes\):\n)");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), head); it != std::sregex_iterator(); ++it)
        v.push_back(err.substr(size_t(it->position(0) + it->length(0)), std::stoul((*it)[2])));
    return v;
}

// Replies fixed by a grammar: a thinking block then the answer (hermes-qwen3), an analysis
// message then the final one (harmony).
const char * kThinkReply = R"(root ::= "<think>\nI should greet.\n</think>\n\nHello friend.")";
const char * kHarmonyReply =
    R"(root ::= "<|channel|>analysis<|message|>It is 21.<|end|><|start|>assistant<|channel|>final<|message|>Warm.")";

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The CLI on the slave side of a pseudo-terminal (stdin, stdout and stderr all the terminal,
// as in a shell). out holds everything it wrote, with the terminal's echo of what was sent.
class PtyChat {
public:
    // env: one NAME=VALUE set for the CLI only ("" = none).
    explicit PtyChat(const std::string & args, const std::string & env = "") {
        const std::string cmd =
            (env.empty() ? "exec " : "exec env " + sh_quote(env) + " ") + sh_quote(cli_bin()) + " chat " + args;
        struct winsize ws = {40, 200, 0, 0};
        pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
        if (pid_ == 0) {
            execl("/bin/sh", "sh", "-c", cmd.c_str(), (char *)nullptr);
            _exit(127);
        }
        EXPECT_GT(pid_, 0) << "forkpty failed";
    }
    ~PtyChat() {
        if (pid_ > 0 && status_ < 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (fd_ >= 0) close(fd_);
    }
    void send(const std::string & s) { ASSERT_EQ(write(fd_, s.data(), s.size()), ssize_t(s.size())); }
    // Reads until out has at least `n` matches of `re` after offset `from` (true), the
    // terminal closes or `timeout_s` passes (false). The bounds here only catch a hang: on a
    // loaded machine a turn's prefill at -t 1 can itself take tens of seconds.
    bool wait_for(const std::string & re, int n = 1, size_t from = 0, double timeout_s = 180) {
        const std::regex rx(re);
        const double end = now_s() + timeout_s;
        for (;;) {
            const std::string tail = out.substr(std::min(from, out.size()));
            const auto b = std::sregex_iterator(tail.begin(), tail.end(), rx);
            if (std::distance(b, std::sregex_iterator()) >= n) return true;
            if (now_s() > end || !pump(0.1)) return false;
        }
    }
    // Reads until out has grown by `bytes` since `from`.
    bool wait_growth(size_t from, size_t bytes, double timeout_s = 180) {
        const double end = now_s() + timeout_s;
        while (out.size() < from + bytes)
            if (now_s() > end || !pump(0.1)) return false;
        return true;
    }
    // Reads what is left and reaps the process: its exit code (128 + signal), -1 on timeout.
    int wait_exit(double timeout_s = 180) {
        const double end = now_s() + timeout_s;
        while (now_s() < end && pump(0.1)) {
        }
        for (;;) {
            int st = 0;
            const pid_t r = waitpid(pid_, &st, WNOHANG);
            if (r == pid_) {
                status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                return status_;
            }
            if (now_s() > end) return -1;
            usleep(20000);
        }
    }
    std::string out;

private:
    // One poll of the master: false once the slave side is closed (the process ended).
    bool pump(double timeout_s) {
        pollfd p{fd_, POLLIN, 0};
        const int r = poll(&p, 1, int(timeout_s * 1000));
        if (r <= 0) return true;
        char b[4096];
        const ssize_t n = read(fd_, b, sizeof b);
        if (n <= 0) return false;  // EIO: the slave is closed
        out.append(b, size_t(n));
        return true;
    }
    int fd_ = -1;
    pid_t pid_ = -1;
    int status_ = -1;
};

const char * kFooter = R"(\[(\d+) tok, [0-9.]+ tok/s \| prefill (\d+) tok \((\d+) reused\)[^\]]*\])";
// A footer (and -v's second line), then the prompt for the next turn.
const std::string kFooterThenPrompt = std::string(kFooter) + R"(\r?\n(moestream chat: [^\r\n]*\r?\n)?> )";

struct Footer {
    int generated = 0, prefilled = 0, reused = 0;
    std::string text;
};

std::vector<Footer> footers(const std::string & out) {
    std::vector<Footer> v;
    const std::regex rx(kFooter);
    for (auto it = std::sregex_iterator(out.begin(), out.end(), rx); it != std::sregex_iterator(); ++it)
        v.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3]), (*it)[0]});
    return v;
}

// Two greedy turns in a terminal; the footers of both. extra: more flags; end: how the chat
// is ended (then exit 0 and the summary).
std::vector<Footer> two_turns(const std::string & model, const std::string & extra,
                              const std::string & end, std::string * out_all) {
    PtyChat c("-m " + sh_quote(model) + " -t 1 -c 1024 -n 8 " + extra + " -sys 'Be terse.'");
    EXPECT_TRUE(c.wait_for("> ")) << c.out;
    c.send("Hello there\r");
    EXPECT_TRUE(c.wait_for(kFooterThenPrompt, 1)) << c.out;
    c.send("How are you\r");
    EXPECT_TRUE(c.wait_for(kFooterThenPrompt, 2)) << c.out;
    c.send(end);
    EXPECT_EQ(c.wait_exit(), 0) << c.out;
    EXPECT_NE(c.out.find("moestream chat: 2 replies"), std::string::npos) << c.out;
    *out_all = c.out;
    return footers(c.out);
}

TEST(ChatCli, SecondTurnReusesTheFirstTurnsKv) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    std::string out;
    // -v before -sys: a flag's position must not swallow the next option.
    const std::vector<Footer> f = two_turns(m, "-v", "/exit\r", &out);
    ASSERT_EQ(f.size(), 2u) << out;
    // The model's own template, run by minja (not the chatml fallback).
    EXPECT_NE(out.find("template the model's template (minja; tool calls not parsed)"), std::string::npos) << out;
    EXPECT_NE(out.find("KV reuse on"), std::string::npos) << out;
    EXPECT_EQ(f[0].reused, 0);
    EXPECT_GT(f[0].generated, 0);
    // Turn 2 reuses at least turn 1's whole prompt and prefills only what follows.
    EXPECT_GE(f[1].reused, f[0].prefilled) << f[1].text;
    EXPECT_NE(out.find("lossless]"), std::string::npos) << out;

    // Negative control: --no-cache-prompt prefills the whole conversation in turn 2: the same
    // prompt (turn 1 is computed identically), none of it reused. Ended with Ctrl-D.
    std::string out_c;
    const std::vector<Footer> c = two_turns(m, "--no-cache-prompt", "\x04", &out_c);
    ASSERT_EQ(c.size(), 2u) << out_c;
    EXPECT_EQ(c[0].prefilled, f[0].prefilled);
    EXPECT_EQ(c[1].reused, 0);
    EXPECT_EQ(c[1].prefilled, f[1].prefilled + f[1].reused) << c[1].text << " vs " << f[1].text;
    EXPECT_LT(f[1].prefilled, c[1].prefilled);
}

TEST(ChatCli, CtrlCStopsTheReplyNotTheChat) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    // Replies until the context is full (thousands of tokens, seconds): Ctrl-C stops them.
    PtyChat c("-m " + sh_quote(m) + " -t 1 -c 8192 -n -1 --ignore-eos");
    ASSERT_TRUE(c.wait_for("> ")) << c.out;
    for (const char * turn : {"Tell me everything\r", "And again\r"}) {
        const size_t at = c.out.size();
        c.send(turn);
        ASSERT_TRUE(c.wait_growth(at, 200)) << c.out;  // the echo, then the reply streaming
        c.send("\x03");
        ASSERT_TRUE(c.wait_for(R"(stopped \(Ctrl-C\)\]\r?\n> )", 1, at)) << c.out;
    }
    const std::vector<Footer> f = footers(c.out);
    ASSERT_EQ(f.size(), 2u) << c.out;
    for (const Footer & r : f) {
        EXPECT_GT(r.generated, 0) << r.text;                        // it answered
        EXPECT_LT(r.generated + r.prefilled + r.reused, 4000) << r.text;  // and was cut short
    }
    // Ctrl-C at the prompt: the summary of the session, exit 130.
    c.send("\x03");
    EXPECT_EQ(c.wait_exit(), 130) << c.out;
    EXPECT_NE(c.out.find("moestream chat: interrupted (Ctrl-C)"), std::string::npos) << c.out;
    EXPECT_NE(c.out.find("moestream chat: 2 replies"), std::string::npos) << c.out;
}

// A line typed while a reply streams is not echoed into the reply and not sent as a turn the
// screen never showed: when the reply ends the chat says it was discarded and waits at the
// prompt. Synchronised on output, no sleeps: the line is typed once 200 bytes of the reply
// have streamed, and the reply goes on until the context is full (-c 1024 --ignore-eos,
// about 900 more tokens). Control: the same line typed at the prompt is echoed and answered.
TEST(ChatCli, TextTypedWhileAReplyStreamsIsDiscardedWithANotice) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    PtyChat c("-m " + sh_quote(m) + " -t 1 -c 1024 -n -1 --ignore-eos");
    ASSERT_TRUE(c.wait_for("> ")) << c.out;
    const size_t at = c.out.size();
    c.send("Tell me everything\r");
    ASSERT_TRUE(c.wait_growth(at, 200)) << c.out;  // the echo, then the reply streaming
    c.send("typed ahead\r");
    ASSERT_TRUE(c.wait_for("text typed while the reply streamed was discarded: type at the prompt[^>]*" +
                           kFooterThenPrompt, 1, at))
        << c.out;
    EXPECT_EQ(c.out.find("typed ahead"), std::string::npos) << "echoed into the reply";
    ASSERT_EQ(footers(c.out).size(), 1u) << "sent as a turn: " << c.out;
    // Control: typed at the prompt, the same line is shown and answered (stopped with Ctrl-C
    // once it streams: CI time).
    const size_t before = c.out.size();
    c.send("typed ahead\r");
    ASSERT_TRUE(c.wait_growth(before, 200)) << c.out;
    c.send("\x03");
    ASSERT_TRUE(c.wait_for(R"(stopped \(Ctrl-C\)\]\r?\n> )", 1, before)) << c.out;
    EXPECT_NE(c.out.find("typed ahead", before), std::string::npos) << c.out;
    EXPECT_EQ(footers(c.out).size(), 2u) << c.out;
    c.send("/exit\r");
    EXPECT_EQ(c.wait_exit(), 0) << c.out;
    EXPECT_NE(c.out.find("moestream chat: 2 replies"), std::string::npos) << c.out;
}

// --color (llama.cpp's -co): on a terminal the user's typed input shows in its own colour, set
// before the line is read and reset after it. Controls: --color off on a terminal, and a pipe.
TEST(ChatCli, ColorColoursTheTypedInputOnATerminalOnly) {
    TempDir dir("chatcolor");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    // One turn on a terminal, driven on output (the whole prompt, colour included, then the
    // footer and the next prompt), ended with Ctrl-D at the prompt.
    auto one_turn = [&](const std::string & color) {
        PtyChat c("-m " + sh_quote(m) + " -t 1 -n 2 --color " + color);
        EXPECT_TRUE(c.wait_for(color == "on" ? "> \033\\[1;32m" : "> ")) << c.out;
        c.send("Hello there\r");
        EXPECT_TRUE(c.wait_for(kFooterThenPrompt, 1)) << c.out;
        c.send("\x04");
        EXPECT_EQ(c.wait_exit(), 0) << c.out;
        return c.out;
    };
    const std::string on = one_turn("on");
    const size_t set = on.find("> \033[1;32m");
    ASSERT_NE(set, std::string::npos) << on;
    EXPECT_NE(on.find("Hello there", set), std::string::npos) << on;
    EXPECT_NE(on.find("\033[0m", set), std::string::npos) << on;
    const std::string off = one_turn("off");
    EXPECT_NE(off.find("Hello there"), std::string::npos) << off;
    EXPECT_EQ(off.find("\033[1;32m"), std::string::npos) << off;
    const CmdResult pipe = chat_pipe(m, "Hello there\n", "-n 2 --color on");
    EXPECT_EQ(pipe.exit_code, 0) << pipe.err;
    EXPECT_EQ(pipe.out.find("\033["), std::string::npos) << pipe.out;
}

TEST(ChatCli, PipedStdinIsOneTurnPerLine) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    CmdResult r = run_cmd("printf 'Hello there\\nHow are you\\n/exit\\nnot read\\n' | " +
                          sh_quote(cli_bin()) + " chat -m " + sh_quote(m) + " -t 1 -n 4");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::vector<Footer> f = footers(r.err);
    ASSERT_EQ(f.size(), 2u) << r.err;  // /exit ended it: the fourth line was not read
    EXPECT_GE(f[1].reused, f[0].prefilled) << r.err;
    EXPECT_NE(r.err.find("moestream chat: 2 replies"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("> "), std::string::npos) << "no prompt without a terminal: " << r.out;
    // A line ending in '\' continues on the next: one turn, the same prompt as the escape \n
    // (escapes are processed by default) and not the same as --no-escape's literal "\n".
    auto one_turn = [&](const std::string & input, const std::string & extra) {
        CmdResult c = run_cmd("printf '%s' " + sh_quote(input) + " | " + sh_quote(cli_bin()) +
                              " chat -m " + sh_quote(m) + " -t 1 -n 2 " + extra);
        EXPECT_EQ(c.exit_code, 0) << c.err;
        const std::vector<Footer> v = footers(c.err);
        EXPECT_EQ(v.size(), 1u) << input << "\n" << c.err;
        return v.empty() ? -1 : v[0].prefilled;
    };
    const int continued = one_turn("Hello \\\nthere\n", "");
    EXPECT_EQ(continued, one_turn("Hello \\nthere\n", ""));
    EXPECT_NE(continued, one_turn("Hello \\nthere\n", "--no-escape"));
    // A turn that cannot be answered ends a piped chat with the error's exit code, named.
    r = run_cmd("printf 'Hello there\\n' | " + sh_quote(cli_bin()) + " chat -m " + sh_quote(m) +
                " -t 1 -n 4 -c 32");
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("more than the context (32 tokens)"), std::string::npos) << r.err;
    // A lossy knob is named in the footer (the first test's default footer says lossless).
    r = run_cmd("echo Hi | " + sh_quote(cli_bin()) + " chat -m " + sh_quote(m) + " -t 1 -n 2 --n-expert-used 1");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("| LOSSY (--n-expert-used 1)]"), std::string::npos) << r.err;
    // End of input ends it too (exit 0).
    r = run_cmd("printf 'Hello there' | " + sh_quote(cli_bin()) + " chat -m " + sh_quote(m) + " -t 1 -n 4");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(footers(r.err).size(), 1u) << r.err;
}

// /help, /clear, /save FILE and /load FILE are commands, never turns: /clear keeps the system
// prompt and forgets the rest, /load brings a saved conversation back, //TEXT sends /TEXT, an
// unknown command in a piped chat ends it with exit 64 naming it.
TEST(ChatCli, SlashCommandsClearSaveAndLoadTheConversation) {
    TempDir dir("chat-cmd");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    const std::string saved = dir.path("conv.json");
    CmdResult r = chat_pipe(m,
                            "Hello there\n/help\n/save " + saved + "\n/clear\nSecond words\n/load " +
                                saved + "\n//slash turn\n/exit\n",
                            "-n 4 -sys 'Be terse.' --verbose-prompt");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(footers(r.err).size(), 3u) << r.err;
    EXPECT_NE(r.err.find("/save FILE"), std::string::npos) << "the /help list: " << r.err;
    const std::vector<std::string> p = turn_prompts(r.err);
    ASSERT_EQ(p.size(), 3u) << r.err;
    EXPECT_NE(p[0].find("Hello there"), std::string::npos);
    EXPECT_EQ(p[1].find("Hello there"), std::string::npos) << "/clear forgot the first turn: " << p[1];
    EXPECT_NE(p[1].find("Be terse."), std::string::npos) << "/clear kept the system prompt";
    EXPECT_NE(p[2].find("Hello there"), std::string::npos) << "/load brought it back: " << p[2];
    EXPECT_EQ(p[2].find("Second words"), std::string::npos) << p[2];
    EXPECT_NE(p[2].find("/slash turn"), std::string::npos) << p[2];
    EXPECT_EQ(p[2].find("//slash"), std::string::npos) << p[2];
    for (const std::string & q : p) EXPECT_EQ(q.find("/help"), std::string::npos) << "never sent: " << q;
    const auto j = nlohmann::json::parse(slurp(saved), nullptr, false);
    ASSERT_TRUE(j.is_object()) << slurp(saved);
    ASSERT_EQ(j["messages"].size(), 3u) << j.dump();
    EXPECT_EQ(j["messages"][0]["role"], "system");
    EXPECT_EQ(j["messages"][1]["content"], "Hello there");
    EXPECT_EQ(j["messages"][2]["role"], "assistant");
    // Bad commands in a piped chat: named, exit 64 (usage) or 3 (a file that is not a
    // conversation); nothing sent.
    CmdResult u = chat_pipe(m, "/nope\nHello\n", "-n 2");
    EXPECT_EQ(u.exit_code, 64) << u.err;
    EXPECT_NE(u.err.find("unknown command '/nope'"), std::string::npos) << u.err;
    EXPECT_EQ(footers(u.err).size(), 0u);
    const std::string junk = dir.path("junk.json");
    ASSERT_TRUE(write_bytes(junk, "[{\"role\": \"robot\", \"content\": \"x\"}]"));
    CmdResult l = chat_pipe(m, "/load " + junk + "\n", "-n 2");
    EXPECT_EQ(l.exit_code, 3) << l.err;
    EXPECT_NE(l.err.find("messages[0]: role 'robot'"), std::string::npos) << l.err;
}

// A conversation that outgrows the context loses its oldest turns after the system prompt,
// with one line saying so, and goes on (the context of 512 tokens holds about two turns).
TEST(ChatCli, AFullContextDropsTheOldestTurnsAndGoesOn) {
    TempDir dir("chat-ctx");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    std::string input;
    for (int i = 0; i < 5; ++i)
        input += "turn " + std::to_string(i) + " with some more words to fill it, and then some "
                 "more words again, so that a few of these turns fill the context\n";
    auto run = [&](const std::string & ctx) {
        return run_cmd("printf '%s' " + sh_quote(input) + " | " + sh_quote(cli_bin()) + " chat -m " +
                       sh_quote(m) + " -t 1 -n 8 -sys 'Be terse.' --verbose-prompt -c " + ctx);
    };
    CmdResult r = run("512");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(footers(r.err).size(), 5u) << r.err;
    EXPECT_NE(r.err.find("moestream chat: the context (512 tokens) was full: dropped the"), std::string::npos)
        << r.err;
    const std::vector<std::string> p = turn_prompts(r.err);
    ASSERT_EQ(p.size(), 5u) << r.err;
    EXPECT_EQ(p[4].find("turn 0 "), std::string::npos) << "the oldest turn is gone: " << p[4];
    EXPECT_NE(p[4].find("Be terse."), std::string::npos) << "the system prompt stays: " << p[4];
    EXPECT_NE(p[4].find("turn 4 "), std::string::npos);
    // Control: a context that holds everything drops nothing.
    CmdResult big = run("2048");
    EXPECT_EQ(big.exit_code, 0) << big.err;
    EXPECT_EQ(big.err.find("dropped"), std::string::npos) << big.err;
    const std::vector<std::string> q = turn_prompts(big.err);
    ASSERT_EQ(q.size(), 5u);
    EXPECT_NE(q[4].find("turn 0 "), std::string::npos);
}

// Reply i of a session is sampled with seed --seed + i (docs/cli.md, "Chat"). At --temp 100
// the tiny random-weight model's next-token distribution is so flat that the draw is decided
// by the sampler's random numbers, not by the context (measured: 0 of 160 tokens differ
// between two unrelated prompts at the same seed). So a two-turn session at seed S prints
// reply 0 of a one-turn session at S followed by reply 0 of a one-turn session at S + 1; at
// most a couple of bytes may differ where the flat distribution still tips a draw, while
// another seed differs in most bytes (the negative control).
TEST(ChatCli, ReplyIIsSampledWithSeedPlusI) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    auto session = [&](const std::string & turns, int seed) {
        CmdResult r = run_cmd("printf '%s' " + sh_quote(turns) + " | " + sh_quote(cli_bin()) +
                              " chat -m " + sh_quote(m) + " -t 1 -n 12 --ignore-eos --temp 100 --seed " +
                              std::to_string(seed));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(footers(r.err).size(), size_t(std::count(turns.begin(), turns.end(), '\n')))
            << r.err;
        return r.out;
    };
    // Bytes that differ (a length difference counts every missing byte).
    auto distance = [](const std::string & a, const std::string & b) {
        size_t d = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
        for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d += a[i] != b[i];
        return d;
    };
    const std::string two = session("Hello there\nHello there\n", 5);
    EXPECT_EQ(session("Hello there\nHello there\n", 5), two) << "the same session replays exactly";
    const std::string at5 = session("Hello there\n", 5), at6 = session("Hello there\n", 6);
    const std::string at7 = session("Hello there\n", 7);
    ASSERT_GE(at5.size(), 12u);
    EXPECT_GE(distance(at5, at6), 6u) << "two replies to the same question differ";
    EXPECT_LE(distance(two, at5 + at6), 2u) << "reply 1 is sampled with --seed + 1";
    EXPECT_GE(distance(two, at5 + at7), 6u) << "negative control: another seed for reply 1";
    EXPECT_GE(distance(two, at5 + at5), 6u) << "negative control: reply 1 not at --seed";
}

TEST(ChatCli, BadInputIsOneLineAndItsExitCode) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, kLlama3Template, "llama3.gguf");
    const std::string chat = sh_quote(cli_bin()) + " chat ";
    auto expect = [&](const std::string & args, int code, const std::string & msg) {
        SCOPED_TRACE(args);
        CmdResult r = run_cmd(chat + args + " </dev/null");
        EXPECT_EQ(r.exit_code, code) << r.err;
        EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");
    };
    expect("-m " + dir.path("missing.gguf"), 2, "missing.gguf");
    expect("-n 4", 64, "--model is required");
    expect("-m " + sh_quote(m) + " --bogus", 64, "--bogus");
    expect("-m " + sh_quote(m) + " -p hi", 64, "-p: chat reads each user turn from stdin");
    expect("-m " + sh_quote(m) + " -cnv", 64, "-cnv is not needed");
    expect("-m " + sh_quote(m) + " --stats-json x.json", 64, "--stats-json: not available in chat");
    expect("-m " + sh_quote(m) + " --jinja", 64, "not supported by moestream: --jinja");
    expect("-m " + sh_quote(m) + " -dev none", 64, "not supported by moestream: -dev (CPU only)");
    expect("-m " + sh_quote(m) + " --top-k 4", 64, "--top-k shapes sampling");
    expect("-m " + sh_quote(m) + " -sysf " + dir.path("none.txt"), 3, "none.txt");
    // A template minja cannot parse: refused, naming the construct.
    const std::string odd = model_with_template(dir, "{{ nothing minja parses }}", "odd.gguf");
    expect("-m " + sh_quote(odd), 2,
           "the chat template (the model's) cannot be rendered (minja: Expected closing "
           "expression tag");
    // `run` points llama.cpp's conversation flag at chat.
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(m) + " -cnv");
    EXPECT_EQ(r.exit_code, 64);
    EXPECT_NE(r.err.find("-cnv: for a chat use `moestream chat -m MODEL`"), std::string::npos) << r.err;
    // Controls: the same model and the accepted spellings run (exit 0), -sys / -sysf included.
    r = run_cmd("echo hi | " + chat + "-m " + sh_quote(m) + " -t 1 -n 2 -sys 'Be terse.' --temp 0.5 --top-k 4");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run_cmd("echo 'Be terse.' > " + dir.path("sys.txt") + " && echo hi | " + chat + "-m " +
                sh_quote(m) + " -t 1 -n 2 -sysf " + dir.path("sys.txt"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    // A flag before a llama.cpp multi-letter spelling does not swallow it (run too).
    r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(m) + " -t 1 -n 1 --ignore-eos -tb 1");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(ChatCli, ThinkingIsSplitFromTheAnswerAndLeftOutOfTheHistory) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    const std::string fixed = "-n 200 --grammar " + sh_quote(kThinkReply) + " --verbose-prompt";
    CmdResult r = chat_pipe(m, "Hi\nAgain\n", fixed + " -v");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("renderer minja | reasoning split, shown"), std::string::npos) << r.err;
    // stdout: the answers only; the thinking on stderr, each line prefixed.
    EXPECT_EQ(r.out, "Hello friend.\nHello friend.\n");
    EXPECT_EQ(footers(r.err).size(), 2u) << r.err;
    size_t n = 0;
    for (size_t at = r.err.find("\nthinking: I should greet.\n"); at != std::string::npos;
         at = r.err.find("\nthinking: I should greet.\n", at + 1))
        ++n;
    EXPECT_EQ(n, 2u) << r.err;
    // Turn 2's prompt: the first reply without its thinking, as Qwen3's template renders an
    // assistant turn before the last user message.
    std::vector<std::string> p = turn_prompts(r.err);
    ASSERT_EQ(p.size(), 2u) << r.err;
    EXPECT_EQ(p[1], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello friend.<|im_end|>\n"
                    "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n");

    // --hide-reasoning: the same answers, no thinking shown.
    CmdResult h = chat_pipe(m, "Hi\n", fixed + " --hide-reasoning");
    ASSERT_EQ(h.exit_code, 0) << h.err;
    EXPECT_EQ(h.out, "Hello friend.\n");
    EXPECT_EQ(h.err.find("I should greet"), std::string::npos) << h.err;

    // Controls. Thinking off: the prompt opens an empty thinking block and the same text is
    // the answer as generated (not split), markers and all.
    CmdResult off = chat_pipe(m, "Hi\n", fixed + " --reasoning off");
    ASSERT_EQ(off.exit_code, 0) << off.err;
    EXPECT_EQ(off.out, "<think>\nI should greet.\n</think>\n\nHello friend.\n");
    p = turn_prompts(off.err);
    ASSERT_EQ(p.size(), 1u) << off.err;
    EXPECT_EQ(p[0], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    // A template without thinking: the reply is printed and kept as generated, so turn 2's
    // prompt carries the thinking.
    const std::string l3 = model_with_template(dir, kLlama3Template, "llama3.gguf");
    CmdResult raw = chat_pipe(l3, "Hi\nAgain\n", fixed + " -v");
    ASSERT_EQ(raw.exit_code, 0) << raw.err;
    EXPECT_NE(raw.err.find("renderer minja | reasoning none (the template has no thinking)"), std::string::npos) << raw.err;
    EXPECT_EQ(raw.out, "<think>\nI should greet.\n</think>\n\nHello friend.\n"
                       "<think>\nI should greet.\n</think>\n\nHello friend.\n");
    EXPECT_EQ(raw.err.find("thinking: "), std::string::npos) << raw.err;
    p = turn_prompts(raw.err);
    ASSERT_EQ(p.size(), 2u) << raw.err;
    EXPECT_NE(p[1].find("I should greet."), std::string::npos) << p[1];
}

TEST(ChatCli, HarmonyIsRenderedWithItsEffortAndItsChannelsSplit) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("harmony"), "harmony.gguf");
    const std::string fixed = "-n 300 --grammar " + sh_quote(kHarmonyReply) + " --verbose-prompt";
    CmdResult r = chat_pipe(m, "Weather?\nAgain\n", fixed + " --reasoning-effort high");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "Warm.\nWarm.\n");  // the final channel only
    EXPECT_NE(r.err.find("\nthinking: It is 21.\n"), std::string::npos) << r.err;  // analysis
    std::vector<std::string> p = turn_prompts(r.err);
    ASSERT_EQ(p.size(), 2u) << r.err;
    // moestream's harmony renderer: its system message with the effort, the generation prompt.
    EXPECT_EQ(p[0].rfind("<|start|>system<|message|>You are ChatGPT, a large language model", 0), 0u) << p[0];
    EXPECT_NE(p[0].find("\nReasoning: high\n"), std::string::npos) << p[0];
    const std::string turn1 = "<|start|>user<|message|>Weather?<|end|><|start|>assistant";
    EXPECT_EQ(p[0].substr(p[0].size() - turn1.size()), turn1);
    // Turn 2: the first reply as its final message, its analysis dropped.
    const std::string hist = "<|start|>user<|message|>Weather?<|end|><|start|>assistant<|channel|>final"
                             "<|message|>Warm.<|end|><|start|>user<|message|>Again<|end|><|start|>assistant";
    EXPECT_EQ(p[1].substr(p[1].size() - hist.size()), hist) << p[1];
    EXPECT_EQ(p[1].find("It is 21."), std::string::npos) << p[1];
    // The template's default effort without the flag (control for the flag's effect).
    CmdResult d = chat_pipe(m, "Weather?\n", fixed);
    ASSERT_EQ(d.exit_code, 0) << d.err;
    p = turn_prompts(d.err);
    ASSERT_EQ(p.size(), 1u) << d.err;
    EXPECT_NE(p[0].find("\nReasoning: medium\n"), std::string::npos) << p[0];
    // Control: the same reply through a template llama.cpp renders keeps the channel markers
    // (the model really writes them; the split is what removes them).
    const std::string l3 = model_with_template(dir, kLlama3Template, "llama3.gguf");
    CmdResult raw = chat_pipe(l3, "Weather?\n", fixed);
    ASSERT_EQ(raw.exit_code, 0) << raw.err;
    EXPECT_EQ(raw.out, "<|channel|>analysis<|message|>It is 21.<|end|><|start|>assistant<|channel|>final"
                       "<|message|>Warm.\n");
}

TEST(ChatCli, ReasoningATemplateCannotDoIsRefusedByName) {
    TempDir dir("chat");
    const std::string harmony = model_with_template(dir, family_template("harmony"), "harmony.gguf");
    const std::string qwen3 = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    const std::string l3 = model_with_template(dir, kLlama3Template, "llama3.gguf");
    auto expect = [&](const std::string & model, const std::string & flags, int code,
                      const std::string & msg) {
        SCOPED_TRACE(flags);
        CmdResult r = chat_pipe(model, "Hi\n", "-n 2 " + flags);
        EXPECT_EQ(r.exit_code, code) << r.err;
        if (!msg.empty()) {
            EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
        }
        if (code != 0) {
            EXPECT_EQ(r.out, "");
        }
    };
    expect(harmony, "--reasoning off", 64, "--reasoning: this model's chat template cannot turn its thinking off (harmony");
    expect(l3, "-rea on", 64, "--reasoning: this model's chat template has no thinking to enable (the model's template");
    expect(qwen3, "--reasoning-effort low", 64, "--reasoning-effort: this model's chat template has no reasoning effort (hermes");
    expect(l3, "--reasoning maybe", 64, "--reasoning");
    expect(qwen3, "--reasoning-format none", 64, "not supported by moestream: --reasoning-format");
    expect(qwen3, "--grammar " + sh_quote("root ::= ("), 64, "grammar");
    // Controls: what each template can do runs.
    expect(harmony, "--reasoning on --reasoning-effort low", 0, "");
    expect(qwen3, "-rea off", 0, "");
    expect(l3, "--reasoning off", 0, "");
}

// A --grammar-file nested past the limit (llama.cpp's parser recursed until SIGSEGV): exit 64
// naming the grammar before any turn; the limit itself is the control.
TEST(ChatCli, GrammarFileNestedTooDeepIsAUsageError) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    auto nested = [](int depth) {
        return "root ::= " + std::string(size_t(depth), '(') + "\"a\"" +
               std::string(size_t(depth), ')') + "\n";
    };
    ASSERT_TRUE(write_bytes(dir.path("deep.gbnf"), nested(20000)));
    CmdResult r = chat_pipe(m, "Hi\n", "-n 2 --grammar-file " + sh_quote(dir.path("deep.gbnf")));
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("grammar: groups nest more than 256 deep"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_TRUE(write_bytes(dir.path("ok.gbnf"), nested(256)));
    CmdResult ok = chat_pipe(m, "Hi\n", "-n 2 --grammar-file " + sh_quote(dir.path("ok.gbnf")));
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// stdin without newlines (/dev/zero) grew without bound and never answered: one clear error,
// exit 3, once a line passes the 64 MiB limit (under `timeout`: a regression fails, not
// hangs). A normal line is the control (the other tests).
TEST(ChatCli, StdinLineLongerThanTheLimitIsOneError) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    CmdResult r = run_cmd("timeout 120 " + sh_quote(cli_bin()) + " chat -m " + sh_quote(m) +
                          " -t 1 -c 2048 -n 2 < /dev/zero");
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("stdin: a line longer than 64 MiB"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
}

// -sysf and --grammar-file on a FIFO nobody writes to wait like `cat`; Ctrl-C ends that at
// once (exit 130, whenever the SIGINT comes; the outer timeout only guards against a hang).
TEST(ChatCli, CtrlCEndsAWaitForAFifoWriter) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    const std::string fifo = dir.path("nowriter.fifo");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    for (const char * flag : {"-sysf", "--grammar-file"}) {
        SCOPED_TRACE(flag);
        CmdResult r = run_cmd("timeout -k 5 60 timeout -s INT --preserve-status 0.5 " +
                              sh_quote(cli_bin()) + " chat -m " + sh_quote(m) + " -t 1 " + flag +
                              " " + sh_quote(fifo) + " < /dev/null");
        EXPECT_EQ(r.exit_code, 130) << r.err;
        EXPECT_EQ(r.out, "");
    }
}

TEST(ChatCli, ReasoningIsDimmedOnATerminal) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    for (const bool hide : {false, true}) {
        PtyChat c("-m " + sh_quote(m) + " -t 1 -c 1024 -n 200 --grammar " + sh_quote(kThinkReply) +
                  (hide ? " --hide-reasoning" : ""));
        ASSERT_TRUE(c.wait_for("> ")) << c.out;
        c.send("Hi\r");
        ASSERT_TRUE(c.wait_for(kFooterThenPrompt, 1)) << c.out;
        c.send("/exit\r");
        EXPECT_EQ(c.wait_exit(), 0) << c.out;
        // Faint (SGR 2) thinking, reset, then the answer on its own line; hidden: the answer.
        const bool dimmed = c.out.find("\x1b[2mI should greet.\x1b[0m\r\nHello friend.") != std::string::npos;
        EXPECT_EQ(dimmed, !hide) << c.out;
        EXPECT_EQ(c.out.find("I should greet.") == std::string::npos, hide) << c.out;
        EXPECT_NE(c.out.find("Hello friend."), std::string::npos) << c.out;
    }
}

// A terminal that takes no colour (NO_COLOR set, or TERM=dumb) gets the `thinking: ` lines
// instead of the faint style; the control is the dimmed test above, on the same terminal.
TEST(ChatCli, NoColorTerminalGetsPlainThinkingLines) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    for (const char * env : {"NO_COLOR=1", "TERM=dumb"}) {
        SCOPED_TRACE(env);
        PtyChat c(std::string("-m ") + sh_quote(m) + " -t 1 -c 1024 -n 200 --grammar " +
                  sh_quote(kThinkReply), env);
        ASSERT_TRUE(c.wait_for("> ")) << c.out;
        c.send("Hi\r");
        ASSERT_TRUE(c.wait_for(kFooterThenPrompt, 1)) << c.out;
        c.send("/exit\r");
        EXPECT_EQ(c.wait_exit(), 0) << c.out;
        EXPECT_EQ(c.out.find("\x1b[2m"), std::string::npos) << c.out;
        EXPECT_NE(c.out.find("thinking: I should greet."), std::string::npos) << c.out;
        EXPECT_NE(c.out.find("Hello friend."), std::string::npos) << c.out;
    }
}

// Split while streaming: the reasoning and the answer reach the terminal before the reply has
// ended (endless replies, never complete for their grammar, stopped with Ctrl-C), and a reply
// stopped inside its reasoning ends the dim style before the footer.
TEST(ChatCli, SplitRepliesStreamTokenByToken) {
    TempDir dir("chat");
    const std::string m = model_with_template(dir, family_template("hermes-qwen3"), "qwen3.gguf");
    const std::string answer_forever = R"(root ::= "<think>\nI should greet.\n</think>\n\nHello" x
x ::= [a-z ] x)";
    const std::string think_forever = R"(root ::= "<think>\nHm" x
x ::= [a-z ] x)";
    for (const std::string & g : {answer_forever, think_forever}) {
        SCOPED_TRACE(g);
        PtyChat c("-m " + sh_quote(m) + " -t 1 -c 8192 -n -1 --grammar " + sh_quote(g));
        ASSERT_TRUE(c.wait_for("> ")) << c.out;
        const size_t at = c.out.size();
        c.send("Hi\r");
        const bool thinking = g == think_forever;
        ASSERT_TRUE(c.wait_for(thinking ? R"(\x1b\[2mHm[a-z ]{20})" : R"(\r\nHello[a-z ]{20})", 1, at)) << c.out;
        EXPECT_EQ(footers(c.out).size(), 0u) << "shown before the reply ended: " << c.out;
        c.send("\x03");
        ASSERT_TRUE(c.wait_for(R"(stopped \(Ctrl-C\)\]\r?\n> )", 1, at)) << c.out;
        const size_t footer = c.out.rfind('[', c.out.rfind(" tok, "));  // the footer's start
        const size_t reset = c.out.rfind("\x1b[0m");
        EXPECT_NE(reset, std::string::npos) << c.out;
        EXPECT_LT(reset, footer) << c.out;
        c.send("/exit\r");
        EXPECT_EQ(c.wait_exit(), 0) << c.out;
    }
}

}  // namespace
