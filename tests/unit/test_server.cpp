// test_server.cpp — `moestream serve` against a real server process on loopback with a tiny
// synth model: every endpoint, SSE framing, parity with `moestream run`, request errors
// (400/401/404/413/415), lossy reporting, queueing (arrival order, 503 + Retry-After), a client
// disconnecting mid-stream, KV prefix reuse, and the server still healthy afterwards.
// Each test starts its own server on a free port (--port 0, the port is read from stdout).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "api.h"
#include "server_stats.h"
#include "test_util.h"

namespace moestream::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string tiny_model() {
    return synth_model("tiny", "qwen3moe", "q4_k");
}

// A `moestream serve` child process; stopped (SIGTERM, then SIGKILL) on destruction.
class ServerProc {
public:
    ServerProc(const std::vector<std::string> & args, const std::vector<std::string> & env = {},
               const std::string & model = "") {
        char tmpl[] = "/tmp/moestream-serve-XXXXXX";
        dir_ = mkdtemp(tmpl);
        err_path_ = dir_ + "/stderr";
        int fds[2];
        if (pipe(fds) != 0) throw std::runtime_error("pipe");
        pid_ = fork();
        if (pid_ == 0) {
            for (const auto & e : env) putenv(strdup(e.c_str()));
            dup2(fds[1], 1);
            FILE * err = std::fopen(err_path_.c_str(), "w");
            if (err) dup2(fileno(err), 2);
            close(fds[0]);
            std::vector<std::string> full = {cli_bin(), "serve", "-m",
                                             model.empty() ? tiny_model() : model, "-v"};
            if (std::find(args.begin(), args.end(), "--port") == args.end())
                full.insert(full.end(), {"--port", "0"});
            // One compute thread unless a test says otherwise: tests run two at a time, and
            // two ggml thread pools on two cores spin against each other.
            if (std::find(args.begin(), args.end(), "-t") == args.end())
                full.insert(full.end(), {"-t", "1"});
            full.insert(full.end(), args.begin(), args.end());
            std::vector<char *> argv;
            for (auto & a : full) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(fds[1]);
        std::string out;
        auto deadline = std::chrono::steady_clock::now() + 60s;
        while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
            pollfd p{fds[0], POLLIN, 0};
            if (poll(&p, 1, 200) <= 0) continue;
            char buf[512];
            ssize_t n = read(fds[0], buf, sizeof buf);
            if (n <= 0) break;
            out.append(buf, size_t(n));
            size_t at = out.find("listening on http://127.0.0.1:");
            if (at != std::string::npos && out.find('/', at + 30) != std::string::npos)
                port_ = std::atoi(out.c_str() + at + 30);
        }
        close(fds[0]);
        stdout_ = out;
    }
    ~ServerProc() {
        stop();
        std::filesystem::remove_all(dir_);
    }
    int stop() {
        if (pid_ <= 0) return status_;
        kill(pid_, SIGTERM);
        for (int i = 0; i < 2400; ++i) {  // 120 s: only a hang (the exit status is the claim)
            int st = 0;
            if (waitpid(pid_, &st, WNOHANG) == pid_) {
                pid_ = -1;
                status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                return status_;
            }
            std::this_thread::sleep_for(50ms);
        }
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
        status_ = 128 + SIGKILL;
        return status_;
    }
    int port() const { return port_; }
    // CPU seconds (user + system) the server has used so far: unlike wall time, not
    // stretched by other processes on a loaded machine. -1 if /proc cannot tell.
    double cpu_seconds() const {
        std::ifstream f("/proc/" + std::to_string(pid_) + "/stat");
        std::string stat((std::istreambuf_iterator<char>(f)), {});
        const size_t paren = stat.rfind(')');  // the command name may hold spaces
        if (paren == std::string::npos) return -1;
        std::istringstream in(stat.substr(paren + 2));
        std::string field;
        double ticks = 0;
        for (int i = 3; i <= 15 && in >> field; ++i)  // fields 14 and 15: utime, stime
            if (i >= 14) ticks += std::stod(field);
        return ticks / double(sysconf(_SC_CLK_TCK));
    }
    std::string log() const {
        std::ifstream f(err_path_);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    }
    const std::string & out() const { return stdout_; }

    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(120, 0);
        return c;
    }

private:
    std::string dir_, err_path_, stdout_;
    pid_t pid_ = -1;
    int port_ = 0;
    int status_ = -1;
};

httplib::Result post(const ServerProc & s, const std::string & path, const json & body,
                     const httplib::Headers & h = {}) {
    auto c = s.client();
    return c.Post(path.c_str(), h, body.dump(), "application/json");
}

json body_json(const httplib::Result & r) {
    return json::parse(r->body, nullptr, false);
}

// One server for the llama-server and OpenAI-shape checks below.
const ServerProc & habits_server() {
    static ServerProc s({"--lossless"});
    return s;
}

// What SDKs send by default (store, metadata, service_tier) is accepted without effect, a
// wrong type of them refused by name; error objects carry OpenAI's `code`: a string or null.
TEST(Server, SdkDefaultFieldsAcceptedAndErrorCodesAreStringsOrNull) {
    const ServerProc & s = habits_server();
    ASSERT_GT(s.port(), 0) << s.log();
    const json base{{"prompt", "Once"}, {"max_tokens", 4}, {"cache_prompt", false}};
    auto plain = post(s, "/v1/completions", base);
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200) << plain->body;
    json with = base;
    with["store"] = false;
    with["metadata"] = {{"app", "x"}};
    with["service_tier"] = "auto";
    auto r = post(s, "/v1/completions", with);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(body_json(r)["choices"][0]["text"], body_json(plain)["choices"][0]["text"])
        << "no effect on the output";
    for (const auto & [k, v] : {std::pair<std::string, json>{"store", "yes"}, {"metadata", 3},
                                {"service_tier", json::array()}}) {
        json bad = base;
        bad[k] = v;
        auto b = post(s, "/v1/completions", bad);
        ASSERT_TRUE(b);
        EXPECT_EQ(b->status, 400) << k;
        EXPECT_EQ(body_json(b)["error"]["param"], k);
        EXPECT_TRUE(body_json(b)["error"]["code"].is_null()) << b->body;
    }
    auto nf = s.client().Get("/v1/models/other");
    ASSERT_TRUE(nf);
    EXPECT_EQ(nf->status, 404);
    EXPECT_EQ(body_json(nf)["error"]["code"], "model_not_found") << nf->body;
}

// GET /v1/models/{id} answers the served model; an unknown URL's 404 names the routes there
// are; GET /slots lists the one slot as llama-server does.
TEST(Server, ModelByIdSlotsAndA404ThatNamesTheRoutes) {
    const ServerProc & s = habits_server();
    ASSERT_GT(s.port(), 0) << s.log();
    auto c = s.client();
    auto list = c.Get("/v1/models");
    ASSERT_TRUE(list);
    const std::string id = body_json(list)["data"][0]["id"];
    auto one = c.Get(("/v1/models/" + id).c_str());
    ASSERT_TRUE(one);
    EXPECT_EQ(one->status, 200) << one->body;
    EXPECT_EQ(body_json(one)["id"], id);
    EXPECT_EQ(body_json(one)["object"], "model");
    auto other = c.Get(("/v1/models/" + id + "x").c_str());
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 404) << "control: another id";
    auto nf = c.Post("/v1/nothing", "{}", "application/json");
    ASSERT_TRUE(nf);
    EXPECT_EQ(nf->status, 404);
    const std::string msg = body_json(nf)["error"]["message"];
    EXPECT_NE(msg.find("POST /v1/nothing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/v1/chat/completions"), std::string::npos) << msg;
    auto slots = c.Get("/slots");
    ASSERT_TRUE(slots);
    ASSERT_EQ(slots->status, 200);
    const json sj = body_json(slots);
    ASSERT_TRUE(sj.is_array() && sj.size() == 1) << slots->body;
    EXPECT_EQ(sj[0]["id"], 0);
    EXPECT_EQ(sj[0]["n_ctx"], 512);
    EXPECT_EQ(sj[0]["is_processing"], false);
}

// llama-server's serve flags: --alias names the model, --no-webui drops the page, the sampling
// flags become every request's defaults (shown in /stats and each reply's settings, a
// request's own value still wins), --metrics, --slots and --jinja are accepted.
TEST(Server, LlamaServerFlagsAliasNoWebuiAndSamplingDefaults) {
    ServerProc s({"--lossless", "--alias", "my-model", "--no-webui", "--top-k", "7", "--min-p",
                  "0.05", "--repeat-penalty", "1.1", "--metrics", "--slots", "--jinja"});
    ASSERT_GT(s.port(), 0) << s.log();
    EXPECT_NE(s.out().find(", lossless, "), std::string::npos) << s.out();  // --lossless: no knob
    auto c = s.client();
    auto models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(body_json(models)["data"][0]["id"], "my-model");
    auto page = c.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 404) << "--no-webui";
    auto st = c.Get("/stats");
    ASSERT_TRUE(st);
    const json d = body_json(st)["defaults"];
    EXPECT_EQ(d["top_k"], 7);
    EXPECT_NEAR(d["min_p"].get<double>(), 0.05, 1e-6);
    EXPECT_NEAR(d["repeat_penalty"].get<double>(), 1.1, 1e-6);
    auto r = post(s, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 1}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json req = body_json(r)["moestream"]["settings"]["request"];
    EXPECT_EQ(req["top_k"], 7);
    EXPECT_EQ(body_json(r)["model"], "my-model");
    auto own = post(s, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 1}, {"top_k", 3}});
    ASSERT_TRUE(own);
    EXPECT_EQ(body_json(own)["moestream"]["settings"]["request"]["top_k"], 3);
    // Control: a server without the flags has llama.cpp's off values and its page.
    const ServerProc & plain = habits_server();
    auto pst = plain.client().Get("/stats");
    ASSERT_TRUE(pst);
    EXPECT_EQ(body_json(pst)["defaults"]["top_k"], 0);
    auto ppage = plain.client().Get("/");
    ASSERT_TRUE(ppage);
    EXPECT_EQ(ppage->status, 200);
}

