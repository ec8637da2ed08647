// server_http.cpp — Server's HTTP routes (server_impl.h): authorization, JSON bodies,
// errors and one handler per endpoint (docs/server.md).
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
#include "llama_completion.h"
#include "logprobs_json.h"
#include "time_json.h"
#include "web_assets.h"
#include "server_impl.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`

void Server::send_json(httplib::Response & res, int status, const json & j) {
    res.status = status;
    res.set_content(dump(j) + "\n", "application/json");
}

void Server::send_error(httplib::Response & res, const ApiError & e) {
    send_json(res, e.status, error_json(e));
}

ApiError Server::api_error(int status, const std::string & msg, const std::string & type) {
    ApiError e;
    e.status = status;
    e.message = msg;
    e.type = type;
    return e;
}

bool Server::authorized(const httplib::Request & req, httplib::Response & res) const {
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

bool Server::json_body(const httplib::Request & req, httplib::Response & res) {
    const std::string ct = req.get_header_value("Content-Type");
    if (ct.compare(0, 16, "application/json") == 0) return true;
    if (!req.has_header("Origin")) return true;
    send_error(res, api_error(415,
                              "Content-Type must be application/json for a request from a "
                              "web page (one with an Origin header)",
                              "invalid_request_error"));
    return false;
}

// The endpoints. Adding one: a row here, its handler inline or as a Server member in this
// file (and, if a member, its declaration in server_impl.h).
const std::vector<Server::Route> & Server::routes() {
    using Req = httplib::Request;
    using Res = httplib::Response;
    static const std::vector<Route> table = {
        {"GET", "/health", "/health", kOpen,
         [](Server & s, const Req &, Res & res) {
             // A changed model file fails every request.
             const Status fs = s.engine_->model_file_status();
             if (!fs.ok())
                 return send_json(res, 503, json{{"status", "error"}, {"model", s.model_name_},
                                                 {"error", fs.message()}});
             send_json(res, 200, json{{"status", "ok"}, {"model", s.model_name_}});
         }},
        {"GET", "/stats", "/stats", kAuth,
         [](Server & s, const Req &, Res & res) { send_json(res, 200, s.stats_json()); }},
        {"GET", "/props", "/props", kAuth,
         [](Server & s, const Req &, Res & res) { send_json(res, 200, s.props_json()); }},
        {"GET", "/metrics", "/metrics", kAuth,
         [](Server & s, const Req &, Res & res) {
             res.set_content(metrics_text(s.metrics_.snapshot(), s.jobs_.waiting(),
                                          mib(double(current_rss_bytes()))),
                             "text/plain; version=0.0.4");
         }},
        // llama-server's slot listing: this server has one slot (one generation at a time;
        // others wait in the queue).
        {"GET", "/slots", "/slots", kAuth,
         [](Server & s, const Req &, Res & res) {
             send_json(res, 200, json::array({json{{"id", 0},
                                                   {"n_ctx", s.engine_->n_ctx()},
                                                   {"is_processing", s.jobs_.busy()},
                                                   {"speculative", false}}}));
         }},
        {"GET", "/v1/models", "/v1/models", kAuth,
         [](Server & s, const Req &, Res & res) {
             send_json(res, 200, json{{"object", "list"}, {"data", json::array({s.model_json()})}});
         }},
        {"GET", R"(/v1/models/(.+))", "/v1/models/{id}", kAuth,
         [](Server & s, const Req & req, Res & res) {
             const std::string id = req.matches[1];
             if (id != s.model_name_) {
                 ApiError e = api_error(404,
                                        "The model '" + id + "' does not exist (this server has '" +
                                            s.model_name_ + "')",
                                        "invalid_request_error");
                 e.param = "model";
                 e.code = "model_not_found";
                 return send_error(res, e);
             }
             send_json(res, 200, s.model_json());
         }},
        {"POST", "/v1/chat/completions", "/v1/chat/completions", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.generate_route(req, res, true); }},
        {"POST", "/chat/completions", nullptr, kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.generate_route(req, res, true); }},
        {"POST", "/v1/completions", "/v1/completions", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.generate_route(req, res, false); }},
        {"POST", "/completions", nullptr, kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.generate_route(req, res, false); }},
        // OpenAI's Responses API, translated to chat completions (responses.h).
        {"POST", "/v1/responses", "/v1/responses", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.responses_route(req, res); }},
        {"POST", "/responses", nullptr, kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.responses_route(req, res); }},
        // llama-server's native completion: the completions request, its reply shape.
        {"POST", "/completion", "/completion", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.generate_route(req, res, false, true); }},
        // The content type is checked after the slot id and action (slots_route).
        {"POST", R"(/slots/(\d+))", "/slots/{id}", kAuth,
         [](Server & s, const Req & req, Res & res) { s.slots_route(req, res); }},
        {"POST", "/tokenize", "/tokenize", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.tokenize_route(req, res); }},
        {"POST", "/detokenize", "/detokenize", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.detokenize_route(req, res); }},
        {"POST", "/apply-template", "/apply-template", kAuth | kJsonBody,
         [](Server & s, const Req & req, Res & res) { s.apply_template_route(req, res); }},
    };
    return table;
}

std::string Server::routes_text() const {
    std::string out;
    for (const char * method : {"GET", "POST"}) {
        std::string list;
        for (const Route & r : routes())
            if (r.shown && std::strcmp(r.method, method) == 0)
                list += std::string(list.empty() ? "" : ", ") + r.shown;
        if (std::strcmp(method, "GET") == 0 && cfg_.webui)
            list += ", / (the web page, /favicon.ico)";
        out += std::string(out.empty() ? "" : "; ") + method + " " + list;
    }
    return out;
}

