// routes_slots.cpp — llama-server's slot files in `moestream serve` (server_routes.h): POST
// /slots/{id} saves, restores or erases the KV the context holds (--slot-save-path). The
// slot listing, GET /slots, is with the other read-only endpoints (routes_info.cpp).
// Thread-safety: cpp-httplib's threads; a slot action is queued as a Job and runs on the
// worker thread, which passes it the engine.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server_routes.h"

namespace moestream::server {

namespace {

// POST /slots/{id}?action=save|restore|erase, llama-server's slot files: the KV the context
// holds, to and from --slot-save-path DIR/filename (one slot: id 0). The action runs on the
// worker (it owns the engine); this thread waits for it.
void slot_action_route(ServerContext & ctx, const Req & req, Res & res) {
    const ServeConfig & cfg = ctx.cfg();
    if (cfg.slot_save_path.empty())
        return send_error(res, api_error(501,
                                         "This server does not support slots action. Start "
                                         "it with `--slot-save-path`",
                                         "not_supported_error"));
    const std::string id_text = req.matches.size() > 1 ? req.matches[1].str() : "";
    if (id_text != "0")
        return send_error(
            res, api_error(400, "Invalid slot ID: " + id_text + " (this server has one slot: 0)",
                           "invalid_request_error"));
    const std::string action = req.get_param_value("action");
    if (action != "save" && action != "restore" && action != "erase")
        return send_error(
            res, bad_request("action", "Invalid action '" + action + "' (save, restore or erase)"));
    if (!json_body(req, res)) return;  // application/json, as every POST (docs/server.md)
    std::string filename;
    if (action != "erase") {
        const json body = json::parse(req.body, nullptr, false);
        if (!body.is_object() || !body.contains("filename") || !body["filename"].is_string())
            return send_error(res, bad_request("filename", "filename (a string) is required"));
        filename = body["filename"].get<std::string>();
        // A plain name inside the directory: no separators, no . or .., no NUL.
        if (filename.empty() || filename.size() > 255 || filename == "." || filename == ".." ||
            filename.find('/') != std::string::npos || filename.find('\0') != std::string::npos)
            return send_error(res, bad_request("filename", "Invalid filename"));
    }
    const std::string path = cfg.slot_save_path + "/" + filename;
    auto job = std::make_shared<Job>();
    job->action = [action, filename, path](Engine & engine, json * out) {
        const double t0 = now_s();
        int n = 0;
        uint64_t bytes = 0;
        Status st;
        if (action == "save") {
            st = engine.save_kv(path, &n, &bytes);
            if (st.ok())
                *out = json{{"id_slot", 0},
                            {"filename", filename},
                            {"n_saved", n},
                            {"n_written", bytes},
                            {"timings", {{"save_ms", (now_s() - t0) * 1e3}}}};
        } else if (action == "restore") {
            st = engine.restore_kv(path, &n, &bytes);
            if (st.ok())
                *out = json{{"id_slot", 0},
                            {"filename", filename},
                            {"n_restored", n},
                            {"n_read", bytes},
                            {"timings", {{"restore_ms", (now_s() - t0) * 1e3}}}};
        } else {
            n = engine.erase_kv();
            *out = json{{"id_slot", 0}, {"n_erased", n}};
        }
        return st;
    };
    if (!ctx.enqueue(job)) {
        res.set_header("Retry-After", std::to_string(ctx.retry_after_s()));
        return send_error(res, api_error(503, "the server is busy; retry later", "server_busy"));
    }
    std::unique_lock<std::mutex> lk(job->m);
    job->cv.wait(lk, [&] { return job->done; });
    if (!job->status.ok())
        return send_error(res, api_error(http_status(job->status), job->status.message(),
                                         http_status(job->status) == 400 ? "invalid_request_error"
                                                                         : "server_error"));
    send_json(res, 200, job->moestream);
}

}  // namespace

std::vector<Route> slot_routes() {
    return {
        // The content type is checked after the slot id and action (slot_action_route).
        {"POST", R"(/slots/(\d+))", "/slots/{id}", kAuth, slot_action_route},
    };
}

}  // namespace moestream::server
