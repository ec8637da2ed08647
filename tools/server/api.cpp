// api.cpp — request parsing/validation, chat formatting and UTF-8 assembly for
// `moestream serve` (see api.h; field reference in docs/server.md).
#include "api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "json_schema_grammar.h"
#include "moestream/utf8.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`
namespace {

using nlohmann::json;

ApiError bad(const std::string & param, const std::string & message) {
    return bad_request(param, message);
}

// The deepest nesting of arrays and objects in v (v itself at 1), counted without recursion:
// copying or printing a value nested a hundred thousand levels deep overflows the stack
// (nlohmann's parser and destructor do not recurse, its copy and dump do).
int nesting_depth(const json & v) {
    int deepest = 0;
    std::vector<std::pair<const json *, int>> todo{{&v, 1}};
    while (!todo.empty()) {
        const auto [x, d] = todo.back();
        todo.pop_back();
        if (!x->is_structured()) continue;
        deepest = std::max(deepest, d);
        for (const auto & c : *x) todo.push_back({&c, d + 1});
    }
    return deepest;
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

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

namespace {

// Every field a request may carry. Anything else is refused by name: a client must never
// believe a setting took effect when it did not.
const char * const kCommonFields[] = {
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n_predict",
    "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n",
    "presence_penalty", "frequency_penalty", "logit_bias", "seed", "stop", "grammar",
    "ignore_eos", "n", "drop_cold_experts", "cache_prompt", "return_tokens", "user",
    "response_format", "json_schema", "logprobs", "store", "metadata", "service_tier"};
const char * const kChatFields[] = {"messages", "top_logprobs", "tools", "tool_choice",
                                    "parallel_tool_calls", "functions", "function_call",
                                    "chat_template_kwargs", "reasoning_effort"};
const char * const kCompletionFields[] = {"prompt", "echo", "suffix", "best_of"};

bool listed(const std::string & key, bool chat) {
    for (const char * k : kCommonFields)
        if (key == k) return true;
    if (chat) {
        for (const char * k : kChatFields)
            if (key == k) return true;
    } else {
        for (const char * k : kCompletionFields)
            if (key == k) return true;
    }
    return false;
}

bool present(const json & j, const char * key) {
    auto it = j.find(key);
    return it != j.end() && !it->is_null();
}

ApiError unsupported(const std::string & key, const std::string & what) {
    return bad(key, "'" + key + "' is not supported by this server: " + what +
                        " (docs/server.md lists what is)");
}

// Float fields into SamplingParams, with the API's ranges (the engine checks them again).
std::optional<ApiError> get_float(const json & j, const char * key, double lo, double hi,
                                  float * v) {
    double x = *v;
    if (auto e = get_number(j, key, lo, hi, &x)) return e;
    *v = float(x);
    return std::nullopt;
}

std::optional<ApiError> parse_messages(const json & j, std::vector<ChatMessage> * out) {
    auto it = j.find("messages");
    if (it == j.end() || !it->is_array() || it->empty())
        return bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < it->size(); ++i) {
        const json & m = (*it)[i];
        const std::string pm = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return bad(pm, "'" + pm + "' must be an object");
        for (auto f = m.begin(); f != m.end(); ++f) {
            const std::string k = f.key();
            if (k == "function_call")
                return unsupported(pm + "." + k, "the legacy function call (use tool_calls)");
            if (k != "role" && k != "content" && k != "name" && k != "tool_calls" &&
                k != "tool_call_id" && k != "reasoning_content")
                return bad(pm + "." + k, "'" + pm + "." + k + "' is not a field of a message");
        }
        // `name` goes to the template as sent (ChatExtras::messages_json): a template that
        // prints it shows it, any other leaves it out, as llama-server --jinja does.
        if (present(m, "name") && !m["name"].is_string())
            return bad(pm + ".name", "'" + pm + ".name' must be a string");
        if (!m.contains("role") || !m["role"].is_string())
            return bad(pm + ".role", "'" + pm + ".role' must be a string");
        ChatMessage msg;
        msg.role = m["role"].get<std::string>();
        if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for it
        if (msg.role == "function")
            return unsupported(pm + ".role", "the legacy 'function' role (use 'tool')");
        if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
            msg.role != "tool")
            return bad(pm + ".role",
                       "'" + pm + ".role' must be system, developer, user, assistant or tool");
        const bool calls = msg.role == "assistant" && m.contains("tool_calls");
        if (!m.contains("content") && !calls)
            return bad(pm + ".content", "'" + pm + ".content' is missing");
        if (m.contains("content") && !(m["content"].is_null() && msg.role == "assistant"))
            if (auto e = get_content(m["content"], i, &msg.content)) return e;
        if (msg.content.find('\0') != std::string::npos)
            return bad(pm + ".content", "'" + pm + ".content' contains a NUL character");
        out->push_back(std::move(msg));
    }
    return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json & j, GenParams * p) {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return bad("prompt", "'prompt' is missing");
    const json * one = &*it;
    if (it->is_array() && it->size() == 1 && ((*it)[0].is_string() || (*it)[0].is_array()))
        one = &(*it)[0];  // a batch of one prompt
    if (one->is_string()) {
        p->prompt = one->get<std::string>();
        if (p->prompt.empty()) return bad("prompt", "'prompt' must not be empty");
        return std::nullopt;
    }
    if (one->is_array() && !one->empty()) {
        for (const json & t : *one) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
                return bad("prompt", "'prompt' as tokens must be an array of token ids");
            p->prompt_tokens.push_back(int32_t(t.get<int64_t>()));
        }
        return std::nullopt;
    }
    return bad("prompt",
               "'prompt' must be a string, an array of token ids, or an array of one of "
               "those (one prompt per request)");
}