// --api-key-file: the key is the file's first line; without it 401 with code
// "invalid_api_key"; an unreadable file is refused at start, naming it.
TEST(Server, ApiKeyFileTakesTheKeyFromItsFirstLine) {
    TempDir dir("keyfile");
    ASSERT_TRUE(write_bytes(dir.path("key"), "  K9secret \nignored\n"));
    ServerProc s({"--lossless", "--api-key-file", dir.path("key")});
    ASSERT_GT(s.port(), 0) << s.log();
    const json body{{"prompt", "Hi"}, {"max_tokens", 1}};
    auto no = post(s, "/v1/completions", body);
    ASSERT_TRUE(no);
    EXPECT_EQ(no->status, 401);
    EXPECT_EQ(body_json(no)["error"]["code"], "invalid_api_key");
    auto yes = post(s, "/v1/completions", body, {{"Authorization", "Bearer K9secret"}});
    ASSERT_TRUE(yes);
    EXPECT_EQ(yes->status, 200) << yes->body;
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " serve -m " + sh_quote(tiny_model()) +
                          " --api-key-file " + sh_quote(dir.path("missing")));
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_NE(r.err.find("--api-key-file " + dir.path("missing") + ": cannot be read"), std::string::npos) << r.err;
}

// llama-server's POST /completion: the same generation as /v1/completions in llama-server's
// shape (content, stop, tokens_predicted, stop_type), streamed as content events ending with
// stop: true and no [DONE].
TEST(Server, LlamaServerCompletionEndpointMatchesCompletions) {
    const ServerProc & s = habits_server();
    ASSERT_GT(s.port(), 0) << s.log();
    auto ref = post(s, "/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 8}, {"cache_prompt", false}});
    ASSERT_TRUE(ref);
    const std::string text = body_json(ref)["choices"][0]["text"];
    auto r = post(s, "/completion", {{"prompt", "Once upon"}, {"n_predict", 8}, {"cache_prompt", false}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = body_json(r);
    EXPECT_EQ(j["content"], text);
    EXPECT_EQ(j["stop"], true);
    EXPECT_EQ(j["tokens_predicted"], 8);
    EXPECT_EQ(j["stop_type"], "limit");
    EXPECT_FALSE(j.contains("choices")) << "control: not the OpenAI shape";
    auto st = post(s, "/completion", {{"prompt", "Once upon"}, {"n_predict", 8}, {"stream", true}, {"cache_prompt", false}});
    ASSERT_TRUE(st);
    std::string streamed;
    int stops = 0;
    for (size_t a = 0; (a = st->body.find("data: ", a)) != std::string::npos; a += 6) {
        const json e = json::parse(st->body.substr(a + 6, st->body.find('\n', a) - a - 6), nullptr, false);
        ASSERT_FALSE(e.is_discarded()) << st->body;
        streamed += e["content"].get<std::string>();
        stops += e["stop"].get<bool>();
    }
    EXPECT_EQ(streamed, text);
    EXPECT_EQ(stops, 1);
    EXPECT_EQ(st->body.find("[DONE]"), std::string::npos);
}

// The generation of `moestream run` for the same prompt (greedy, lossless): token ids and text.
struct RunOut {
    std::vector<int> tokens;
    std::string text;
};
RunOut moestream_run(const std::string & prompt, int n) {
    char tmpl[] = "/tmp/moestream-run-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    CmdResult r = run_cmd(sh_quote(cli_bin()) + " run -m " + sh_quote(tiny_model()) + " -p " +
                          sh_quote(prompt) + " -n " + std::to_string(n) + " --stats-json " +
                          sh_quote(dir + "/s.json"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream f(dir + "/s.json");
    json j = json::parse(f, nullptr, false);
    std::filesystem::remove_all(dir);
    RunOut o;
    if (j.is_object()) o.tokens = j["tokens"].get<std::vector<int>>();
    // run prints the raw bytes and one newline; the server sends them as valid UTF-8.
    std::string text = r.out;
    if (!text.empty() && text.back() == '\n') text.pop_back();
    o.text = server::sanitize_utf8(text);
    return o;
}

// Splits an SSE body into its events; checks the framing of each.
std::vector<std::string> sse_data(const std::string & body) {
    std::vector<std::string> data;
    size_t pos = 0;
    while (pos < body.size()) {
        size_t end = body.find("\n\n", pos);
        EXPECT_NE(end, std::string::npos) << "event not terminated by a blank line at " << pos;
        if (end == std::string::npos) break;
        std::string ev = body.substr(pos, end - pos);
        pos = end + 2;
        if (ev.rfind(": ", 0) == 0) continue;  // comment (keep-alive)
        EXPECT_EQ(ev.rfind("data: ", 0), 0u) << "event [" << ev << "]";
        EXPECT_EQ(ev.find('\n'), std::string::npos) << "one data line per event";
        data.push_back(ev.substr(6));
    }
    return data;
}

// /completion carries llama-server's generation_settings (the request's settings under its
// names), timings (prompt and predicted counts and times) and, with n_probs N, one
// completion_probabilities entry per token with N alternatives, the same log-probabilities
// /v1/completions gives; streamed, each event carries its tokens' entries and the last one the
// settings and timings. Controls: no n_probs, no completion_probabilities; n_probs out of
// range or beside logprobs is a 400 naming it.
TEST(Server, LlamaServerCompletionHasSettingsTimingsAndProbabilities) {
    const ServerProc & s = habits_server();
    ASSERT_GT(s.port(), 0) << s.log();
    const json req{{"prompt", "Once upon"}, {"n_predict", 5}, {"n_probs", 2}, {"top_k", 7},
                   {"cache_prompt", false}};
    auto r = post(s, "/completion", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = body_json(r);
    const json & gs = j["generation_settings"];
    EXPECT_EQ(gs["n_probs"], 2);
    EXPECT_EQ(gs["top_k"], 7);
    EXPECT_EQ(gs["n_predict"], 5);
    EXPECT_EQ(gs["temperature"], 0);
    const json & t = j["timings"];
    EXPECT_EQ(t["prompt_n"], j["tokens_evaluated"]);
    EXPECT_EQ(t["cache_n"], 0);
    EXPECT_EQ(t["predicted_n"], j["tokens_predicted"]);
    EXPECT_GT(t["prompt_ms"].get<double>(), 0);
    EXPECT_NEAR(t["predicted_per_second"].get<double>(),
                t["predicted_n"].get<double>() / t["predicted_ms"].get<double>() * 1e3, 1e-6);
    const json & probs = j["completion_probabilities"];
    ASSERT_EQ(probs.size(), 5u) << j.dump();
    auto ref = post(s, "/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 5}, {"logprobs", 2},
                                           {"top_k", 7}, {"cache_prompt", false}});
    ASSERT_TRUE(ref);
    const json lp = body_json(ref)["choices"][0]["logprobs"];
    std::string text;
    for (size_t i = 0; i < probs.size(); ++i) {
        const json & e = probs[i];
        for (const json & byte : e["bytes"]) text += char(byte.get<int>());  // a token may split a character
        EXPECT_EQ(e["logprob"], lp["token_logprobs"][i]) << i;
        ASSERT_EQ(e["top_logprobs"].size(), 2u) << i;
        EXPECT_EQ(e["top_logprobs"][0]["id"], e["id"]) << "greedy: the most likely token";
    }
    EXPECT_EQ(server::sanitize_utf8(text), j["content"]);
    json plain = req;
    plain.erase("n_probs");
    auto np = post(s, "/completion", plain);
    ASSERT_TRUE(np);
    EXPECT_FALSE(body_json(np).contains("completion_probabilities")) << "control";
    EXPECT_EQ(body_json(np)["generation_settings"]["n_probs"], 0);
    for (const json & bad : {json{{"prompt", "x"}, {"n_probs", 21}},
                             json{{"prompt", "x"}, {"n_probs", 1}, {"logprobs", 1}}}) {
        auto b = post(s, "/completion", bad);
        ASSERT_TRUE(b);
        EXPECT_EQ(b->status, 400) << bad.dump();
        EXPECT_EQ(body_json(b)["error"]["param"], "n_probs") << b->body;
    }
    json streamed = req;
    streamed["stream"] = true;
    auto st = post(s, "/completion", streamed);
    ASSERT_TRUE(st);
    size_t entries = 0;
    json last;
    for (const std::string & d : sse_data(st->body)) {
        last = json::parse(d);
        if (!last["stop"].get<bool>()) entries += last.value("completion_probabilities", json::array()).size();
    }
    EXPECT_EQ(entries, 5u) << st->body;
    EXPECT_EQ(last["stop"], true);
    EXPECT_EQ(last["timings"]["predicted_n"], 5);
    EXPECT_EQ(last["generation_settings"]["n_probs"], 2);
}

TEST(Server, HealthModelsStats) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto c = s.client();
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(body_json(h)["status"], "ok");
    auto m = c.Get("/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    json mj = body_json(m);
    EXPECT_EQ(mj["object"], "list");
    ASSERT_EQ(mj["data"].size(), 1u);
    EXPECT_EQ(mj["data"][0]["id"], std::filesystem::path(tiny_model()).filename().string());
    auto st = c.Get("/stats");
    ASSERT_TRUE(st);
    json sj = body_json(st);
    for (const char * k :
         {"tok_s", "cache_hit_pct", "mib_per_token", "resident_expert_mib", "rss_mib",
          "queue_waiting", "settings", "defaults", "lossy", "generating", "time_per_token"})
        EXPECT_TRUE(sj.contains(k)) << k;
    EXPECT_EQ(sj["lossy"], false);
    EXPECT_EQ(sj["defaults"]["drop_cold_experts"], 0.0);
    auto page = c.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_NE(page->body.find("<title>moestream</title>"), std::string::npos);
    EXPECT_NE(page->get_header_value("Content-Security-Policy").find("default-src 'self'"),
              std::string::npos);
    auto js = c.Get("/app.js");
    ASSERT_TRUE(js);
    EXPECT_EQ(js->status, 200);
    EXPECT_NE(js->body.find("textContent"), std::string::npos);
    auto nf = c.Get("/nope");
    ASSERT_TRUE(nf);
    EXPECT_EQ(nf->status, 404);
    EXPECT_TRUE(body_json(nf).contains("error"));
}

// /stats "cache": the expert cache's counters since start, as `--stats-json` counts them: every
// lookup a hit or a miss, and with the LRU cache's split staging (the default) slices
// committed while reads ran. Controls: with MOESTREAM_STAGE_SPLIT=0 no slice is deferred;
// with the cache off the object is null.
TEST(Server, StatsShowTheCacheCounters) {
    const auto cache_after_one_request = [](const std::vector<std::string> & args,
                                            const std::vector<std::string> & env) {
        ServerProc s(args, env);
        EXPECT_GT(s.port(), 0) << s.log();
        auto r = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}});
        EXPECT_TRUE(r && r->status == 200) << (r ? r->body : s.log());
        auto st = s.client().Get("/stats");
        EXPECT_TRUE(st);
        return st ? body_json(st)["cache"] : json();
    };
    const json c = cache_after_one_request({"--lossless"}, {"MOESTREAM_SLOT_CACHE=0"});
    ASSERT_TRUE(c.is_object()) << c.dump();
    EXPECT_GT(c["lookups"].get<uint64_t>(), 0u);
    EXPECT_EQ(c["lookups"].get<uint64_t>(),
              c["hits"].get<uint64_t>() + c["misses"].get<uint64_t>());
    EXPECT_GT(c["misses"].get<uint64_t>(), 0u) << "the first request fills the cache";
    EXPECT_GT(c["deferred_commits"].get<uint64_t>(), 0u) << c.dump();
    EXPECT_GT(c["pool_mib"].get<double>(), 0);
    EXPECT_EQ(c["commit_failures"], 0);

    const json nosplit = cache_after_one_request(
        {"--lossless"}, {"MOESTREAM_SLOT_CACHE=0", "MOESTREAM_STAGE_SPLIT=0"});
    ASSERT_TRUE(nosplit.is_object()) << nosplit.dump();
    EXPECT_EQ(nosplit["deferred_commits"], 0) << "control: nothing deferred without split staging";
    EXPECT_EQ(nosplit["misses"], c["misses"]);

    EXPECT_TRUE(cache_after_one_request({"--lossless", "--cache-mb", "0"}, {}).is_null());
}

// Non-streaming output equals `moestream run` for the same prompt and settings (greedy,
// lossless): token ids and text. Negative control: run with another prompt differs.
TEST(Server, CompletionEqualsRun) {
    const std::string prompt = "Once upon a time";
    RunOut ref = moestream_run(prompt, 12);
    ASSERT_EQ(ref.tokens.size(), 12u);
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto st0 = s.client().Get("/stats");
    ASSERT_TRUE(st0);
    EXPECT_TRUE(body_json(st0)["read_latency"].is_null()) << "no request has read anything yet";
    auto r = post(
        s, "/v1/completions",
        {{"prompt", prompt}, {"max_tokens", 12}, {"return_tokens", true}, {"cache_prompt", false}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = body_json(r);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["moestream"]["tokens"].get<std::vector<int>>(), ref.tokens);
    EXPECT_EQ(j["choices"][0]["text"], ref.text);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
    EXPECT_EQ(j["moestream"]["lossy"], false);
    EXPECT_EQ(j["moestream"]["settings"]["request"]["temperature"], 0.0);
    // /stats: the request's time per decoded token, its buckets adding up (docs/metrics.md).
    auto st = s.client().Get("/stats");
    ASSERT_TRUE(st);
    const json tp = body_json(st)["time_per_token"];
    double sum = 0;
    for (const char * k : {"compute_s", "io_s", "stage_s", "hook_s", "sampling_s", "other_s"}) {
        EXPECT_GE(tp[k].get<double>(), 0) << k;
        sum += tp[k].get<double>();
    }
    EXPECT_GT(tp["compute_s"].get<double>(), 0);
    EXPECT_NEAR(sum, tp["step_s"].get<double>(), 1e-9 + 1e-9 * sum);
    // /stats: the request's expert read times (docs/metrics.md, "Read latency").
    const json rl = body_json(st)["read_latency"];
    ASSERT_TRUE(rl.is_object()) << rl.dump();
    EXPECT_GT(rl["reads"].get<uint64_t>(), 0u);
    EXPECT_GT(rl["p50_ms"].get<double>(), 0);
    EXPECT_LE(rl["p50_ms"].get<double>(), rl["p99_ms"].get<double>());
    EXPECT_LE(rl["p99_ms"].get<double>(), rl["max_ms"].get<double>());

    RunOut other = moestream_run("A different prompt entirely", 12);
    EXPECT_NE(j["moestream"]["tokens"].get<std::vector<int>>(), other.tokens)
        << "negative control: the comparison must be able to fail";
}

// A read error (EIO, injected on the 60th expert read: the first request's second token)
// fails that request with an error naming errno 5, and the same running server answers the
// next request exactly as `run` does (nothing poisoned, the engine still usable).
TEST(Server, IoErrorFailsTheRequestAndTheNextOneIsAnswered) {
    const std::string prompt = "Once upon a time";
    RunOut ref = moestream_run(prompt, 12);
    ASSERT_EQ(ref.tokens.size(), 12u);
    ServerProc s({"--lossless"}, {"MOESTREAM_DEBUG_IO_FAULT=eio-once:60"});
    ASSERT_GT(s.port(), 0) << s.log();
    const json req = {{"prompt", prompt}, {"max_tokens", 12}, {"return_tokens", true},
                      {"cache_prompt", false}};
    auto bad = post(s, "/v1/completions", req);
    ASSERT_TRUE(bad);
    EXPECT_GE(bad->status, 500) << bad->body;
    EXPECT_NE(bad->body.find("errno 5"), std::string::npos) << bad->body;
    auto good = post(s, "/v1/completions", req);
    ASSERT_TRUE(good);
    ASSERT_EQ(good->status, 200) << good->body;
    EXPECT_EQ(body_json(good)["moestream"]["tokens"].get<std::vector<int>>(), ref.tokens);
    auto h = s.client().Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
}

// The model file rewritten in place with its mtime restored (`dd conv=notrunc` + `touch -r`):
// /health says so (503, naming the change) instead of 200 while every request fails.
TEST(Server, ChangedModelFileMakesHealthFail) {
    const std::string copy = "/tmp/moestream-serve-changed-" + std::to_string(getpid()) + ".gguf";
    std::filesystem::copy_file(tiny_model(), copy,
                               std::filesystem::copy_options::overwrite_existing);
    ServerProc s({"--lossless"}, {}, copy);
    ASSERT_GT(s.port(), 0) << s.log();
    auto h = s.client().Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200) << h->body;  // control: unchanged
    struct stat st;
    ASSERT_EQ(stat(copy.c_str(), &st), 0);
    {
        std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(st.st_size / 2));
        f.write("\x55\xaa\x55\xaa", 4);
    }
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
    h = s.client().Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 503) << h->body;
    EXPECT_NE(h->body.find("ctime changed: yes"), std::string::npos) << h->body;
    EXPECT_NE(h->body.find("mtime changed: no"), std::string::npos) << h->body;
    auto r = post(s, "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 2}});
    ASSERT_TRUE(r);
    EXPECT_GE(r->status, 500) << r->body;
    std::filesystem::remove(copy);
}

