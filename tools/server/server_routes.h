// server_routes.h — the endpoints of `moestream serve` (server.h, docs/server.md): a Route is
// one row (method, path, checks, handler); each route file returns its group's rows and holds
// their handlers, free functions over a ServerContext (server_context.h):
//   routes_info.cpp      GET /health, /stats, /props, /metrics, /slots, /v1/models,
//                        /v1/models/{id}
//   routes_generate.cpp  POST /v1/chat/completions, /v1/completions, /v1/responses, /completion
//                        (and their aliases without /v1)
//   routes_slots.cpp     POST /slots/{id} (the slot files)
//   routes_tokens.cpp    POST /tokenize, /detokenize, /apply-template
// server_http.cpp collects the groups (routes()), checks each row's RouteCheck bits before
// its handler and names the routes in a 404. Adding an endpoint to a group is a row and its
// handler in that group's file; a new group is a file, its declaration here and its line in
// routes().
// Invariants: the handlers see the engine only through ServerContext (never a generate);
// every error a handler answers is an OpenAI-style error body (send_error).
// Thread-safety: the handlers run on cpp-httplib's threads, several at once; what they call
// on ServerContext is safe from any thread. The helpers below are pure.
#pragma once

#include <httplib.h>

#include <string>
#include <vector>

#include "api.h"
#include "server_context.h"
#include "server_util.h"

namespace moestream::server {

// The handlers' request and response (cpp-httplib's).
using Req = httplib::Request;
using Res = httplib::Response;

// What the router checks before a route's handler runs (bits of Route::checks).
enum RouteCheck : unsigned {
    kOpen = 0,
    kAuth = 1,      // the API key (--api-key), compared in constant time
    kJsonBody = 2,  // a JSON body (json_body), checked after the key
};

// One endpoint.
struct Route {
    const char * method;  // "GET" or "POST"
    const char * path;    // cpp-httplib's pattern (a regex where it has groups)
    const char * shown;   // how the 404 names it; nullptr = an alias, not listed
    unsigned checks;      // RouteCheck bits, done before the handler
    void (*handle)(ServerContext &, const Req &, Res &);
};

// The groups, in the order the 404 lists them (server_http.cpp's routes()).
std::vector<Route> info_routes();      // routes_info.cpp
std::vector<Route> generate_routes();  // routes_generate.cpp
std::vector<Route> slot_routes();      // routes_slots.cpp
std::vector<Route> token_routes();     // routes_tokens.cpp

// ---- replies and errors (server_http.cpp) ---------------------------------------------------
void send_json(httplib::Response & res, int status, const json & j);
void send_error(httplib::Response & res, const ApiError & e);
ApiError api_error(int status, const std::string & msg, const std::string & type);

// Browsers send a cross-origin POST without asking first only for form content types (or
// none): requiring application/json from a browser keeps other web sites from driving this
// server. A request without an Origin header does not come from a web page (curl -d, SDKs):
// its body is read as JSON whatever its Content-Type says. False: a 415 was answered.
bool json_body(const httplib::Request & req, httplib::Response & res);

}  // namespace moestream::server
