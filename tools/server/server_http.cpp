// server_http.cpp — the HTTP side of the Server (server_impl.h): cpp-httplib's settings, the
// web page, the route groups collected into one table (server_routes.h), the checks each row
// asks for (API key, JSON body) and the errors and 404 every route shares (docs/server.md).
#include <httplib.h>
#include <sys/socket.h>

#include <cctype>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "moestream/log.h"
#include "server_impl.h"
#include "server_routes.h"
#include "web_assets.h"

namespace moestream::server {

void send_json(httplib::Response & res, int status, const json & j) {
    res.status = status;
    res.set_content(dump(j) + "\n", "application/json");
}

void send_error(httplib::Response & res, const ApiError & e) {
    send_json(res, e.status, error_json(e));
}

ApiError api_error(int status, const std::string & msg, const std::string & type) {
    ApiError e;
    e.status = status;
    e.message = msg;
    e.type = type;
    return e;
}

bool json_body(const httplib::Request & req, httplib::Response & res) {
    const std::string ct = req.get_header_value("Content-Type");
    if (ct.compare(0, 16, "application/json") == 0) return true;
    if (!req.has_header("Origin")) return true;
    send_error(res, api_error(415,
                              "Content-Type must be application/json for a request from a "
                              "web page (one with an Origin header)",
                              "invalid_request_error"));
    return false;
}

namespace {

// The API key of --api-key ("" = none): false when it is missing or wrong (a 401 was answered).
bool authorized(const ServeConfig & cfg, const httplib::Request & req, httplib::Response & res) {
    if (cfg.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 9110); the key is not.
    const std::string prefix = "bearer ";
    bool scheme = h.size() > prefix.size();
    for (size_t i = 0; scheme && i < prefix.size(); ++i)
        scheme = std::tolower(static_cast<unsigned char>(h[i])) == prefix[i];
    if (scheme && same_key(h.substr(prefix.size()), cfg.api_key)) return true;
    res.set_header("WWW-Authenticate", "Bearer");
    ApiError e = api_error(401, "missing or wrong API key (Authorization: Bearer KEY)",
                           "authentication_error");
    e.code = "invalid_api_key";
    send_error(res, e);
    return false;
}

// Every endpoint: the groups of server_routes.h, in the order the 404 names them.
const std::vector<Route> & routes() {
    static const std::vector<Route> table = [] {
        std::vector<Route> all;
        for (auto group : {info_routes, generate_routes, slot_routes, token_routes})
            for (const Route & r : group()) all.push_back(r);
        return all;
    }();
    return table;
}

}  // namespace

std::string Server::routes_text() const {
    std::string out;
    for (const char * method : {"GET", "POST"}) {
        std::string list;
        for (const Route & r : routes())
            if (r.shown && std::strcmp(r.method, method) == 0)
                list += std::string(list.empty() ? "" : ", ") + r.shown;
        if (std::strcmp(method, "GET") == 0 && ctx_.cfg().webui)
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
    http_.set_payload_max_length(ctx_.cfg().body_limit_bytes);
    http_.set_keep_alive_timeout(5);
    http_.set_keep_alive_max_count(100);
    http_.set_read_timeout(5, 0);
    http_.set_write_timeout(5, 0);
    if (!ctx_.cfg().cors_origin.empty()) {
        const std::string origin = ctx_.cfg().cors_origin;
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
    for (const WebAsset & a : ctx_.cfg().webui ? web_assets() : no_assets) {
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
    if (ctx_.cfg().webui)  // the page's icon: browsers ask for /favicon.ico whatever the page says
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
            if ((r->checks & kAuth) && !authorized(ctx_.cfg(), req, res)) return;
            if ((r->checks & kJsonBody) && !json_body(req, res)) return;
            r->handle(ctx_, req, res);
        };
        if (std::strcmp(r->method, "GET") == 0)
            http_.Get(r->path, handler);
        else
            http_.Post(r->path, handler);
    }
}

}  // namespace moestream::server