// Chat: the default template (chatml; the synth model carries none) applied to the messages
// gives exactly the prompt `run` is given here; streamed and non-streamed replies agree.
TEST(Server, ChatEqualsRunWithChatmlAndStreams) {
    const std::string expected_prompt =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n";
    RunOut ref = moestream_run(expected_prompt, 10);
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    json req{{"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                       {{"role", "user"}, {"content", "Hi there"}}})},
             {"max_tokens", 10},
             {"return_tokens", true},
             {"cache_prompt", false}};
    auto r = post(s, "/v1/chat/completions", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = body_json(r);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(j["moestream"]["tokens"].get<std::vector<int>>(), ref.tokens);
    EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
    EXPECT_NE(
        j["moestream"]["settings"]["request"]["chat_template"].get<std::string>().find("chatml"),
        std::string::npos);

    req["stream"] = true;
    auto sr = post(s, "/v1/chat/completions", req);
    ASSERT_TRUE(sr);
    ASSERT_EQ(sr->status, 200);
    EXPECT_EQ(sr->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
    std::vector<std::string> data = sse_data(sr->body);
    ASSERT_GE(data.size(), 3u);
    EXPECT_EQ(data.back(), "[DONE]");
    std::string streamed;
    json last;
    for (size_t i = 0; i + 1 < data.size(); ++i) {
        json ev = json::parse(data[i], nullptr, false);
        ASSERT_FALSE(ev.is_discarded()) << data[i];
        EXPECT_EQ(ev["object"], "chat.completion.chunk");
        const json & ch = ev["choices"][0];
        if (i == 0) {
            EXPECT_EQ(ch["delta"]["role"], "assistant");
        }
        if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
        if (i + 2 < data.size()) {
            EXPECT_TRUE(ch["finish_reason"].is_null());
        }
        last = ev;
    }
    EXPECT_EQ(streamed, ref.text);
    EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(last["usage"]["completion_tokens"], 10);
    EXPECT_EQ(last["moestream"]["tokens"].get<std::vector<int>>(), ref.tokens);
    EXPECT_EQ(last["moestream"]["lossy"], false);

    // Completions stream too.
    auto cr =
        post(s, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 3}, {"stream", true}});
    ASSERT_TRUE(cr);
    std::vector<std::string> cd = sse_data(cr->body);
    ASSERT_GE(cd.size(), 2u);
    EXPECT_EQ(cd.back(), "[DONE]");
    EXPECT_EQ(json::parse(cd[0])["object"], "text_completion");
}

// The second turn of a conversation reuses the first turn's KV prefix (the logits are
// checked against a from-scratch prefill in test_prefix_reuse.cpp); cache_prompt false does not.
TEST(Server, KvPrefixReuseAcrossTurns) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    json turn1{{"messages", json::array({{{"role", "user"}, {"content", "Tell me a story"}}})},
               {"max_tokens", 6}};
    auto r1 = post(s, "/v1/chat/completions", turn1);
    ASSERT_TRUE(r1);
    ASSERT_EQ(r1->status, 200);
    json j1 = body_json(r1);
    json turn2 = turn1;
    turn2["messages"].push_back(
        {{"role", "assistant"}, {"content", j1["choices"][0]["message"]["content"]}});
    turn2["messages"].push_back({{"role", "user"}, {"content", "And then?"}});
    auto r2 = post(s, "/v1/chat/completions", turn2);
    ASSERT_TRUE(r2);
    ASSERT_EQ(r2->status, 200);
    json j2 = body_json(r2);
    const int reused = j2["moestream"]["stats"]["n_prompt_reused"];
    EXPECT_GE(reused, j1["moestream"]["stats"]["n_prompt"].get<int>())
        << "at least the first turn's prompt is reused";
    EXPECT_LT(reused, j2["moestream"]["stats"]["n_prompt"].get<int>());
    turn2["cache_prompt"] = false;
    auto r3 = post(s, "/v1/chat/completions", turn2);
    ASSERT_TRUE(r3);
    ASSERT_EQ(r3->status, 200);
    EXPECT_EQ(body_json(r3)["moestream"]["stats"]["n_prompt_reused"], 0);
}

