// logprobs_json.cpp — see logprobs_json.h.
#include "logprobs_json.h"

#include "api.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`

using nlohmann::json;

namespace {

json bytes_of(const std::string & s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}

json entry(const TokenProb & t) {
    return json{{"token", sanitize_utf8(t.piece)},
                {"logprob", float_json(t.logprob)},
                {"bytes", bytes_of(t.piece)}};
}

}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprob> & lp) {
    json content = json::array();
    for (const TokenLogprob & l : lp) {
        json e = entry(l.chosen);
        json top = json::array();
        for (const TokenProb & t : l.top) top.push_back(entry(t));
        e["top_logprobs"] = top;
        content.push_back(e);
    }
    return json{{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs_json(const std::vector<TokenLogprob> & lp, size_t * offset) {
    json tokens = json::array(), logprobs = json::array(), tops = json::array(),
         offsets = json::array();
    for (const TokenLogprob & l : lp) {
        tokens.push_back(sanitize_utf8(l.chosen.piece));
        logprobs.push_back(float_json(l.chosen.logprob));
        json top = json::object();
        for (const TokenProb & t : l.top) {
            const std::string k = sanitize_utf8(t.piece);
            if (!top.contains(k)) top[k] = float_json(t.logprob);  // most likely first
        }
        const std::string k = sanitize_utf8(l.chosen.piece);
        if (!top.contains(k)) top[k] = float_json(l.chosen.logprob);
        tops.push_back(top);
        offsets.push_back(*offset);
        *offset += l.chosen.piece.size();
    }
    return json{{"tokens", tokens},
                {"token_logprobs", logprobs},
                {"top_logprobs", tops},
                {"text_offset", offsets}};
}

json llama_probs_json(const std::vector<TokenLogprob> & lp) {
    json out = json::array();
    for (const TokenLogprob & l : lp) {
        json e = entry(l.chosen);
        e["id"] = l.chosen.token;
        json top = json::array();
        for (const TokenProb & t : l.top) {
            json a = entry(t);
            a["id"] = t.token;
            top.push_back(a);
        }
        e["top_logprobs"] = top;
        out.push_back(e);
    }
    return out;
}

}  // namespace moestream::server