std::optional<ApiError> parse_stop(const json & j, std::vector<std::string> * out) {
    auto it = j.find("stop");
    if (it == j.end() || it->is_null()) return std::nullopt;
    std::vector<json> items;
    if (it->is_string())
        items.push_back(*it);
    else if (it->is_array())
        items.assign(it->begin(), it->end());
    else
        return bad("stop", "'stop' must be a string or an array of strings");
    for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string() || items[i].get<std::string>().empty())
            return bad("stop", "'stop' entries must be non-empty strings (entry " +
                                   std::to_string(i) + " is not)");
        out->push_back(items[i].get<std::string>());
    }
    return std::nullopt;
}

// {"<token id>": bias, ...} or [[id, bias], ...]; a bias of false bans the token. Ids are
// checked against the vocabulary by the engine.
std::optional<ApiError> parse_logit_bias(const json & j, SamplingParams * sp) {
    auto it = j.find("logit_bias");
    if (it == j.end() || it->is_null()) return std::nullopt;
    auto add = [&](const std::string & what, int64_t id, const json & b) -> std::optional<ApiError> {
        float v;
        if (b.is_boolean() && !b.get<bool>())
            v = -INFINITY;
        else if (b.is_number() && std::isfinite(b.get<double>()) && b.get<double>() >= -100 &&
                 b.get<double>() <= 100)
            v = float(b.get<double>());
        else
            return bad("logit_bias", "'logit_bias' " + what +
                                         ": the bias must be a number in [-100, 100] or false "
                                         "(never produce the token)");
        if (id < 0 || id > INT32_MAX)
            return bad("logit_bias", "'logit_bias' " + what + ": not a token id");
        sp->logit_bias.push_back({int32_t(id), v});
        return std::nullopt;
    };
    if (it->is_object()) {
        for (auto e = it->begin(); e != it->end(); ++e) {
            const std::string & k = e.key();
            char * end = nullptr;
            const long long id = std::strtoll(k.c_str(), &end, 10);
            if (k.empty() || *end != '\0')
                return bad("logit_bias", "'logit_bias' keys must be token ids, got \"" + k +
                                             "\" (text keys are not supported)");
            if (auto err = add("token " + k, id, e.value())) return err;
        }
        return std::nullopt;
    }
    if (it->is_array()) {
        for (const json & e : *it) {
            if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer())
                return bad("logit_bias", "'logit_bias' as an array holds [token id, bias] pairs");
            if (auto err = add("token " + e[0].dump(), e[0].get<int64_t>(), e[1])) return err;
        }
        return std::nullopt;
    }
    return bad("logit_bias", "'logit_bias' must be an object {\"token id\": bias}");
}