// {"a": {"a": ... {}}} nested n objects deep.
std::string nested_object(int n) {
    std::string o;
    for (int i = 0; i < n; ++i) o += R"({"a":)";
    o += "{}";
    for (int i = 0; i < n; ++i) o += "}";
    return o;
}

TEST(Server, MalformedRequestsAre400AndServerStaysHealthy) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto c = s.client();
    struct Case {
        std::string path, body, param;
    };
    const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
    const std::vector<Case> cases = {
        {"/v1/chat/completions", "{not json", ""},
        {"/v1/chat/completions", "[1,2]", ""},
        {"/v1/chat/completions", R"({"messages":"hi"})", "messages"},
        {"/v1/chat/completions", R"({"messages":[]})", "messages"},
        {"/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})",
         "messages[0].role"},
        {"/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})",
         "messages[0].content"},
        {"/v1/chat/completions", "{" + msgs + R"(,"temperature":"hot"})", "temperature"},
        {"/v1/chat/completions", "{" + msgs + R"(,"temperature":-1})", "temperature"},
        {"/v1/chat/completions", "{" + msgs + R"(,"max_tokens":0})", "max_tokens"},
        {"/v1/chat/completions", "{" + msgs + R"(,"max_tokens":1.5})", "max_tokens"},
        {"/v1/chat/completions", "{" + msgs + R"(,"max_tokens":1,"n_predict":2})", "n_predict"},
        {"/v1/chat/completions", "{" + msgs + R"(,"top_p":0})", "top_p"},
        {"/v1/chat/completions", "{" + msgs + R"(,"top_p":1.5})", "top_p"},
        {"/v1/chat/completions", "{" + msgs + R"(,"seed":-1})", "seed"},
        {"/v1/chat/completions", "{" + msgs + R"(,"n":2})", "n"},
        {"/v1/chat/completions", "{" + msgs + R"(,"stream":"yes"})", "stream"},
        {"/v1/chat/completions", "{" + msgs + R"(,"stop":[""]})", "stop"},
        {"/v1/chat/completions", "{" + msgs + R"(,"stop":5})", "stop"},
        {"/v1/chat/completions", "{" + msgs + R"(,"min_p":2})", "min_p"},
        {"/v1/chat/completions", "{" + msgs + R"(,"repeat_penalty":0})", "repeat_penalty"},
        {"/v1/chat/completions", "{" + msgs + R"(,"presence_penalty":3})", "presence_penalty"},
        {"/v1/chat/completions", "{" + msgs + R"(,"logit_bias":{"abc":1}})", "logit_bias"},
        {"/v1/chat/completions", "{" + msgs + R"(,"logit_bias":{"99999":1}})", "logit_bias"},
        {"/v1/chat/completions", "{" + msgs + R"(,"grammar":"root ::= ("})", "grammar"},
        {"/v1/chat/completions", "{" + msgs + R"(,"foo":1})", "foo"},
        {"/v1/chat/completions", "{" + msgs + R"(,"tools":[{"type":"function"}]})", "tools[0]"},
        // Well-formed tools on a template without tool syntax (chatml): refused, naming it.
        {"/v1/chat/completions",
         "{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f"}}]})", "tools"},
        {"/v1/chat/completions", "{" + msgs + R"(,"tool_choice":"required"})", "tool_choice"},
        {"/v1/chat/completions", "{" + msgs + R"(,"tool_choice":"sometimes"})", "tool_choice"},
        {"/v1/chat/completions", "{" + msgs + R"(,"response_format":{"type":"json_schema"}})",
         "response_format.json_schema"},
        {"/v1/chat/completions", "{" + msgs + R"(,"response_format":{"type":"xml"}})",
         "response_format.type"},
        {"/v1/chat/completions",
         "{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x",)" +
             R"j("schema":{"type":"string","pattern":"a(?=b)"}}}})j",
         "response_format"},
        {"/v1/chat/completions",
         "{" + msgs + R"(,"response_format":{"type":"json_object"},"json_schema":{}})",
         "json_schema"},
        {"/v1/chat/completions", "{" + msgs + R"(,"json_schema":{"type":"integer"},"grammar":"root ::= \"1\""})",
         "json_schema"},
        {"/v1/chat/completions",
         "{" + msgs + R"(,"json_schema":{"anyOf":[{"$ref":"#"},{"type":"null"}]}})",
         "json_schema"},  // left-recursive: llama.cpp refuses the grammar
        {"/v1/chat/completions", "{" + msgs + R"(,"logprobs":"yes"})", "logprobs"},
        {"/v1/chat/completions", "{" + msgs + R"(,"top_logprobs":2})", "top_logprobs"},
        {"/v1/chat/completions", "{" + msgs + R"(,"logprobs":true,"top_logprobs":21})",
         "top_logprobs"},
        {"/v1/chat/completions", R"({"messages":[{"role":"tool","content":"x"}]})",
         "messages[0].tool_call_id"},
        {"/v1/chat/completions",
         R"({"messages":[{"role":"tool","tool_call_id":"a","content":"x"}]})", "messages"},
        {"/v1/chat/completions", R"({"messages":[{"role":"function","content":"x"}]})",
         "messages[0].role"},
        {"/v1/completions", R"({"prompt":"x","logprobs":21})", "logprobs"},
        {"/v1/completions", R"({"prompt":"x","logprobs":true})", "logprobs"},
        {"/v1/completions", R"({"prompt":"x","suffix":"y"})", "suffix"},
        {"/v1/completions", R"({"prompt":"x","best_of":2})", "best_of"},
        {"/v1/completions", R"({"prompt":["a","b"]})", "prompt"},
        {"/v1/chat/completions", "{" + msgs + R"(,"drop_cold_experts":2})", "drop_cold_experts"},
        {"/v1/completions", R"({"prompt":7})", "prompt"},
        {"/v1/completions", R"({"prompt":""})", "prompt"},
        {"/v1/completions", R"({})", "prompt"},
        // Nesting deeper than kMaxRequestNesting (copying or printing it would overflow the
        // stack): 400 naming the field, before anything else looks at it.
        {"/v1/chat/completions",
         R"({"messages":[{"role":"user","content":)" + std::string(100000, '[') +
             std::string(100000, ']') + "}]}",
         "messages"},
        {"/v1/chat/completions",
         "{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" +
             nested_object(300) + "}}]}",
         "tools"},
        {"/v1/completions", R"({"prompt":"x","stop":)" + std::string(300, '[') + std::string(300, ']') + "}",
         "stop"},
        // A grammar nested past kMaxGrammarDepth (llama.cpp's parser recurses per level: one
        // such request used to end the server with SIGSEGV): 400 naming it.
        {"/v1/completions",
         R"({"prompt":"hi","max_tokens":2,"grammar":"root ::= )" + std::string(20000, '(') +
             R"(\"a\")" + std::string(20000, ')') + "\"}",
         "grammar"},
        {"/v1/chat/completions", "{" + msgs + R"(,"tools":[{"type":5,"function":{"name":"f"}}]})",
         "tools[0]"},
        {"/v1/chat/completions", "{" + msgs + R"(,"tool_choice":{"type":[1],"function":{}}})",
         "tool_choice"},
    };
    for (const Case & k : cases) {
        auto r = c.Post(k.path.c_str(), k.body, "application/json");
        ASSERT_TRUE(r) << k.body;
        EXPECT_EQ(r->status, 400) << k.body << " -> " << r->body;
        json j = body_json(r);
        ASSERT_TRUE(j.contains("error")) << r->body;
        EXPECT_TRUE(j["error"]["message"].is_string());
        if (!k.param.empty()) {
            EXPECT_EQ(j["error"]["param"], k.param) << k.body;
        }
    }
    // A form content type from a web page (an Origin header): 415; the same body from curl -d
    // (no Origin) is read as JSON.
    auto ct = c.Post("/v1/completions", {{"Origin", "http://elsewhere.example"}},
                     R"({"prompt":"x","max_tokens":1})", "text/plain");
    ASSERT_TRUE(ct);
    EXPECT_EQ(ct->status, 415);
    auto curl = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})",
                       "application/x-www-form-urlencoded");
    ASSERT_TRUE(curl);
    EXPECT_EQ(curl->status, 200) << curl->body;
    // A prompt longer than the context (the synth model's 512 tokens): 400 naming the prompt;
    // the same prompt within the context is served (the control).
    auto lc = post(s, "/v1/completions", {{"prompt", std::string(600, 'x')}, {"max_tokens", 1}});
    ASSERT_TRUE(lc);
    EXPECT_EQ(lc->status, 400) << lc->body;
    EXPECT_EQ(body_json(lc)["error"]["param"], "prompt") << lc->body;
    EXPECT_NE(lc->body.find("longer than the context (512 tokens)"), std::string::npos) << lc->body;
    auto lc_ok = post(s, "/v1/completions", {{"prompt", std::string(400, 'x')}, {"max_tokens", 1}});
    ASSERT_TRUE(lc_ok);
    EXPECT_EQ(lc_ok->status, 200) << lc_ok->body;
    // prompt + max_tokens over the context: clamped, finish_reason "length" at the end of it.
    auto cl = post(s, "/v1/completions",
                   {{"prompt", std::string(500, 'x')}, {"max_tokens", 4000}, {"ignore_eos", true}});
    ASSERT_TRUE(cl);
    ASSERT_EQ(cl->status, 200) << cl->body;
    EXPECT_EQ(body_json(cl)["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(body_json(cl)["usage"]["total_tokens"], 512) << cl->body;
    // Still healthy and still generating.
    auto ok = post(s, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    EXPECT_EQ(s.stop(), 0) << "clean exit on SIGTERM";
}

// App defaults (lossy drop-cold 0.75) are reported per response; a request can turn the
// knob off; the API key is enforced and never logged; bodies above the limit get 413.
// A lossless server's budget is held by the fixed-slot cache, which cannot drop experts: a
// request for drop-cold is refused by name (400, param drop_cold_experts) and /props says
// drop-cold is unavailable. Control: with MOESTREAM_SLOT_CACHE=0 the LRU cache holds it and
// the same request runs lossy.
TEST(Server, DropColdPerRequestRunsOnTheFixedSlots) {
    const json req{{"prompt", "Hello"}, {"max_tokens", 4}, {"drop_cold_experts", 0.5}};
    {
        ServerProc s({"--lossless"});
        ASSERT_GT(s.port(), 0) << s.log();
        auto p = s.client().Get("/props");
        ASSERT_TRUE(p);
        EXPECT_EQ(body_json(p)["settings"]["cache_store"], "fixed slots") << p->body;
        EXPECT_EQ(body_json(p)["default_generation_settings"]["drop_cold_available"], true)
            << p->body;
        auto r = post(s, "/v1/completions", req);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        EXPECT_EQ(body_json(r)["moestream"]["lossy"], true);
        EXPECT_EQ(body_json(r)["moestream"]["settings"]["engine"]["cache_store"], "fixed slots");
    }
    // The control: with the cache off drop-cold is refused by name.
    ServerProc s({"--lossless", "--cache-mb", "0"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto r = post(s, "/v1/completions", req);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(body_json(r)["error"]["param"], "drop_cold_experts") << r->body;
}

TEST(Server, LossyDefaultsApiKeyAndBodyLimit) {
    const std::string key = "s3cret-test-key-4711";
    ServerProc s({"--api-key", key, "--max-body", "4096"});
    ASSERT_GT(s.port(), 0) << s.log();
    // The startup line names the lossy default by its flag (the registry's words).
    EXPECT_NE(s.out().find("LOSSY defaults: --drop-cold-experts 0.75"), std::string::npos)
        << s.out();
    const json req{{"prompt", "Hello"}, {"max_tokens", 4}};
    const httplib::Headers auth{{"Authorization", "Bearer " + key}};
    auto c = s.client();
    for (const char * path : {"/v1/models", "/stats"}) {
        auto r = c.Get(path);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 401) << path;
        EXPECT_TRUE(body_json(r).contains("error"));
    }
    auto no = post(s, "/v1/completions", req);
    ASSERT_TRUE(no);
    EXPECT_EQ(no->status, 401);
    auto wrong = post(s, "/v1/completions", req, {{"Authorization", "Bearer nope"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);

    auto r = post(s, "/v1/completions", req, auth);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = body_json(r);
    EXPECT_EQ(j["moestream"]["lossy"], true);
    EXPECT_EQ(j["moestream"]["settings"]["request"]["drop_cold_experts"], 0.75);
    EXPECT_EQ(j["moestream"]["settings"]["engine"]["drop_cold_experts"], 0.75);
    json off = req;
    off["drop_cold_experts"] = 0;
    auto r2 = post(s, "/v1/completions", off, auth);
    ASSERT_TRUE(r2);
    json j2 = body_json(r2);
    EXPECT_EQ(j2["moestream"]["lossy"], true) << "it reused the KV the lossy request computed";
    EXPECT_EQ(j2["moestream"]["settings"]["engine"]["drop_cold_experts"], 0.0);
    off["cache_prompt"] = false;  // a fresh prefill with the knob off: lossless
    auto r3 = post(s, "/v1/completions", off, auth);
    ASSERT_TRUE(r3);
    EXPECT_EQ(body_json(r3)["moestream"]["lossy"], false) << r3->body;

    json big = req;
    big["prompt"] = std::string(8000, 'x');
    auto b = post(s, "/v1/completions", big, auth);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->status, 413);
    EXPECT_TRUE(body_json(b).contains("error")) << b->body;

    auto ok = post(s, "/v1/completions", req, auth);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    s.stop();
    const std::string log = s.log();
    EXPECT_NE(log.find("POST /v1/completions"), std::string::npos) << "the request log is on (-v)";
    EXPECT_EQ(log.find(key), std::string::npos) << "the API key must never be logged";
}

// A raw streaming request on its own socket; returns the fd (-1 on failure).
int send_stream(int port, const std::string & body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) return -1;
    std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    if (write(fd, req.data(), req.size()) != ssize_t(req.size())) return -1;
    return fd;
}

// The same, then reads until the first generated text has arrived.
int open_stream(int port, const std::string & body) {
    int fd = send_stream(port, body);
    if (fd < 0) return -1;
    std::string got;
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (got.find("\"content\":\"") == std::string::npos ||
           got.find("\"content\":\"\"") == got.rfind("\"content\":\"")) {
        pollfd p{fd, POLLIN, 0};
        if (std::chrono::steady_clock::now() > deadline) return -1;
        if (poll(&p, 1, 200) <= 0) continue;
        char buf[4096];
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) return -1;
        got.append(buf, size_t(n));
    }
    return fd;
}

json stats(const ServerProc & s) {
    auto r = s.client().Get("/stats");
    return r ? body_json(r) : json();
}

template <class F>
bool wait_until(F f, std::chrono::milliseconds limit = 60000ms) {  // the bound only catches a hang
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (f()) return true;
        std::this_thread::sleep_for(20ms);
    }
    return false;
}

// One generation at a time: requests wait in arrival order, a full queue answers 503 with
// Retry-After, and a client that disconnects mid-stream cancels its generation.
TEST(Server, QueueOrderBusyAndDisconnect) {
    ServerProc s({"--lossless", "--queue", "2"}, {"MOESTREAM_DEBUG_TOKEN_DELAY_MS=25"});
    ASSERT_GT(s.port(), 0) << s.log();
    const json long_req{{"messages", json::array({{{"role", "user"}, {"content", "Go on"}}})},
                        {"max_tokens", 2000},
                        {"stream", true}};
    int fd = open_stream(s.port(), long_req.dump());
    ASSERT_GE(fd, 0) << s.log();
    ASSERT_TRUE(wait_until([&] { return stats(s)["generating"] == true; }));

    // Two queued requests (B first, then C), then a third waiting one is refused.
    std::vector<std::string> order;
    std::mutex m;
    auto queued = [&](const std::string & name) {
        auto r = post(s, "/v1/completions", {{"prompt", "Hello " + name}, {"max_tokens", 3}});
        std::lock_guard<std::mutex> lk(m);
        order.push_back(name + ":" + (r ? std::to_string(r->status) : std::string("fail")));
    };
    std::thread b(queued, "B");
    ASSERT_TRUE(wait_until([&] { return stats(s)["queue_waiting"] == 1; }));
    std::thread c(queued, "C");
    ASSERT_TRUE(wait_until([&] { return stats(s)["queue_waiting"] == 2; }));
    auto busy = post(s, "/v1/completions", {{"prompt", "D"}, {"max_tokens", 1}});
    ASSERT_TRUE(busy);
    EXPECT_EQ(busy->status, 503);
    EXPECT_GE(std::atoi(busy->get_header_value("Retry-After").c_str()), 1);
    EXPECT_EQ(body_json(busy)["error"]["type"], "server_busy");

    // The streaming client goes away: its generation stops long before 2000 tokens.
    close(fd);
    b.join();
    c.join();
    EXPECT_EQ(order, (std::vector<std::string>{"B:200", "C:200"}));
    json st = stats(s);
    EXPECT_GE(st["requests"]["cancelled"].get<int>(), 1) << st.dump();
    EXPECT_EQ(st["requests"]["rejected_busy"], 1);
    EXPECT_NE(s.log().find("cancelled after"), std::string::npos) << s.log();
    const std::string lg = s.log();
    size_t at = lg.find("cancelled after ");
    ASSERT_NE(at, std::string::npos);
    EXPECT_LT(std::atoi(lg.c_str() + at + 16), 1500)
        << "generation stopped soon after the disconnect";
    // Healthy afterwards.
    auto ok = post(s, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
}

// --queue 0: the running request is the only one; any other gets 503 until it ends.
TEST(Server, QueueZeroServesOneAtATime) {
    ServerProc s({"--lossless", "--queue", "0"}, {"MOESTREAM_DEBUG_TOKEN_DELAY_MS=25"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto first = post(s, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
    ASSERT_TRUE(first);
    EXPECT_EQ(first->status, 200) << "an idle server takes a request even with no queue";
    const json long_req{{"messages", json::array({{{"role", "user"}, {"content", "Go on"}}})},
                        {"max_tokens", 2000},
                        {"stream", true}};
    int fd = open_stream(s.port(), long_req.dump());
    ASSERT_GE(fd, 0) << s.log();
    auto busy = post(s, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 1}});
    ASSERT_TRUE(busy);
    EXPECT_EQ(busy->status, 503);
    close(fd);
    ASSERT_TRUE(wait_until([&] { return stats(s)["generating"] == false; }));
    auto after = post(s, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 1}});
    ASSERT_TRUE(after);
    EXPECT_EQ(after->status, 200);
}

// A streaming client that leaves while it waits in the queue frees its place at once (the
// keep-alive comment written every 0.5 s fails), before the running request ends.
TEST(Server, QueuedClientThatLeavesFreesItsPlace) {
    ServerProc s({"--lossless", "--queue", "1"}, {"MOESTREAM_DEBUG_TOKEN_DELAY_MS=25"});
    ASSERT_GT(s.port(), 0) << s.log();
    const json long_req{{"messages", json::array({{{"role", "user"}, {"content", "Go on"}}})},
                        {"max_tokens", 2000},
                        {"stream", true}};
    int running = open_stream(s.port(), long_req.dump());
    ASSERT_GE(running, 0) << s.log();
    int queued = send_stream(s.port(), long_req.dump());
    ASSERT_GE(queued, 0);
    ASSERT_TRUE(wait_until([&] { return stats(s)["queue_waiting"] == 1; }));
    close(queued);
    ASSERT_TRUE(wait_until([&] { return stats(s)["queue_waiting"] == 0; }));
    // Left by its disconnect, not dequeued because the running request ended (2000 tokens).
    EXPECT_EQ(stats(s)["requests"]["served"], 0) << "the queue emptied only when the running request ended";
    EXPECT_EQ(stats(s)["generating"], true) << "the running request is not affected";
    close(running);
    ASSERT_TRUE(wait_until([&] { return stats(s)["generating"] == false; }));
    EXPECT_EQ(stats(s)["requests"]["cancelled"], 2);
}

// A port already in use is an error (exit 1), not a second server sharing the port.
TEST(Server, PortInUseFails) {
    ServerProc a({"--lossless"});
    ASSERT_GT(a.port(), 0) << a.log();
    ServerProc b({"--lossless", "--port", std::to_string(a.port())});
    EXPECT_EQ(b.port(), 0) << b.out();
    EXPECT_EQ(b.stop(), 1) << b.log();
    EXPECT_NE(b.log().find("cannot listen"), std::string::npos) << b.log();
}

// A message's `name` reaches the chat template as sent: a template that prints it shows it,
// one with no place for it (ChatML here; the real templates in the tree) leaves it out and
// renders exactly the prompt without it, as llama-server --jinja does. Control: the printing
// template differs with and without the name. A name that is not a string is a 400.
TEST(ServerApi, MessageNameGoesToTheTemplateAsLlamaServerDoes) {
    const auto render = [](const std::string & tmpl, const json & msg) {
        server::ChatExtras x;
        const json body{{"messages", json::array({msg})}};
        EXPECT_FALSE(server::parse_chat_extras(body.dump(), &x).has_value());
        chat::ChatFormat f;
        std::string err, out;
        EXPECT_TRUE(chat::load_chat_format(tmpl, "<s>", "</s>", false, &f, &err)) << err;
        chat::RenderInput in;
        in.messages = x.turns;
        in.messages_json = x.messages_json;
        EXPECT_TRUE(chat::render_chat_format(f, in, &out, &err)) << err;
        return out;
    };
    const std::string chatml =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n";
    const std::string named =
        "{% for m in messages %}{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}: "
        "{{ m.content }}\n{% endfor %}assistant:";
    const json plain{{"role", "user"}, {"content", "Hi"}};
    json with = plain;
    with["name"] = "alice";
    EXPECT_EQ(render(chatml, with), render(chatml, plain));
    // (A template's last newline is dropped, as Jinja does by default.)
    EXPECT_EQ(render(chatml, with), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant");
    EXPECT_EQ(render(named, with), "user (alice): Hi\nassistant:");
    EXPECT_NE(render(named, with), render(named, plain));  // control
    server::GenParams p;
    json bad = plain;
    bad["name"] = 7;
    const auto e = server::parse_request(json{{"messages", json::array({bad})}}.dump(), true, {}, &p);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->param, "messages[0].name");
}

TEST(ServerApi, Utf8StreamHoldsBackUnfinishedSequences) {
    server::Utf8Stream u;
    EXPECT_EQ(u.push("a\xE2\x82"), "a");  // "€" = E2 82 AC, split across pieces
    EXPECT_EQ(u.push("\xAC!"), "\xE2\x82\xAC!");
    EXPECT_EQ(u.push("\xFF"), "\xEF\xBF\xBD");  // invalid byte -> U+FFFD
    EXPECT_EQ(u.push("\xF0\x9F"), "");
    EXPECT_EQ(u.finish(), "\xEF\xBF\xBD");  // unfinished at the end -> U+FFFD
    EXPECT_EQ(server::sanitize_utf8("ok\xC0\xAFz"), "ok\xEF\xBF\xBD\xEF\xBF\xBDz");  // overlong
}

// The metrics without a server: what the worker reports is what /metrics and /stats show,
// read from a snapshot copy. Control: a counter nothing touched stays 0.
TEST(ServerApi, MetricsShowTheCountersTheWorkerReports) {
    server::ServerMetrics m(false, false);
    m.count_rejected();
    m.count_rejected();
    m.begin_job(7, 12);
    m.end_job(false, true);  // a generation whose client left
    const server::Snapshot s = m.snapshot();
    const std::string text = server::metrics_text(s, 3, 1.5);
    EXPECT_NE(text.find("\nmoestream_requests_rejected_busy_total 2\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nmoestream_requests_cancelled_total 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nmoestream_queue_waiting 3\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nmoestream_requests_errors_total 0\n"), std::string::npos)
        << "control: " << text;
    const json j = server::stats_figures_json(s, 3, 8);
    EXPECT_EQ(j["requests"]["rejected_busy"], 2);
    EXPECT_EQ(j["requests"]["cancelled"], 1);
    EXPECT_EQ(j["requests"]["served"], 0) << "control";
    EXPECT_EQ(j["request_id"], 7);
    EXPECT_EQ(j["n_prompt"], 12);
}

// /stats's phase follows the worker: prefill from begin_job, decode once a token is out, idle
// after end_job. Control: before any job, idle.
TEST(ServerApi, MetricsPhaseFollowsTheJob) {
    server::ServerMetrics m(false, false);
    auto phase = [&] { return server::stats_figures_json(m.snapshot(), 0, 0)["phase"]; };
    EXPECT_EQ(phase(), "idle") << "control";
    m.begin_job(1, 4);
    EXPECT_EQ(phase(), "prefill");
    m.publish_live(RunStats{});
    EXPECT_EQ(phase(), "decode");
    m.end_job(false, false);
    EXPECT_EQ(phase(), "idle");
}

}  // namespace
}  // namespace moestream::test

