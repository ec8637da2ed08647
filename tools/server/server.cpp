// server.cpp — `moestream serve` (see server.h and docs/server.md): HTTP routes, the job
// queue, the worker thread that owns the Engine, and the stats snapshots.
#include "server.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "log.h"
#include "sysinfo.h"
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

// One generation request, shared by the HTTP thread that owns the connection and the worker.
struct Job {
    uint64_t id = 0;
    GenParams params;
    int64_t created = 0;  // unix seconds (the OpenAI "created" field)
    std::atomic<bool> cancelled{false};

    std::mutex m;  // guards everything below
    std::condition_variable cv;
    std::string unsent;  // streamed text (valid UTF-8) not yet written to the client
    bool done = false;
    Status status;     // when done
    std::string text;  // the whole completion (valid UTF-8)
    std::vector<int32_t> tokens;
    std::string finish_reason;
    json moestream;  // settings, lossy, per-request stats
    int n_prompt = 0, n_generated = 0;
};

// The worker's view for /stats, published under Server::stats_m_.
struct Snapshot {
    bool generating = false;
    uint64_t job_id = 0;
    int n_generated = 0;
    double tok_s = 0, cache_hit_pct = 0, mib_per_token = 0;
    uint64_t served = 0, cancelled = 0, errors = 0, rejected_busy = 0;
    double resident_expert_mib = 0, cache_budget_mib = 0, cache_hit_pct_total = 0;
    double avg_request_s = 0;
    bool lossy = false;
    json engine_settings;
};

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

class Server {
public:
    Server(const ServeConfig & cfg, std::unique_ptr<Engine> engine)
        : cfg_(cfg), engine_(std::move(engine)) {
        model_name_ = basename_of(cfg.run.model_path);
        tmpl_ = choose_chat_template(engine_->chat_template());
        cache_on_ = cfg.run.stream && engine_->stats().cache_budget_bytes > 0;
        publish_after_job(0, 0);
    }

    int serve() {
        setup_routes();
        int port = cfg_.port;
        if (port == 0) {
            port = http_.bind_to_any_port(cfg_.host);
            if (port < 0) return bind_failed();
        } else if (!http_.bind_to_port(cfg_.host, port)) {
            return bind_failed();
        }
        if (cfg_.host != "127.0.0.1" && cfg_.host != "localhost" && cfg_.host != "::1")
            MS_LOG_WARN("listening on %s: reachable from other machines%s", cfg_.host.c_str(),
                        cfg_.api_key.empty() ? " and no --api-key is set" : "");
        worker_ = std::thread([this] { worker_loop(); });
        std::printf(
            "moestream serve: listening on http://%s:%d/ (model %s, %s, chat template %s)\n",
            cfg_.host.c_str(), port, model_name_.c_str(),
            engine_->lossy() ? "LOSSY defaults" : "lossless", tmpl_.description.c_str());
        std::fflush(stdout);
        bool ok = http_.listen_after_bind();
        shutdown();
        return ok ? 0 : 1;
    }

    // From the signal thread: cancel what runs and waits (streams end at once), then stop
    // accepting; serve() returns once the HTTP threads are done.
    void stop() {
        {
            std::lock_guard<std::mutex> lk(q_m_);
            stopping_ = true;
            for (auto & j : queue_) j->cancelled = true;
            if (running_) running_->cancelled = true;
        }
        q_cv_.notify_all();
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
        const std::string prefix = "Bearer ";
        if (h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 &&
            same_key(h.substr(prefix.size()), cfg_.api_key))
            return true;
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(res, api_error(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                  "authentication_error"));
        return false;
    }

    // Browsers send a cross-origin POST without asking first only for form content types:
    // requiring application/json keeps other web sites from driving this server.
    static bool json_body(const httplib::Request & req, httplib::Response & res) {
        const std::string ct = req.get_header_value("Content-Type");
        if (ct.compare(0, 16, "application/json") == 0) return true;
        send_error(
            res, api_error(415, "Content-Type must be application/json", "invalid_request_error"));
        return false;
    }