void Server::setup_routes() {
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
    http_.set_error_handler([this](const httplib::Request & req, httplib::Response & res) {
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
    for (const Route & route : routes()) {
        const Route * r = &route;  // the table is static
        auto handler = [this, r](const httplib::Request & req, httplib::Response & res) {
            if ((r->checks & kAuth) && !authorized(req, res)) return;
            if ((r->checks & kJsonBody) && !json_body(req, res)) return;
            r->handle(*this, req, res);
        };
        if (std::strcmp(r->method, "GET") == 0)
            http_.Get(r->path, handler);
        else
            http_.Post(r->path, handler);
    }
}

void Server::responses_route(const httplib::Request & req, httplib::Response & res) {
    std::string chat_body;
    if (auto e = responses_to_chat(req.body, &chat_body)) return send_error(res, *e);
    generate_route(req, res, true, false, &chat_body);
}

json Server::model_json() const {
    return json{{"id", model_name_},
                {"object", "model"},
                {"created", started_unix_},
                {"owned_by", "moestream"}};
}

json Server::stats_json() const {
    json j = stats_figures_json(metrics_.snapshot(), jobs_.waiting(), cfg_.queue_max);
    j["model"] = model_name_;
    const RequestDefaults & d = cfg_.defaults;
    j["defaults"] = json{{"max_tokens", d.max_tokens < 0 ? json(nullptr) : json(d.max_tokens)},
                         {"max_tokens_limit", engine_->n_ctx() - 1},
                         {"n_ctx", engine_->n_ctx()},
                         {"temperature", float_json(d.temperature)},
                         {"top_k", d.sampling.top_k},
                         {"top_p", float_json(d.sampling.top_p)},
                         {"min_p", float_json(d.sampling.min_p)},
                         {"repeat_penalty", float_json(d.sampling.repeat_penalty)},
                         {"repeat_last_n", d.sampling.repeat_last_n},
                         {"presence_penalty", float_json(d.sampling.presence_penalty)},
                         {"frequency_penalty", float_json(d.sampling.frequency_penalty)},
                         {"seed", d.seed},
                         {"drop_cold_experts", d.drop_cold},
                         {"cache_prompt", true},
                         {"chat_template", tmpl_.empty() ? json(nullptr) : json(tmpl_)},
                         {"drop_cold_available", drop_cold_block_ == DropColdBlock::kNone}};
    return j;
}

json Server::props_json() const {
    json st = stats_json();
    return json{{"model_path", cfg_.run.model_path},
                {"model", model_name_},
                {"n_ctx", engine_->n_ctx()},
                {"n_vocab", engine_->n_vocab()},
                {"total_slots", 1},
                {"chat_template", tmpl_.empty() ? json(nullptr) : json(tmpl_)},
                {"chat_template_renderer", renderer_json()},
                {"default_generation_settings", st["defaults"]},
                {"lossy", st["lossy"]},
                {"settings", st["settings"]}};
}

void Server::generate_route(const httplib::Request & req, httplib::Response & res, bool chat,
                    bool llama_shape, const std::string * responses_body) {
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
    std::string llama_body;  // /completion: n_probs taken out (llama_completion.h)
    if (llama_shape) {
        llama_body = req.body;
        if (auto e = take_n_probs(&llama_body, &job->n_probs)) return send_error(res, *e);
    }
    if (auto e = parse_request(responses_body ? *responses_body : llama_shape ? llama_body : req.body,
                               chat, cfg_.defaults, &job->params))
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
    if (p.stream) return stream_reply(job, res);
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
    if (job->cancelled && jobs_.stopping()) {  // SIGTERM: not a failure of the request
        res.set_header("Retry-After", "5");
        return send_error(res, api_error(503, "the server is stopping; retry later",
                                         "server_busy"));
    }
    if (!job->status.ok()) return send_error(res, ReplyWriter::job_error(*job));
    send_json(res, 200, replies_.reply_json(*job));
}

void Server::slots_route(const httplib::Request & req, httplib::Response & res) {
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

std::optional<ApiError> Server::prepare_prompt(GenParams & p, ChatPlan * plan) const {
    const char * param = p.chat ? "messages" : "prompt";
    if (p.chat) {
        if (tmpl_.empty())
            return api_error_param(400,
                                   "chat completions are not available: the model's chat "
                                   "template is not one llama.cpp renders; format the "
                                   "prompt yourself and use /v1/completions",
                                   "messages");
        if (auto e = plan_chat(fmt_, tmpl_, &p, plan)) return e;
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

void Server::stream_reply(const std::shared_ptr<Job> & job, httplib::Response & res) {
    open_streams_++;
    replies_.stream(job, res, [this, job](bool success) {
        if (!success) client_left(job);
        open_streams_--;
    });
}

ApiError Server::api_error_param(int status, const std::string & msg, const std::string & param) {
    ApiError e = api_error(status, msg, "invalid_request_error");
    e.param = param;
    return e;
}

void Server::tokenize_route(const httplib::Request & req, httplib::Response & res) const {
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

void Server::detokenize_route(const httplib::Request & req, httplib::Response & res) const {
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

void Server::apply_template_route(const httplib::Request & req, httplib::Response & res) const {
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
    send_json(res, 200, json{{"prompt", sanitize_utf8(plan.shown)}, {"chat_template", tmpl_}});
}

}  // namespace moestream::server
