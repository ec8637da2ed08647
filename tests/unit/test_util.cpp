#include "test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace moestream::test {

namespace {
// Compiled-in defaults (tests/CMakeLists.txt) become environment variables unless already set,
// so the CLI, the reference tools and the tests all see the same settings.
struct EnvDefaults {
    EnvDefaults() {
#ifdef MOESTREAM_TEST_BIN
        setenv("MOESTREAM_BIN", MOESTREAM_TEST_BIN, 0);
        setenv("MOESTREAM_SRC", MOESTREAM_TEST_SRC, 0);
        setenv("MOESTREAM_TEST_MODELS", MOESTREAM_TEST_MODELS_DIR, 0);
        setenv("LLAMA_TOOL", MOESTREAM_TEST_LLAMA_TOOL, 0);
        setenv("GGML_BACKEND_PATH", MOESTREAM_TEST_BACKEND, 0);
#endif
    }
} g_env_defaults;
}  // namespace

std::string llama_tool() {
    const char * e = std::getenv("LLAMA_TOOL");
    return e && *e ? e : "scripts/llama-tool";
}

LlamaCompletionIds llama_completion_ids(const std::string & args, const std::string & env) {
    TempDir dir("llama-session");
    const std::string session = dir.path("session.bin");
    CmdResult r = run_cmd(env + " " + sh_quote(llama_tool()) + " llama-completion " + args +
                          " --prompt-cache " + sh_quote(session) + " --prompt-cache-all");
    LlamaCompletionIds out;
    out.exit_code = r.exit_code;
    out.err = r.err.substr(r.err.size() > 4000 ? r.err.size() - 4000 : 0);
    out.ids = session_file_tokens(session);
    return out;
}

::testing::AssertionResult same_generation(const std::vector<int32_t> & session_ids, int n_prompt,
                                           const std::vector<int32_t> & tokens) {
    if (!tokens.empty() && n_prompt >= 0 && session_ids.size() == size_t(n_prompt) + tokens.size() &&
        std::equal(tokens.begin(), tokens.end(), session_ids.begin() + n_prompt))
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "llama-completion's session ids " << ::testing::PrintToString(session_ids)
           << ", moestream's " << n_prompt << " prompt ids then " << ::testing::PrintToString(tokens);
}

std::vector<int32_t> session_file_tokens(const std::string & path) {
    // llama_state_save_file: u32 magic 'ggsn', u32 version, u32 n, n x i32 ids, the state.
    const std::string b = slurp(path);
    uint32_t head[3];
    if (b.size() < sizeof head) return {};
    std::memcpy(head, b.data(), sizeof head);
    if (head[0] != 0x6767736Eu || b.size() < sizeof head + 4 * uint64_t(head[2])) return {};
    std::vector<int32_t> ids(head[2]);
    std::memcpy(ids.data(), b.data() + sizeof head, 4 * ids.size());
    return ids;
}

std::string sh_quote(const std::string & s) {
    std::string r = "'";
    for (char c : s) {
        if (c == '\'') r += "'\\''";
        else r += c;
    }
    return r + "'";
}

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string doc_block(const std::string & rel, const std::string & begin, const std::string & end) {
    const std::string s = slurp(std::string(MOESTREAM_TEST_SRC) + "/" + rel);
    const size_t at = s.find(begin), stop = s.find(end);
    if (at == std::string::npos || stop == std::string::npos || stop < at) return "<no markers>";
    return s.substr(at + begin.size(), stop - at - begin.size());
}

bool write_bytes(const std::string & path, const std::string & data) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(data.data(), std::streamsize(data.size()));
    return bool(f);
}

CmdResult run_cmd(const std::string & cmd) {
    char tmpl[] = "/tmp/moestream-test-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    std::string dir = tmpl;
    std::string full = "( " + cmd + " ) >" + dir + "/out 2>" + dir + "/err";
    int st = std::system(full.c_str());
    CmdResult r;
    if (st == -1) r.exit_code = -1;
    else if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
    else if (WIFSIGNALED(st)) r.exit_code = 128 + WTERMSIG(st);
    r.out = slurp(dir + "/out");
    r.err = slurp(dir + "/err");
    std::filesystem::remove_all(dir);
    return r;
}

std::string cli_bin() {
    const char * e = std::getenv("MOESTREAM_BIN");
    return e ? e : "build/bin/moestream";
}

std::string python_cmd() {
    const char * e = std::getenv("MOESTREAM_PYTHON");
    return sh_quote(e && *e ? e : "/usr/bin/python3");
}

std::string src_dir() {
    const char * e = std::getenv("MOESTREAM_SRC");
    return e && *e ? e : MOESTREAM_TEST_SRC;
}

std::string gguf_mutate_cmd() {
    return python_cmd() + " " + sh_quote(src_dir() + "/tests/tools/gguf_mutate.py");
}