    void setup_routes() {
        http_.new_task_queue = [] { return new httplib::ThreadPool(32); };
        // cpp-httplib's default sets SO_REUSEPORT, which lets a second server bind the same
        // port and share its connections: only SO_REUSEADDR (a quick restart) here.
        http_.set_socket_options([](int sock) {
            int yes = 1;
            setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        });
        http_.set_payload_max_length(cfg_.body_limit_bytes);
        http_.set_keep_alive_timeout(5);
        http_.set_logger([](const httplib::Request & req, const httplib::Response & res) {
            MS_LOG_INFO("%s %s -> %d", req.method.c_str(), req.path.c_str(), res.status);
        });
        http_.set_error_handler([](const httplib::Request &, httplib::Response & res) {
            if (!res.body.empty()) return;
            std::string msg = "HTTP error " + std::to_string(res.status);
            if (res.status == 404) msg = "not found";
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

        for (const WebAsset & a : web_assets()) {
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
        http_.Get("/health", [this](const httplib::Request &, httplib::Response & res) {
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
        http_.Post("/v1/chat/completions",
                   [this](const httplib::Request & req, httplib::Response & res) {
                       generate_route(req, res, true);
                   });
        http_.Post("/v1/completions",
                   [this](const httplib::Request & req, httplib::Response & res) {
                       generate_route(req, res, false);
                   });
    }

    void generate_route(const httplib::Request & req, httplib::Response & res, bool chat) {
        if (!authorized(req, res) || !json_body(req, res)) return;
        auto job = std::make_shared<Job>();
        if (auto e = parse_request(req.body, chat, cfg_.defaults, &job->params))
            return send_error(res, *e);
        GenParams & p = job->params;
        if (p.drop_cold > 0 && !cache_on_) {
            ApiError e = api_error(400,
                                   "drop_cold_experts needs the expert cache, which is off in this "
                                   "server (--cache-mb / --no-stream)",
                                   "invalid_request_error");
            e.param = "drop_cold_experts";
            return send_error(res, e);
        }
        if (chat) {
            std::string err;
            if (!format_chat(tmpl_, p.messages, &p.prompt, &err))
                return send_error(res, api_error(400, err, "invalid_request_error"));
        }
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
            auto sent_role = std::make_shared<bool>(false);
            res.set_chunked_content_provider(
                "text/event-stream",
                [this, job, sent_role](size_t, httplib::DataSink & sink) {
                    return stream_step(*job, sink, sent_role.get());
                },
                [this, job](bool success) {
                    if (success) return;
                    job->cancelled = true;  // the client went away: free its place in the queue
                    std::lock_guard<std::mutex> lk(q_m_);
                    auto it = std::find(queue_.begin(), queue_.end(), job);
                    if (it != queue_.end()) {
                        queue_.erase(it);
                        std::lock_guard<std::mutex> sl(stats_m_);
                        snap_.cancelled++;
                    }
                });
            return;
        }
        std::unique_lock<std::mutex> lk(job->m);
        job->cv.wait(lk, [&] { return job->done; });
        if (!job->status.ok())
            return send_error(res,
                              api_error(http_status(job->status), job->status.message(),
                                        http_status(job->status) == 400 ? "invalid_request_error"
                                                                        : "server_error"));
        send_json(res, 200, final_json(*job));
    }

    json chunk_json(const Job & job, const json & delta_or_text, const json & finish) const {
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
        job.cv.wait_for(lk, std::chrono::milliseconds(500),
                        [&] { return !job.unsent.empty() || job.done; });
        if (!job.unsent.empty()) {
            std::string t;
            t.swap(job.unsent);
            lk.unlock();
            json d = job.params.chat ? json{{"content", t}} : json(t);
            return write_str(sink, sse(chunk_json(job, d, nullptr))) ? true : fail();
        }
        if (job.done) {
            std::string out;
            if (job.status.ok()) {
                json last =
                    chunk_json(job, job.params.chat ? json::object() : json(""), job.finish_reason);
                last["usage"] = usage_json(job);
                last["moestream"] = job.moestream;
                out = sse(last);
            } else {
                ApiError e = api_error(
                    http_status(job.status), job.status.message(),
                    http_status(job.status) == 400 ? "invalid_request_error" : "server_error");
                out = sse(error_json(e));
            }
            lk.unlock();
            out += "data: [DONE]\n\n";
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
            c["message"] = json{{"role", "assistant"}, {"content", job.text}};
        else
            c["text"] = job.text, c["logprobs"] = nullptr;
        c["finish_reason"] = job.finish_reason;
        return json{{"id", job_name(job)},
                    {"object", job.params.chat ? "chat.completion" : "text_completion"},
                    {"created", job.created},
                    {"model", model_name_},
                    {"choices", json::array({c})},
                    {"usage", usage_json(job)},
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
        Status st = cfg_.run.stream ? engine_->set_drop_cold(p.drop_cold) : Status::Ok();
        if (!st.ok()) {
            {
                std::lock_guard<std::mutex> sl(stats_m_);
                snap_.errors++;
            }
            return finish(job, st);
        }
        GenerateRequest r;
        r.prompt = p.prompt;
        r.n_predict = p.max_tokens;
        r.sampling.temp = p.temperature;
        r.sampling.seed = p.seed;
        r.sampling.top_k = p.top_k;
        r.sampling.top_p = p.top_p;
        r.reuse_prefix = p.cache_prompt;
        {
            std::lock_guard<std::mutex> sl(stats_m_);
            snap_.generating = true;
            snap_.job_id = job.id;
            snap_.n_generated = 0;
            snap_.tok_s = snap_.cache_hit_pct = snap_.mib_per_token = 0;
        }
        Utf8Stream utf8;
        std::string all;
        const double t0 = now_s();
        GenerateResult g;
        st = engine_->generate(
            r,
            [&](const std::string & piece) {
                if (cfg_.token_delay_ms > 0)
                    std::this_thread::sleep_for(std::chrono::milliseconds(cfg_.token_delay_ms));
                std::string t = utf8.push(piece);
                if (!t.empty()) {
                    {
                        std::lock_guard<std::mutex> lk(job.m);
                        job.unsent += t;
                        job.text += t;
                    }
                    job.cv.notify_all();
                }
                publish_live();
                return !job.cancelled.load();
            },
            &g);
        const double dt = now_s() - t0;
        std::string tail = utf8.finish();
        const RunStats & s = engine_->stats();
        const bool cancelled = job.cancelled.load();
        {
            std::lock_guard<std::mutex> lk(job.m);
            job.unsent += tail;
            job.text += tail;
            job.tokens = g.tokens;
            job.n_prompt = s.n_prompt;
            job.n_generated = s.n_generated;
            job.finish_reason = cancelled                              ? "cancelled"
                                : int(g.tokens.size()) >= p.max_tokens ? "length"
                                                                       : "stop";
            job.moestream = request_report(job, g, cancelled);
        }
        publish_live();
        publish_after_job(dt, st.ok() ? 1 : 0);
        {
            std::lock_guard<std::mutex> sl(stats_m_);
            snap_.generating = false;
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
        snap_.n_generated = s.n_generated;
        snap_.tok_s = f.tok_s;
        snap_.cache_hit_pct = f.cache_hit_pct;
        snap_.mib_per_token = f.mib_per_token;
    }

    // After a job (and at start): settings, cache figures, the mean request time.
    void publish_after_job(double dt, int ok) {
        const RunStats & s = engine_->stats();
        json settings = json::parse(engine_->settings_json(), nullptr, false);
        std::lock_guard<std::mutex> sl(stats_m_);
        snap_.engine_settings = settings;
        snap_.lossy = engine_->lossy();
        snap_.resident_expert_mib = mib(double(s.resident_expert_bytes));
        snap_.cache_budget_mib = mib(double(s.cache_budget_bytes));
        snap_.cache_hit_pct_total = s.cache_hit_pct;
        if (ok) {
            snap_.served++;
            snap_.avg_request_s = snap_.served == 1 ? dt : 0.8 * snap_.avg_request_s + 0.2 * dt;
        }
    }

    json request_settings(const GenParams & p) const {
        return json{{"max_tokens", p.max_tokens},
                    {"temperature", p.temperature},
                    {"top_p", p.top_p},
                    {"top_k", p.top_k},
                    {"seed", p.seed},
                    {"drop_cold_experts", p.drop_cold},
                    {"cache_prompt", p.cache_prompt},
                    {"stream", p.stream},
                    {"chat_template", p.chat ? json(tmpl_.description) : json(nullptr)}};
    }

    // The moestream object of a response: what produced it and how it went.
    json request_report(const Job & job, const GenerateResult & g, bool cancelled) {
        const RunStats & s = engine_->stats();
        const DecodeFigures f = decode_figures(s);
        json st{{"n_prompt", s.n_prompt},
                {"n_prompt_reused", s.n_prompt_reused},
                {"n_generated", s.n_generated},
                {"prefill_s", s.prefill_s},
                {"prefill_tok_s", s.prefill_tok_s},
                {"decode_tok_s", f.tok_s},
                {"cache_hit_pct", f.cache_hit_pct},
                {"flash_mib_per_token", f.mib_per_token},
                {"resident_expert_mib", mib(double(s.resident_expert_bytes))},
                {"experts_dropped", s.experts_dropped}};
        json r{{"lossy", engine_->lossy()},
               {"settings", json{{"engine", json::parse(engine_->settings_json(), nullptr, false)},
                                 {"request", request_settings(job.params)}}},
               {"stats", st},
               {"cancelled", cancelled}};
        if (job.params.return_tokens) r["tokens"] = g.tokens;
        return r;
    }

    json stats_json() {
        size_t waiting;
        {
            std::lock_guard<std::mutex> lk(q_m_);
            waiting = queue_.size();
        }
        std::lock_guard<std::mutex> sl(stats_m_);
        const Snapshot & s = snap_;
        json defaults{{"max_tokens", cfg_.defaults.max_tokens},
                      {"max_tokens_limit", cfg_.defaults.max_tokens_limit},
                      {"temperature", cfg_.defaults.temperature},
                      {"seed", cfg_.defaults.seed},
                      {"drop_cold_experts", cfg_.defaults.drop_cold},
                      {"cache_prompt", true},
                      {"chat_template", tmpl_.description},
                      {"drop_cold_available", cache_on_}};
        return json{{"generating", s.generating},
                    {"request_id", s.job_id},
                    {"n_generated", s.n_generated},
                    {"tok_s", s.tok_s},
                    {"cache_hit_pct", s.cache_hit_pct},
                    {"mib_per_token", s.mib_per_token},
                    {"cache_hit_pct_total", s.cache_hit_pct_total},
                    {"resident_expert_mib", s.resident_expert_mib},
                    {"cache_budget_mib", s.cache_budget_mib},
                    {"rss_mib", mib(double(current_rss_bytes()))},
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
    ChatTemplate tmpl_;
    bool cache_on_ = false;
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
    std::unique_ptr<Engine> engine;
    Status st = Engine::open(ro, &engine);
    if (!st.ok()) {
        MS_LOG_ERROR("%s", st.message().c_str());
        return st.exit_code();
    }
    if (!cfg.drop_cold_explicit && cfg.defaults.drop_cold > 0) {
        st = engine->set_drop_cold(cfg.defaults.drop_cold);
        if (!st.ok()) {
            MS_LOG_WARN("app default drop-cold %.2f not applied, serving lossless: %s",
                        cfg.defaults.drop_cold, st.message().c_str());
            cfg.defaults.drop_cold = 0;
        }
    }
    // -c 0 means the model's context: the engine reports the length it chose.
    const int n_ctx = nlohmann::json::parse(engine->settings_json()).value("n_ctx", cfg.run.n_ctx);
    cfg.defaults.max_tokens_limit = std::max(1, n_ctx - 1);
    cfg.defaults.max_tokens = std::min(cfg.defaults.max_tokens, cfg.defaults.max_tokens_limit);
    if (cfg.token_delay_ms > 0)
        MS_LOG_WARN("MOESTREAM_DEBUG_TOKEN_DELAY_MS=%d: every token is delayed (tests only)",
                    cfg.token_delay_ms);

    Server server(cfg, std::move(engine));
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
