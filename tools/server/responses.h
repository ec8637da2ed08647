// responses.h — OpenAI's Responses API (POST /v1/responses) on top of chat completions: a
// request is translated into the chat completions body it means (then validated and generated
// exactly as /v1/chat/completions), and the finished generation is written as a Response
// object; the streaming events are built from the same pieces (docs/server.md, "Responses").
// Supported: `input` as a string or items (messages with string or input_text/output_text
// parts, function_call and function_call_output items), `instructions`, `max_output_tokens`,
// `temperature`, `top_p`, `stream`, function `tools`, `tool_choice`, `parallel_tool_calls`,
// `text.format` (text, json_object, json_schema), `store`/`metadata`/`user`/`service_tier`
// (no effect). Anything else is refused by name (`previous_response_id`: this server keeps no
// responses). Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api.h"

namespace moestream::server {

// The chat completions body of a Responses request; an error names the Responses field.
std::optional<ApiError> responses_to_chat(const std::string & body, std::string * chat_body);

// A chat-completions field named in an error, as the Responses request calls it.
std::string responses_param(const std::string & chat_param);

// What a finished (or running) generation has produced, for the Response object.
struct ResponseState {
    std::string id;  // "resp_N"
    int64_t created = 0;
    std::string model;
    std::string status = "completed";  // in_progress | completed | incomplete | cancelled
    std::string text, reasoning;
    std::vector<chat::ToolCall> calls;
    bool length_cut = false;  // finish_reason length: incomplete_details max_output_tokens
    int input_tokens = 0, output_tokens = 0;
};

// The ids of a response's output items (stable between the stream's events and the final object).
std::string message_item_id(const ResponseState & r);
std::string reasoning_item_id(const ResponseState & r);
std::string call_item_id(const ResponseState & r, size_t i);

// Output items, each as the final object has them.
nlohmann::json message_item(const ResponseState & r, const std::string & status);
nlohmann::json reasoning_item(const ResponseState & r);
nlohmann::json call_item(const ResponseState & r, size_t i);

// The Response object (output: reasoning, message, function calls, those present).
nlohmann::json response_json(const ResponseState & r);

}  // namespace moestream::server