namespace moestream::test {
namespace {

// /tokenize and /detokenize round-trip; /apply-template gives the prompt chat generates from;
// /props and /metrics report the context and counters; the /chat/completions alias and the
// developer role work; token-id prompts are accepted when they round-trip.
TEST(Server, TokenizeDetokenizeTemplatePropsMetrics) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto t = post(s, "/tokenize", {{"content", "Hello"}});
    ASSERT_TRUE(t);
    ASSERT_EQ(t->status, 200) << t->body;
    const auto ids = body_json(t)["tokens"].get<std::vector<int>>();
    EXPECT_EQ(ids, (std::vector<int>{'H', 'e', 'l', 'l', 'o'})) << "byte-level vocabulary";
    auto d = post(s, "/detokenize", {{"tokens", ids}});
    ASSERT_TRUE(d);
    EXPECT_EQ(body_json(d)["content"], "Hello");
    auto bad = post(s, "/detokenize", {{"tokens", {1, 100000}}});
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << "control: an id outside the vocabulary";

    const json msgs = json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", "Hi"}}});
    auto at = post(s, "/apply-template", {{"messages", msgs}});
    ASSERT_TRUE(at);
    ASSERT_EQ(at->status, 200) << at->body;
    EXPECT_EQ(body_json(at)["prompt"],
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
    auto chat = post(s, "/chat/completions",
                     {{"messages", msgs}, {"max_tokens", 3}, {"return_tokens", true}});
    ASSERT_TRUE(chat);
    ASSERT_EQ(chat->status, 200) << chat->body;
    auto same = post(s, "/v1/completions",
                     {{"prompt", body_json(at)["prompt"]}, {"max_tokens", 3}, {"return_tokens", true}});
    ASSERT_TRUE(same);
    EXPECT_EQ(body_json(chat)["usage"]["prompt_tokens"], body_json(same)["usage"]["prompt_tokens"]);
    EXPECT_EQ(body_json(chat)["moestream"]["tokens"], body_json(same)["moestream"]["tokens"])
        << "chat generates from exactly the applied template";

    auto by_ids = post(s, "/v1/completions",
                       {{"prompt", ids}, {"max_tokens", 2}, {"cache_prompt", false},
                        {"return_tokens", true}});
    auto by_text = post(s, "/v1/completions",
                        {{"prompt", "Hello"}, {"max_tokens", 2}, {"cache_prompt", false},
                         {"return_tokens", true}});
    ASSERT_TRUE(by_ids && by_text);
    ASSERT_EQ(by_ids->status, 200) << by_ids->body;
    EXPECT_EQ(body_json(by_ids)["moestream"]["tokens"], body_json(by_text)["moestream"]["tokens"]);

    auto c = s.client();
    auto props = c.Get("/props");
    ASSERT_TRUE(props);
    EXPECT_EQ(body_json(props)["n_ctx"], 512) << "the synth model's context (no -c given)";
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    EXPECT_NE(m->body.find("\nmoestream_requests_served_total 4\n"), std::string::npos) << m->body;
    EXPECT_NE(m->body.find("# TYPE moestream_tokens_generated_total counter"), std::string::npos);
}

// --cors ORIGIN: the header on responses and preflights answered; without it neither.
TEST(Server, CorsOnlyWhenAskedAndBearerInAnyCase) {
    ServerProc s({"--lossless", "--cors", "http://localhost:3000", "--api-key", "k1"});
    ASSERT_GT(s.port(), 0) << s.log();
    auto c = s.client();
    auto pre = c.Options("/v1/chat/completions");
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
    auto lower = post(s, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 1}},
                      {{"Authorization", "bearer k1"}});
    ASSERT_TRUE(lower);
    EXPECT_EQ(lower->status, 200) << lower->body;
    auto wrong = post(s, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 1}},
                      {{"Authorization", "bearer K1"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << "control: the key itself is case-sensitive";

    ServerProc plain({"--lossless"});
    ASSERT_GT(plain.port(), 0) << plain.log();
    auto pc = plain.client();
    auto no = pc.Options("/v1/chat/completions");
    ASSERT_TRUE(no);
    EXPECT_EQ(no->status, 404);
    auto h = pc.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_FALSE(h->has_header("Access-Control-Allow-Origin"));
}

}  // namespace
}  // namespace moestream::test

