// test_cli_flags.cpp — the command line a llama.cpp user types (docs/cli.md), end to end
// through the CLI binary: llama.cpp's spellings accepted or refused by name in one line,
// readable parse errors, defaults shown, -n -1, -f -, escapes, seeds. Each refusal has a
// control: the neighbouring accepted spelling runs (exit 0) and has the effect it names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "../../tools/cli/llama_refused.h"
#include "test_util.h"

using nlohmann::json;
using namespace moestream::test;

namespace {

CmdResult cli(const std::string & args) { return run_cmd(sh_quote(cli_bin()) + " " + args); }

std::string model() { return sh_quote(synth_model("tiny", "qwen3moe", "q8_0")); }

int lines(const std::string & s) { return int(std::count(s.begin(), s.end(), '\n')); }

// `run` with --stats-json; the parsed object (null on failure, with the error reported).
json run_stats(const std::string & args, CmdResult * out = nullptr, const std::string & pre = "") {
    static int n = 0;
    const std::string path = "/tmp/moestream-cliflags-" + std::to_string(getpid()) + "-" +
                             std::to_string(n++) + ".json";
    CmdResult r = run_cmd(pre + sh_quote(cli_bin()) + " run -m " + model() + " -t 1 " + args +
                          " --stats-json " + path);
    if (out) *out = r;
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    std::ifstream f(path);
    if (r.exit_code != 0 || !f) return json();
    json j = json::parse(f);
    std::remove(path.c_str());
    return j;
}

// A refused command: exit 64, the message, one line plus the pointer to --help (no usage dump).
void expect_refused(const std::string & args, const std::string & msg) {
    SCOPED_TRACE(args);
    CmdResult r = cli(args);
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
    EXPECT_LE(lines(r.err), 2) << r.err;
    EXPECT_EQ(r.out, "");
}

TEST(CliFlags, LlamaCppFlagsWithoutMeaningAreRefusedByTheirOwnName) {
    const std::string m = " -m " + model();
    expect_refused("run" + m + " -cnv", "-cnv: for a chat use `moestream chat -m MODEL`");
    expect_refused("run" + m + " -no-cnv", "-no-cnv is not needed");
    expect_refused("run" + m + " -dev none", "not supported by moestream: -dev (CPU only)");
    expect_refused("run" + m + " --mlock", "not supported by moestream: --mlock");
    // serve: a stop string and ignore_eos are a request's; refused on its command line.
    expect_refused("serve" + m + " -r User:", "-r is not a serve flag");
    expect_refused("serve" + m + " --ignore-eos", "--ignore-eos is not a serve flag");
    // Any other long option is named, never CLI11's "arguments were not expected".
    expect_refused("serve" + m + " --frobnicate 40", "unknown option '--frobnicate'");
    expect_refused("run" + m + " -ngl lots", "-ngl 'lots': expected a layer count, auto or all");
    // A single-dash word CLI11 would split into short flags is named as typed.
    expect_refused("run" + m + " -foo", "unknown option '-foo'");
    // Control: the same position with an accepted spelling runs.
    EXPECT_FALSE(run_stats("-n 1").is_null());
}

// llama_refused.h's table is live for `run`: no spelling is one of run's own options (its
// --help), each row's last spelling is refused with its own name and the row's reason (one
// process per row, not per spelling: CI time), and a spelling appears in one row only.
// Control: a flag not in the table is "unknown option", not "not supported".
TEST(CliFlags, EveryLlamaFlagMoestreamLacksIsRefusedWithItsReason) {
    using moestream::cli::kRefusedFlags;
    const std::string m = " -m " + model();
    const std::string help = cli("run --help").out;
    ASSERT_NE(help.find(",--ctx-size "), std::string::npos) << help;  // the check's control
    std::set<std::string> seen;
    for (const auto & row : kRefusedFlags) {
        const std::string all = row.flags;
        std::string flag;
        for (size_t at = 0; at <= all.size();) {
            size_t end = all.find(',', at);
            if (end == std::string::npos) end = all.size();
            flag = all.substr(at, end - at);
            at = end + 1;
            EXPECT_TRUE(seen.insert(flag).second) << flag << " is in two rows";
            for (const char * pre : {" ", ","})  // an option of run's, as --help lists it
                for (const char * sep : {" ", ","})
                    EXPECT_EQ(help.find(pre + flag + sep), std::string::npos) << flag << " is run's";
        }
        expect_refused("run" + m + " " + flag + " 1",
                       "not supported by moestream: " + flag + " (" + row.why + ")");
    }
    EXPECT_GE(seen.size(), 100u);
    // The same table speaks for serve and chat where they lack the flag.
    expect_refused("serve" + m + " --threads-http 4", "not supported by moestream: --threads-http (");
    expect_refused("chat" + m + " --mlock", "not supported by moestream: --mlock (");
    const CmdResult r = cli("run" + m + " --no-such-llama-flag");
    EXPECT_EQ(r.exit_code, 64);
    EXPECT_NE(r.err.find("unknown option '--no-such-llama-flag'"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("not supported by moestream"), std::string::npos) << r.err;
}

// The spellings an options listing shows ("-c,--ctx-size N", "--temp, --temperature N"):
// every word that starts with a dash and a letter.
std::set<std::string> listed_flags(const std::string & help) {
    std::set<std::string> out;
    const std::regex flag(R"((^|[\s,])(--?[A-Za-z][-A-Za-z0-9.]*))");
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) {
        const size_t lead = line.find_first_not_of(' ');
        if (lead == std::string::npos || line[lead] != '-') continue;  // option lines only
        std::smatch desc;  // the description starts after a gap, at a word that is not a flag
        const std::string rest = line.substr(lead);
        const std::string head =
            std::regex_search(rest, desc, std::regex(R"(\s{2,}[^-\s])")) ? rest.substr(0, size_t(desc.position(0))) : rest;
        for (std::sregex_iterator it(head.begin(), head.end(), flag), end; it != end; ++it)
            if (it->str(2).back() != '-') out.insert(it->str(2));
    }
    return out;
}

bool in_refused_table(const std::string & flag) { return moestream::cli::refused_flag_reason(flag) != nullptr; }

// Every flag of Debian's llama-cli, llama-server, llama-completion and llama-perplexity (their
// --help) that a subcommand lacks is refused by its own name on serve, eval, run, chat,
// inspect and replay, never with the "unknown option" or CLI11's "not expected" text. The
// table's rows are checked per row above; here each other flag (another subcommand's option,
// a llama.cpp synonym, an accepted no-op) runs once on one subcommand that lacks it, the
// subcommands taking turns, and -co / --color on every one that lacks it. Control: a flag
// llama.cpp does not have gets the generic text this test forbids.
TEST(CliFlags, EveryLlamaCppFlagIsTakenOrRefusedByNameOnEverySubcommand) {
    std::set<std::string> llama;
    for (const char * tool : {"llama-cli", "llama-server", "llama-completion", "llama-perplexity"}) {
        const CmdResult h =
            run_cmd(sh_quote(std::string(MOESTREAM_TEST_SRC) + "/scripts/llama-tool") + " " + tool + " --help");
        if (h.exit_code != 0) GTEST_SKIP() << tool << " --help failed (no llama.cpp prefix?): " << h.err;
        const std::set<std::string> f = listed_flags(h.out + h.err);
        llama.insert(f.begin(), f.end());
    }
    ASSERT_GE(llama.size(), 300u);
    ASSERT_TRUE(llama.count("--ctx-size") && llama.count("-co") && llama.count("--fim-qwen-1.5b-default"));
    const auto generic = [](const CmdResult & r) {
        return r.err.find("unknown option") != std::string::npos ||
               r.err.find("not expected") != std::string::npos;
    };
    const std::vector<std::string> cmds = {"serve", "eval", "run", "chat", "inspect", "replay"};
    std::map<std::string, std::set<std::string>> own;
    for (const std::string & c : cmds) own[c] = listed_flags(cli(c + " --help").out);
    ASSERT_TRUE(own["run"].count("--color") && !own["serve"].count("--color"));
    // An input that does not exist: what is not refused stops there, before any work.
    const auto input = [](const std::string & c) {
        return c == "replay" ? std::string(" /nonexistent.trace ") : std::string(" -m /nonexistent.gguf ");
    };
    const auto check = [&](const std::string & c, const std::string & flag) {
        SCOPED_TRACE(c + " " + flag);
        const CmdResult r = cli(c + input(c) + flag);
        EXPECT_FALSE(generic(r)) << r.err;
        const bool refused = r.err.find("not supported by moestream") != std::string::npos ||
                             r.err.find(" is not an option of ") != std::string::npos;
        if (refused && r.err.find(flag) == std::string::npos)
            ADD_FAILURE() << "refused without naming " << flag << ": " << r.err;
    };
    size_t turn = 0, runs = 0;
    for (const std::string & flag : llama) {
        if (in_refused_table(flag) || flag == "--help" || flag == "-h" || flag == "--version") continue;
        std::vector<std::string> lacking;
        for (const std::string & c : cmds)
            if (!own[c].count(flag)) lacking.push_back(c);
        if (lacking.empty()) continue;
        check(lacking[turn++ % lacking.size()], flag);
        ++runs;
    }
    EXPECT_GE(runs, 40u);
    for (const std::string & c : cmds)
        if (!own[c].count("--color"))
            for (const char * f : {"-co", "--color"}) {
                const CmdResult r = cli(c + input(c) + f);
                EXPECT_EQ(r.exit_code, 64) << c << " " << r.err;
                EXPECT_NE(r.err.find(std::string(f) + " is not an option of `moestream " + c +
                                     "` (it colours generated text on a terminal; this command prints none"),
                          std::string::npos)
                    << r.err;
            }
    // Control: a flag llama.cpp lacks gets the text the check above forbids.
    const CmdResult no = cli("serve" + input("serve") + "--no-such-llama-flag");
    EXPECT_FALSE(llama.count("--no-such-llama-flag"));
    EXPECT_TRUE(generic(no)) << no.err;
}

// docs/cli.md's table of refused llama.cpp flags is the CLI's (llama_refused.h). Control: a
// reason changed in the rendering no longer matches.
TEST(CliFlags, RefusedLlamaFlagsDocTableIsTheCliTable) {
    const std::string doc =
        doc_block("docs/cli.md", "<!-- llama-refused:begin -->", "<!-- llama-refused:end -->");
    const std::string md = moestream::cli::refused_flags_markdown();
    EXPECT_EQ(doc, md) << "paste between the docs/cli.md markers:\n" << md;
    std::string changed = md;
    changed.replace(changed.find("CPU only"), 3, "cpu");
    EXPECT_NE(doc, changed);
}

// -ngl (any count) is accepted with one line saying the build is CPU only, and the run goes
// on; -fa reaches llama.cpp (the settings say which); --log-disable silences the line.
TEST(CliFlags, GpuLayersAcceptedWithOneLineAndFlashAttnPassedOn) {
    CmdResult r;
    json j = run_stats("-p Hi -n 1 -ngl 99 -fa off --no-warmup", &r);
    ASSERT_FALSE(j.is_null());
    EXPECT_NE(r.err.find("-ngl 99: this build computes on the CPU (GPU layers: none)"), std::string::npos)
        << r.err;
    EXPECT_EQ(j["settings"]["flash_attn"], "off");
    json on = run_stats("-p Hi -n 1 --flash-attn on");
    ASSERT_FALSE(on.is_null());
    EXPECT_EQ(on["settings"]["flash_attn"], "on");
    CmdResult q;
    json d = run_stats("-p Hi -n 1 --n-gpu-layers 0 --log-disable", &q);
    ASSERT_FALSE(d.is_null());
    EXPECT_EQ(d["settings"]["flash_attn"], "auto") << "control: llama.cpp's choice without -fa";
    EXPECT_EQ(q.err.find("GPU layers"), std::string::npos) << "--log-disable: " << q.err;
    expect_refused("run -m " + model() + " -fa maybe", "--flash-attn");
}

// The live prefill line (tokens done/total, tok/s, ETA) is drawn on a terminal only (util-linux
// `script` gives the run one), and --log-disable keeps it off there too.
// A command run under script(1) (stderr a terminal) shows every one of `lines`; with
// --log-disable, or with stderr a pipe, it shows no `quiet` text.
void expect_progress_on_a_terminal_only(const std::string & cmd, const std::vector<std::string> & lines,
                                        const std::string & quiet_text) {
    CmdResult tty = run_cmd("script -qec " + sh_quote(cmd) + " /dev/null");
    EXPECT_EQ(tty.exit_code, 0) << tty.out << tty.err;
    for (const std::string & l : lines) EXPECT_NE(tty.out.find(l), std::string::npos) << l << "\n" << tty.out;
    CmdResult quiet = run_cmd("script -qec " + sh_quote(cmd + " --log-disable") + " /dev/null");
    EXPECT_EQ(quiet.exit_code, 0) << quiet.out;
    EXPECT_EQ(quiet.out.find(quiet_text), std::string::npos) << quiet.out;
    CmdResult pipe = run_cmd(cmd);  // stderr is a pipe here
    EXPECT_EQ(pipe.exit_code, 0) << pipe.err;
    EXPECT_EQ(pipe.err.find(quiet_text), std::string::npos) << pipe.err;
}

TEST(CliFlags, PrefillProgressLineOnATerminalOnly) {
    TempDir dir("progress");
    std::string prompt;
    for (int i = 0; i < 60; ++i) prompt += "word ";
    ASSERT_TRUE(write_bytes(dir.path("p.txt"), prompt));
    const std::string run = sh_quote(cli_bin()) + " run -m " + model() + " -t 1 -c 512 -b 16 -n 1 -f " +
                            sh_quote(dir.path("p.txt"));
    expect_progress_on_a_terminal_only(run, {"moestream: prefill 16/300 tokens | ", " tok/s | ETA "},
                                       "moestream: prefill 16/");
}

// While the engine opens, a live line of the dense weights read (MiB done of the total) on a
// terminal only. Controls: --log-disable and a pipe show no such line.
TEST(CliFlags, LoadProgressLineOnATerminalOnly) {
    const std::string run = sh_quote(cli_bin()) + " run -m " + model() + " -t 1 -c 64 -n 1 -p Hi";
    expect_progress_on_a_terminal_only(run, {"moestream: load 0/", " MiB | "}, "moestream: load ");
}

// --color (llama.cpp's -co): on a terminal, run --display-prompt shows the prompt in its own
// colour, reset before the generated text; the bare flag is on (even under NO_COLOR). Controls:
// a pipe, --color off and NO_COLOR under auto show no colour.
TEST(CliFlags, ColorColoursTheDisplayedPromptOnATerminalOnly) {
    const std::string run = sh_quote(cli_bin()) + " run -m " + model() + " -t 1 -c 64 -n 2 -p Hello --display-prompt";
    const std::string coloured = "\033[33mHello\033[0m";
    auto tty = [](const std::string & cmd) { return run_cmd("script -qec " + sh_quote(cmd) + " /dev/null"); };
    const CmdResult on = tty(run);  // auto (the default), on a terminal
    EXPECT_EQ(on.exit_code, 0) << on.out;
    EXPECT_NE(on.out.find(coloured), std::string::npos) << on.out;
    const CmdResult bare = tty("NO_COLOR=1 " + run + " --color");
    EXPECT_NE(bare.out.find(coloured), std::string::npos) << "the bare flag is on: " << bare.out;
    const CmdResult off = tty(run + " -co off");
    EXPECT_EQ(off.exit_code, 0) << off.out;
    EXPECT_NE(off.out.find("Hello"), std::string::npos) << off.out;
    EXPECT_EQ(off.out.find("\033[33m"), std::string::npos) << off.out;
    const CmdResult no_color = tty("NO_COLOR=1 " + run);
    EXPECT_EQ(no_color.out.find("\033[33m"), std::string::npos) << no_color.out;
    const CmdResult pipe = run_cmd(run + " --color on");  // stdout a pipe
    EXPECT_EQ(pipe.exit_code, 0) << pipe.err;
    EXPECT_EQ(pipe.out.rfind("Hello", 0), 0u) << pipe.out;
    EXPECT_EQ(pipe.out.find("\033["), std::string::npos) << pipe.out;
    expect_refused("run -m " + model() + " --color maybe", "--color");
}

// eval draws a live line of positions scored, for the reference pass and the scored run, on a
// terminal only. Controls: --log-disable and a pipe show no such line.
TEST(CliFlags, EvalProgressLineOnATerminalOnly) {
    TempDir dir("evalprogress");
    std::string text;
    for (int i = 0; i < 60; ++i) text += "word ";
    ASSERT_TRUE(write_bytes(dir.path("t.txt"), text));
    const std::string ev = sh_quote(cli_bin()) + " eval -m " + model() + " -t 1 --bootstrap 200 -f " +
                           sh_quote(dir.path("t.txt"));
    expect_progress_on_a_terminal_only(
        ev, {"moestream: eval: reference 1/", "moestream: eval 1/", " positions/s | ETA "},
        "moestream: eval");
}

// --help says what the code does: serve's drop-cold default is the app's 0.75 (not run's 0), a
// required option shows no default, usage lines name the program.
TEST(CliFlags, HelpShowsTheDefaultsTheCodeUses) {
    CmdResult serve = cli("serve --help");
    EXPECT_NE(serve.out.find("--drop-cold-experts FLOAT:(0, 1]=0.75 (the app default"), std::string::npos) << serve.out;
    CmdResult run = cli("run --help");
    EXPECT_NE(run.out.find("--drop-cold-experts FLOAT:(0, 1]=0\n"), std::string::npos) << "control: run's is 0";
    CmdResult synth = cli("synth --help");
    EXPECT_NE(synth.out.find("Usage: moestream synth [OPTIONS]"), std::string::npos) << synth.out;
    EXPECT_EQ(synth.out.find("=tiny REQUIRED"), std::string::npos) << synth.out;
    EXPECT_NE(run.out.find("takes at most 1/4 of the memory"), std::string::npos) << run.out;
}

TEST(CliFlags, LlamaCppSpellingsOfMoestreamOptionsTakeEffect) {
    json j = run_stats("-p Hi -n 2 -tb 1 -ub 8 -b 16 -c 64 -s 5 --temp 0.7 --top-k 4 --top-p 0.9 "
                       "--ctx-size 64 --batch-size 16 --threads 1 --seed 9 -s 5");
    ASSERT_FALSE(j.is_null());
    const json & s = j["settings"];
    EXPECT_EQ(s["n_threads_batch"], 1);
    EXPECT_EQ(s["n_ubatch"], 8);
    EXPECT_EQ(s["n_batch"], 16);
    EXPECT_EQ(s["n_ctx"], 64);
    EXPECT_EQ(s["n_ctx_reason"], "requested");
    EXPECT_EQ(s["seed"], 5);
    // Control: -ub above -b is capped at -b, not taken as given.
    json c = run_stats("-p Hi -n 1 -b 16 -ub 64");
    ASSERT_FALSE(c.is_null());
    EXPECT_EQ(c["settings"]["n_ubatch"], 16);
}

TEST(CliFlags, ParseErrorsAreOneReadableLine) {
    const std::string m = " -m " + model();
    expect_refused("run" + m + " --drop-cold-experts 0", "--drop-cold-experts: 0 is not in (0, 1]");
    expect_refused("run" + m + " -t 0", "--threads: 0 is not in 1..512");
    expect_refused("run" + m + " -n -2", "--n-predict: -2 is not in -1..");
    expect_refused("run" + m + " -c 8", "--ctx-size: 8 is not in 16..");
    expect_refused("run" + m + " --seed -2", "--seed: -2 is not in 0..4294967295 (or -1: random)");
    expect_refused("run" + m + " --seed x", "--seed: 'x' is not a whole number");
    CmdResult r = cli("run" + m + " --drop-cold-experts 0");
    EXPECT_EQ(r.err.find("0.000000"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("see `moestream run --help`"), std::string::npos) << r.err;
    expect_refused("foo", "unknown subcommand 'foo'");
    // Control: a known subcommand's --help exits 0 and does list its options.
    r = cli("inspect --help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--model"), std::string::npos);
}

TEST(CliFlags, HelpShowsDefaultsAndVersionPrints) {
    CmdResult h = cli("run --help");
    ASSERT_EQ(h.exit_code, 0);
    for (const char * d : {"--batch INT:0..65536=0", "--cache-mb auto|INT:0..1099511627776=auto",
                           "--n-predict INT:-1..16777216=64", "--ctx-size INT:16..4194304|0=0", "--io-threads INT:1..64=4"})
        EXPECT_NE(h.out.find(d), std::string::npos) << d << "\n" << h.out;
    // -t's default is this machine's, and a run without -t uses what --help says.
    const size_t at = h.out.find("--threads INT:1..512=");
    ASSERT_NE(at, std::string::npos);
    const int shown = std::stoi(h.out.substr(at + 21));
    EXPECT_GE(shown, 1);
    CmdResult r;
    const std::string path = "/tmp/moestream-cliflags-t-" + std::to_string(getpid()) + ".json";
    r = cli("run -m " + model() + " -p Hi -n 1 --stats-json " + path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream f(path);
    json j = json::parse(f);
    std::remove(path.c_str());
    EXPECT_EQ(j["settings"]["n_threads"], shown);
    // -c 0 (the default) takes the model's context and says so.
    EXPECT_NE(j["settings"]["n_ctx_reason"].get<std::string>().find("the model's"), std::string::npos);
    CmdResult v = cli("--version");
    EXPECT_EQ(v.exit_code, 0);
    EXPECT_EQ(v.out.rfind("moestream ", 0), 0u) << v.out;
}

TEST(CliFlags, NPredictMinusOneFillsTheContext) {
    json j = run_stats("-p Hi -n -1 -c 32");
    ASSERT_FALSE(j.is_null());
    EXPECT_EQ(j["n_prompt"].get<int>() + j["n_generated"].get<int>(), 32);
    // Control: -n 5 stops at 5.
    json c = run_stats("-p Hi -n 5 -c 32");
    ASSERT_FALSE(c.is_null());
    EXPECT_EQ(c["n_generated"], 5);
}

TEST(CliFlags, PromptFromStdinEscapesAndEcho) {
    CmdResult a, b;
    json p = run_stats("-p 'one two' -n 4", &a);
    json f = run_stats("-f - -n 4", &b, "printf 'one two' | ");
    ASSERT_FALSE(p.is_null());
    ASSERT_FALSE(f.is_null());
    EXPECT_EQ(p["tokens"], f["tokens"]);
    EXPECT_EQ(p["n_prompt"], f["n_prompt"]);
    // Empty stdin is a bad input (3), named.
    CmdResult e = run_cmd("printf '' | " + sh_quote(cli_bin()) + " run -m " + model() + " -f -");
    EXPECT_EQ(e.exit_code, 3);
    EXPECT_NE(e.err.find("standard input: the prompt file is empty"), std::string::npos) << e.err;

    // -e (the default) turns \n into a newline; --no-escape keeps the backslash.
    json esc = run_stats("-p 'a\\nb' -n 1");
    json lit = run_stats("-p 'a\\nb' -n 1 --no-escape");
    json nl = run_stats("-f - -n 1", nullptr, "printf 'a\\nb' | ");
    ASSERT_FALSE(esc.is_null());
    ASSERT_FALSE(lit.is_null());
    ASSERT_FALSE(nl.is_null());
    EXPECT_EQ(esc["n_prompt"], nl["n_prompt"]);
    EXPECT_NE(esc["n_prompt"], lit["n_prompt"]);

    CmdResult shown, plain;
    run_stats("-p 'Echo me' -n 2 --display-prompt", &shown);
    run_stats("-p 'Echo me' -n 2", &plain);
    EXPECT_EQ(shown.out.rfind("Echo me", 0), 0u) << shown.out;
    EXPECT_NE(plain.out.rfind("Echo me", 0), 0u) << plain.out;
    EXPECT_EQ(shown.out.substr(7), plain.out);

    // No -p: the prompt used is said.
    CmdResult none;
    run_stats("-n 1", &none);
    EXPECT_NE(none.err.find("no -p or -f given: the prompt is \"Once upon a time\""), std::string::npos)
        << none.err;
}

TEST(CliFlags, SeedMinusOneIsRandomAndPrinted) {
    CmdResult r;
    json j = run_stats("-p Hi -n 2 --temp 1 --seed -1", &r);
    ASSERT_FALSE(j.is_null());
    const size_t at = r.err.find("--seed -1: random seed ");
    ASSERT_NE(at, std::string::npos) << r.err;
    EXPECT_EQ(j["settings"]["seed"].get<uint64_t>(), std::stoull(r.err.substr(at + 23)));
    // The printed seed reproduces the run.
    json again = run_stats("-p Hi -n 2 --temp 1 --seed " + std::to_string(j["settings"]["seed"].get<uint64_t>()));
    ASSERT_FALSE(again.is_null());
    EXPECT_EQ(again["tokens"], j["tokens"]);
}

TEST(CliFlags, SamplingFlagsThatGreedyWouldIgnoreAreRefused) {
    const std::string m = " -m " + model();
    expect_refused("run" + m + " --top-k 5", "--top-k shapes sampling, and --temp 0");
    expect_refused("run" + m + " --top-p 0.5", "--top-p shapes sampling, and --temp 0");
    // Control: with a temperature they apply; top-k 1 is greedy whatever the seed.
    json g = run_stats("-p Hi -n 6");
    json k1 = run_stats("-p Hi -n 6 --temp 5 --top-k 1 --seed 3");
    ASSERT_FALSE(g.is_null());
    ASSERT_FALSE(k1.is_null());
    EXPECT_EQ(g["tokens"], k1["tokens"]);
    json hot = run_stats("-p Hi -n 6 --temp 5 --seed 3");
    ASSERT_FALSE(hot.is_null());
    EXPECT_NE(g["tokens"], hot["tokens"]);
}

}  // namespace

// --- Nothing silently ignored: a combination that makes a flag ineffective is refused by name.

TEST(CliIgnored, PrefetchThatCouldNotRunIsRefused) {
    const std::string m = " -m " + model() + " -p Hi -n 2";
    expect_refused("run" + m + " --prefetch --cache-mb 100000 --io-threads 1", "--prefetch needs a worker lane");
    expect_refused("run" + m + " --prefetch --cache-mb 4 --force-cache --drop-cold-experts 0.5",
                   "--prefetch and --drop-cold-experts exclude each other");
    // Control: with the cache and two lanes it runs, and is on.
    json j = run_stats("-p Hi -n 4 --prefetch --cache-mb 100000 --io-threads 2");
    ASSERT_FALSE(j.is_null());
    EXPECT_TRUE(j["prefetch"].get<bool>());
}

// With the cache off, --prefetch reads into a second set of expert slots: it runs, and is on.
TEST(CliIgnored, PrefetchWithTheCacheOffRuns) {
    json j = run_stats("-p Hi -n 4 --prefetch --cache-mb 0 --io-threads 2");
    ASSERT_FALSE(j.is_null());
    EXPECT_TRUE(j["prefetch"].get<bool>());
    EXPECT_GT(j["prefetch_predictions"].get<uint64_t>(), 0u);
    // Control: without the flag it is off.
    json off = run_stats("-p Hi -n 4 --cache-mb 0 --io-threads 2");
    ASSERT_FALSE(off.is_null());
    EXPECT_FALSE(off["prefetch"].get<bool>());
}

TEST(CliIgnored, StreamingFlagsWithNoStreamAreRefused) {
    const std::string m = " -m " + model() + " -p Hi -n 2 --no-stream";
    expect_refused("run" + m + " --cache-mb 4 --force-cache", "--cache-mb applies to streaming; remove --no-stream");
    expect_refused("run" + m + " --io-threads 2", "--io-threads applies to streaming");
    expect_refused("run" + m + " --prefetch", "--prefetch applies to streaming");
    json j = run_stats("-p Hi -n 2 --no-stream");  // control
    ASSERT_FALSE(j.is_null());
    EXPECT_FALSE(j["settings"]["stream"].get<bool>());
}

TEST(CliIgnored, EvalRefusesSamplingAndBatchFlags) {
    const std::string text = "/tmp/moestream-cliflags-text-" + std::to_string(getpid()) + ".txt";
    { std::ofstream(text) << "The quick brown fox jumps over the lazy dog again and again."; }
    const std::string e = "eval -m " + model() + " -f " + text + " --max-tokens 8 --bootstrap 100";
    expect_refused(e + " --temp 0.5", "--temp has no effect on eval");
    expect_refused(e + " --seed 3", "--seed has no effect on eval");
    expect_refused(e + " -b 8", "--batch-size has no effect on eval");
    CmdResult ok = cli(e);  // control
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    std::remove(text.c_str());
}

TEST(CliIgnored, ReplayRefusesSweepFlagsItWouldIgnoreAndEmptyListItems) {
    const std::string trace = "/tmp/moestream-cliflags-" + std::to_string(getpid()) + ".trace";
    CmdResult rec = cli("run -m " + model() + " -p Hi -n 8 --cache-mb 4 --force-cache --route-trace " + trace);
    ASSERT_EQ(rec.exit_code, 0) << rec.err;
    expect_refused("replay " + trace + " --validate --budgets 8", "--budgets has no effect with --validate");
    expect_refused("replay " + trace + " --routing-stats --budgets 8", "--budgets has no effect with --routing-stats");
    expect_refused("replay " + trace + " --budgets 4,,8", "--budgets: empty item in '4,,8'");
    expect_refused("replay " + trace + " --budgets 4,", "--budgets: empty item in '4,'");
    expect_refused("replay " + trace + " --drop-cold 2", "--drop-cold: '2' is not in [0, 1]");
    // Controls: the same flags alone run.
    EXPECT_EQ(cli("replay " + trace + " --budgets 4,8").exit_code, 0);
    EXPECT_EQ(cli("replay " + trace + " --validate").exit_code, 0);
    EXPECT_EQ(cli("replay " + trace + " --routing-stats").exit_code, 0);
    std::remove(trace.c_str());
}

// --- The sampler's options (penalties, min-p, ignore-eos, reverse prompts) take effect.

TEST(CliSampling, PenaltiesChangeARepetitiveGreedyRun) {
    json plain = run_stats("-p Hi -n 48");
    ASSERT_FALSE(plain.is_null());
    auto distinct = [](const json & j) {
        std::vector<int> t = j["tokens"].get<std::vector<int>>();
        std::sort(t.begin(), t.end());
        return size_t(std::unique(t.begin(), t.end()) - t.begin());
    };
    // The control: greedy on this model repeats tokens, so a penalty has something to change.
    ASSERT_LT(distinct(plain), 48u);
    for (const char * fl : {"--repeat-penalty 1.5", "--presence-penalty 1.5", "--frequency-penalty 1"}) {
        json j = run_stats(std::string("-p Hi -n 48 ") + fl);
        ASSERT_FALSE(j.is_null()) << fl;
        EXPECT_GT(distinct(j), distinct(plain)) << fl;
    }
    // --repeat-last-n 0 turns the penalties off: the plain run again.
    json off = run_stats("-p Hi -n 48 --repeat-penalty 1.5 --repeat-last-n 0");
    ASSERT_FALSE(off.is_null());
    EXPECT_EQ(off["tokens"], plain["tokens"]);
    expect_refused("run -m " + model() + " --min-p 0.1", "--min-p shapes sampling, and --temp 0");
    expect_refused("run -m " + model() + " --repeat-penalty 0", "--repeat-penalty: 0 is not in (0, 100]");
    json hot = run_stats("-p Hi -n 8 --temp 0.8 --min-p 1 --seed 2");  // min-p 1: the likeliest only
    json g = run_stats("-p Hi -n 8");
    ASSERT_FALSE(hot.is_null());
    EXPECT_EQ(hot["tokens"], g["tokens"]);
    json ie = run_stats("-p Hi -n -1 -c 48 --ignore-eos");
    ASSERT_FALSE(ie.is_null());
    EXPECT_EQ(ie["n_prompt"].get<int>() + ie["n_generated"].get<int>(), 48);
}

TEST(CliSampling, ReversePromptStopsBeforeItAndIsNotPrinted) {
    CmdResult full, cut, lit;
    json f = run_stats("-p Hi -n 24", &full);
    ASSERT_FALSE(f.is_null());
    const std::string text = f["text"].get<std::string>();
    const size_t nl = text.find('\n');
    ASSERT_NE(nl, std::string::npos) << "the control needs a newline in the greedy text";
    // -r '\n' (an escape, processed by default): the text ends before the first newline.
    json c = run_stats("-p Hi -n 24 -r '\\n'", &cut);
    ASSERT_FALSE(c.is_null());
    EXPECT_EQ(c["text"].get<std::string>(), text.substr(0, nl));
    EXPECT_LT(c["n_generated"].get<int>(), f["n_generated"].get<int>());
    // --no-escape: a literal backslash-n, which the text does not contain: the full run.
    json l = run_stats("-p Hi -n 24 --no-escape -r '\\n'", &lit);
    ASSERT_FALSE(l.is_null());
    EXPECT_EQ(l["text"], f["text"]);
    // Several -r: the earliest match ends it.
    json two = run_stats("-p Hi -n 24 -r 'not in the text at all' -r '\\n'");
    ASSERT_FALSE(two.is_null());
    EXPECT_EQ(two["text"].get<std::string>(), text.substr(0, nl));
}

// --- Outputs are checked before any work; an output that cannot be written exits 3 everywhere.

TEST(CliOutputs, UnwritableOutputsStopEverySubcommandBeforeWork) {
    const std::string m = model();
    struct Case {
        std::string args, msg;
    };
    const std::string trace = "/tmp/moestream-cliflags-out-" + std::to_string(getpid()) + ".trace";
    ASSERT_EQ(cli("run -m " + m + " -p Hi -n 4 --cache-mb 4 --force-cache --route-trace " + trace).exit_code, 0);
    const std::string text = "/tmp/moestream-cliflags-out-" + std::to_string(getpid()) + ".txt";
    { std::ofstream(text) << "One two three four five six seven eight nine ten."; }
    const std::vector<Case> cases = {
        {"run -m " + m + " -p Hi --stats-json /nonexistent/x.json",
         "--stats-json /nonexistent/x.json: the directory /nonexistent does not exist"},
        {"run -m " + m + " -p Hi --stats-csv /tmp", "--stats-csv: '/tmp' exists and is a directory"},
        {"run -m " + m + " -p Hi --dump-logits /nonexistent/l.bin", "--dump-logits /nonexistent/l.bin"},
        {"eval -m " + m + " -f " + text + " --save-ref /nonexistent/r.ref", "--save-ref /nonexistent/r.ref"},
        {"synth --preset tiny -o /nonexistent/m.gguf", "-o /nonexistent/m.gguf"},
        {"replay " + trace + " --plot /nonexistent/p.png", "--plot /nonexistent/p.png"},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(c.args);
        CmdResult r = cli(c.args);
        EXPECT_EQ(r.exit_code, 3) << r.err;
        EXPECT_NE(r.err.find(c.msg), std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");                                            // nothing ran
        EXPECT_EQ(r.err.find("model ready"), std::string::npos) << r.err;  // nor loaded
    }
    // Two flags naming one file would overwrite each other.
    expect_refused("run -m " + m + " -p Hi --stats-json /tmp/same.json --stats-csv /tmp/same.json",
                   "the same file is named by two output flags");
    // Control: writable paths run and are written.
    const std::string js = "/tmp/moestream-cliflags-out-" + std::to_string(getpid()) + ".json";
    CmdResult ok = cli("run -m " + m + " -p Hi -n 2 --stats-json " + js);
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_TRUE(std::ifstream(js).good());
    std::remove(js.c_str());
    std::remove(trace.c_str());
    std::remove(text.c_str());
}

// An output flag naming an input (the model, a shard of its set, the prompt or text file, the
// reference, the trace), directly, through a symbolic link or a hard link: exit 3 before any
// work, every input byte for byte unchanged (the model was overwritten and the run exited 0).
TEST(CliOutputs, OutputNamingAnInputIsRefusedAndEveryInputUnchanged) {
    TempDir dir("cliflags-in");
    const std::string m = dir.path("m.gguf"), p = dir.path("p.txt"), t = dir.path("t.trace");
    const std::string s1 = dir.path("s-00001-of-00002.gguf"), s2 = dir.path("s-00002-of-00002.gguf");
    const std::string model_bytes = slurp(synth_model("tiny", "qwen3moe", "q8_0"));
    ASSERT_FALSE(model_bytes.empty());
    for (const std::string & f : {m, s1, s2}) ASSERT_TRUE(write_bytes(f, model_bytes));
    ASSERT_TRUE(write_bytes(p, "One two three four five six seven eight nine ten."));
    ASSERT_EQ(cli("run -m " + sh_quote(m) + " -p Hi -n 2 --route-trace " + sh_quote(t)).exit_code, 0);
    ASSERT_EQ(::symlink(m.c_str(), dir.path("link").c_str()), 0);
    ASSERT_EQ(::link(m.c_str(), dir.path("hard").c_str()), 0);
    const std::vector<std::string> inputs = {m, s1, s2, p, t};
    std::vector<std::string> before;
    for (const std::string & f : inputs) before.push_back(slurp(f));
    const std::string q = sh_quote(m);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"run -m " + q + " -p Hi -n 2 --stats-json " + q, "--stats-json " + m + ": is the input -m"},
        {"run -m " + q + " -p Hi -n 2 --stats-csv " + sh_quote(dir.path("link")), "--stats-csv"},
        {"run -m " + q + " -p Hi -n 2 --dump-logits " + sh_quote(dir.path("hard")), "--dump-logits"},
        {"run -m " + q + " -p Hi -n 2 --route-trace " + q, "--route-trace"},
        {"run -m " + q + " -f " + sh_quote(p) + " -n 2 --stats-json " + sh_quote(p), "is the input -f"},
        {"run -m " + sh_quote(s1) + " -p Hi -n 2 --stats-json " + sh_quote(s2), "is the input -m (shard 2)"},
        {"eval -m " + q + " -f " + sh_quote(p) + " --save-ref " + q, "--save-ref"},
        {"eval -m " + q + " -f " + sh_quote(p) + " --route-trace " + sh_quote(p), "is the input -f"},
        {"replay " + sh_quote(t) + " --plot " + sh_quote(t), "is the input the trace"},
    };
    for (const auto & [args, msg] : cases) {
        SCOPED_TRACE(args);
        CmdResult r = cli(args);
        EXPECT_EQ(r.exit_code, 3) << r.err;
        EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("refusing to overwrite an input"), std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");
        for (size_t i = 0; i < inputs.size(); ++i) EXPECT_TRUE(slurp(inputs[i]) == before[i]) << inputs[i];
    }
    // Control: another path in the same directory is written.
    CmdResult ok = cli("run -m " + q + " -p Hi -n 2 --stats-json " + sh_quote(dir.path("s.json")));
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_FALSE(slurp(dir.path("s.json")).empty());
}

