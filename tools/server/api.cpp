// api.cpp — request parsing/validation, chat formatting and UTF-8 assembly for
// `moestream serve` (see api.h; field reference in docs/server.md).
#include "api.h"

#include <cmath>
#include <limits>

#include "llama.h"

namespace moestream::server {
namespace {

using nlohmann::json;

ApiError bad(const std::string & param, const std::string & message) {
    ApiError e;
    e.status = 400;
    e.param = param;
    e.message = message;
    return e;
}

// Reads an optional number field into *v within [lo, hi]. Absent or null: unchanged.
std::optional<ApiError> get_number(const json & j, const char * key, double lo, double hi,
                                   double * v) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) return bad(key, std::string("'") + key + "' must be a number");
    double x = it->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
        return bad(key, std::string("'") + key + "' must be in [" + json(lo).dump() + ", " +
                            json(hi).dump() + "], got " + it->dump());
    *v = x;
    return std::nullopt;
}

std::optional<ApiError> get_int(const json & j, const char * key, int64_t lo, int64_t hi,
                                int64_t * v) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    bool integral =
        it->is_number_integer() || (it->is_number_float() && std::isfinite(it->get<double>()) &&
                                    std::floor(it->get<double>()) == it->get<double>());
    if (!integral) return bad(key, std::string("'") + key + "' must be an integer");
    double x = it->get<double>();
    if (it->is_number_unsigned())
        x = double(it->get<uint64_t>());
    else if (it->is_number_integer())
        x = double(it->get<int64_t>());
    if (x < double(lo) || x > double(hi))
        return bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + it->dump());
    *v = int64_t(x);
    return std::nullopt;
}

std::optional<ApiError> get_bool(const json & j, const char * key, bool * v) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) return bad(key, std::string("'") + key + "' must be true or false");
    *v = it->get<bool>();
    return std::nullopt;
}

// A message's content: a string, or OpenAI's array of parts of which only "text" is supported.
std::optional<ApiError> get_content(const json & c, size_t i, std::string * out) {
    const std::string param = "messages[" + std::to_string(i) + "].content";
    if (c.is_string()) {
        *out = c.get<std::string>();
        return std::nullopt;
    }
    if (!c.is_array())
        return bad(param, "'" + param + "' must be a string or an array of text parts");
    out->clear();
    for (const auto & part : c) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string())
            return bad(param,
                       "'" + param +
                           "': only parts {\"type\": \"text\", \"text\": \"...\"} are supported");
        *out += part["text"].get<std::string>();
    }
    return std::nullopt;
}

