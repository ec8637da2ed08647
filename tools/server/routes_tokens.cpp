// routes_tokens.cpp — the vocabulary and template endpoints of `moestream serve`
// (server_routes.h), llama-server's: POST /tokenize, /detokenize and /apply-template. They use
// the loaded vocabulary and chat template only; none queues a job.
// Thread-safety: cpp-httplib's threads (ServerContext's tokenize / detokenize and the chat
// format are safe beside a generate).
#include <cstdint>
#include <string>
#include <vector>

#include "chat_request.h"
#include "server_routes.h"

namespace moestream::server {

namespace {

// POST /tokenize {"content": text} -> {"tokens": [...]} (with the model's start token when
// it uses one, as a prompt is tokenized for `with_pieces`: each token's text too).
void tokenize_route(ServerContext & ctx, const Req & req, Res & res) {
    json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("content") || !j["content"].is_string())
        return send_error(res, bad_request("content", "'content' must be a string"));
    for (auto it = j.begin(); it != j.end(); ++it)
        if (it.key() != "content" && it.key() != "with_pieces")
            return send_error(res, bad_request(it.key(), "unknown field '" + it.key() + "'"));
    if (j.contains("with_pieces") && !j["with_pieces"].is_boolean() && !j["with_pieces"].is_null())
        return send_error(res, bad_request("with_pieces", "'with_pieces' must be true or false"));
    const bool pieces =
        j.contains("with_pieces") && j["with_pieces"].is_boolean() && j["with_pieces"].get<bool>();
    std::vector<int32_t> toks;
    Status st = ctx.tokenize(j["content"].get<std::string>(), &toks);
    if (!st.ok()) return send_error(res, bad_request("content", st.message()));
    json out = json::array();
    for (int32_t t : toks) {
        if (!pieces) {
            out.push_back(t);
            continue;
        }
        std::string piece;
        ctx.detokenize({t}, &piece);
        out.push_back(json{{"id", t}, {"piece", sanitize_utf8(piece)}});
    }
    send_json(res, 200, json{{"tokens", out}});
}

// POST /detokenize {"tokens": [...]} -> {"content": text}
void detokenize_route(ServerContext & ctx, const Req & req, Res & res) {
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
        return send_error(res, bad_request("tokens", "the body must be {\"tokens\": [token ids]}"));
    std::string text;
    Status st = ctx.detokenize(toks, &text);
    if (!st.ok()) return send_error(res, bad_request("tokens", st.message()));
    send_json(res, 200, json{{"content", sanitize_utf8(text)}});
}

// POST /apply-template {"messages": [...]} -> {"prompt": text, "chat_template": name}
void apply_template_route(ServerContext & ctx, const Req & req, Res & res) {
    json j = json::parse(req.body, nullptr, false);
    bool fields_ok = j.is_object() && j.contains("messages");
    for (auto it = j.begin(); fields_ok && it != j.end(); ++it)
        fields_ok = it.key() == "messages" || it.key() == "tools" || it.key() == "tool_choice" ||
                    it.key() == "parallel_tool_calls" || it.key() == "chat_template_kwargs" ||
                    it.key() == "reasoning_effort";
    if (!fields_ok)
        return send_error(res, bad_request("messages",
                                           "the body must be {\"messages\": [...]} with "
                                           "optional tools, tool_choice, "
                                           "parallel_tool_calls, chat_template_kwargs, "
                                           "reasoning_effort"));
    GenParams p;
    if (auto e = parse_request(req.body, true, ctx.cfg().defaults, &p)) return send_error(res, *e);
    if (ctx.template_name().empty())
        return send_error(res, bad_request("messages",
                                           "the model's chat template is not one "
                                           "llama.cpp renders"));
    ChatPlan plan;
    if (auto e = plan_chat(ctx.chat_format(), ctx.template_name(), &p, &plan, true))
        return send_error(res, *e);
    send_json(res, 200,
              json{{"prompt", sanitize_utf8(plan.shown)}, {"chat_template", ctx.template_name()}});
}

}  // namespace

std::vector<Route> token_routes() {
    return {
        {"POST", "/tokenize", "/tokenize", kAuth | kJsonBody, tokenize_route},
        {"POST", "/detokenize", "/detokenize", kAuth | kJsonBody, detokenize_route},
        {"POST", "/apply-template", "/apply-template", kAuth | kJsonBody, apply_template_route},
    };
}

}  // namespace moestream::server