// Under a file size limit (prlimit --fsize) SIGXFSZ killed run with its temporary file left
// and partial --stats-csv files: now every output fails cleanly — the old file unchanged, no
// temporary file — with exit 3, and the route trace (whose failure never stops inference) is
// dropped with its warning, exit 0. Control: the same runs without the limit write them.
TEST(CliOutputs, FileSizeLimitLeavesNoPartOfAnOutputAndNoTemporaryFile) {
    TempDir dir("cliflags-fsize");
    const std::string run = sh_quote(cli_bin()) + " run -m " + model() +
                            " -p Hi -n 48 --ignore-eos --cache-mb 0 -t 1 ";
    const std::string limit = "prlimit --fsize=1024 -- ";
    auto temps = [&] {
        int n = 0;
        for (const auto & e : std::filesystem::directory_iterator(dir.dir()))
            n += e.path().filename().string().find(".tmp.") != std::string::npos;
        return n;
    };
    for (const char * flag : {"--stats-csv", "--stats-json", "--dump-logits"}) {
        SCOPED_TRACE(flag);
        const std::string out = dir.path("out");
        ASSERT_TRUE(write_bytes(out, "old\n"));
        CmdResult r = run_cmd(limit + run + flag + " " + sh_quote(out));
        EXPECT_EQ(r.exit_code, 3) << r.err;
        EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
        EXPECT_EQ(slurp(out), "old\n");
        EXPECT_EQ(temps(), 0);
        CmdResult ok = run_cmd(run + flag + " " + sh_quote(out));  // control
        EXPECT_EQ(ok.exit_code, 0) << ok.err;
        EXPECT_GT(slurp(out).size(), 1024u);
    }
    const std::string trace = dir.path("t.trace");
    CmdResult r = run_cmd(limit + run + "--route-trace " + sh_quote(trace));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("tracing is off, inference continues"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(trace));
    EXPECT_EQ(temps(), 0);
}

