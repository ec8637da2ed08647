// test_input_files.cpp — files the CLI reads and writes that are not what they claim:
// prompt/text files that are directories, devices or streams that never end (read_text_file,
// include/moestream/text_file.h), and output paths that are special files
// (docs/reliability.md, "Inputs that exhaust memory or hang", "Writers and special files").
// Every CLI run is under a 4 GiB address-space limit and a timeout, so a regression fails
// instead of exhausting the machine.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moestream/text_file.h"
#include "test_util.h"

using moestream::ErrorCode;
using moestream::read_text_file;
using moestream::Status;
using namespace moestream::test;

namespace {

std::string limited(const std::string & cmd) {
#if defined(__SANITIZE_ADDRESS__)
    return "timeout 120 " + cmd;  // ASan's shadow reserves terabytes of address space
#else
    return "timeout 120 prlimit --as=4294967296 " + cmd;
#endif
}

std::string tmp_path(const std::string & name) {
    return models_dir() + "/in-" + std::to_string(getpid()) + "-" + name;
}

// The temporary files ("NAME.tmp.PID", AtomicFile) next to this process's tmp_path() files.
std::vector<std::string> own_temp_files() {
    const std::string prefix = "in-" + std::to_string(getpid()) + "-";
    std::vector<std::string> v;
    for (const auto & e : std::filesystem::directory_iterator(models_dir())) {
        const std::string n = e.path().filename().string();
        if (n.rfind(prefix, 0) == 0 && n.find(".tmp.") != std::string::npos) v.push_back(n);
    }
    return v;
}

}  // namespace

// The reader: a regular file and stdin ("-") are read whole; a directory, an empty file and
// anything past the limit are refused naming the path; a device that never ends stops at the
// limit (+1 byte) with an error instead of growing.
TEST(TextFile, ReadsFilesAndStdinAndRefusesWhatIsNotText) {
    const std::string f = tmp_path("prompt.txt");
    {
        std::ofstream o(f, std::ios::binary);
        o << "Once upon a time\n";
    }
    std::string s;
    Status st = read_text_file(f, "prompt", &s);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(s, "Once upon a time\n");
    // Exactly at the limit: read; one byte more: refused.
    st = read_text_file(f, "prompt", &s, 17);
    EXPECT_TRUE(st.ok()) << st.message();
    st = read_text_file(f, "prompt", &s, 16);
    EXPECT_EQ(st.code(), ErrorCode::kBadInput);
    EXPECT_NE(st.message().find("the limit of a prompt file"), std::string::npos) << st.message();
    EXPECT_TRUE(s.empty());

    st = read_text_file("/dev/zero", "text", &s, 1 << 20);
    EXPECT_NE(st.message().find("/dev/zero: more than 1 MiB, the limit of a text file (a device"),
              std::string::npos)
        << st.message();
    st = read_text_file(models_dir(), "text", &s);
    EXPECT_NE(st.message().find(": is a directory, not a text file"), std::string::npos)
        << st.message();
    st = read_text_file("/dev/null", "prompt", &s);
    EXPECT_NE(st.message().find("/dev/null: the prompt file is empty"), std::string::npos)
        << st.message();
    st = read_text_file(f + ".missing", "prompt", &s);
    EXPECT_NE(st.message().find("cannot read the prompt file: No such file"), std::string::npos)
        << st.message();
    std::remove(f.c_str());
}

