// server.cpp — `moestream serve` (see server.h and docs/server.md): HTTP routes, the job
// queue, the worker thread that owns the Engine, and the stats snapshots.
#include "server.h"
#include "responses.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "chat_jinja.h"
#include "chat_request.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"
#include "logprobs_json.h"
#include "time_json.h"
#include "web_assets.h"

namespace moestream::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double now_s() {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}
double mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

std::string dump(const json & j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The field a library refusal names: its message starts with it ("top_p must be ...",
// "logit_bias: token id ..."), else "".
std::string field_of(const std::string & msg) {
    static const char * const kFields[] = {
        "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
        "presence_penalty", "frequency_penalty", "logit_bias", "grammar", "ignore_eos",
        "stop", "n_predict"};
    for (const char * f : kFields) {
        const size_t n = std::strlen(f);
        if (msg.compare(0, n, f) == 0 && (msg.size() == n || msg[n] == ' ' || msg[n] == ':' ||
                                          msg[n] == '['))
            return std::string(f) == "n_predict" ? "max_tokens" : f;
    }
    return "";
}

// The connected socket of a request (httplib 0.11 does not expose it): the fd of this
// process whose local and peer ports and peer address are the request's. -1 if not found.
int find_request_socket(const httplib::Request & req) {
    DIR * d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    while (dirent * e = readdir(d)) {
        const int fd = std::atoi(e->d_name);
        if (fd <= 2) continue;
        sockaddr_storage a{}, b{};
        socklen_t la = sizeof a, lb = sizeof b;
        if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &la) != 0 ||
            getpeername(fd, reinterpret_cast<sockaddr *>(&b), &lb) != 0)
            continue;
        auto port_of = [](const sockaddr_storage & s) {
            if (s.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in &>(s).sin_port));
            if (s.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6 &>(s).sin6_port));
            return -1;
        };
        char host[INET6_ADDRSTRLEN] = {0};
        if (b.ss_family == AF_INET)
            inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(b).sin_addr, host, sizeof host);
        else if (b.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(b).sin6_addr, host, sizeof host);
        if (port_of(a) == req.local_port && port_of(b) == req.remote_port &&
            req.remote_addr == host) {
            found = fd;
            break;
        }
    }
    closedir(d);
    return found;
}