namespace moestream::test {
namespace {

// response_format json_object: every reply that ends by itself is a JSON object; the same
// draws without it are not JSON (the control); combining it with grammar is refused.
TEST(Server, JsonObjectResponseFormatGivesJsonObjects) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    json req{{"messages", json::array({{{"role", "user"}, {"content", "JSON please"}}})},
             {"max_tokens", 60},
             {"temperature", 1.0}};
    int complete = 0, plain_json = 0;
    for (int seed = 1; seed <= 3; ++seed) {
        req["seed"] = seed;
        json jr = req;
        jr["response_format"] = {{"type", "json_object"}};
        auto r = post(s, "/v1/chat/completions", jr);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json c = body_json(r)["choices"][0];
        if (c["finish_reason"] == "stop") {
            ++complete;
            json parsed = json::parse(c["message"]["content"].get<std::string>(), nullptr, false);
            EXPECT_TRUE(parsed.is_object()) << c["message"]["content"];
        }
        json short_req = req;
        short_req["max_tokens"] = 16;
        auto p = post(s, "/v1/chat/completions", short_req);
        ASSERT_TRUE(p);
        const std::string text = body_json(p)["choices"][0]["message"]["content"];
        if (!json::parse(text, nullptr, false).is_discarded()) ++plain_json;
    }
    EXPECT_GT(complete, 0) << "some replies end by themselves";
    EXPECT_EQ(body_json(post(s, "/v1/chat/completions", req))["moestream"]["settings"]["request"]
                  ["response_format"],
              "text");
    EXPECT_EQ(plain_json, 0) << "control: without response_format the model writes no JSON";
    json both = req;
    both["response_format"] = {{"type", "json_object"}};
    both["grammar"] = "root ::= \"a\"";
    auto b = post(s, "/v1/chat/completions", both);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->status, 400);
    EXPECT_EQ(body_json(b)["error"]["param"], "response_format");
}

}  // namespace
}  // namespace moestream::test