// Through the CLI: `run -f` and `eval -f` on /dev/zero, a directory, a FIFO fed by a writer
// that never stops, and stdin that never ends: exit 3 (bad input) with one error line, no
// OOM kill, no hang. Controls: the same prompt through "-" and through a file generates.
TEST(TextFile, RunAndEvalRefuseEndlessAndSpecialInputs) {
    setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string bin = sh_quote(cli_bin());
    const std::string fifo = tmp_path("endless.fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    const std::string dir = tmp_path("dir");
    std::filesystem::create_directory(dir);
    struct Case {
        std::string feed, file, expect;
    } cases[] = {
        {"", "/dev/zero", "/dev/zero: more than 64 MiB"},
        {"", dir, "is a directory"},
        {"(yes > " + sh_quote(fifo) + " 2>/dev/null &) ; ", fifo, "more than 64 MiB"},
        {"yes 2>/dev/null | ", "-", "standard input: more than 64 MiB"},
        {"", "/dev/null", "file is empty"},
    };
    for (const char * cmd : {"run", "eval"}) {
        for (const Case & c : cases) {
            SCOPED_TRACE(std::string(cmd) + " -f " + c.file);
            CmdResult r = run_cmd(c.feed + limited(bin + " " + cmd + " -m " + sh_quote(model) +
                                                   " -f " + sh_quote(c.file) +
                                                   (std::string(cmd) == "run" ? " -n 2" : "")));
            EXPECT_EQ(r.exit_code, 3) << r.err;
            EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
            EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        }
    }
    const std::string p = tmp_path("p.txt");
    {
        std::ofstream o(p);
        o << "The expert streaming engine";
    }
    CmdResult a = run_cmd(limited(bin + " run -m " + sh_quote(model) + " -f " + sh_quote(p) +
                                  " -n 4"));
    CmdResult b = run_cmd("cat " + sh_quote(p) + " | " +
                          limited(bin + " run -m " + sh_quote(model) + " -f - -n 4"));
    EXPECT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_FALSE(a.out.empty());
    std::remove(p.c_str());
    std::remove(fifo.c_str());
    std::filesystem::remove(dir);
}

// A FIFO nobody writes to: the text readers wait like `cat` (so `-f <(cmd)` works), and Ctrl-C
// ends the wait at once: exit 130 whenever the SIGINT comes (`timeout -s INT` sends it after
// 0.5 s; the outer timeout only turns a regression into a failure instead of a hang).
TEST(TextFile, CtrlCEndsAWaitForAFifoWriter) {
    setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string fifo = tmp_path("nowriter.fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    for (const char * cmd : {"run", "eval"}) {
        SCOPED_TRACE(cmd);
        CmdResult r = run_cmd("timeout -k 5 60 timeout -s INT --preserve-status 0.5 " +
                              sh_quote(cli_bin()) + " " + cmd + " -m " + sh_quote(model) +
                              " -f " + sh_quote(fifo));
        EXPECT_EQ(r.exit_code, 130) << r.err;
        EXPECT_EQ(r.out, "");
    }
    std::remove(fifo.c_str());
}

// ---- writers ---------------------------------------------------------------------------------

namespace {

bool is_char_device(const std::string & p) {
    struct stat st;
    return lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

}  // namespace

// `synth -o`, `run --route-trace` and `eval --save-ref` given a path that is a device node, a
// FIFO or a directory: refused (exit 64, naming the option and what the path is), and the
// node is still there afterwards. The device is a private copy of /dev/null made with mknod
// (root only: otherwise that part is skipped, said in the output), so a regression replaces it
// and not the machine's /dev/null. Controls: a regular file is replaced, and a symbolic link
// to a file is written through (the link stays a link).
TEST(Writers, RefuseSpecialFilesAndNeverRenameOverThem) {
    setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string bin = sh_quote(cli_bin());
    const std::string dev = tmp_path("null-dev");
    const bool have_dev = mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
    if (!have_dev) std::printf("[ SKIPPED part ] mknod needs root: no device-node case\n");
    const std::string fifo = tmp_path("out.fifo");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    const std::string dir = tmp_path("out.dir");
    std::filesystem::create_directory(dir);
    std::vector<std::pair<std::string, std::string>> targets = {{fifo, "a FIFO"},
                                                                {dir, "a directory"}};
    if (have_dev) targets.push_back({dev, "a character device"});
    const std::string text = tmp_path("text.txt");
    {
        std::ofstream o(text);
        o << "The expert streaming engine reads only what the router selects, layer by layer.";
    }
    int refused = 0;
    for (const auto & [path, kind] : targets) {
        struct {
            std::string cmd, opt;
        } writers[] = {
            {bin + " synth --preset tiny -o " + sh_quote(path), "synth: -o"},
            {bin + " run -m " + sh_quote(model) + " -p hi -n 2 --route-trace " + sh_quote(path),
             "--route-trace"},
            {bin + " eval -m " + sh_quote(model) + " -f " + sh_quote(text) +
                 " --max-tokens 8 --save-ref " + sh_quote(path),
             "--save-ref"},
        };
        for (const auto & w : writers) {
            SCOPED_TRACE(w.cmd);
            CmdResult r = run_cmd(limited(w.cmd));
            EXPECT_EQ(r.exit_code, 3) << r.err;
            EXPECT_NE(r.err.find(w.opt + ": '" + path + "' exists and is " + kind +
                                 ", not a regular file; refusing to replace it"),
                      std::string::npos)
                << r.err;
            ++refused;
        }
    }
    EXPECT_GE(refused, 6);
    struct stat st;
    ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    ASSERT_EQ(lstat(dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    if (have_dev) {
        EXPECT_TRUE(is_char_device(dev));
    }
    // No temporary file was left next to them. Only this test's own names are looked at:
    // the directory is shared with tests running in parallel, whose synth_model() and synth
    // runs hold their own "NAME.tmp.PID" files there while they write.
    EXPECT_EQ(own_temp_files(), std::vector<std::string>{});
    {  // control: a planted temporary file of this test is found
        const std::string planted = fifo + ".tmp.1";
        std::ofstream(planted) << "x";
        EXPECT_EQ(own_temp_files().size(), 1u);
        std::remove(planted.c_str());
    }

    // Controls: a regular file is replaced (synth: with --force); a link to a file is written
    // through.
    const std::string reg = tmp_path("out.gguf");
    {
        std::ofstream o(reg);
        o << "old";
    }
    CmdResult r = run_cmd(limited(bin + " synth --preset tiny --force -o " + sh_quote(reg)));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(std::filesystem::file_size(reg), 1000000u);
    const std::string link = tmp_path("link.trace"), target = tmp_path("target.trace");
    std::filesystem::create_symlink(target, link);  // dangling until written
    r = run_cmd(limited(bin + " run -m " + sh_quote(model) + " -p hi -n 2 --route-trace " +
                        sh_quote(link)));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(std::filesystem::is_symlink(link));
    EXPECT_TRUE(std::filesystem::is_regular_file(target));
    r = run_cmd(limited(bin + " replay " + sh_quote(link)));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const std::string & p : {reg, link, target, text, fifo, dev}) std::remove(p.c_str());
    std::filesystem::remove(dir);
}

// `replay --plot FILE` writes FILE as named: no ".png" appended to a name without an extension.
TEST(Writers, ReplayPlotWritesTheNameGiven) {
    // The interpreter replay uses (cli_replay.cpp): $MOESTREAM_PYTHON, else /usr/bin/python3.
    const char * py = std::getenv("MOESTREAM_PYTHON");
    const std::string python = py && *py ? py : "/usr/bin/python3";
    if (run_cmd(sh_quote(python) + " -c 'import matplotlib'").exit_code != 0)
        GTEST_SKIP() << "python3-matplotlib is not installed";
    setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
    const std::string model = synth_model("tiny", "qwen3moe", "q8_0");
    const std::string bin = sh_quote(cli_bin());
    const std::string trace = tmp_path("plot.trace"), plot = tmp_path("plot-noext");
    CmdResult r = run_cmd(limited(bin + " run -m " + sh_quote(model) +
                                  " -p 'Once upon a time' -n 8 --route-trace " + sh_quote(trace)));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_cmd(limited(bin + " replay " + sh_quote(trace) + " --plot " + sh_quote(plot)));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(std::filesystem::exists(plot));
    EXPECT_FALSE(std::filesystem::exists(plot + ".png"));
    std::ifstream f(plot, std::ios::binary);
    char magic[4] = {};
    f.read(magic, 4);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG");
    for (const std::string & p : {trace, plot, plot + ".png"}) std::remove(p.c_str());
}
