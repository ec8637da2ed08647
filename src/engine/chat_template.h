// chat_template.h — chat messages -> prompt text with the model's chat template, through
// llama.cpp's template recogniser (llama_chat_apply_template: a fixed set of template
// families, no Jinja). Which family is used is named, so every response can say it.
//
// Invariants: a model template llama.cpp does not recognise is never replaced by another
// family: ChatTemplate::usable is false and render_chat refuses. Only a model without any
// template falls back to chatml, and its name says so.
// Thread-safety: pure functions over immutable strings.
#pragma once

#include <string>
#include <vector>

#include "moestream/moestream.h"

namespace moestream {

struct ChatTemplate {
    bool usable = false;
    std::string tmpl;  // what llama_chat_apply_template receives (a template text or a name)
    std::string name;  // "chatml", "llama3", ... with how it was chosen; see chat_template_name
    std::string why;   // when !usable: why not
};

// model_tmpl: the GGUF tokenizer.chat_template (null or "" when the model carries none).
ChatTemplate choose_chat_template(const char * model_tmpl);

// Renders messages (roles as given; no NUL bytes) and, with add_assistant, the assistant
// turn's opener. kBadInput naming the message for a NUL byte; kBadInput when the template is
// not usable or llama.cpp refuses.
Status render_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages,
                   bool add_assistant, std::string * out);

}  // namespace moestream