namespace moestream::test {
namespace {

// The schema of the json_schema tests and a check of it written here: an object with "name"
// (a string; at most 3 characters keeps the random model's strings short), "age" (an integer)
// and "kind" ("a" or "b"), nothing else.
const char kPersonSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},"age":{"type":"integer"},)"
    R"("kind":{"enum":["a","b"]}},"required":["name","age","kind"],"additionalProperties":false})";
bool is_person(const json & v) {
    if (!v.is_object() || v.size() != 3 || !v.contains("name") || !v.contains("age") ||
        !v.contains("kind"))
        return false;
    if (!v["name"].is_string() || !v["age"].is_number_integer() ||
        (v["kind"] != "a" && v["kind"] != "b"))
        return false;
    size_t chars = 0;
    for (unsigned char c : v["name"].get<std::string>()) chars += (c & 0xC0) != 0x80;
    return chars <= 3;
}

// response_format json_schema (and llama-server's json_schema field): replies that end by
// themselves are instances of the schema, property order as the schema gives it; the same
// draws without it are not (the control).
TEST(Server, JsonSchemaResponseFormatFollowsTheSchema) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    json req{{"messages", json::array({{{"role", "user"}, {"content", "a person"}}})},
             {"max_tokens", 80},
             {"temperature", 1.0}};
    int complete = 0, plain_ok = 0;
    for (int seed = 1; seed <= 4; ++seed) {
        req["seed"] = seed;
        // The body as text: nlohmann::json would sort the schema's keys.
        std::string text_body = req.dump();
        text_body.pop_back();
        if (seed % 2)
            text_body += R"(,"response_format":{"type":"json_schema","json_schema":{"name":"person",)"
                    R"("strict":true,"schema":)" + std::string(kPersonSchema) + "}}}";
        else
            text_body += R"(,"json_schema":)" + std::string(kPersonSchema) + "}";
        auto r = s.client().Post("/v1/chat/completions", text_body, "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json body = body_json(r);
        EXPECT_EQ(body["moestream"]["settings"]["request"]["response_format"], "json_schema");
        const json c = body["choices"][0];
        if (c["finish_reason"] == "stop") {
            ++complete;
            const std::string text = c["message"]["content"];
            EXPECT_TRUE(is_person(json::parse(text, nullptr, false))) << text;
            EXPECT_LT(text.find("\"name\""), text.find("\"age\"")) << "schema order: " << text;
            EXPECT_LT(text.find("\"age\""), text.find("\"kind\"")) << "schema order: " << text;
        }
        json plain = req;
        plain["max_tokens"] = 30;
        auto p = post(s, "/v1/chat/completions", plain);
        ASSERT_TRUE(p);
        if (is_person(json::parse(body_json(p)["choices"][0]["message"]["content"].get<std::string>(),
                                  nullptr, false)))
            ++plain_ok;
    }
    EXPECT_GT(complete, 0) << "some replies end by themselves";
    EXPECT_EQ(plain_ok, 0) << "control: without the schema the model writes no such object";
    // An unsupported keyword: 400 naming it and where it is.
    json bad = req;
    bad["response_format"] = {
        {"type", "json_schema"},
        {"json_schema",
         {{"name", "x"},
          {"schema", json::parse(R"({"type":"object","properties":{"e":{"type":"string","format":"ipv6"}}})")}}}};
    auto b = post(s, "/v1/chat/completions", bad);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->status, 400);
    EXPECT_EQ(body_json(b)["error"]["param"], "response_format");
    const std::string msg = body_json(b)["error"]["message"];
    EXPECT_NE(msg.find("'format' at #/properties/e/format"), std::string::npos) << msg;
}

json chat_lp(const ServerProc & s, json extra) {
    json req{{"messages", json::array({{{"role", "user"}, {"content", "Count"}}})},
             {"max_tokens", 12},
             {"ignore_eos", true},
             {"logprobs", true},
             {"top_logprobs", 5},
             {"cache_prompt", false}};  // reused KV is not bit-exact: the logprobs would differ
    for (auto it = extra.begin(); it != extra.end(); ++it) req[it.key()] = it.value();
    auto r = post(s, "/v1/chat/completions", req);
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return body_json(r);
}

// logprobs: the OpenAI shapes (chat and completions, streamed and not) and their sanity: every
// log probability <= 0, top_logprobs sorted and their probabilities summing to at most 1, the
// greedy token the most likely one, its bytes the reply's text. Controls: sampled at a high
// temperature the chosen token is not always the most likely; logit_bias changes the choice
// but not the reported (raw) probability.
TEST(Server, LogprobsHaveOpenAiShapesAndAreSane) {
    ServerProc s({"--lossless"});
    ASSERT_GT(s.port(), 0) << s.log();
    const json g = chat_lp(s, json::object());
    const json & lp = g["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), 12u) << g.dump();
    std::string bytes;
    for (const json & e : lp) {
        ASSERT_TRUE(e["token"].is_string() && e["logprob"].is_number() && e["bytes"].is_array());
        EXPECT_LE(e["logprob"].get<double>(), 0.0);
        ASSERT_EQ(e["top_logprobs"].size(), 5u);
        double mass = 0, prev = 0;
        for (size_t i = 0; i < 5; ++i) {
            const double l = e["top_logprobs"][i]["logprob"];
            EXPECT_LE(l, 0.0);
            if (i) {
                EXPECT_LE(l, prev) << "sorted, most likely first";
            }
            prev = l;
            mass += std::exp(l);
        }
        EXPECT_LE(mass, 1.0 + 1e-5);
        EXPECT_EQ(e["top_logprobs"][0]["bytes"], e["bytes"]) << "greedy: the most likely token";
        EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
        for (int b : e["bytes"]) bytes += char(b);
    }
    EXPECT_EQ(server::sanitize_utf8(bytes), g["choices"][0]["message"]["content"]);
    const json off = chat_lp(s, {{"logprobs", false}, {"top_logprobs", nullptr}});
    EXPECT_TRUE(off["choices"][0]["logprobs"].is_null()) << "control: off when not asked";

    // Control: sampled hot, some chosen tokens are not the most likely one.
    const json hot = chat_lp(s, {{"temperature", 5.0}, {"seed", 3}, {"max_tokens", 30}});
    int not_top = 0;
    for (const json & e : hot["choices"][0]["logprobs"]["content"])
        not_top += e["logprob"].get<double>() < e["top_logprobs"][0]["logprob"].get<double>();
    EXPECT_GT(not_top, 0) << "the greedy check above can fail";
    // logit_bias forces 'Q' (byte token 81): chosen every time, its probability the model's.
    const json q = chat_lp(s, {{"logit_bias", {{"81", 100}}}});
    int below = 0;
    for (const json & e : q["choices"][0]["logprobs"]["content"]) {
        EXPECT_EQ(e["token"], "Q");
        below += e["logprob"].get<double>() < e["top_logprobs"][0]["logprob"].get<double>();
    }
    EXPECT_GT(below, 0) << "the reported probability is before the bias";

    // Streamed: the chunks' entries are the same as the whole reply's.
    json sreq{{"messages", json::array({{{"role", "user"}, {"content", "Count"}}})},
              {"max_tokens", 12}, {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 5},
              {"stream", true}, {"cache_prompt", false}};
    auto st = post(s, "/v1/chat/completions", sreq);
    ASSERT_TRUE(st);
    json streamed = json::array();
    for (const std::string & d : sse_data(st->body)) {
        if (d == "[DONE]") continue;
        const json c = json::parse(d)["choices"][0];
        if (c.contains("logprobs") && c["logprobs"].is_object())
            for (const json & e : c["logprobs"]["content"]) streamed.push_back(e);
    }
    EXPECT_EQ(streamed, lp);

    // Completions: integer logprobs, parallel arrays, top_logprobs with the chosen token.
    json creq{{"prompt", "Count"}, {"max_tokens", 8}, {"ignore_eos", true}, {"logprobs", 3},
              {"cache_prompt", false}};
    auto cr = post(s, "/v1/completions", creq);
    ASSERT_TRUE(cr);
    ASSERT_EQ(cr->status, 200) << cr->body;
    const json cl = body_json(cr)["choices"][0]["logprobs"];
    ASSERT_EQ(cl["tokens"].size(), 8u) << cl.dump();
    ASSERT_EQ(cl["token_logprobs"].size(), 8u);
    ASSERT_EQ(cl["top_logprobs"].size(), 8u);
    ASSERT_EQ(cl["text_offset"].size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
        EXPECT_LE(cl["top_logprobs"][i].size(), 4u);
        EXPECT_TRUE(cl["top_logprobs"][i].contains(cl["tokens"][i].get<std::string>()));
        if (i) {
            EXPECT_GT(cl["text_offset"][i].get<int>(), cl["text_offset"][i - 1].get<int>());
        }
    }
    creq["stream"] = true;
    auto cs = post(s, "/v1/completions", creq);
    ASSERT_TRUE(cs);
    json offsets = json::array(), toks = json::array();
    for (const std::string & d : sse_data(cs->body)) {
        if (d == "[DONE]") continue;
        const json c = json::parse(d)["choices"][0];
        if (!c["logprobs"].is_object()) continue;
        for (const json & o : c["logprobs"]["text_offset"]) offsets.push_back(o);
        for (const json & t : c["logprobs"]["tokens"]) toks.push_back(t);
    }
    EXPECT_EQ(offsets, cl["text_offset"]);
    EXPECT_EQ(toks, cl["tokens"]);
}

}  // namespace