// True when the peer has closed its side of the connection (or it failed).
bool peer_gone(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// One generation request, shared by the HTTP thread that owns the connection and the worker.
struct Job {
    uint64_t id = 0;
    GenParams params;
    ChatPlan plan;  // chat: how the reply is split (chat_request.h)
    int64_t created = 0;  // unix seconds (the OpenAI "created" field)
    std::atomic<bool> cancelled{false};

    std::mutex m;  // guards everything below
    std::condition_variable cv;
    std::string unsent;  // streamed text (valid UTF-8) not yet written to the client
    std::string unsent_reasoning;  // the same for reasoning_content
    std::string reasoning;         // the whole reasoning_content
    std::vector<ToolCall> calls;   // parsed tool calls; calls_sent of them streamed
    size_t calls_sent = 0;
    bool done = false;
    Status status;     // when done
    std::string text;  // the whole completion (valid UTF-8)
    std::vector<int32_t> tokens;
    std::string finish_reason;
    std::string stop_string;  // finish "stop" on a stop string: which
    std::vector<TokenLogprob> logprobs;         // params.logprobs >= 0: every token's
    std::vector<TokenLogprob> unsent_logprobs;  // streamed: not yet written
    size_t logprobs_offset = 0;  // streamed completions: text_offset of the next token
    json moestream;  // settings, lossy, per-request stats
    // A slot action (POST /slots/{id}) instead of a generation: run on the worker, which
    // owns the engine; it fills `moestream` with the response.
    std::function<Status(json *)> action;
    int n_prompt = 0, n_generated = 0;
    bool llama_shape = false;  // llama-server's /completion reply shape (set before it runs)
    bool responses = false;    // /v1/responses: a Response object and its events
};

// Where a /v1/responses stream is (responses.h): the items opened so far and their text.
struct ResponsesStream {
    int seq = 0;  // sequence_number of the next event
    bool created = false;
    int next_index = 0;  // output_index of the next item
    int reasoning_index = -1, message_index = -1;
    bool reasoning_closed = false;
    std::string text, reasoning;
};

// The worker's view for /stats, published under Server::stats_m_.
struct Snapshot {
    bool generating = false;
    bool prefilling = false;  // generating, and no token out yet: the prompt is being processed
    int n_prompt = 0;         // the running (or last) request's prompt tokens
    uint64_t job_id = 0;
    int n_generated = 0;
    double tok_s = 0, cache_hit_pct = 0, mib_per_token = 0;
    TimeBreakdown decode_time;  // the running (or last) request's decode steps
    uint64_t served = 0, cancelled = 0, errors = 0, rejected_busy = 0;
    double resident_expert_mib = 0, cache_budget_mib = 0, cache_hit_pct_total = 0;
    double avg_request_s = 0;
    uint64_t prompt_tokens_total = 0, generated_tokens_total = 0;
    double prefill_s_total = 0, decode_s_total = 0;
    bool lossy = false;
    json engine_settings;
    json cache;  // the expert cache's counters since start, as of the last finished request
    json read_latency;  // the last finished request's expert read times (null: not streaming)
    json prompt_cache;  // the last finished request's --prompt-cache restore (null: off)
    json warm_experts;  // --warm-experts: the file, experts listed and read, first-16 hit rate
};

// /stats "cache": the expert cache's counters over the engine's life (docs/server.md); null
// without a cache.
json cache_counters_json(const RunStats & s) {
    if (s.cache_budget_bytes == 0) return nullptr;
    return json{{"lookups", s.cache_lookups},
                {"hits", s.cache_hits},
                {"misses", s.cache_misses},
                {"evictions", s.evictions},
                {"rereads", s.rereads},
                {"commit_failures", s.cache_commit_failures},
                {"recycled_commits", s.cache_recycled_commits},
                {"moved_commits", s.cache_moved_commits},
                {"deferred_commits", s.cache_deferred_commits},
                {"warmed_commits", s.cache_warmed_commits},
                {"pool_mib", mib(double(s.cache_pool_bytes))},
                {"pool_warm_mib", mib(double(s.cache_pool_warm_bytes))},
                {"pool_warm_error", s.cache_pool_warm_error}};
}

// The decode figures of the current (or last) generation, from the engine's per-token stats.
struct DecodeFigures {
    double tok_s = 0, cache_hit_pct = 0, mib_per_token = 0;
};
DecodeFigures decode_figures(const RunStats & s) {
    double dec_s = 0, bytes = 0;
    uint64_t hits = 0, misses = 0;
    for (const TokenStats & t : s.tokens) {
        dec_s += t.decode_s;
        bytes += double(t.flash_bytes_read);
        hits += t.cache_hits;
        misses += t.cache_misses;
    }
    const size_t n = s.tokens.size();
    DecodeFigures f;
    f.tok_s = dec_s > 0 ? double(n) / dec_s : 0;
    f.cache_hit_pct = hits + misses ? 100.0 * double(hits) / double(hits + misses) : 0;
    f.mib_per_token = n ? mib(bytes / double(n)) : 0;
    return f;
}

int http_status(const Status & st) {
    switch (st.code()) {
        case ErrorCode::kUsage:
        case ErrorCode::kBadInput:
            return 400;
        default:
            return 500;
    }
}

// Constant-time comparison (the key's length is not secret).
bool same_key(const std::string & a, const std::string & b) {
    if (a.size() != b.size()) return false;
    unsigned char d = 0;
    for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
    return d == 0;
}

std::string basename_of(const std::string & path) {
    size_t s = path.find_last_of('/');
    return s == std::string::npos ? path : path.substr(s + 1);
}

// A request's drop_cold_experts refused, in the server's words (its flags).
std::string drop_cold_refusal(DropColdBlock why) {
    switch (why) {
        case DropColdBlock::kFixedSlots:
            return "drop_cold_experts needs the LRU expert cache, and this server's budget is "
                   "held by the fixed-slot cache (start it without --lossless, or with "
                   "MOESTREAM_SLOT_CACHE=0)";
        case DropColdBlock::kMissFallback:
            return "drop_cold_experts cannot be combined with --miss-fallback";
        case DropColdBlock::kResident:
        case DropColdBlock::kCacheOff:
        case DropColdBlock::kNone:
            break;
    }
    return "drop_cold_experts needs the expert cache, which is off in this server (--cache-mb / "
           "--no-stream)";
}

class Server {
public:
    Server(const ServeConfig & cfg, std::unique_ptr<Engine> engine)
        : cfg_(cfg), engine_(std::move(engine)) {
        model_name_ = cfg.alias.empty() ? basename_of(cfg.run.model_path) : cfg.alias;
        std::string bos, eos, err;
        bool bos_added = false;
        engine_->special_texts(&bos, &eos, &bos_added);
        const std::string src =
            cfg.chat_template.empty() ? engine_->chat_template() : cfg.chat_template;
        if (load_chat_format(src, bos, eos, bos_added, &fmt_, &err)) {
            tmpl_ = fmt_.name;
            if (!cfg.chat_template_from.empty()) tmpl_ += " from " + cfg.chat_template_from;
        } else {
            tmpl_error_ = "the chat template (" +
                          (cfg.chat_template_from.empty() ? std::string("the model's")
                                                          : cfg.chat_template_from) +
                          ") cannot be rendered (" + err + ")" +
                          "; give a template that renders with --chat-template-file";
        }
        drop_cold_block_ = engine_->drop_cold_block();
        publish_after_job(0, 0);
    }

    // Why the chat template cannot be used ("" = it renders): the server does not start.
    const std::string & template_error() const { return tmpl_error_; }

    int serve() {
        setup_routes();
        int port = cfg_.port;
        if (port == 0) {
            port = http_.bind_to_any_port(cfg_.host);
            if (port < 0) return bind_failed();
        } else if (!http_.bind_to_port(cfg_.host, port)) {
            return bind_failed();
        }
        // cpp-httplib listens with a backlog of 5: a burst of connections would be refused or
        // delayed by the kernel. listen() again on the bound socket raises it.
        if (listen_fd_ >= 0) ::listen(listen_fd_, 512);
        if (cfg_.host.compare(0, 4, "127.") != 0 && cfg_.host != "localhost" && cfg_.host != "::1")
            MS_LOG_WARN("listening on %s: reachable from other machines%s", cfg_.host.c_str(),
                        cfg_.api_key.empty() ? " and no --api-key is set" : "");
        worker_ = std::thread([this] { worker_loop(); });
        std::printf(
            "moestream serve: listening on http://%s:%d/ (model %s, %s, context %d, chat "
            "template %s)\n",
            cfg_.host.find(':') != std::string::npos ? ("[" + cfg_.host + "]").c_str()
                                                     : cfg_.host.c_str(),
            port, model_name_.c_str(), engine_->lossy() ? "LOSSY defaults" : "lossless",
            engine_->n_ctx(), tmpl_.empty() ? "none (unsupported)" : tmpl_.c_str());
        std::fflush(stdout);
        bool ok = http_.listen_after_bind();
        shutdown();
        return ok ? 0 : 1;
    }

    // From the signal thread: cancel what runs and waits, let the open streams send their
    // final chunk and [DONE] (cpp-httplib stops writing chunks once it stops listening), then
    // stop accepting; serve() returns once the HTTP threads are done.
    void stop() {
        {
            std::lock_guard<std::mutex> lk(q_m_);
            stopping_ = true;
            for (auto & j : queue_) j->cancelled = true;
            if (running_) running_->cancelled = true;
        }
        q_cv_.notify_all();
        const double deadline = now_s() + 3.0;
        while (open_streams_.load() > 0 && now_s() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        http_.stop();
    }

private:
    int bind_failed() {
        MS_LOG_ERROR("cannot listen on %s:%d (in use, or not an address of this machine)",
                     cfg_.host.c_str(), cfg_.port);
        return 1;
    }

    void shutdown() {
        {
            std::lock_guard<std::mutex> lk(q_m_);
            stopping_ = true;
            for (auto & j : queue_) j->cancelled = true;
            if (running_) running_->cancelled = true;
        }
        q_cv_.notify_all();
        if (worker_.joinable()) worker_.join();
    }

    // ---- HTTP -------------------------------------------------------------------------
    static void send_json(httplib::Response & res, int status, const json & j) {
        res.status = status;
        res.set_content(dump(j) + "\n", "application/json");
    }
    static void send_error(httplib::Response & res, const ApiError & e) {
        send_json(res, e.status, error_json(e));
    }
    static ApiError api_error(int status, const std::string & msg, const std::string & type) {
        ApiError e;
        e.status = status;
        e.message = msg;
        e.type = type;
        return e;
    }

    bool authorized(const httplib::Request & req, httplib::Response & res) const {
        if (cfg_.api_key.empty()) return true;
        const std::string h = req.get_header_value("Authorization");
        // The scheme is case-insensitive (RFC 9110); the key is not.
        const std::string prefix = "bearer ";
        bool scheme = h.size() > prefix.size();
        for (size_t i = 0; scheme && i < prefix.size(); ++i)
            scheme = std::tolower(static_cast<unsigned char>(h[i])) == prefix[i];
        if (scheme && same_key(h.substr(prefix.size()), cfg_.api_key)) return true;
        res.set_header("WWW-Authenticate", "Bearer");
        ApiError e = api_error(401, "missing or wrong API key (Authorization: Bearer KEY)",
                               "authentication_error");
        e.code = "invalid_api_key";
        send_error(res, e);
        return false;
    }

    // Browsers send a cross-origin POST without asking first only for form content types (or
    // none): requiring application/json from a browser keeps other web sites from driving this
    // server. A request without an Origin header does not come from a web page (curl -d, SDKs):
    // its body is read as JSON whatever its Content-Type says.
    static bool json_body(const httplib::Request & req, httplib::Response & res) {
        const std::string ct = req.get_header_value("Content-Type");
        if (ct.compare(0, 16, "application/json") == 0) return true;
        if (!req.has_header("Origin")) return true;
        send_error(res, api_error(415,
                                  "Content-Type must be application/json for a request from a "
                                  "web page (one with an Origin header)",
                                  "invalid_request_error"));
        return false;
    }

    // The routes, for the 404 that names them.
    static const char * routes_text() {
        return "GET /health, /stats, /props, /metrics, /slots, /v1/models, /v1/models/{id}, / "
               "(the web page, /favicon.ico); POST /v1/chat/completions, /v1/completions, /v1/responses, /completion, "
               "/tokenize, /detokenize, /apply-template";
    }

    void setup_routes() {
        // A connection holds a pool thread while it sends its request, however slowly, and
        // while it is kept alive idle: a large pool keeps slow or idle sockets from starving
        // /health and the API; per-read/write timeouts and keep-alive limits bound each one.
        http_.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
        // cpp-httplib's default sets SO_REUSEPORT, which lets a second server bind the same
        // port and share its connections: only SO_REUSEADDR (a quick restart) here.
        http_.set_socket_options([this](int sock) {
            int yes = 1;
            setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
            listen_fd_ = sock;
        });
        http_.set_payload_max_length(cfg_.body_limit_bytes);
        http_.set_keep_alive_timeout(5);
        http_.set_keep_alive_max_count(100);
        http_.set_read_timeout(5, 0);
        http_.set_write_timeout(5, 0);
        if (!cfg_.cors_origin.empty()) {
            const std::string origin = cfg_.cors_origin;
            http_.set_post_routing_handler(
                [origin](const httplib::Request &, httplib::Response & res) {
                    res.set_header("Access-Control-Allow-Origin", origin);
                    res.set_header("Vary", "Origin");
                });
            http_.Options(".*", [](const httplib::Request &, httplib::Response & res) {
                res.status = 204;
                res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
                res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
                res.set_header("Access-Control-Max-Age", "600");
            });
        }
        http_.set_logger([](const httplib::Request & req, const httplib::Response & res) {
            MS_LOG_INFO("%s %s -> %d", req.method.c_str(), req.path.c_str(), res.status);
        });
        http_.set_error_handler([](const httplib::Request & req, httplib::Response & res) {
            if (!res.body.empty()) return;
            std::string msg = "HTTP error " + std::to_string(res.status);
            if (res.status == 404)
                msg = "Invalid URL (" + req.method + " " + req.path + "); this server has " +
                      routes_text();
            if (res.status == 405) msg = "method not allowed";
            if (res.status == 413) msg = "the request body is larger than the limit (--max-body)";
            send_json(res, res.status,
                      error_json(api_error(res.status, msg, "invalid_request_error")));
        });
        http_.set_exception_handler(
            [](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
                std::string what = "internal error";
                try {
                    if (ep) std::rethrow_exception(ep);
                } catch (const std::exception & e) {
                    what = e.what();
                } catch (...) {
                }
                MS_LOG_ERROR("request failed: %s", what.c_str());
                send_json(res, 500, error_json(api_error(500, what, "server_error")));
            });

        static const std::vector<WebAsset> no_assets;
        for (const WebAsset & a : cfg_.webui ? web_assets() : no_assets) {
            const std::string path = a.path == "/index.html" ? "/" : a.path;
            const WebAsset * ap = &a;
            auto handler = [ap](const httplib::Request &, httplib::Response & res) {
                res.set_header("Content-Security-Policy",
                               "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:");
                res.set_header("X-Content-Type-Options", "nosniff");
                res.set_header("Cache-Control", "no-cache");
                res.set_content(reinterpret_cast<const char *>(ap->data), ap->size,
                                ap->content_type);
            };
            http_.Get(path, handler);
            if (path == "/") http_.Get("/index.html", handler);
        }
        if (cfg_.webui)  // the page's icon: browsers ask for /favicon.ico whatever the page says
            http_.Get("/favicon.ico", [](const httplib::Request &, httplib::Response & res) {
                res.set_header("Cache-Control", "max-age=86400");
                res.set_content(
                    "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\"><rect width=\"16\" "
                    "height=\"16\" rx=\"3\" fill=\"#24303c\"/><path d=\"M3 12V5h2l3 4 3-4h2v7h-2V8l-3 "
                    "4-3-4v4z\" fill=\"#fff\"/></svg>",
                    "image/svg+xml");
            });
        http_.Get("/health", [this](const httplib::Request &, httplib::Response & res) {
            const Status fs = engine_->model_file_status();  // a changed file fails every request
            if (!fs.ok())
                return send_json(res, 503, json{{"status", "error"}, {"model", model_name_},
                                                {"error", fs.message()}});
            send_json(res, 200, json{{"status", "ok"}, {"model", model_name_}});
        });
        http_.Get("/stats", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            send_json(res, 200, stats_json());
        });
        http_.Get("/v1/models", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            json m{{"id", model_name_},
                   {"object", "model"},
                   {"created", started_unix_},
                   {"owned_by", "moestream"}};
            send_json(res, 200, json{{"object", "list"}, {"data", json::array({m})}});
        });
        http_.Get(R"(/v1/models/(.+))", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            const std::string id = req.matches[1];
            if (id != model_name_) {
                ApiError e = api_error(404, "The model '" + id + "' does not exist (this server has '" +
                                                model_name_ + "')",
                                       "invalid_request_error");
                e.param = "model";
                e.code = "model_not_found";
                return send_error(res, e);
            }
            send_json(res, 200, json{{"id", model_name_},
                                     {"object", "model"},
                                     {"created", started_unix_},
                                     {"owned_by", "moestream"}});
        });
        // llama-server's slot listing: this server has one slot (one generation at a time;
        // others wait in the queue).
        http_.Get("/slots", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            bool busy;
            {
                std::lock_guard<std::mutex> lk(q_m_);
                busy = running_ != nullptr;
            }
            send_json(res, 200, json::array({json{{"id", 0},
                                                  {"n_ctx", engine_->n_ctx()},
                                                  {"is_processing", busy},
                                                  {"speculative", false}}}));
        });
        // OpenAI's Responses API, translated to chat completions (responses.h).
        for (const char * path : {"/v1/responses", "/responses"})
            http_.Post(path, [this](const httplib::Request & req, httplib::Response & res) {
                if (!authorized(req, res) || !json_body(req, res)) return;
                std::string chat_body;
                if (auto e = responses_to_chat(req.body, &chat_body)) return send_error(res, *e);
                generate_route(req, res, true, false, &chat_body);
            });
        // llama-server's native completion: the completions request, llama-server's reply shape.
        http_.Post("/completion", [this](const httplib::Request & req, httplib::Response & res) {
            generate_route(req, res, false, true);
        });
        for (const char * path : {"/v1/chat/completions", "/chat/completions"})
            http_.Post(path, [this](const httplib::Request & req, httplib::Response & res) {
                generate_route(req, res, true);
            });
        for (const char * path : {"/v1/completions", "/completions"})
            http_.Post(path, [this](const httplib::Request & req, httplib::Response & res) {
                generate_route(req, res, false);
            });
        http_.Post(R"(/slots/(\d+))", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            slots_route(req, res);
        });
        http_.Post("/tokenize", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res) || !json_body(req, res)) return;
            tokenize_route(req, res);
        });
        http_.Post("/detokenize", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res) || !json_body(req, res)) return;
            detokenize_route(req, res);
        });
        http_.Post("/apply-template",
                   [this](const httplib::Request & req, httplib::Response & res) {
                       if (!authorized(req, res) || !json_body(req, res)) return;
                       apply_template_route(req, res);
                   });
        http_.Get("/props", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            send_json(res, 200, props_json());
        });
        http_.Get("/metrics", [this](const httplib::Request & req, httplib::Response & res) {
            if (!authorized(req, res)) return;
            res.set_content(metrics_text(), "text/plain; version=0.0.4");
        });
    }

    // responses_body: the chat completions body a /v1/responses request was translated to
    // (authorization and content type already checked); errors then name its fields.
    void generate_route(const httplib::Request & req, httplib::Response & res, bool chat,
                        bool llama_shape = false, const std::string * responses_body = nullptr) {
        if (!responses_body && (!authorized(req, res) || !json_body(req, res))) return;
        auto job = std::make_shared<Job>();
        job->llama_shape = llama_shape;
        job->responses = responses_body != nullptr;
        auto send_error = [&](httplib::Response & r, ApiError e) {
            if (job->responses && responses_param(e.param) != e.param) {  // its own field names
                const std::string from = "'" + e.param + "'";
                e.param = responses_param(e.param);
                for (size_t at; (at = e.message.find(from)) != std::string::npos;)
                    e.message.replace(at, from.size(), "'" + e.param + "'");
            }
            Server::send_error(r, e);
        };
        if (auto e = parse_request(responses_body ? *responses_body : req.body, chat, cfg_.defaults,
                                   &job->params))
            return send_error(res, *e);
        GenParams & p = job->params;
        if (p.drop_cold > 0 && drop_cold_block_ != DropColdBlock::kNone) {
            ApiError e = api_error(400, drop_cold_refusal(drop_cold_block_), "invalid_request_error");
            e.param = "drop_cold_experts";
            return send_error(res, e);
        }
        if (auto e = prepare_prompt(p, &job->plan)) return send_error(res, *e);
        job->created = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
        if (!enqueue(job)) {
            res.set_header("Retry-After", std::to_string(retry_after_s()));
            return send_error(res,
                              api_error(503,
                                        "the server is busy (" + std::to_string(cfg_.queue_max) +
                                            " requests already wait); retry later",
                                        "server_busy"));
        }
        if (p.stream) {
            res.set_header("Cache-Control", "no-cache");
            res.set_header("X-Accel-Buffering", "no");
            auto sent_role = std::make_shared<bool>(llama_shape);  // llama-server: no role chunk
            open_streams_++;
            if (job->responses) {
                auto rs = std::make_shared<ResponsesStream>();
                res.set_chunked_content_provider(
                    "text/event-stream",
                    [this, job, rs](size_t, httplib::DataSink & sink) {
                        return responses_stream_step(*job, sink, rs.get());
                    },
                    [this, job](bool success) {
                        if (!success) client_left(job);
                        open_streams_--;
                    });
                return;
            }
            res.set_chunked_content_provider(
                "text/event-stream",
                [this, job, sent_role](size_t, httplib::DataSink & sink) {
                    return stream_step(*job, sink, sent_role.get());
                },
                [this, job](bool success) {
                    if (!success) client_left(job);
                    open_streams_--;
                });
            return;
        }
        // Not streaming: nothing is written before the end, so watch the connection instead;
        // a client that leaves cancels its job, waiting or running.
        const int fd = find_request_socket(req);
        std::unique_lock<std::mutex> lk(job->m);
        while (!job->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return job->done; })) {
            if (fd >= 0 && !job->cancelled && peer_gone(fd)) {
                lk.unlock();
                client_left(job);
                lk.lock();
            }
        }
        lk.unlock();  // done: the job is no longer written to
        bool stopping;
        {
            std::lock_guard<std::mutex> ql(q_m_);
            stopping = stopping_;
        }
        if (job->cancelled && stopping) {  // SIGTERM: not a failure of the request
            res.set_header("Retry-After", "5");
            return send_error(res, api_error(503, "the server is stopping; retry later",
                                             "server_busy"));
        }
        if (!job->status.ok())
            return send_error(res,
                              api_error(http_status(job->status), job->status.message(),
                                        http_status(job->status) == 400 ? "invalid_request_error"
                                                                        : "server_error"));
        if (job->responses) {
            json r = response_json(response_state(*job, true));
            r["moestream"] = job->moestream;
            return send_json(res, 200, r);
        }
        send_json(res, 200, job->llama_shape ? llama_final_json(*job) : final_json(*job));
    }

    // POST /slots/{id}?action=save|restore|erase, llama-server's slot files: the KV the
    // context holds, to and from --slot-save-path DIR/filename (one slot: id 0).
    void slots_route(const httplib::Request & req, httplib::Response & res) {
        if (cfg_.slot_save_path.empty())
            return send_error(res, api_error(501,
                                             "This server does not support slots action. Start "
                                             "it with `--slot-save-path`",
                                             "not_supported_error"));
        const std::string id_text = req.matches.size() > 1 ? req.matches[1].str() : "";
        if (id_text != "0")
            return send_error(res, api_error(400, "Invalid slot ID: " + id_text +
                                                      " (this server has one slot: 0)",
                                             "invalid_request_error"));
        const std::string action = req.get_param_value("action");
        if (action != "save" && action != "restore" && action != "erase")
            return send_error(res, api_error_param(400, "Invalid action '" + action +
                                                            "' (save, restore or erase)",
                                                   "action"));
        if (!json_body(req, res)) return;  // application/json, as every POST (docs/server.md)
        std::string filename;
        if (action != "erase") {
            const json body = json::parse(req.body, nullptr, false);
            if (!body.is_object() || !body.contains("filename") || !body["filename"].is_string())
                return send_error(res, api_error_param(400, "filename (a string) is required",
                                                       "filename"));
            filename = body["filename"].get<std::string>();
            // A plain name inside the directory: no separators, no . or .., no NUL.
            if (filename.empty() || filename.size() > 255 || filename == "." ||
                filename == ".." || filename.find('/') != std::string::npos ||
                filename.find('\0') != std::string::npos)
                return send_error(res, api_error_param(400, "Invalid filename", "filename"));
        }
        const std::string path = cfg_.slot_save_path + "/" + filename;
        auto job = std::make_shared<Job>();
        job->action = [this, action, filename, path](json * out) {
            const double t0 = now_s();
            int n = 0;
            uint64_t bytes = 0;
            Status st;
            if (action == "save") {
                st = engine_->save_kv(path, &n, &bytes);
                if (st.ok())
                    *out = json{{"id_slot", 0},  {"filename", filename}, {"n_saved", n},
                                {"n_written", bytes}, {"timings", {{"save_ms", (now_s() - t0) * 1e3}}}};
            } else if (action == "restore") {
                st = engine_->restore_kv(path, &n, &bytes);
                if (st.ok())
                    *out = json{{"id_slot", 0},  {"filename", filename}, {"n_restored", n},
                                {"n_read", bytes}, {"timings", {{"restore_ms", (now_s() - t0) * 1e3}}}};
            } else {
                n = engine_->erase_kv();
                *out = json{{"id_slot", 0}, {"n_erased", n}};
            }
            return st;
        };
        if (!enqueue(job)) {
            res.set_header("Retry-After", std::to_string(retry_after_s()));
            return send_error(res, api_error(503, "the server is busy; retry later", "server_busy"));
        }
        std::unique_lock<std::mutex> lk(job->m);
        job->cv.wait(lk, [&] { return job->done; });
        if (!job->status.ok())
            return send_error(res, api_error(http_status(job->status), job->status.message(),
                                             http_status(job->status) == 400
                                                 ? "invalid_request_error"
                                                 : "server_error"));
        send_json(res, 200, job->moestream);
    }

    // The client went away: cancel its job; a waiting one leaves the queue at once (and is
    // finished here, so its handler returns), a running one stops at its next token.
    void client_left(const std::shared_ptr<Job> & job) {
        job->cancelled = true;
        bool removed = false;
        {
            std::lock_guard<std::mutex> lk(q_m_);
            auto it = std::find(queue_.begin(), queue_.end(), job);
            if (it != queue_.end()) {
                queue_.erase(it);
                removed = true;
                std::lock_guard<std::mutex> sl(stats_m_);
                snap_.cancelled++;
            }
        }
        if (removed) {
            {
                std::lock_guard<std::mutex> lk(job->m);
                job->status = Status::Runtime("cancelled: the client left");
                job->done = true;
            }
            job->cv.notify_all();
        }
    }

    // The prompt text of a request (chat: the template applied), checked against the
    // context and the engine's own rules before it is queued, so that a refusal is a 400
    // even for a streaming request. Runs on the HTTP thread: the engine methods used read
    // only the loaded vocabulary and template.
    std::optional<ApiError> prepare_prompt(GenParams & p, ChatPlan * plan) const {
        const char * param = p.chat ? "messages" : "prompt";
        if (p.chat) {
            if (tmpl_.empty())
                return api_error_param(400,
                                       "chat completions are not available: the model's chat "
                                       "template is not one llama.cpp renders; format the "
                                       "prompt yourself and use /v1/completions",
                                       "messages");
            if (auto e = plan_chat(fmt_, tmpl_, &p, plan)) return e;
            Status st = plan->rendered ? Status::Ok()
                                       : engine_->apply_chat_template(p.messages, true, &p.prompt);
            if (!st.ok()) return api_error_param(400, st.message(), "messages");
        } else if (!p.prompt_tokens.empty()) {
            // Token ids are passed as their text: accepted when the text gives the same ids.
            Status st = engine_->detokenize(p.prompt_tokens, &p.prompt);
            std::vector<int32_t> again;
            if (st.ok()) st = engine_->tokenize(p.prompt, &again);
            if (!st.ok()) return api_error_param(400, "'prompt': " + st.message(), "prompt");
            if (again != p.prompt_tokens)
                return api_error_param(400,
                                       "'prompt': these token ids do not come back from their "
                                       "text (the server tokenizes text); send the text",
                                       "prompt");
        }
        GenerateRequest r = engine_request(p);
        int n_prompt = 0;
        Status st = engine_->check_request(r, &n_prompt);
        if (!st.ok()) {
            std::string field = field_of(st.message());
            if (field.empty() && n_prompt >= engine_->n_ctx()) field = param;
            std::string msg = st.message();
            if (n_prompt >= engine_->n_ctx())
                msg = "the prompt is " + std::to_string(n_prompt) +
                      " tokens, longer than the context (" + std::to_string(engine_->n_ctx()) +
                      " tokens): shorten it";
            if (field == "grammar" && !p.format_param.empty()) {  // the server's grammar
                field = p.format_param;
                msg = "'" + field + "': llama.cpp refuses the grammar made from it (" + msg +
                      "); a schema that comes back to itself before writing any JSON text, "
                      "such as a $ref to an enclosing schema first in an anyOf, cannot be "
                      "generated";
            }
            return api_error_param(400, msg, field);
        }
        return std::nullopt;
    }
    static ApiError api_error_param(int status, const std::string & msg, const std::string & param) {
        ApiError e = api_error(status, msg, "invalid_request_error");
        e.param = param;
        return e;
    }

    // What the engine is asked to do for p.
    static GenerateRequest engine_request(const GenParams & p) {
        GenerateRequest r;
        r.prompt = p.prompt;
        r.n_predict = p.max_tokens;
        r.clamp_to_context = true;  // like llama-server: stop when the context is full
        r.sampling = p.sampling;
        r.stop = p.stop;
        r.reuse_prefix = p.cache_prompt;
        r.logprobs = p.logprobs;
        return r;
    }

    json chunk_json(const Job & job, const json & delta_or_text, const json & finish) const {
        if (job.llama_shape) return json{{"content", delta_or_text}, {"stop", false}};
        json c;
        c["index"] = 0;
        if (job.params.chat)
            c["delta"] = delta_or_text;
        else
            c["text"] = delta_or_text, c["logprobs"] = nullptr;
        c["finish_reason"] = finish;
        return json{{"id", job_name(job)},
                    {"object", job.params.chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", job.created},
                    {"model", model_name_},
                    {"choices", json::array({c})}};
    }
    std::string job_name(const Job & job) const {
        return (job.params.chat ? "chatcmpl-" : "cmpl-") + std::to_string(job.id);
    }
    static std::string sse(const json & j) { return "data: " + dump(j) + "\n\n"; }

    // One call of the chunked content provider: writes what is ready, or a keep-alive comment
    // after 0.5 s (so a vanished client is noticed while it waits in the queue).
    bool stream_step(Job & job, httplib::DataSink & sink, bool * sent_role) {
        auto fail = [&] {
            job.cancelled = true;
            return false;
        };
        if (!*sent_role) {
            *sent_role = true;
            json first = job.params.chat ? json{{"role", "assistant"}, {"content", ""}} : json("");
            return write_str(sink, sse(chunk_json(job, first, nullptr))) ? true : fail();
        }
        std::unique_lock<std::mutex> lk(job.m);
        job.cv.wait_for(lk, std::chrono::milliseconds(500), [&] {
            return !job.unsent.empty() || !job.unsent_reasoning.empty() ||
                   !job.unsent_logprobs.empty() || job.calls_sent < job.calls.size() ||
                   job.done;
        });
        if (!job.unsent.empty() || !job.unsent_reasoning.empty() ||
            !job.unsent_logprobs.empty() || job.calls_sent < job.calls.size()) {
            std::string out;
            if (!job.unsent_reasoning.empty())
                out += sse(chunk_json(job, json{{"reasoning_content", job.unsent_reasoning}}, nullptr));
            if (!job.unsent.empty() || !job.unsent_logprobs.empty()) {
                json chunk = chunk_json(job, job.params.chat ? json{{"content", job.unsent}}
                                                             : json(job.unsent),
                                        nullptr);
                if (job.params.logprobs >= 0)
                    chunk["choices"][0]["logprobs"] =
                        job.params.chat ? chat_logprobs_json(job.unsent_logprobs)
                                        : completion_logprobs_json(job.unsent_logprobs,
                                                                   &job.logprobs_offset);
                out += sse(chunk);
            }
            for (; job.calls_sent < job.calls.size(); ++job.calls_sent)
                out += sse(chunk_json(
                    job,
                    json{{"tool_calls",
                          json::array({tool_call_delta(job.calls[job.calls_sent], job.calls_sent)})}},
                    nullptr));
            job.unsent.clear();
            job.unsent_reasoning.clear();
            job.unsent_logprobs.clear();
            lk.unlock();
            return write_str(sink, out) ? true : fail();
        }
        if (job.done) {
            std::string out;
            if (job.status.ok()) {
                json last =
                    chunk_json(job, job.params.chat ? json::object() : json(""), job.finish_reason);
                last["usage"] = usage_json(job);
                last["moestream"] = job.moestream;
                if (job.llama_shape) last = llama_final_json(job, false);
                out = sse(last);
            } else {
                ApiError e = api_error(
                    http_status(job.status), job.status.message(),
                    http_status(job.status) == 400 ? "invalid_request_error" : "server_error");
                out = sse(error_json(e));
            }
            lk.unlock();
            if (!job.llama_shape) out += "data: [DONE]\n\n";  // llama-server's /completion ends with stop: true
            if (!write_str(sink, out)) return fail();
            sink.done();
            return true;
        }
        lk.unlock();
        return write_str(sink, ": waiting\n\n") ? true : fail();
    }
    static bool write_str(httplib::DataSink & sink, const std::string & s) {
        return sink.is_writable() && sink.write(s.data(), s.size());
    }

    static json usage_json(const Job & job) {
        return json{{"prompt_tokens", job.n_prompt},
                    {"completion_tokens", job.n_generated},
                    {"total_tokens", job.n_prompt + job.n_generated}};
    }

    json final_json(const Job & job) const {
        json c;
        c["index"] = 0;
        if (job.params.chat)
            c["message"] = reply_message(job.text, job.reasoning, job.calls);
        else
            c["text"] = job.text, c["logprobs"] = nullptr;
        c["finish_reason"] = job.finish_reason;
        if (job.params.chat) c["logprobs"] = nullptr;
        size_t offset = 0;
        if (job.params.logprobs >= 0)
            c["logprobs"] = job.params.chat ? chat_logprobs_json(job.logprobs)
                                            : completion_logprobs_json(job.logprobs, &offset);
        return json{{"id", job_name(job)},
                    {"object", job.params.chat ? "chat.completion" : "text_completion"},
                    {"created", job.created},
                    {"model", model_name_},
                    {"choices", json::array({c})},
                    {"usage", usage_json(job)},
                    {"moestream", job.moestream}};
    }

    // The Response of a /v1/responses job (done: its final status; else in progress).
    ResponseState response_state(const Job & job, bool done) const {
        ResponseState r;
        r.id = "resp_" + std::to_string(job.id);
        r.created = job.created;
        r.model = model_name_;
        r.status = !done                              ? "in_progress"
                   : job.finish_reason == "length"    ? "incomplete"
                   : job.finish_reason == "cancelled" ? "cancelled"
                                                      : "completed";
        r.length_cut = done && job.finish_reason == "length";
        if (done) {
            r.text = job.text;
            r.reasoning = job.reasoning;
            r.calls = job.calls;
            r.input_tokens = job.n_prompt;
            r.output_tokens = job.n_generated;
        }
        return r;
    }

    // One call of the chunked content provider of a /v1/responses stream: the Responses
    // API's events (response.created, output items opened, text deltas, items done,
    // response.completed), as stream_step writes chat chunks.
    bool responses_stream_step(Job & job, httplib::DataSink & sink, ResponsesStream * st) {
        auto fail = [&] {
            job.cancelled = true;
            return false;
        };
        auto ev = [&](const std::string & type, json j) {
            j["type"] = type;
            j["sequence_number"] = st->seq++;
            return "event: " + type + "\ndata: " + dump(j) + "\n\n";
        };
        if (!st->created) {
            st->created = true;
            const json r = response_json(response_state(job, false));
            std::string first = ev("response.created", {{"response", r}});
            first += ev("response.in_progress", {{"response", r}});
            return write_str(sink, first) ? true : fail();
        }
        std::unique_lock<std::mutex> lk(job.m);
        job.cv.wait_for(lk, std::chrono::milliseconds(500), [&] {
            return !job.unsent.empty() || !job.unsent_reasoning.empty() ||
                   job.calls_sent < job.calls.size() || job.done;
        });
        ResponseState r = response_state(job, false);
        std::string out;
        auto close_reasoning = [&] {
            if (st->reasoning_index < 0 || st->reasoning_closed) return;
            st->reasoning_closed = true;
            r.reasoning = st->reasoning;
            out += ev("response.reasoning_text.done", {{"item_id", reasoning_item_id(r)},
                                                       {"output_index", st->reasoning_index},
                                                       {"content_index", 0},
                                                       {"text", st->reasoning}});
            out += ev("response.output_item.done",
                      {{"output_index", st->reasoning_index}, {"item", reasoning_item(r)}});
        };
        auto open_message = [&] {
            if (st->message_index >= 0) return;
            st->message_index = st->next_index++;
            out += ev("response.output_item.added",
                      {{"output_index", st->message_index}, {"item", message_item(r, "in_progress")}});
            out += ev("response.content_part.added",
                      {{"item_id", message_item_id(r)},
                       {"output_index", st->message_index},
                       {"content_index", 0},
                       {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
        };
        if (!job.unsent_reasoning.empty()) {
            if (st->reasoning_index < 0) {
                st->reasoning_index = st->next_index++;
                json item = reasoning_item(r);
                item["content"] = json::array();
                out += ev("response.output_item.added", {{"output_index", st->reasoning_index}, {"item", item}});
            }
            out += ev("response.reasoning_text.delta", {{"item_id", reasoning_item_id(r)},
                                                        {"output_index", st->reasoning_index},
                                                        {"content_index", 0},
                                                        {"delta", job.unsent_reasoning}});
            st->reasoning += job.unsent_reasoning;
            job.unsent_reasoning.clear();
        }
        if (!job.unsent.empty()) {
            close_reasoning();
            open_message();
            out += ev("response.output_text.delta", {{"item_id", message_item_id(r)},
                                                     {"output_index", st->message_index},
                                                     {"content_index", 0},
                                                     {"delta", job.unsent},
                                                     {"logprobs", json::array()}});
            st->text += job.unsent;
            job.unsent.clear();
        }
        job.unsent_logprobs.clear();
        for (; job.calls_sent < job.calls.size(); ++job.calls_sent) {
            close_reasoning();
            r.calls = job.calls;
            const size_t i = job.calls_sent;
            const int index = st->next_index++;
            json item = call_item(r, i);
            const std::string args = item["arguments"];
            item["arguments"] = "";
            item["status"] = "in_progress";
            out += ev("response.output_item.added", {{"output_index", index}, {"item", item}});
            out += ev("response.function_call_arguments.delta",
                      {{"item_id", call_item_id(r, i)}, {"output_index", index}, {"delta", args}});
            out += ev("response.function_call_arguments.done",
                      {{"item_id", call_item_id(r, i)}, {"output_index", index}, {"arguments", args}});
            out += ev("response.output_item.done", {{"output_index", index}, {"item", call_item(r, i)}});
        }
        if (job.done) {
            if (job.status.ok()) {
                const ResponseState fin = response_state(job, true);
                close_reasoning();
                if (job.calls.empty() || !st->text.empty()) {
                    open_message();
                    json part{{"type", "output_text"}, {"text", st->text}, {"annotations", json::array()}};
                    out += ev("response.output_text.done", {{"item_id", message_item_id(r)},
                                                            {"output_index", st->message_index},
                                                            {"content_index", 0},
                                                            {"text", st->text}});
                    out += ev("response.content_part.done", {{"item_id", message_item_id(r)},
                                                             {"output_index", st->message_index},
                                                             {"content_index", 0},
                                                             {"part", part}});
                    out += ev("response.output_item.done",
                              {{"output_index", st->message_index},
                               {"item", message_item(fin, fin.status == "completed" ? "completed" : "incomplete")}});
                }
                json final = response_json(fin);
                final["moestream"] = job.moestream;
                out += ev(fin.status == "completed" ? "response.completed" : "response.incomplete",
                          {{"response", final}});
            } else {
                const ApiError e = api_error(
                    http_status(job.status), job.status.message(),
                    http_status(job.status) == 400 ? "invalid_request_error" : "server_error");
                out += ev("error", {{"message", e.message}, {"code", nullptr}, {"param", nullptr}});
            }
            lk.unlock();
            if (!write_str(sink, out)) return fail();
            sink.done();
            return true;
        }
        lk.unlock();
        if (out.empty()) out = ": waiting\n\n";
        return write_str(sink, out) ? true : fail();
    }

    // llama-server's /completion reply (with_text: the whole content; streamed, the last event
    // carries none).
    json llama_final_json(const Job & job, bool with_text = true) const {
        const std::string stop_type = job.finish_reason == "length" ? "limit"
                                      : !job.stop_string.empty()    ? "word"
                                      : job.finish_reason == "stop" ? "eos"
                                                                    : job.finish_reason;
        return json{{"content", with_text ? job.text : std::string()},
                    {"stop", true},
                    {"model", model_name_},
                    {"tokens_predicted", job.n_generated},
                    {"tokens_evaluated", job.n_prompt},
                    {"stop_type", stop_type},
                    {"stopping_word", job.stop_string},
                    {"moestream", job.moestream}};
    }

    // ---- queue ------------------------------------------------------------------------
    bool enqueue(const std::shared_ptr<Job> & job) {
        {
            std::lock_guard<std::mutex> lk(q_m_);
            // An idle worker takes the job at once: it never waits, whatever --queue says.
            const bool idle = !running_ && queue_.empty();
            if (stopping_ || (!idle && int(queue_.size()) >= cfg_.queue_max)) {
                std::lock_guard<std::mutex> sl(stats_m_);
                snap_.rejected_busy++;
                return false;
            }
            job->id = ++next_id_;
            queue_.push_back(job);
        }
        q_cv_.notify_one();
        return true;
    }

    int retry_after_s() {
        double avg;
        size_t waiting;
        {
            std::lock_guard<std::mutex> sl(stats_m_);
            avg = snap_.avg_request_s;
        }
        {
            std::lock_guard<std::mutex> lk(q_m_);
            waiting = queue_.size();
        }
        double s = std::ceil(std::max(1.0, avg) * double(waiting + 1));
        return int(std::min(60.0, s));
    }

    void worker_loop() {
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> lk(q_m_);
                q_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) break;  // stopping
                job = queue_.front();
                queue_.pop_front();
                running_ = job;
            }
            run_job(*job);
            std::lock_guard<std::mutex> lk(q_m_);
            running_.reset();
        }
    }

    // Ends a job: the worker is idle before the client hears back, so a client that sends its
    // next request at once does not find the server busy.
    void finish(Job & job, Status st) {
        {
            std::lock_guard<std::mutex> lk(q_m_);
            if (running_.get() == &job) running_.reset();
        }
        {
            std::lock_guard<std::mutex> lk(job.m);
            job.status = std::move(st);
            job.done = true;
        }
        job.cv.notify_all();
    }

    void run_job(Job & job) {
        const GenParams & p = job.params;
        if (job.cancelled) {  // gone while it waited
            {
                std::lock_guard<std::mutex> sl(stats_m_);
                snap_.cancelled++;
            }
            return finish(job, Status::Runtime("cancelled"));
        }
        if (job.action) return finish(job, job.action(&job.moestream));
        Status st = cfg_.run.stream ? engine_->set_drop_cold(p.drop_cold) : Status::Ok();
        if (!st.ok()) {
            {
                std::lock_guard<std::mutex> sl(stats_m_);
                snap_.errors++;
            }
            // In the server's words (its flags), not the library's option names.
            if (cfg_.option_words) st = Status::Error(st.code(), cfg_.option_words(st.message()));
            return finish(job, st);
        }
        GenerateRequest r = engine_request(p);
        // A client that leaves (or SIGTERM) during a long prompt stops it between micro-batches.
        r.on_prefill = [&job](int, int) { return !job.cancelled; };
        int n_prompt = 0;  // for /stats while the prompt is processed (checked before queueing)
        if (!engine_->check_request(r, &n_prompt).ok()) n_prompt = 0;
        {
            std::lock_guard<std::mutex> sl(stats_m_);
            snap_.generating = true;
            snap_.prefilling = true;
            snap_.n_prompt = n_prompt;
            snap_.job_id = job.id;
            snap_.n_generated = 0;
            snap_.tok_s = snap_.cache_hit_pct = snap_.mib_per_token = 0;
            snap_.decode_time = TimeBreakdown{};
        }
        Utf8Stream utf8;
        std::unique_ptr<ReplyParser> parser;
        if (job.plan.parse)
            parser = std::make_unique<ReplyParser>(fmt_, job.plan.tools, job.plan.thinking);
        GenerateResult g;
        size_t logprobs_taken = 0;  // of g.logprobs, passed on to the job
        // Text -> the job: through the reply parser when the chat format splits replies; the
        // new tokens' log probabilities go with it.
        auto deliver = [&](const std::string & t, bool last) {
            ReplyDelta d;
            if (parser) {
                d = parser->push(t);
                if (last) {
                    ReplyDelta e = parser->finish();
                    d.content += e.content;
                    d.reasoning += e.reasoning;
                    for (auto & c : e.calls) d.calls.push_back(std::move(c));
                }
            } else {
                d.content = t;
            }
            if (d.empty() && g.logprobs.size() == logprobs_taken) return;
            {
                std::lock_guard<std::mutex> lk(job.m);
                while (logprobs_taken < g.logprobs.size())
                    job.unsent_logprobs.push_back(g.logprobs[logprobs_taken++]);
                job.unsent += d.content;
                job.text += d.content;
                job.unsent_reasoning += d.reasoning;
                job.reasoning += d.reasoning;
                for (ToolCall & c : d.calls) {
                    c.id = next_call_id();
                    job.calls.push_back(std::move(c));
                }
            }
            job.cv.notify_all();
        };
        const double t0 = now_s();
        st = engine_->generate(
            r,
            [&](const std::string & piece) {
                if (cfg_.token_delay_ms > 0)
                    std::this_thread::sleep_for(std::chrono::milliseconds(cfg_.token_delay_ms));
                deliver(utf8.push(piece), false);
                publish_live();
                // A reply that may hold one call ends with it (ChatPlan::stop_after_call).
                if (job.plan.stop_after_call && !job.calls.empty()) return false;
                return !job.cancelled.load();
            },
            &g);
        const double dt = now_s() - t0;
        deliver(utf8.finish(), true);
        const RunStats & s = engine_->stats();
        const bool cancelled = job.cancelled.load();
        {
            std::lock_guard<std::mutex> lk(job.m);
            job.tokens = g.tokens;
            job.logprobs = g.logprobs;
            job.n_prompt = s.n_prompt;
            job.n_generated = s.n_generated;
            job.finish_reason = cancelled                           ? "cancelled"
                                : g.finish == FinishReason::kLength ? "length"
                                : !job.calls.empty()                ? "tool_calls"
                                                                    : "stop";
            job.stop_string = g.stop_string;
            job.moestream = request_report(job, g, cancelled);
            if (!cancelled && g.finish == FinishReason::kCancelled && !job.calls.empty())
                job.moestream["stats"]["finish"] = "tool_call";  // ended after its call
        }
        publish_live();
        publish_after_job(dt, st.ok() && !cancelled ? 1 : 0);
        {
            std::lock_guard<std::mutex> sl(stats_m_);
            snap_.generating = false;
            snap_.prefilling = false;
            if (!st.ok()) snap_.errors++;
            if (cancelled) snap_.cancelled++;
        }
        if (cancelled)
            MS_LOG_INFO("request %llu cancelled after %d tokens (client gone)",
                        (unsigned long long)job.id, s.n_generated);
        finish(job, st);
    }

    // Figures of the running request from the engine's per-token stats (worker thread).
    void publish_live() {
        const RunStats & s = engine_->stats();
        const DecodeFigures f = decode_figures(s);
        std::lock_guard<std::mutex> sl(stats_m_);
        snap_.prefilling = false;
        snap_.n_generated = s.n_generated;
        snap_.tok_s = f.tok_s;
        snap_.cache_hit_pct = f.cache_hit_pct;
        snap_.mib_per_token = f.mib_per_token;
        snap_.decode_time = tools::sum_token_times(s.tokens);
    }

    // After a job (and at start): settings, cache figures, the mean request time.
    void publish_after_job(double dt, int ok) {
        const RunStats & s = engine_->stats();
        json settings = json::parse(engine_->settings_json(), nullptr, false);
        std::lock_guard<std::mutex> sl(stats_m_);
        if (dt > 0) {  // a generation ran (not the start)
            snap_.prompt_tokens_total += uint64_t(s.n_prompt - s.n_prompt_reused);
            snap_.generated_tokens_total += uint64_t(s.n_generated);
            snap_.prefill_s_total += s.prefill_s;
            snap_.decode_s_total += s.decode_s;
        }
        snap_.engine_settings = settings;
        snap_.lossy = engine_->lossy();
        snap_.resident_expert_mib = mib(double(s.resident_expert_bytes));
        snap_.cache_budget_mib = mib(double(s.cache_budget_bytes));
        snap_.cache_hit_pct_total = s.cache_hit_pct;
        snap_.cache = cache_counters_json(s);
        if (!cfg_.run.prompt_cache.empty())
            snap_.prompt_cache = json{{"tokens_restored", s.prompt_cache_tokens},
                                      {"read_mib", mib(double(s.prompt_cache_read_bytes))},
                                      {"restore_s", s.prompt_cache_restore_s},
                                      {"written_mib", mib(double(s.prompt_cache_written_bytes))},
                                      {"refused", s.prompt_cache_refused}};
        if (!cfg_.run.warm_experts.empty())
            snap_.warm_experts = json{{"file", s.warm_experts_file},
                                      {"listed", s.warm_experts_listed},
                                      {"preloaded", s.warm_experts_preloaded},
                                      {"first16_hit_pct", s.first16_hit_pct},
                                      {"refused", s.warm_experts_refused}};
        snap_.read_latency = s.reads_timed == 0 ? json(nullptr)
                                                : json{{"reads", s.reads_timed},
                                                       {"p50_ms", s.read_p50_s * 1e3},
                                                       {"p99_ms", s.read_p99_s * 1e3},
                                                       {"max_ms", s.read_max_s * 1e3}};
        if (ok) {
            snap_.served++;
            snap_.avg_request_s = snap_.served == 1 ? dt : 0.8 * snap_.avg_request_s + 0.2 * dt;
        }
    }

    json request_settings(const GenParams & p) const {
        const SamplingParams & sp = p.sampling;
        json bias = json::object();
        for (const auto & [id, b] : sp.logit_bias)
            bias[std::to_string(id)] = std::isfinite(b) ? float_json(b) : json(false);
        return json{{"max_tokens", p.max_tokens < 0 ? json(nullptr) : json(p.max_tokens)},
                    {"temperature", float_json(sp.temp)},
                    {"top_p", float_json(sp.top_p)},
                    {"top_k", sp.top_k},
                    {"min_p", float_json(sp.min_p)},
                    {"repeat_penalty", float_json(sp.repeat_penalty)},
                    {"repeat_last_n", sp.repeat_last_n},
                    {"presence_penalty", float_json(sp.presence_penalty)},
                    {"frequency_penalty", float_json(sp.frequency_penalty)},
                    {"logit_bias", bias},
                    {"grammar", sp.grammar.empty() || p.response_format != "text"
                                    ? json(nullptr)
                                    : json(sp.grammar)},
                    {"response_format", p.response_format},
                    {"logprobs", p.logprobs < 0 ? json(nullptr) : json(p.logprobs)},
                    {"ignore_eos", sp.ignore_eos},
                    {"stop", p.stop},
                    {"seed", sp.seed},
                    {"drop_cold_experts", p.drop_cold},
                    {"cache_prompt", p.cache_prompt},
                    {"stream", p.stream},
                    {"chat_template", p.chat ? json(tmpl_) : json(nullptr)},
                    {"chat_format", p.chat ? chat_format_json(p) : json(nullptr)}};
    }

    // A tool call's id: 9 letters and digits (the form Mistral templates require), unique
    // within this server's run and unlikely to repeat across runs. Worker thread only.
    std::string next_call_id() {
        static const char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
        uint64_t n = uint64_t(started_unix_) * 1000 + ++calls_made_;
        std::string id(9, '0');
        for (int i = 8; i >= 0 && n; --i, n /= 36) id[size_t(i)] = kDigits[n % 36];
        return id;
    }

    // How a chat request's prompt was made and its reply read.
    json chat_format_json(const GenParams & p) const {
        const ChatExtras & x = p.extras;
        return json{{"renderer", fmt_.jinja ? fmt_.jinja->renderer() : "llama.cpp"},
                    {"tools", x.tools.size()},
                    {"tool_choice", x.tools.empty() ? json(nullptr)
                                    : x.tool_choice == "function" ? json(x.tool_name)
                                                                  : json(x.tool_choice)},
                    {"thinking", fmt_.thinking ? json(x.enable_thinking.value_or(true))
                                               : json(nullptr)},
                    {"reasoning_effort", fmt_.effort
                                             ? json(x.reasoning_effort.empty()
                                                        ? "medium" : x.reasoning_effort)
                                             : json(nullptr)}};
    }

    // The moestream object of a response: what produced it and how it went.
    json request_report(const Job & job, const GenerateResult & g, bool cancelled) {
        const RunStats & s = engine_->stats();
        const DecodeFigures f = decode_figures(s);
        json st{{"n_prompt", s.n_prompt},
                {"n_prompt_reused", s.n_prompt_reused},
                {"prompt_cache_tokens", s.prompt_cache_tokens},
                {"prompt_cache_read_bytes", s.prompt_cache_read_bytes},
                {"prompt_cache_restore_s", s.prompt_cache_restore_s},
                {"n_generated", s.n_generated},
                {"prefill_s", s.prefill_s},
                {"prefill_tok_s", s.prefill_tok_s},
                {"decode_tok_s", f.tok_s},
                {"cache_hit_pct", f.cache_hit_pct},
                {"first16_hit_pct", s.first16_hit_pct},
                {"flash_mib_per_token", f.mib_per_token},
                {"resident_expert_mib", mib(double(s.resident_expert_bytes))},
                {"experts_dropped", s.experts_dropped},
                {"experts_substituted", s.experts_substituted},
                {"finish", finish_reason_name(g.finish)}};
        json r{{"lossy", g.lossy},
               {"settings", json{{"engine", json::parse(engine_->settings_json(), nullptr, false)},
                                 {"request", request_settings(job.params)}}},
               {"stats", st},
               {"cancelled", cancelled}};
        if (job.params.return_tokens) r["tokens"] = g.tokens;
        if (g.finish == FinishReason::kStop) r["stop_string"] = g.stop_string;
        return r;
    }

    // POST /tokenize {"content": text} -> {"tokens": [...]} (with the model's start token when
    // it uses one, as a prompt is tokenized for `with_pieces`: each token's text too).
    void tokenize_route(const httplib::Request & req, httplib::Response & res) const {
        json j = json::parse(req.body, nullptr, false);
        if (!j.is_object() || !j.contains("content") || !j["content"].is_string())
            return send_error(res, api_error_param(400, "'content' must be a string", "content"));
        for (auto it = j.begin(); it != j.end(); ++it)
            if (it.key() != "content" && it.key() != "with_pieces")
                return send_error(res, api_error_param(400, "unknown field '" + it.key() + "'",
                                                       it.key()));
        if (j.contains("with_pieces") && !j["with_pieces"].is_boolean() && !j["with_pieces"].is_null())
            return send_error(res, api_error_param(400, "'with_pieces' must be true or false",
                                                   "with_pieces"));
        const bool pieces = j.contains("with_pieces") && j["with_pieces"].is_boolean() &&
                            j["with_pieces"].get<bool>();
        std::vector<int32_t> toks;
        Status st = engine_->tokenize(j["content"].get<std::string>(), &toks);
        if (!st.ok()) return send_error(res, api_error_param(400, st.message(), "content"));
        json out = json::array();
        for (int32_t t : toks) {
            if (!pieces) {
                out.push_back(t);
                continue;
            }
            std::string piece;
            engine_->detokenize({t}, &piece);
            out.push_back(json{{"id", t}, {"piece", sanitize_utf8(piece)}});
        }
        send_json(res, 200, json{{"tokens", out}});
    }

    // POST /detokenize {"tokens": [...]} -> {"content": text}
    void detokenize_route(const httplib::Request & req, httplib::Response & res) const {
        json j = json::parse(req.body, nullptr, false);
        std::vector<int32_t> toks;
        bool ok = j.is_object() && j.contains("tokens") && j["tokens"].is_array() && j.size() == 1;
        if (ok)
            for (const json & t : j["tokens"]) {
                ok = ok && t.is_number_integer() && t.get<int64_t>() >= 0 &&
                     t.get<int64_t>() <= INT32_MAX;
                if (ok) toks.push_back(int32_t(t.get<int64_t>()));
            }
        if (!ok)
            return send_error(res, api_error_param(
                                       400, "the body must be {\"tokens\": [token ids]}", "tokens"));
        std::string text;
        Status st = engine_->detokenize(toks, &text);
        if (!st.ok()) return send_error(res, api_error_param(400, st.message(), "tokens"));
        send_json(res, 200, json{{"content", sanitize_utf8(text)}});
    }

    // POST /apply-template {"messages": [...]} -> {"prompt": text, "chat_template": name}
    void apply_template_route(const httplib::Request & req, httplib::Response & res) const {
        json j = json::parse(req.body, nullptr, false);
        bool fields_ok = j.is_object() && j.contains("messages");
        for (auto it = j.begin(); fields_ok && it != j.end(); ++it)
            fields_ok = it.key() == "messages" || it.key() == "tools" ||
                        it.key() == "tool_choice" || it.key() == "parallel_tool_calls" ||
                        it.key() == "chat_template_kwargs" || it.key() == "reasoning_effort";
        if (!fields_ok)
            return send_error(res, api_error_param(400,
                                                   "the body must be {\"messages\": [...]} with "
                                                   "optional tools, tool_choice, "
                                                   "parallel_tool_calls, chat_template_kwargs, "
                                                   "reasoning_effort",
                                                   "messages"));
        GenParams p;
        if (auto e = parse_request(req.body, true, cfg_.defaults, &p)) return send_error(res, *e);
        if (tmpl_.empty())
            return send_error(res, api_error_param(400,
                                                   "the model's chat template is not one "
                                                   "llama.cpp renders",
                                                   "messages"));
        ChatPlan plan;
        if (auto e = plan_chat(fmt_, tmpl_, &p, &plan, true)) return send_error(res, *e);
        std::string prompt = plan.shown;
        Status st = plan.rendered ? Status::Ok()
                                  : engine_->apply_chat_template(p.messages, true, &prompt);
        if (!st.ok()) return send_error(res, api_error_param(400, st.message(), "messages"));
        send_json(res, 200, json{{"prompt", sanitize_utf8(prompt)}, {"chat_template", tmpl_}});
    }

    // GET /props: what llama-server's /props reports that applies here.
    json props_json() {
        json st = stats_json();
        return json{{"model_path", cfg_.run.model_path},
                    {"model", model_name_},
                    {"n_ctx", engine_->n_ctx()},
                    {"n_vocab", engine_->n_vocab()},
                    {"total_slots", 1},
                    {"chat_template", tmpl_.empty() ? json(nullptr) : json(tmpl_)},
                    {"chat_template_renderer",
                     fmt_.jinja ? json(fmt_.jinja->renderer()) : json(nullptr)},
                    {"default_generation_settings", st["defaults"]},
                    {"lossy", st["lossy"]},
                    {"settings", st["settings"]}};
    }

    // GET /metrics: Prometheus text exposition.
    std::string metrics_text() {
        const json st = stats_json();
        std::string out;
        auto metric = [&](const char * name, const char * type, const char * help, double v) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%.17g", v);
            out += std::string("# HELP moestream_") + name + " " + help + "\n# TYPE moestream_" +
                   name + " " + type + "\nmoestream_" + name + " " + buf + "\n";
        };
        Snapshot s;
        {
            std::lock_guard<std::mutex> sl(stats_m_);
            s = snap_;
        }
        metric("requests_served_total", "counter", "requests answered in full", double(s.served));
        metric("requests_cancelled_total", "counter", "requests whose client left or that the "
               "server stopped", double(s.cancelled));
        metric("requests_errors_total", "counter", "requests that failed", double(s.errors));
        metric("requests_rejected_busy_total", "counter", "requests refused with 503",
               double(s.rejected_busy));
        metric("queue_waiting", "gauge", "requests waiting behind the running one",
               st["queue_waiting"].get<double>());
        metric("generating", "gauge", "1 while a generation runs", s.generating ? 1 : 0);
        metric("prompt_tokens_total", "counter", "prompt tokens prefilled (not reused)",
               double(s.prompt_tokens_total));
        metric("tokens_generated_total", "counter", "tokens generated",
               double(s.generated_tokens_total));
        metric("prefill_seconds_total", "counter", "time spent in prefill", s.prefill_s_total);
        metric("decode_seconds_total", "counter", "time spent decoding", s.decode_s_total);
        metric("decode_tokens_per_second", "gauge", "decode speed of the running or last request",
               s.tok_s);
        metric("cache_hit_ratio", "gauge", "expert cache hits / lookups of the running or last "
               "request's decode", s.cache_hit_pct / 100.0);
        metric("cache_hit_ratio_total", "gauge", "expert cache hits / lookups since start",
               s.cache_hit_pct_total / 100.0);
        metric("flash_mib_per_token", "gauge", "MiB read from the model file per decoded token "
               "(running or last request)", s.mib_per_token);
        metric("resident_expert_mib", "gauge", "expert bytes resident in the cache",
               s.resident_expert_mib);
        metric("rss_mib", "gauge", "resident set size", st["rss_mib"].get<double>());
        metric("lossy", "gauge", "1 when the current settings are lossy", s.lossy ? 1 : 0);
        return out;
    }

    json stats_json() {
        size_t waiting;
        {
            std::lock_guard<std::mutex> lk(q_m_);
            waiting = queue_.size();
        }
        std::lock_guard<std::mutex> sl(stats_m_);
        const Snapshot & s = snap_;
        json defaults{{"max_tokens", cfg_.defaults.max_tokens < 0
                                         ? json(nullptr)
                                         : json(cfg_.defaults.max_tokens)},
                      {"max_tokens_limit", engine_->n_ctx() - 1},
                      {"n_ctx", engine_->n_ctx()},
                      {"temperature", float_json(cfg_.defaults.temperature)},
                      {"top_k", cfg_.defaults.sampling.top_k},
                      {"top_p", float_json(cfg_.defaults.sampling.top_p)},
                      {"min_p", float_json(cfg_.defaults.sampling.min_p)},
                      {"repeat_penalty", float_json(cfg_.defaults.sampling.repeat_penalty)},
                      {"repeat_last_n", cfg_.defaults.sampling.repeat_last_n},
                      {"presence_penalty", float_json(cfg_.defaults.sampling.presence_penalty)},
                      {"frequency_penalty", float_json(cfg_.defaults.sampling.frequency_penalty)},
                      {"seed", cfg_.defaults.seed},
                      {"drop_cold_experts", cfg_.defaults.drop_cold},
                      {"cache_prompt", true},
                      {"chat_template", tmpl_.empty() ? json(nullptr) : json(tmpl_)},
                      {"drop_cold_available", drop_cold_block_ == DropColdBlock::kNone}};
        return json{{"generating", s.generating},
                    {"phase", !s.generating ? "idle" : s.prefilling ? "prefill" : "decode"},
                    {"n_prompt", s.n_prompt},
                    {"request_id", s.job_id},
                    {"n_generated", s.n_generated},
                    {"tok_s", s.tok_s},
                    {"cache_hit_pct", s.cache_hit_pct},
                    {"mib_per_token", s.mib_per_token},
                    {"time_per_token", tools::time_breakdown_json(s.decode_time, true)},
                    {"cache_hit_pct_total", s.cache_hit_pct_total},
                    {"resident_expert_mib", s.resident_expert_mib},
                    {"cache_budget_mib", s.cache_budget_mib},
                    {"cache", s.cache},
                    {"read_latency", s.read_latency},
                    {"rss_mib", mib(double(current_rss_bytes()))},
                    {"prompt_cache", s.prompt_cache},
                    {"warm_experts", s.warm_experts},
                    {"peak_rss_mib", mib(double(peak_rss_bytes()))},
                    {"queue_waiting", waiting},
                    {"queue_max", cfg_.queue_max},
                    {"requests", json{{"served", s.served},
                                      {"cancelled", s.cancelled},
                                      {"errors", s.errors},
                                      {"rejected_busy", s.rejected_busy}}},
                    {"lossy", s.lossy},
                    {"model", model_name_},
                    {"settings", s.engine_settings},
                    {"defaults", defaults}};
    }

    ServeConfig cfg_;
    std::unique_ptr<Engine> engine_;  // worker thread only (and the constructor)
    std::string model_name_;
    std::string tmpl_;  // the chat template's name; "" = chat refused
    std::string tmpl_error_;  // why the template cannot be parsed ("" = it renders)
    ChatFormat fmt_;    // the model template's family when moestream renders it
    static constexpr int kHttpThreads = 128;
    int listen_fd_ = -1;  // the listening socket (set_socket_options)
    std::atomic<int> open_streams_{0};  // SSE responses not yet finished
    DropColdBlock drop_cold_block_ = DropColdBlock::kResident;  // the engine's, at start
    uint64_t calls_made_ = 0;  // tool calls parsed (next_call_id)
    int64_t started_unix_ = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    httplib::Server http_;
    std::thread worker_;

    std::mutex q_m_;  // guards queue_, running_, stopping_, next_id_
    std::condition_variable q_cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    std::shared_ptr<Job> running_;
    bool stopping_ = false;
    uint64_t next_id_ = 0;

    std::mutex stats_m_;  // guards snap_
    Snapshot snap_;
};

}  // namespace

