// chat_request.h — a chat request through the model's chat format (chat_format.h): checks the
// tool and reasoning fields against what the template can do, renders the prompt, and sets the
// grammar that enforces tool_choice "required" or a named function. docs/server.md, "Tools and
// reasoning".
#pragma once

#include <optional>
#include <string>

#include "api.h"
#include "chat_format.h"

namespace moestream::server {

// What the worker does with a chat reply.
struct ChatPlan {
    bool parse = false;     // split the reply with a ReplyParser
    bool tools = false;     // ... looking for tool calls
    bool thinking = false;  // ... starting in the thinking block
    bool stop_after_call = false;  // end the generation once the first call is complete
    std::string shown;      // the rendered prompt as /apply-template shows it (with the
                            // start token's text, which the engine adds as a token instead)
};

// f: the model's chat format (kNone: the template is llama.cpp's business, and tools,
// enable_thinking and reasoning_effort are refused naming tmpl_name). Fills p->prompt when
// the format renders it, and p->sampling.grammar when a call is forced.
// render_only (/apply-template): the prompt is all that is asked, so tools are rendered for
// a template whose calls moestream does not parse (a generation refuses them).
std::optional<ApiError> plan_chat(const chat::ChatFormat & f, const std::string & tmpl_name,
                                  GenParams * p, ChatPlan * plan, bool render_only = false);

// The message of a chat response from a parsed reply (content null when it is only calls).
nlohmann::json reply_message(const std::string & content, const std::string & reasoning,
                             const std::vector<chat::ToolCall> & calls);
// One tool call as a streamed delta entry ({"index", "id", "type", "function"}).
nlohmann::json tool_call_delta(const chat::ToolCall & c, size_t index);

}  // namespace moestream::server