// --- Ctrl-C during run: the summary of what ran, the outputs written, exit 130.

TEST(CliInterrupt, CtrlCDuringRunPrintsTheSummaryAndExits130) {
    const std::string js = "/tmp/moestream-cliflags-int-" + std::to_string(getpid()) + ".json";
    // The SIGINT goes when the first generated byte reaches stdout (the prompt is not shown),
    // not after a fixed sleep: on a loaded machine the model may still be loading after any
    // fixed time. stdout goes on being read, so the run never sees a closed pipe.
    TempDir dir("cliflags-int");
    const std::string out = sh_quote(dir.path("out.fifo"));
    CmdResult r = run_cmd("mkfifo " + out + " && { " + sh_quote(cli_bin()) + " run -m " + model() +
                          " -p Hi -n -1 -c 16384 --ignore-eos -t 1 --stats-json " + js + " > " +
                          out + " & pid=$!; { head -c 1 && kill -INT $pid && cat; } < " + out +
                          " > /dev/null; wait $pid; }");
    EXPECT_EQ(r.exit_code, 130) << r.err;
    EXPECT_NE(r.err.find("interrupted (Ctrl-C) after"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("decode "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("lossless"), std::string::npos) << r.err;
    std::ifstream f(js);
    ASSERT_TRUE(f.good()) << "--stats-json not written after Ctrl-C";
    json j = json::parse(f);
    std::remove(js.c_str());
    // It stopped mid-generation (the control: the run was not already over).
    EXPECT_GT(j["n_generated"].get<int>(), 0);
    EXPECT_LT(j["n_prompt"].get<int>() + j["n_generated"].get<int>(), 16384);
    // Without the signal the same command ends normally.
    CmdResult ok = cli("run -m " + model() + " -p Hi -n 8 --ignore-eos -t 1");
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_EQ(ok.err.find("interrupted"), std::string::npos);
}

// --- synth: no silent overwrite, --dry-run without -o, both spellings of a type.

TEST(CliSynth, RefusesOverwriteDryRunNeedsNoOutputTypeSpellings) {
    const std::string dir = "/tmp/moestream-cliflags-synth-" + std::to_string(getpid());
    ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
    const std::string a = dir + "/a.gguf", b = dir + "/b.gguf";
    ASSERT_EQ(cli("synth --preset tiny --type q4_k -o " + a).exit_code, 0);
    CmdResult again = cli("synth --preset tiny --type q4_k --seed 2 -o " + a);
    EXPECT_EQ(again.exit_code, 64) << again.err;
    EXPECT_NE(again.err.find("-o " + a + " exists; add --force to overwrite it"), std::string::npos) << again.err;
    // q4_K (inspect's spelling) is q4_k: the same bytes.
    ASSERT_EQ(cli("synth --preset tiny --type q4_K -o " + b).exit_code, 0) << "q4_K refused";
    EXPECT_EQ(run_cmd("cmp " + a + " " + b).exit_code, 0) << "a was overwritten, or q4_K differs";
    // --force overwrites (seed 2 gives other bytes).
    ASSERT_EQ(cli("synth --preset tiny --type q4_k --seed 2 --force -o " + a).exit_code, 0);
    EXPECT_NE(run_cmd("cmp -s " + a + " " + b).exit_code, 0);
    // --dry-run plans without -o, writes nothing.
    CmdResult dry = cli("synth --preset tiny --dry-run");
    EXPECT_EQ(dry.exit_code, 0) << dry.err;
    EXPECT_NE(dry.out.find("dry run: "), std::string::npos) << dry.out;
    expect_refused("synth --preset tiny --dry-run --force", "--force has no effect with --dry-run");
    expect_refused("synth --preset tiny", "-o FILE is required (or --dry-run to plan only)");
    std::system(("rm -rf " + dir).c_str());
}

// --- eval names the lossy knobs and prices the reads: both MiB/token figures and the avoided.

TEST(CliEval, NamesTheKnobsAndBothReadFigures) {
    const std::string text = "/tmp/moestream-cliflags-eval-" + std::to_string(getpid()) + ".txt";
    { std::ofstream(text) << "It was the best of times, it was the worst of times, it was the age "
                             "of wisdom, it was the age of foolishness, it was the epoch of belief."; }
    const std::string e = "eval -m " + model() + " -f " + text + " --max-tokens 32 --bootstrap 100 -t 1 ";
    CmdResult lossy = cli(e + "--cache-mb 8 --drop-cold-experts 0.5 --drop-renorm --n-expert-used 3");
    ASSERT_EQ(lossy.exit_code, 0) << lossy.err;
    EXPECT_NE(lossy.out.find("LOSSY: --n-expert-used 3 (the model's 4) --drop-cold-experts 0.5 --drop-renorm"),
              std::string::npos) << lossy.out;
    EXPECT_NE(lossy.out.find("MiB/token (reference "), std::string::npos) << lossy.out;
    EXPECT_NE(lossy.out.find("MiB/token avoided ("), std::string::npos) << lossy.out;
    CmdResult js = cli(e + "--cache-mb 8 --drop-cold-experts 0.5 --json");
    ASSERT_EQ(js.exit_code, 0) << js.err;
    const json j = json::parse(js.out);
    EXPECT_NEAR(j["bytes_per_token_avoided"].get<double>(),
                j["reference"]["bytes_per_token"].get<double>() - j["bytes_per_token"].get<double>(), 1e-6);
    // Control: lossless settings name no knob.
    CmdResult ll = cli(e + "--cache-mb 8");
    ASSERT_EQ(ll.exit_code, 0) << ll.err;
    EXPECT_NE(ll.out.find("lossless settings"), std::string::npos) << ll.out;
    EXPECT_EQ(ll.out.find("LOSSY"), std::string::npos) << ll.out;
    std::remove(text.c_str());
}

// --- The README's reference comparison: `run -p Hello` and llama-completion (through
// scripts/llama-tool, which loads moestream's CPU backend, with --no-repack) print the same text.

TEST(CliReference, RunAndLlamaCompletionGiveTheSameText) {
    const std::string m = sh_quote(synth_model("tiny", "qwen3moe", "q4_k"));
    const std::string unpinned = "env -u GGML_BACKEND_PATH MOESTREAM_BIN=" + sh_quote(cli_bin());
    const std::string llama = "-m " + m + " -p Hello -n 32 --temp 0 -no-cnv --no-display-prompt -fit off";
    TempDir dir("cliref");
    CmdResult ours = run_cmd(unpinned + " " + sh_quote(cli_bin()) + " run -m " + m +
                             " -p Hello -n 32 --stats-json " + sh_quote(dir.path("s.json")));
    ASSERT_EQ(ours.exit_code, 0) << ours.err;
    const json st = json::parse(slurp(dir.path("s.json")));
    const int n_prompt = st["n_prompt"].get<int>();
    const std::vector<int32_t> tokens = st["tokens"].get<std::vector<int32_t>>();
    // The ids come from llama-completion's session file, not its stdout (docs/reliability.md).
    LlamaCompletionIds ref = llama_completion_ids(llama + " --no-repack", unpinned);
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    EXPECT_TRUE(same_generation(ref.ids, n_prompt, tokens));
    // Controls: where moestream's backend is not the conservative haswell pin, the pin gives
    // other ids, and so does repacking (both are what the comparison has to rule out).
    CmdResult ver = run_cmd(unpinned + " " + sh_quote(cli_bin()) + " --version");
    if (ver.out.find("libggml-cpu-haswell.so") == std::string::npos) {
        LlamaCompletionIds pinned = llama_completion_ids(
            llama + " --no-repack",
            "MOESTREAM_BIN=" + sh_quote(cli_bin()) + " GGML_BACKEND_PATH=$(" +
                sh_quote(std::string(MOESTREAM_TEST_SRC) + "/scripts/ggml-backend-path") + ")");
        ASSERT_EQ(pinned.exit_code, 0) << pinned.err;
        EXPECT_FALSE(same_generation(pinned.ids, n_prompt, tokens)) << "the haswell pin gave the same ids";
    }
    LlamaCompletionIds repacked = llama_completion_ids(llama, unpinned);
    ASSERT_EQ(repacked.exit_code, 0) << repacked.err;
    EXPECT_FALSE(same_generation(repacked.ids, n_prompt, tokens)) << "repacking changed nothing here";
}

// --- replay --plot errors: one line with the decoded exit code, never a raw wait status.

TEST(CliReplayPlot, PlotFailuresAreNamedWithTheirExitCode) {
    const std::string dir = "/tmp/moestream-cliflags-plot-" + std::to_string(getpid());
    ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
    const std::string trace = dir + "/t.trace", png = dir + "/p.png", fake = dir + "/fakepy";
    ASSERT_EQ(cli("run -m " + model() + " -p Hi -n 4 --cache-mb 4 --force-cache --route-trace " + trace).exit_code, 0);
    { std::ofstream(fake) << "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho 'ValueError: boom' >&2\nexit 3\n"; }
    ASSERT_EQ(std::system(("chmod +x " + fake).c_str()), 0);
    CmdResult missing = run_cmd("MOESTREAM_PYTHON=" + dir + "/nopython " + sh_quote(cli_bin()) +
                                " replay " + trace + " --budgets 4 --plot " + png);
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_NE(missing.err.find("--plot: " + dir + "/nopython not found"), std::string::npos) << missing.err;
    CmdResult failed = run_cmd("MOESTREAM_PYTHON=" + fake + " " + sh_quote(cli_bin()) + " replay " +
                               trace + " --budgets 4 --plot " + png);
    EXPECT_EQ(failed.exit_code, 1);
    EXPECT_NE(failed.err.find("the plot script failed (exit 3): ValueError: boom"), std::string::npos) << failed.err;
    EXPECT_EQ(failed.err.find("Traceback"), std::string::npos) << failed.err;
    EXPECT_EQ(failed.err.find("exit 768"), std::string::npos) << failed.err;  // 3 << 8, the raw status
    // Control: with a python that succeeds, replay exits 0.
    { std::ofstream(fake) << "#!/bin/sh\ntouch \"$3\"\n"; }
    CmdResult ok = run_cmd("MOESTREAM_PYTHON=" + fake + " " + sh_quote(cli_bin()) + " replay " + trace +
                           " --budgets 4 --plot " + png);
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    std::system(("rm -rf " + dir).c_str());
}

// The plot marks one token's working set and every expert: replay computes both from the
// trace's shapes, and they agree with inspect's figures for the traced model.
TEST(CliReplayPlot, MarkersAgreeWithInspect) {
    const std::string trace = "/tmp/moestream-cliflags-mark-" + std::to_string(getpid()) + ".trace";
    ASSERT_EQ(cli("run -m " + model() + " -p Hi -n 4 --cache-mb 8 --route-trace " + trace).exit_code, 0);
    CmdResult r = cli("replay " + trace + " --budgets 4 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json d = json::parse(r.out);
    const json m = json::parse(cli("inspect --json -m " + model()).out);
    EXPECT_NEAR(d["working_set_mib"].get<double>(),
                double(m["token_working_set_bytes"].get<uint64_t>()) / (1 << 20), 1e-9);
    EXPECT_NEAR(d["all_experts_mib"].get<double>(),
                double(m["expert_bytes_total"].get<uint64_t>()) / (1 << 20), 1e-9);
    std::remove(trace.c_str());
}

// --version after a subcommand's name (llama.cpp's habit) prints the version, exit 0, on every
// subcommand, before any required argument is asked for. Control: the same without --version
// asks for them.
TEST(CliFlags, VersionAfterAnySubcommandPrintsTheVersion) {
    const CmdResult top = cli("--version");
    ASSERT_EQ(top.exit_code, 0) << top.err;
    ASSERT_NE(top.out.find("moestream "), std::string::npos) << top.out;
    std::vector<std::string> subs = {"run", "inspect", "synth", "replay", "eval", "make-fallback"};
    // serve and chat where this build has them (the sanitizer builds leave them out).
    if (cli("serve --help").exit_code == 0) subs.insert(subs.end(), {"chat", "serve"});
    for (const std::string & sub : subs) {
        const CmdResult r = cli(sub + " --version");
        EXPECT_EQ(r.exit_code, 0) << sub << ": " << r.err;
        EXPECT_EQ(r.out, top.out) << sub;
    }
    const CmdResult control = cli("replay");
    EXPECT_NE(control.exit_code, 0);
    EXPECT_EQ(control.out.find("moestream 0"), std::string::npos) << control.out;
}