int run_server(const ServeConfig & cfg_in) {
    ServeConfig cfg = cfg_in;
    // SIGPIPE: a client that disconnects must not kill the server (writes then fail).
    // SIGINT/SIGTERM: blocked in every thread, taken by one waiter that stops the server.
    ::signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);

    RunOptions ro = cfg.run;
    if (!cfg.drop_cold_explicit) ro.drop_cold = 0;  // applied after open, if the cache allows
    // The app default drop-cold needs the LRU cache; without it (--lossless) the fixed-slot
    // cache may hold the budget, and requests for drop-cold are refused by name.
    ro.drop_cold_later = cfg.defaults.drop_cold > 0;
    std::unique_ptr<Engine> engine;
    Status st = Engine::open(ro, &engine);
    if (!st.ok()) {
        MS_LOG_ERROR("%s", (cfg.option_words ? cfg.option_words(st.message()) : st.message()).c_str());
        return st.exit_code();
    }
    if (!cfg.drop_cold_explicit && cfg.defaults.drop_cold > 0) {
        st = engine->set_drop_cold(cfg.defaults.drop_cold);
        if (!st.ok()) {
            MS_LOG_WARN("app default drop-cold %.2f not applied, serving lossless: %s",
                        cfg.defaults.drop_cold,
                        (cfg.option_words ? cfg.option_words(st.message()) : st.message()).c_str());
            cfg.defaults.drop_cold = 0;
        }
    }
    if (cfg.token_delay_ms > 0)
        MS_LOG_WARN("MOESTREAM_DEBUG_TOKEN_DELAY_MS=%d: every token is delayed (tests only)",
                    cfg.token_delay_ms);

    Server server(cfg, std::move(engine));
    if (!server.template_error().empty()) {
        MS_LOG_ERROR("%s", server.template_error().c_str());
        return Status::BadInput("").exit_code();
    }
    std::thread sig([&server, set] {
        int signo = 0;
        sigwait(&set, &signo);
        if (signo == SIGINT || signo == SIGTERM) {
            MS_LOG_INFO("signal %d: stopping", signo);
            server.stop();
        }
    });
    int rc = server.serve();
    // Wake the signal thread if the server stopped by itself (bind failure).
    pthread_kill(sig.native_handle(), SIGTERM);
    sig.join();
    return rc;
}

}  // namespace moestream::server
