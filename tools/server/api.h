// api.h — the OpenAI-compatible request/response layer of `moestream serve`, independent of
// HTTP and of the engine's thread: parsing and validating request bodies into GenParams
// (every field this server takes does what docs/server.md says; any other field is refused
// by name), keeping streamed text valid UTF-8, and the error body. docs/server.md is the reference for every field.
//
// Invariants: a request that parses is within the documented ranges (the worker never sees an
// out-of-range value); every string that leaves here in JSON is valid UTF-8.
// Thread-safety: pure functions and value types; Utf8Stream is used by one thread at a time.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat_format.h"
#include "moestream/moestream.h"

namespace moestream::server {

// Server-wide defaults for a request's settings (flags of `serve`; docs/server.md).
struct RequestDefaults {
    int max_tokens = -1;       // -n; -1 = until end-of-generation or the context is full
    float temperature = 0.0f;  // --temp
    uint32_t seed = 1;         // --seed
    double drop_cold = 0.0;    // the server's --drop-cold-experts (0.75 unless --lossless)
    // --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
    // --frequency-penalty (llama-server's sampling flags); temp and seed: the fields above.
    SamplingParams sampling;
};

// The tool and reasoning fields of a chat request (api_tools.cpp).
struct ChatExtras {
    std::vector<chat::ChatTurn> turns;  // the messages with their tool fields
    chat::ojson tools = chat::ojson::array();  // as sent
    std::string tool_choice = "auto";  // auto | none | required | function (tool_name)
    std::string tool_name;
    bool parallel_tool_calls = true;
    std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking
    std::string reasoning_effort;         // "" = not given
    chat::ojson messages_json;            // the messages as sent (what the template reads)
    chat::ojson kwargs = chat::ojson::object();  // the other chat_template_kwargs, as sent
    bool uses_tools() const;   // tools offered, or tool calls/results in the messages
    bool forces_call() const;  // tool_choice required or named
};

// How deep a request field may nest arrays and objects (a tool schema nests at most 64
// schemas, each two levels: json_schema_grammar.h); a deeper field is refused with 400.
constexpr int kMaxRequestNesting = 256;

// One validated generation request.
struct GenParams {
    bool chat = false;                  // /v1/chat/completions (messages) vs /v1/completions
    std::vector<ChatMessage> messages;  // chat ("developer" arrives as "system")
    std::string prompt;                 // completions (chat: filled by the chat template)
    std::vector<int32_t> prompt_tokens; // completions: a prompt given as token ids
    bool stream = false;
    int max_tokens = -1;  // -1 = until end-of-generation or the context is full
    SamplingParams sampling;
    std::vector<std::string> stop;
    // "text" | "json_object" | "json_schema" (the last two: sampling.grammar set)
    std::string response_format = "text";
    std::string format_param;  // the field that set that grammar ("response_format", ...)
    int logprobs = -1;  // -1 = off; N: each token's log probability and its N alternatives
    double drop_cold = 0.0;      // 0 = off
    bool cache_prompt = true;    // reuse the KV prefix of the previous request
    bool return_tokens = false;  // add the token ids to the moestream object
    std::string model;           // as sent (any name is accepted; /v1/models lists one)
    ChatExtras extras;           // chat: tools and reasoning
};

// A request error: the HTTP status and the OpenAI-style error body.
struct ApiError {
    int status = 400;
    std::string message;
    std::string param;  // the offending field, "" if none
    std::string type = "invalid_request_error";
    std::string code;   // the OpenAI error code ("invalid_api_key", "model_not_found"), "" = null
};

// Parses a body for /v1/chat/completions (chat = true) or /v1/completions. Returns the error
// for malformed JSON, wrong field types, out-of-range values and unsupported features.
std::optional<ApiError> parse_request(const std::string & body, bool chat,
                                      const RequestDefaults & defaults, GenParams * out);

// The most alternatives per token that logprobs / top_logprobs may ask for.
constexpr int kMaxTopLogprobs = 20;

// A float as the shortest decimal that reads back as the same float (0.7f is 0.7, not
// 0.699999988079071 as its double would print); null when not finite.
nlohmann::json float_json(float f);

// The tool and reasoning fields of a chat body that parse_request accepted (api_tools.cpp).
std::optional<ApiError> parse_chat_extras(const std::string & body, ChatExtras * out);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_json(const ApiError & e);
// A 400 invalid_request_error naming `param`.
ApiError bad_request(const std::string & param, const std::string & message);

// Turns a stream of token pieces (arbitrary bytes: a piece may end inside a UTF-8 sequence)
// into valid UTF-8: complete sequences pass through, an unfinished trailing sequence is held
// back until the next piece, invalid bytes become U+FFFD.
class Utf8Stream {
public:
    // Appends a piece; returns the text that is complete now.
    std::string push(const std::string & piece);
    // Ends the stream: a held-back unfinished sequence becomes U+FFFD.
    std::string finish();

private:
    std::string pending_;
};

// The whole-string form: valid UTF-8 for any bytes (what Utf8Stream yields over one piece).
std::string sanitize_utf8(const std::string & bytes);

}  // namespace moestream::server