StatsRun run_with_stats(const std::string & model, const std::string & prompt, int n_predict,
                        const std::string & flags, const std::string & env, bool with_logits) {
    static int counter = 0;
    const std::string base = models_dir() + "/stats-" + std::to_string(getpid()) + "-" +
                             std::to_string(counter++);
    CmdResult r = run_cmd(env + sh_quote(cli_bin()) + " run -m " + sh_quote(model) + " -p " +
                          sh_quote(prompt) + " -n " + std::to_string(n_predict) + " -t 1 " +
                          flags + " --stats-json " + base + ".json" +
                          (with_logits ? " --dump-logits " + base + ".logits" : ""));
    StatsRun out;
    out.rc = r.exit_code;
    out.err = r.err;
    if (r.exit_code == 0) {
        out.stats = slurp(base + ".json");
        if (with_logits) out.logits = slurp(base + ".logits");
    }
    std::remove((base + ".json").c_str());
    if (with_logits) std::remove((base + ".logits").c_str());
    return out;
}

std::string models_dir() {
    const char * e = std::getenv("MOESTREAM_TEST_MODELS");
    std::string d = e ? e : "build/test-models";
    std::filesystem::create_directories(d);
    return d;
}

std::string synth_model(const std::string & preset, const std::string & arch,
                        const std::string & type, int seed, int alignment) {
    std::string path = models_dir() + "/" + preset + "-" + arch + "-" + type + "-s" +
                       std::to_string(seed) + "-a" + std::to_string(alignment) + ".gguf";
    if (std::filesystem::exists(path)) return path;
    std::string tmp = path + ".tmp." + std::to_string(getpid());
    std::string cmd = sh_quote(cli_bin()) + " synth --preset " + preset + " --arch " + arch +
                      " --type " + type + " --seed " + std::to_string(seed) + " --alignment " +
                      std::to_string(alignment) + " -o " + sh_quote(tmp);
    CmdResult r = run_cmd(cmd);
    if (r.exit_code != 0) throw std::runtime_error("synth failed: " + cmd + "\n" + r.err);
    // Never replace a file another test may have open: tests run in parallel, and a run that
    // finds its model replaced after loading it stops with "the model file changed" (engine
    // check_file_unchanged). The rename fails with EEXIST when another test got there first.
    // RENAME_NOREPLACE rather than link() + unlink(): the unlink would change the inode's
    // ctime after another test may have opened the path (ctime is part of the change check).
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
        if (errno != EEXIST)
            throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " +
                                     std::strerror(errno));
        std::remove(tmp.c_str());
    }
    return path;
}


uint64_t pool_file_bytes() {
    uint64_t total = 0;
    for (int fd = 0; fd < 4096; ++fd) {
        char link[64], target[256];
        std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        const ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        struct stat sb;
        if (std::strstr(target, "memfd:moestream-pool") && fstat(fd, &sb) == 0)
            total += uint64_t(sb.st_blocks) * 512;
    }
    return total;
}

TempDir::TempDir(const std::string & tag) {
    std::string tmpl = "/tmp/moestream-" + tag + "-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
    dir_ = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
}

ModelIndex hand_made_index(const std::vector<std::vector<uint64_t>> & layers, uint32_t n_expert,
                           uint32_t n_expert_used, uint64_t first_offset) {
    ModelIndex idx;
    idx.path = "hand-made";
    idx.n_expert = n_expert;
    idx.n_expert_used = n_expert_used;
    idx.n_layer = uint32_t(layers.size());
    uint64_t off = first_offset;
    const Projection projs[3] = {Projection::kGate, Projection::kUp, Projection::kDown};
    for (size_t l = 0; l < layers.size(); ++l) {
        MoeLayer L;
        L.layer = uint32_t(l);
        for (size_t t = 0; t < layers[l].size(); ++t) {
            ExpertTensor et;
            et.name = "blk." + std::to_string(l) + ".ffn_" + projection_name(projs[t % 3]) +
                      "_exps.weight";
            et.layer = uint32_t(l);
            et.proj = projs[t % 3];
            et.type = 24;  // i8: one byte per element, any slice size is a valid shape
            et.ne[0] = int64_t(layers[l][t]);
            et.ne[1] = 1;
            et.ne[2] = n_expert;
            et.row_bytes = layers[l][t];
            et.slice_bytes = layers[l][t];
            et.file_offset = off;
            et.tensor_bytes = uint64_t(n_expert) * et.slice_bytes;
            off += et.tensor_bytes;
            L.expert_bytes += et.slice_bytes;
            L.tensors.push_back(et);
        }
        idx.expert_bytes_total += uint64_t(n_expert) * L.expert_bytes;
        idx.moe_layers.push_back(L);
    }
    idx.file_size = off;
    return idx;
}

}  // namespace moestream::test