// response_format json_object: a JSON object (RFC 8259), with at most one whitespace
// character between tokens so that a model cannot spend its tokens on blank space.
const char kJsonObjectGrammar[] = R"gbnf(
root   ::= "{" ws ( member ( "," ws member )* )? "}" ws
member ::= string ws ":" ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex ) )* "\""
hex    ::= [0-9a-fA-F]
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= ( " " | "\n" )?
)gbnf";

// response_format ({"type": "text" | "json_object" | "json_schema"}, json_object with
// llama-server's "schema") and llama-server's top-level json_schema: a grammar the server
// supplies in p->sampling.grammar. The schema is read again from the body with its key order
// kept (properties are generated in the order the schema gives them).
std::optional<ApiError> parse_structured_output(const std::string & body, const json & j,
                                                GenParams * p) {
    const bool has_rf = present(j, "response_format"), has_js = present(j, "json_schema");
    if (!has_rf && !has_js) return std::nullopt;
    const nlohmann::ordered_json oj = nlohmann::ordered_json::parse(body, nullptr, false);
    const nlohmann::ordered_json * schema = nullptr;
    std::string param, where;  // the field named in errors; the schema's place in the body
    if (has_rf) {
        const json & rf = j["response_format"];
        param = "response_format";
        if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
            return bad(param, "'response_format' must be an object with a 'type'");
        const std::string type = rf["type"].get<std::string>();
        auto only = [&](std::initializer_list<const char *> keys, const json & o,
                        const std::string & at) -> std::optional<ApiError> {
            for (auto it = o.begin(); it != o.end(); ++it)
                if (std::find_if(keys.begin(), keys.end(), [&](const char * k) {
                        return it.key() == k;
                    }) == keys.end())
                    return bad(at + "." + it.key(), "'" + at + "." + it.key() +
                                                        "' is not a field of " + at +
                                                        " with type " + type);
            return std::nullopt;
        };
        if (type == "text") {
            if (auto e = only({"type"}, rf, param)) return e;
        } else if (type == "json_object") {
            if (auto e = only({"type", "schema"}, rf, param)) return e;
            if (rf.contains("schema"))
                schema = &oj["response_format"]["schema"], where = "response_format.schema";
        } else if (type == "json_schema") {
            if (auto e = only({"type", "json_schema"}, rf, param)) return e;
            const std::string at = "response_format.json_schema";
            if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
                return bad(at, "'" + at + "' must be an object {\"name\", \"schema\", \"strict\"}");
            const json & js = rf["json_schema"];
            if (auto e = only({"name", "description", "schema", "strict"}, js, at)) return e;
            for (const char * k : {"name", "description"})
                if (js.contains(k) && !js[k].is_string())
                    return bad(at + "." + k, "'" + at + "." + k + "' must be a string");
            if (js.contains("strict") && !js["strict"].is_boolean())
                return bad(at + ".strict", "'" + at + ".strict' must be true or false");
            if (!js.contains("schema") || js["schema"].is_null())
                return bad(at + ".schema", "'" + at + ".schema' is missing");
            schema = &oj["response_format"]["json_schema"]["schema"];
            where = at + ".schema";
        } else {
            return bad("response_format.type",
                       "'response_format.type' must be text, json_object or json_schema");
        }
        p->response_format = type;
    }
    if (has_js) {
        if (p->response_format != "text")
            return bad("json_schema", "'json_schema' and 'response_format' both constrain the "
                                      "output: give one");
        schema = &oj["json_schema"], param = where = "json_schema";
        p->response_format = "json_schema";
    }
    if (p->response_format == "text") return std::nullopt;
    p->format_param = param;
    if (!p->sampling.grammar.empty())
        return bad(param, "'" + param + "' " + p->response_format +
                              " and 'grammar' both constrain the output: give one");
    if (!schema) {
        p->sampling.grammar = kJsonObjectGrammar;
        return std::nullopt;
    }
    SchemaError err;
    if (!json_schema_to_gbnf(*schema, &p->sampling.grammar, &err))
        return bad(param, "'" + where + "': " + err.message +
                              " (docs/server.md lists the JSON Schema keywords this server takes)");
    return std::nullopt;
}

