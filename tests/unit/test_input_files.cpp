// test_input_files.cpp — files the CLI reads that are not what they claim: prompt/text files
// that are directories, devices or streams that never end (read_text_file,
// include/moestream/text_file.h; docs/reliability.md, "Inputs that exhaust memory or hang").
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

