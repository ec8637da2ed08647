// chat_format_harmony.cpp — the reply syntax of the gpt-oss harmony family
// (chat_format_families.h): messages as <|start|>ROLE<|message|>TEXT<|end|>, the assistant in
// channels (analysis = reasoning, final = the answer, commentary = preambles and tool calls
// `to=functions.NAME <|constrain|>json`): the grammar rules of a forced call and the reply
// parser (ReplyParser). The prompt is the model's template's (chat_jinja.h).
#include "chat_format_families.h"

namespace moestream::chat {
namespace harmony {
std::string call_rule(const std::string & name, const std::string & args) {
    return gbnf::literal("<|channel|>commentary to=functions." + name +
                         " <|constrain|>json<|message|>") +
           " " + args;
}

std::string think_rule() {
    return gbnf::literal("<|channel|>analysis<|message|>") + " ( [^<] | \"<\" [^|] )* " +
           gbnf::literal("<|end|><|start|>assistant");
}

}  // namespace harmony

// The reply after "<|start|>assistant": messages of headers (`<|channel|>NAME`, `to=R`,
// `<|constrain|>json`) and bodies, ended by <|end|>, <|return|>, <|call|> or the next
// <|start|> (a model whose end tokens are not printed gives only the latter). The analysis
// channel -> reasoning; a body addressed to functions.NAME -> a tool call; other text ->
// content. A reply that does not start with a header is content.
ReplyDelta ReplyParser::harmony_step(bool final) {
    static const char * const kEnds[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
    static const char * const kHeads[] = {"<|channel|>", "<|constrain|>", " to=", "to="};
    ReplyDelta d;
    for (;;) {
        if (!h_body_) {
            if (h_first_) {  // the reply's start: a header, or plain text
                bool head = false, maybe = false;
                for (const char * h : kHeads) {
                    const std::string hs = h;
                    head = head || buf_.compare(0, hs.size(), hs) == 0;
                    maybe = maybe || (buf_.size() < hs.size() && hs.compare(0, buf_.size(), buf_) == 0);
                }
                if (!head && maybe && !final) return d;
                h_first_ = false;
                if (!head) {  // plain text: the answer
                    h_body_ = true;
                    h_channel_ = "final";
                    h_recipient_.clear();
                    continue;
                }
            }
            // A message after the first opens with <|start|> (the role follows in the header).
            while (!h_first_ && buf_.compare(0, 9, "<|start|>") == 0) buf_.erase(0, 9);
            if (!h_first_ && !final && buf_.size() < 9 &&
                std::string("<|start|>").compare(0, buf_.size(), buf_) == 0)
                return d;
            const size_t e = buf_.find("<|message|>");
            if (e == std::string::npos) {
                if (final) {  // an unfinished header: as generated
                    add_text(&d.content, &content_started_, &held_content_, buf_);
                    buf_.clear();
                }
                return d;
            }
            h_header_ = buf_.substr(0, e);
            buf_.erase(0, e + 11);
            h_channel_.clear();
            h_recipient_.clear();
            auto word_after = [&](const std::string & key) {
                const size_t p = h_header_.find(key);
                if (p == std::string::npos) return std::string();
                const size_t b = p + key.size();
                const size_t q = h_header_.find_first_of(" <", b);
                return h_header_.substr(b, q == std::string::npos ? std::string::npos : q - b);
            };
            h_channel_ = word_after("<|channel|>");
            h_recipient_ = word_after("to=");
            h_body_ = true;
            h_call_.clear();
            held_content_.clear();
            held_reasoning_.clear();
            continue;
        }
        size_t e = std::string::npos, elen = 0;
        bool start_next = false;
        for (const char * t : kEnds) {
            const size_t p = buf_.find(t);
            if (p < e) e = p, elen = std::string(t).size(), start_next = std::string(t) == "<|start|>";
        }
        const bool call = h_recipient_.rfind("functions.", 0) == 0;
        size_t take = e;
        if (e == std::string::npos) {
            take = buf_.size();
            if (!final) {  // hold what could be the start of an end marker
                const size_t lt = buf_.rfind("<|");
                const size_t l1 = !buf_.empty() && buf_.back() == '<' ? buf_.size() - 1 : buf_.size();
                take = lt != std::string::npos && buf_.find("|>", lt) == std::string::npos ? lt : l1;
            }
        }
        const std::string text = buf_.substr(0, take);
        buf_.erase(0, take);
        if (call)
            h_call_ += text;
        else if (h_channel_ == "analysis")
            add_text(&d.reasoning, &reasoning_started_, &held_reasoning_, text);
        else
            add_text(&d.content, &content_started_, &held_content_, text);
        if (e == std::string::npos && !final) return d;
        // The message ended (or the reply did).
        if (call) {
            const ojson args = ojson::parse(h_call_, nullptr, false);
            if (tools_ && args.is_object()) {
                ToolCall c;
                c.id = "call_" + std::to_string(n_calls_++);
                c.name = h_recipient_.substr(10);
                c.arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
                d.calls.push_back(std::move(c));
            } else {  // not a call (or no tools offered): the message as generated
                add_text(&d.content, &content_started_, &held_content_,
                         h_header_ + "<|message|>" + h_call_);
            }
        }
        h_call_.clear();
        held_content_.clear();
        held_reasoning_.clear();
        h_body_ = false;
        if (e == std::string::npos) return d;  // final
        // <|start|> is left for the header (which drops it); <|end|> etc. are dropped here.
        if (!start_next) buf_.erase(0, elen);
    }
}

void ReplyParser::add_text(std::string * dst, bool * started, std::string * held,
                           const std::string & s) {
    std::string t = *held + s;
    held->clear();
    if (!*started) {
        const size_t ws = t.find_first_not_of(" \t\r\n");
        if (ws == std::string::npos) return;
        t.erase(0, ws);
        *started = true;
    }
    size_t end = t.size();
    while (end > 0 && (t[end - 1] == ' ' || t[end - 1] == '\t' || t[end - 1] == '\r' ||
                       t[end - 1] == '\n'))
        --end;
    *held = t.substr(end);
    *dst += t.substr(0, end);
}

}  // namespace moestream::chat