// Length of the valid UTF-8 sequence starting at s[i] (1..4), 0 if invalid, -1 if it is a
// valid start that the string ends before completing.
int utf8_seq(const std::string & s, size_t i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c == 0xE0)
        len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC)
        len = 3;
    else if (c == 0xED)
        len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF)
        len = 3;
    else if (c == 0xF0)
        len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        len = 4;
    else if (c == 0xF4)
        len = 4, hi = 0x8F;
    else
        return 0;
    for (int k = 1; k < len; ++k) {
        if (i + size_t(k) >= s.size()) return -1;
        const unsigned char b = static_cast<unsigned char>(s[i + size_t(k)]);
        const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return 0;
    }
    return len;
}

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::optional<ApiError> parse_request(const std::string & body, bool chat,
                                      const RequestDefaults & d, GenParams * out) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return bad("", "the request body is not valid JSON");
    if (!j.is_object()) return bad("", "the request body must be a JSON object");
    GenParams p;
    p.chat = chat;
    p.max_tokens = d.max_tokens;
    p.temperature = d.temperature;
    p.seed = d.seed;
    p.drop_cold = d.drop_cold;

    if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
        if (!it->is_string()) return bad("model", "'model' must be a string");
        p.model = it->get<std::string>();
    }
    if (chat) {
        auto it = j.find("messages");
        if (it == j.end() || !it->is_array() || it->empty())
            return bad("messages", "'messages' must be a non-empty array");
        for (size_t i = 0; i < it->size(); ++i) {
            const json & m = (*it)[i];
            const std::string pm = "messages[" + std::to_string(i) + "]";
            if (!m.is_object()) return bad(pm, "'" + pm + "' must be an object");
            if (!m.contains("role") || !m["role"].is_string())
                return bad(pm + ".role", "'" + pm + ".role' must be a string");
            ChatMessage msg;
            msg.role = m["role"].get<std::string>();
            if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
                return bad(pm + ".role", "'" + pm + ".role' must be system, user or assistant");
            if (!m.contains("content"))
                return bad(pm + ".content", "'" + pm + ".content' is missing");
            if (auto e = get_content(m["content"], i, &msg.content)) return e;
            p.messages.push_back(std::move(msg));
        }
    } else {
        auto it = j.find("prompt");
        if (it == j.end()) return bad("prompt", "'prompt' is missing");
        if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
            p.prompt = (*it)[0].get<std::string>();
        } else if (it->is_string()) {
            p.prompt = it->get<std::string>();
        } else {
            return bad("prompt", "'prompt' must be a string (or an array of one string)");
        }
        if (p.prompt.empty()) return bad("prompt", "'prompt' must not be empty");
    }

    if (auto e = get_bool(j, "stream", &p.stream)) return e;
    int64_t v = 0;
    for (const char * key : {"max_tokens", "max_completion_tokens"}) {
        v = p.max_tokens;
        if (auto e = get_int(j, key, 1, d.max_tokens_limit, &v)) return e;
        p.max_tokens = int(v);
    }
    double x = p.temperature;
    if (auto e = get_number(j, "temperature", 0.0, 100.0, &x)) return e;
    p.temperature = float(x);
    x = p.top_p;
    if (auto e = get_number(j, "top_p", 1e-6, 1.0, &x)) return e;
    p.top_p = float(x);
    v = p.top_k;
    if (auto e = get_int(j, "top_k", 0, 1 << 20, &v)) return e;
    p.top_k = int(v);
    v = p.seed;
    if (auto e = get_int(j, "seed", 0, std::numeric_limits<uint32_t>::max(), &v)) return e;
    p.seed = uint32_t(v);
    x = p.drop_cold;
    if (auto e = get_number(j, "drop_cold_experts", 0.0, 1.0, &x)) return e;
    p.drop_cold = x;
    if (auto e = get_bool(j, "cache_prompt", &p.cache_prompt)) return e;
    if (auto e = get_bool(j, "return_tokens", &p.return_tokens)) return e;
    v = 1;
    if (auto e = get_int(j, "n", 1, 1, &v)) return bad("n", "only n = 1 is supported");
    if (auto it = j.find("stop");
        it != j.end() && !it->is_null() && !(it->is_array() && it->empty()))
        return bad("stop", "stop sequences are not supported (docs/server.md)");
    for (const char * key : {"logprobs", "echo"}) {
        bool b = false;
        if (auto e = get_bool(j, key, &b)) return e;
        if (b) return bad(key, std::string("'") + key + "' is not supported");
    }
    *out = std::move(p);
    return std::nullopt;
}

nlohmann::json error_json(const ApiError & e) {
    json err;
    err["message"] = sanitize_utf8(e.message);
    err["type"] = e.type;
    err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
    err["code"] = e.status;
    return json{{"error", err}};
}

ChatTemplate choose_chat_template(const std::string & model_template) {
    ChatTemplate t;
    if (!model_template.empty()) {
        llama_chat_message probe{"user", "hi"};
        char buf[16];
        if (llama_chat_apply_template(model_template.c_str(), &probe, 1, true, buf, sizeof buf) >=
            0) {
            t.tmpl = model_template;
            t.description = "model";
            return t;
        }
        t.tmpl = "chatml";
        t.description = "chatml (default: llama.cpp does not support the model's template)";
        return t;
    }
    t.tmpl = "chatml";
    t.description = "chatml (default: the model carries no template)";
    return t;
}

bool format_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages,
                 std::string * out, std::string * error) {
    std::vector<llama_chat_message> chat;
    size_t total = 0;
    for (const auto & m : messages) {
        chat.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::vector<char> buf(2 * total + 256);
    int32_t n = llama_chat_apply_template(t.tmpl.c_str(), chat.data(), chat.size(), true,
                                          buf.data(), int32_t(buf.size()));
    if (n > int32_t(buf.size())) {
        buf.resize(size_t(n));
        n = llama_chat_apply_template(t.tmpl.c_str(), chat.data(), chat.size(), true, buf.data(),
                                      int32_t(buf.size()));
    }
    if (n < 0) {
        *error = "llama.cpp could not apply the chat template (" + t.description + ")";
        return false;
    }
    out->assign(buf.data(), size_t(n));
    return true;
}

std::string Utf8Stream::push(const std::string & piece) {
    pending_ += piece;
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        int n = utf8_seq(pending_, i);
        if (n < 0) break;  // unfinished: keep for the next piece
        if (n == 0) {
            out += kReplacement;
            i += 1;
        } else {
            out.append(pending_, i, size_t(n));
            i += size_t(n);
        }
    }
    pending_.erase(0, i);
    return out;
}

std::string Utf8Stream::finish() {
    std::string out;
    if (!pending_.empty()) out = kReplacement;
    pending_.clear();
    return out;
}

std::string sanitize_utf8(const std::string & bytes) {
    Utf8Stream s;
    std::string out = s.push(bytes);
    return out + s.finish();
}

}  // namespace moestream::server