// chat: logprobs (true/false) and top_logprobs (0..20, with logprobs true); completions:
// logprobs as the number of alternatives (0..20; null or false = off).
std::optional<ApiError> parse_logprobs(const json & j, bool chat, GenParams * p) {
    int64_t n = 0;
    if (chat) {
        bool on = false;
        if (auto e = get_bool(j, "logprobs", &on)) return e;
        if (present(j, "top_logprobs")) {
            if (!on) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            if (auto e = get_int(j, "top_logprobs", 0, kMaxTopLogprobs, &n)) return e;
        }
        if (on) p->logprobs = int(n);
        return std::nullopt;
    }
    auto it = j.find("logprobs");
    if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()))
        return std::nullopt;
    if (it->is_boolean())
        return bad("logprobs", "'logprobs' of completions is the number of alternatives per "
                               "token (0.." + std::to_string(kMaxTopLogprobs) + ")");
    if (auto e = get_int(j, "logprobs", 0, kMaxTopLogprobs, &n)) return e;
    p->logprobs = int(n);
    return std::nullopt;
}

// Fields that are accepted only at their no-op value, refused by name otherwise.
std::optional<ApiError> refuse_unimplemented(const json & j, bool chat) {
    int64_t one = 1;
    if (auto e = get_int(j, "n", 1, 1 << 20, &one)) return e;
    if (one != 1) return unsupported("n", "one choice per request (n = 1)");
    if (chat) {
        for (const char * k : {"functions", "function_call"})
            if (present(j, k)) return unsupported(k, "the legacy functions (use tools)");
    } else {
        bool echo = false;
        if (auto e = get_bool(j, "echo", &echo)) return e;
        if (echo) return unsupported("echo", "the prompt is not repeated in the output");
        if (auto it = j.find("suffix");
            it != j.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
            return unsupported("suffix", "fill-in-the-middle is not implemented");
        int64_t best_of = 1;
        if (auto e = get_int(j, "best_of", 1, 1 << 20, &best_of)) return e;
        if (best_of != 1) return unsupported("best_of", "one candidate per request (best_of = 1)");
    }
    return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_request(const std::string & body, bool chat,
                                      const RequestDefaults & d, GenParams * out) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return bad("", "the request body is not valid JSON");
    if (!j.is_object()) return bad("", "the request body must be a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it)
        if (nesting_depth(*it) > kMaxRequestNesting)
            return bad(it.key(), "'" + it.key() + "' nests arrays and objects deeper than " +
                                     std::to_string(kMaxRequestNesting) + " levels");
    for (auto it = j.begin(); it != j.end(); ++it)
        if (!listed(it.key(), chat))
            return bad(it.key(), "unknown field '" + it.key() + "' for " +
                                     (chat ? "chat completions" : "completions") +
                                     " (docs/server.md lists the fields this server takes)");
    if (auto e = refuse_unimplemented(j, chat)) return e;

    GenParams p;
    p.chat = chat;
    p.max_tokens = d.max_tokens;
    p.sampling = d.sampling;
    p.sampling.temp = d.temperature;
    p.sampling.seed = d.seed;
    p.drop_cold = d.drop_cold;

    if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
        if (!it->is_string()) return bad("model", "'model' must be a string");
        p.model = it->get<std::string>();
    }
    if (auto it = j.find("user"); it != j.end() && !it->is_null() && !it->is_string())
        return bad("user", "'user' must be a string");
    // Accepted without effect (docs/server.md): nothing is stored, there is one service tier.
    if (auto it = j.find("store"); it != j.end() && !it->is_null() && !it->is_boolean())
        return bad("store", "'store' must be true or false");
    if (auto it = j.find("metadata"); it != j.end() && !it->is_null() && !it->is_object())
        return bad("metadata", "'metadata' must be an object");
    if (auto it = j.find("service_tier"); it != j.end() && !it->is_null() && !it->is_string())
        return bad("service_tier", "'service_tier' must be a string");
    if (chat) {
        if (auto e = parse_messages(j, &p.messages)) return e;
        if (auto e = parse_chat_extras(body, &p.extras)) return e;
    } else {
        if (auto e = parse_prompt(j, &p)) return e;
    }

    if (auto e = get_bool(j, "stream", &p.stream)) return e;
    if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
        if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
        for (auto o = it->begin(); o != it->end(); ++o)
            if (o.key() != "include_usage" || !o->is_boolean())
                return bad("stream_options." + o.key(),
                           "'stream_options' takes only include_usage (true or false)");
    }
    // max_completion_tokens, max_tokens and n_predict are one setting: they must agree.
    const char * given = nullptr;
    for (const char * key : {"max_completion_tokens", "max_tokens", "n_predict"}) {
        int64_t v = p.max_tokens;
        const bool is_n_predict = std::string(key) == "n_predict";
        if (auto e = get_int(j, key, is_n_predict ? -1 : 1, INT32_MAX, &v)) return e;
        if (!present(j, key)) continue;
        if (given && v != p.max_tokens)
            return bad(key, std::string("'") + key + "' and '" + given +
                                "' are the same setting and disagree");
        given = key;
        p.max_tokens = int(v);
    }
    SamplingParams & sp = p.sampling;
    if (auto e = get_float(j, "temperature", 0.0, 100.0, &sp.temp)) return e;
    if (auto e = get_float(j, "top_p", 1e-6, 1.0, &sp.top_p)) return e;
    int64_t v = sp.top_k;
    if (auto e = get_int(j, "top_k", 0, 1 << 20, &v)) return e;
    sp.top_k = int(v);
    if (auto e = get_float(j, "min_p", 0.0, 1.0, &sp.min_p)) return e;
    if (auto e = get_float(j, "repeat_penalty", 1e-3, 100.0, &sp.repeat_penalty)) return e;
    v = sp.repeat_last_n;
    if (auto e = get_int(j, "repeat_last_n", -1, INT32_MAX, &v)) return e;
    sp.repeat_last_n = int(v);
    if (auto e = get_float(j, "presence_penalty", -2.0, 2.0, &sp.presence_penalty)) return e;
    if (auto e = get_float(j, "frequency_penalty", -2.0, 2.0, &sp.frequency_penalty)) return e;
    if (auto e = parse_logit_bias(j, &sp)) return e;
    v = sp.seed;
    if (auto e = get_int(j, "seed", 0, std::numeric_limits<uint32_t>::max(), &v)) return e;
    sp.seed = uint32_t(v);
    if (auto it = j.find("grammar"); it != j.end() && !it->is_null()) {
        if (!it->is_string()) return bad("grammar", "'grammar' must be a string (GBNF)");
        sp.grammar = it->get<std::string>();
    }
    if (auto e = parse_structured_output(body, j, &p)) return e;
    if (auto e = parse_logprobs(j, chat, &p)) return e;
    if (auto e = get_bool(j, "ignore_eos", &sp.ignore_eos)) return e;
    if (sp.ignore_eos && !sp.grammar.empty())
        return bad("ignore_eos", "'ignore_eos' cannot be combined with 'grammar': a grammar "
                                 "ends with the end-of-generation token");
    if (auto e = parse_stop(j, &p.stop)) return e;
    double x = p.drop_cold;
    if (auto e = get_number(j, "drop_cold_experts", 0.0, 1.0, &x)) return e;
    p.drop_cold = x;
    if (auto e = get_bool(j, "cache_prompt", &p.cache_prompt)) return e;
    if (auto e = get_bool(j, "return_tokens", &p.return_tokens)) return e;
    *out = std::move(p);
    return std::nullopt;
}

nlohmann::json float_json(float f) {
    if (!std::isfinite(f)) return json(nullptr);
    char buf[32];
    for (int prec = 1; prec <= 9; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, double(f));
        if (std::strtof(buf, nullptr) == f) break;
    }
    return json(std::strtod(buf, nullptr));
}

ApiError bad_request(const std::string & param, const std::string & message) {
    ApiError e;
    e.status = 400;
    e.param = param;
    e.message = message;
    return e;
}

nlohmann::json error_json(const ApiError & e) {
    json err;
    err["message"] = sanitize_utf8(e.message);
    err["type"] = e.type;
    err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
    err["code"] = e.code.empty() ? json(nullptr) : json(e.code);  // OpenAI's shape: a string or null
    return json{{"error", err}};
}

std::string Utf8Stream::push(const std::string & piece) {
    pending_ += piece;
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        int n = utf8_sequence(pending_, i);
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