// Tool schemas a client may send to a template with tool calls (hermes-qwen3): a property
// whose "type" is a list is served, not a 500 ("type must be string"); 5000 optional
// properties with a forced call build their grammar in linear size (it was quadratic: 89 s of
// CPU on this machine before the answer) and get their answer (here: the prompt does not fit)
// within seconds of the server's CPU time (not wall time, which load stretches); a schema 60 objects deep (within the bounds) is served (the control);
// /tokenize's with_pieces must be a boolean.
TEST(Server, HostileToolSchemasAreBoundedAndNeverA500) {
    const std::string tmpl = src_dir() + "/tests/api/templates/hermes-qwen3.jinja";
    char dir[] = "/tmp/moestream-hermes-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string model = std::string(dir) + "/hermes.gguf";
    CmdResult m = run_cmd(gguf_mutate_cmd() + " " + sh_quote(tiny_model()) + " " + sh_quote(model) + " set-file " +
                          sh_quote("tokenizer.chat_template=" + tmpl));
    ASSERT_EQ(m.exit_code, 0) << m.err;
    ServerProc s({"--lossless", "-c", "4096"}, {}, model);
    ASSERT_GT(s.port(), 0) << s.log();
    const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
    auto tool_req = [&](const json & params) {
        return json{{"messages", msgs},
                    {"max_tokens", 2},
                    {"tools", json::array({{{"type", "function"},
                                            {"function", {{"name", "f"}, {"parameters", params}}}}})},
                    {"tool_choice", "required"}};
    };
    auto r = post(s, "/v1/chat/completions",
                  tool_req({{"type", "object"},
                            {"properties", {{"a", {{"type", json::array({"string", "null"})}}}}},
                            {"required", json::array({"a"})}}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    json big = {{"type", "object"}, {"properties", json::object()}};
    for (int i = 0; i < 5000; ++i) big["properties"]["p" + std::to_string(i)] = {{"type", "string"}};
    const double cpu0 = s.cpu_seconds();
    r = post(s, "/v1/chat/completions", tool_req(big));
    const double cpu = s.cpu_seconds() - cpu0;  // CPU, not wall time: the machine is shared
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("longer than the context"), std::string::npos) << r->body;
    ASSERT_GT(cpu0, 0.0) << "the server has used CPU (loading, earlier requests): /proc is read";
    EXPECT_LT(cpu, 30.0) << "a 5000-property schema took " << cpu << " s of CPU";
    json deep = {{"type", "string"}};
    for (int i = 0; i < 60; ++i) deep = {{"type", "object"}, {"properties", {{"a", deep}}}};
    r = post(s, "/v1/chat/completions", tool_req(deep));
    ASSERT_TRUE(r);
    EXPECT_NE(r->status, 500) << r->body;
    EXPECT_EQ(body_json(r)["error"]["param"], json()) << r->body;  // served or too long, not refused by nesting
    auto c = s.client();
    auto tk = c.Post("/tokenize", R"({"content":"hi","with_pieces":"yes"})", "application/json");
    ASSERT_TRUE(tk);
    EXPECT_EQ(tk->status, 400) << tk->body;
    EXPECT_EQ(body_json(tk)["error"]["param"], "with_pieces");
    tk = c.Post("/tokenize", R"({"content":"hi","with_pieces":true})", "application/json");
    ASSERT_TRUE(tk);
    EXPECT_EQ(tk->status, 200) << tk->body;
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(s.stop(), 0);
    std::filesystem::remove_all(dir);
}

}  // namespace moestream::test

namespace moestream::test {
namespace {

// --prompt-cache: a second server on the same directory restores the first one's prompt (the
// same completion, nothing prefilled); a server without --slot-save-path refuses slot actions.
TEST(Server, PromptCacheRestoresAPromptAcrossRestarts) {
    TempDir dir("serve-pcache");
    const json req{{"prompt", "Once upon a time in a quiet town by the sea"}, {"max_tokens", 6}};
    json first, second, second_stats;
    for (json * out : {&first, &second}) {
        ServerProc s({"--lossless", "--prompt-cache", dir.path("kv")});
        ASSERT_GT(s.port(), 0) << s.log();
        auto r = post(s, "/v1/completions", req);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        *out = body_json(r);
        if (out == &second) {
            auto st = s.client().Get("/stats");
            ASSERT_TRUE(st);
            second_stats = body_json(st);
            auto slot = post(s, "/slots/0?action=save", json{{"filename", "a.bin"}});
            ASSERT_TRUE(slot);
            EXPECT_EQ(slot->status, 501) << slot->body;
        }
    }
    EXPECT_EQ(first["moestream"]["stats"]["prompt_cache_tokens"], 0);
    EXPECT_EQ(second["moestream"]["stats"]["prompt_cache_tokens"],
              second["moestream"]["stats"]["n_prompt"]);
    EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
    EXPECT_EQ(second_stats["prompt_cache"]["tokens_restored"],
              second["moestream"]["stats"]["n_prompt"]);
}

// --slot-save-path: save, erase, restore (the next request reuses the restored KV); a bad
// filename, action or slot id and a corrupt file are 400, and the server stays up.
TEST(Server, SlotSaveEraseRestoreAndRefusals) {
    TempDir dir("serve-slots");
    ServerProc s({"--lossless", "--slot-save-path", dir.dir()});
    ASSERT_GT(s.port(), 0) << s.log();
    const json req{{"prompt", "Once upon a time in a quiet town by the sea"}, {"max_tokens", 4}};
    auto g = post(s, "/v1/completions", req);
    ASSERT_TRUE(g);
    ASSERT_EQ(g->status, 200);
    auto sv = post(s, "/slots/0?action=save", json{{"filename", "a.bin"}});
    ASSERT_TRUE(sv);
    ASSERT_EQ(sv->status, 200) << sv->body;
    const json saved = body_json(sv);
    EXPECT_EQ(saved["filename"], "a.bin");
    EXPECT_GT(saved["n_saved"].get<int>(), 0);
    struct stat st;
    ASSERT_EQ(stat(dir.path("a.bin").c_str(), &st), 0);
    EXPECT_EQ(uint64_t(st.st_size), saved["n_written"].get<uint64_t>());
    auto er = post(s, "/slots/0?action=erase", json::object());
    ASSERT_TRUE(er);
    EXPECT_EQ(body_json(er)["n_erased"], saved["n_saved"]);
    auto rs = post(s, "/slots/0?action=restore", json{{"filename", "a.bin"}});
    ASSERT_TRUE(rs);
    ASSERT_EQ(rs->status, 200) << rs->body;
    EXPECT_EQ(body_json(rs)["n_restored"], saved["n_saved"]);
    auto g2 = post(s, "/v1/completions", req);
    ASSERT_TRUE(g2);
    EXPECT_GT(body_json(g2)["moestream"]["stats"]["n_prompt_reused"].get<int>(), 0)
        << "the restored KV is reused";

    ASSERT_TRUE(write_bytes(dir.path("bad.bin"), "not a KV file at all"));
    for (const auto & [path, body] : std::vector<std::pair<std::string, json>>{
             {"/slots/0?action=restore", json{{"filename", "bad.bin"}}},
             {"/slots/0?action=save", json{{"filename", "../escape.bin"}}},
             {"/slots/0?action=fly", json{{"filename", "a.bin"}}},
             {"/slots/1?action=save", json{{"filename", "a.bin"}}}}) {
        auto r = post(s, path, body);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << path << " " << r->body;
    }
    EXPECT_NE(stat((dir.dir() + "/../escape.bin").c_str(), &st), 0);
    auto h = s.client().Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
}

}  // namespace
}  // namespace moestream::test
