// server_sse.cpp — ReplyWriter (server_sse.h): the JSON bodies of finished jobs and the SSE
// streams of running ones, in each endpoint's shape.
#include "server_sse.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "chat_jinja.h"
#include "chat_request.h"
#include "moestream/log.h"
#include "moestream/sysinfo.h"
#include "llama_completion.h"
#include "logprobs_json.h"
#include "time_json.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`

json ReplyWriter::chunk_json(const Job & job, const json & delta_or_text,
                             const json & finish) const {
    if (job.llama_shape) return json{{"content", delta_or_text}, {"stop", false}};
    json c;
    c["index"] = 0;
    if (job.params.chat)
        c["delta"] = delta_or_text;
    else
        c["text"] = delta_or_text, c["logprobs"] = nullptr;
    c["finish_reason"] = finish;
    return json{{"id", job_name(job)},
                {"object", job.params.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", job.created},
                {"model", model_name_},
                {"choices", json::array({c})}};
}

std::string ReplyWriter::job_name(const Job & job) const {
    return (job.params.chat ? "chatcmpl-" : "cmpl-") + std::to_string(job.id);
}

bool ReplyWriter::stream_step(Job & job, httplib::DataSink & sink, bool * sent_role) const {
    auto fail = [&] {
        job.cancelled = true;
        return false;
    };
    if (!*sent_role) {
        *sent_role = true;
        json first = job.params.chat ? json{{"role", "assistant"}, {"content", ""}} : json("");
        return write_str(sink, sse(chunk_json(job, first, nullptr))) ? true : fail();
    }
    std::unique_lock<std::mutex> lk(job.m);
    job.cv.wait_for(lk, std::chrono::milliseconds(500), [&] {
        return !job.unsent.empty() || !job.unsent_reasoning.empty() ||
               !job.unsent_logprobs.empty() || job.calls_sent < job.calls.size() ||
               job.done;
    });
    if (!job.unsent.empty() || !job.unsent_reasoning.empty() ||
        !job.unsent_logprobs.empty() || job.calls_sent < job.calls.size()) {
        std::string out;
        if (!job.unsent_reasoning.empty())
            out += sse(chunk_json(job, json{{"reasoning_content", job.unsent_reasoning}}, nullptr));
        if (!job.unsent.empty() || !job.unsent_logprobs.empty()) {
            json chunk = chunk_json(job, job.params.chat ? json{{"content", job.unsent}}
                                                         : json(job.unsent),
                                    nullptr);
            if (job.params.logprobs >= 0 && job.llama_shape)
                chunk["completion_probabilities"] = llama_probs_json(job.unsent_logprobs);
            else if (job.params.logprobs >= 0)
                chunk["choices"][0]["logprobs"] =
                    job.params.chat ? chat_logprobs_json(job.unsent_logprobs)
                                    : completion_logprobs_json(job.unsent_logprobs,
                                                               &job.logprobs_offset);
            out += sse(chunk);
        }
        for (; job.calls_sent < job.calls.size(); ++job.calls_sent)
            out += sse(chunk_json(
                job,
                json{{"tool_calls",
                      json::array({tool_call_delta(job.calls[job.calls_sent], job.calls_sent)})}},
                nullptr));
        job.unsent.clear();
        job.unsent_reasoning.clear();
        job.unsent_logprobs.clear();
        lk.unlock();
        return write_str(sink, out) ? true : fail();
    }
    if (job.done) {
        std::string out;
        if (job.status.ok()) {
            json last =
                chunk_json(job, job.params.chat ? json::object() : json(""), job.finish_reason);
            last["usage"] = usage_json(job);
            last["moestream"] = job.moestream;
            if (job.llama_shape) last = llama_final_json(job, false);
            out = sse(last);
        } else {
            out = sse(error_json(job_error(job)));
        }
        lk.unlock();
        if (!job.llama_shape) out += "data: [DONE]\n\n";  // llama-server's /completion ends with stop: true
        if (!write_str(sink, out)) return fail();
        sink.done();
        return true;
    }
    lk.unlock();
    return write_str(sink, ": waiting\n\n") ? true : fail();
}

bool ReplyWriter::write_str(httplib::DataSink & sink, const std::string & s) {
    return sink.is_writable() && sink.write(s.data(), s.size());
}

json ReplyWriter::usage_json(const Job & job) {
    return json{{"prompt_tokens", job.n_prompt},
                {"completion_tokens", job.n_generated},
                {"total_tokens", job.n_prompt + job.n_generated}};
}

json ReplyWriter::final_json(const Job & job) const {
    json c;
    c["index"] = 0;
    if (job.params.chat)
        c["message"] = reply_message(job.text, job.reasoning, job.calls);
    else
        c["text"] = job.text, c["logprobs"] = nullptr;
    c["finish_reason"] = job.finish_reason;
    if (job.params.chat) c["logprobs"] = nullptr;
    size_t offset = 0;
    if (job.params.logprobs >= 0)
        c["logprobs"] = job.params.chat ? chat_logprobs_json(job.logprobs)
                                        : completion_logprobs_json(job.logprobs, &offset);
    return json{{"id", job_name(job)},
                {"object", job.params.chat ? "chat.completion" : "text_completion"},
                {"created", job.created},
                {"model", model_name_},
                {"choices", json::array({c})},
                {"usage", usage_json(job)},
                {"moestream", job.moestream}};
}

ResponseState ReplyWriter::response_state(const Job & job, bool done) const {
    ResponseState r;
    r.id = "resp_" + std::to_string(job.id);
    r.created = job.created;
    r.model = model_name_;
    r.status = !done                              ? "in_progress"
               : job.finish_reason == "length"    ? "incomplete"
               : job.finish_reason == "cancelled" ? "cancelled"
                                                  : "completed";
    r.length_cut = done && job.finish_reason == "length";
    if (done) {
        r.text = job.text;
        r.reasoning = job.reasoning;
        r.calls = job.calls;
        r.input_tokens = job.n_prompt;
        r.output_tokens = job.n_generated;
    }
    return r;
}

bool ReplyWriter::responses_stream_step(Job & job, httplib::DataSink & sink,
                                        ResponsesStream * st) const {
    auto fail = [&] {
        job.cancelled = true;
        return false;
    };
    auto ev = [&](const std::string & type, json j) {
        j["type"] = type;
        j["sequence_number"] = st->seq++;
        return "event: " + type + "\ndata: " + dump(j) + "\n\n";
    };
    if (!st->created) {
        st->created = true;
        const json r = response_json(response_state(job, false));
        std::string first = ev("response.created", {{"response", r}});
        first += ev("response.in_progress", {{"response", r}});
        return write_str(sink, first) ? true : fail();
    }
    std::unique_lock<std::mutex> lk(job.m);
    job.cv.wait_for(lk, std::chrono::milliseconds(500), [&] {
        return !job.unsent.empty() || !job.unsent_reasoning.empty() ||
               job.calls_sent < job.calls.size() || job.done;
    });
    ResponseState r = response_state(job, false);
    std::string out;
    auto close_reasoning = [&] {
        if (st->reasoning_index < 0 || st->reasoning_closed) return;
        st->reasoning_closed = true;
        r.reasoning = st->reasoning;
        out += ev("response.reasoning_text.done", {{"item_id", reasoning_item_id(r)},
                                                   {"output_index", st->reasoning_index},
                                                   {"content_index", 0},
                                                   {"text", st->reasoning}});
        out += ev("response.output_item.done",
                  {{"output_index", st->reasoning_index}, {"item", reasoning_item(r)}});
    };
    auto open_message = [&] {
        if (st->message_index >= 0) return;
        st->message_index = st->next_index++;
        out += ev("response.output_item.added",
                  {{"output_index", st->message_index}, {"item", message_item(r, "in_progress")}});
        out += ev("response.content_part.added",
                  {{"item_id", message_item_id(r)},
                   {"output_index", st->message_index},
                   {"content_index", 0},
                   {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    };
    if (!job.unsent_reasoning.empty()) {
        if (st->reasoning_index < 0) {
            st->reasoning_index = st->next_index++;
            json item = reasoning_item(r);
            item["content"] = json::array();
            out += ev("response.output_item.added", {{"output_index", st->reasoning_index}, {"item", item}});
        }
        out += ev("response.reasoning_text.delta", {{"item_id", reasoning_item_id(r)},
                                                    {"output_index", st->reasoning_index},
                                                    {"content_index", 0},
                                                    {"delta", job.unsent_reasoning}});
        st->reasoning += job.unsent_reasoning;
        job.unsent_reasoning.clear();
    }
    if (!job.unsent.empty()) {
        close_reasoning();
        open_message();
        out += ev("response.output_text.delta", {{"item_id", message_item_id(r)},
                                                 {"output_index", st->message_index},
                                                 {"content_index", 0},
                                                 {"delta", job.unsent},
                                                 {"logprobs", json::array()}});
        st->text += job.unsent;
        job.unsent.clear();
    }
    job.unsent_logprobs.clear();
    for (; job.calls_sent < job.calls.size(); ++job.calls_sent) {
        close_reasoning();
        r.calls = job.calls;
        const size_t i = job.calls_sent;
        const int index = st->next_index++;
        json item = call_item(r, i);
        const std::string args = item["arguments"];
        item["arguments"] = "";
        item["status"] = "in_progress";
        out += ev("response.output_item.added", {{"output_index", index}, {"item", item}});
        out += ev("response.function_call_arguments.delta",
                  {{"item_id", call_item_id(r, i)}, {"output_index", index}, {"delta", args}});
        out += ev("response.function_call_arguments.done",
                  {{"item_id", call_item_id(r, i)}, {"output_index", index}, {"arguments", args}});
        out += ev("response.output_item.done", {{"output_index", index}, {"item", call_item(r, i)}});
    }
    if (job.done) {
        if (job.status.ok()) {
            const ResponseState fin = response_state(job, true);
            close_reasoning();
            if (job.calls.empty() || !st->text.empty()) {
                open_message();
                json part{{"type", "output_text"}, {"text", st->text}, {"annotations", json::array()}};
                out += ev("response.output_text.done", {{"item_id", message_item_id(r)},
                                                        {"output_index", st->message_index},
                                                        {"content_index", 0},
                                                        {"text", st->text}});
                out += ev("response.content_part.done", {{"item_id", message_item_id(r)},
                                                         {"output_index", st->message_index},
                                                         {"content_index", 0},
                                                         {"part", part}});
                out += ev("response.output_item.done",
                          {{"output_index", st->message_index},
                           {"item", message_item(fin, fin.status == "completed" ? "completed" : "incomplete")}});
            }
            json final = response_json(fin);
            final["moestream"] = job.moestream;
            out += ev(fin.status == "completed" ? "response.completed" : "response.incomplete",
                      {{"response", final}});
        } else {
            const ApiError e = job_error(job);
            out += ev("error", {{"message", e.message}, {"code", nullptr}, {"param", nullptr}});
        }
        lk.unlock();
        if (!write_str(sink, out)) return fail();
        sink.done();
        return true;
    }
    lk.unlock();
    if (out.empty()) out = ": waiting\n\n";
    return write_str(sink, out) ? true : fail();
}

json ReplyWriter::llama_final_json(const Job & job, bool with_text) const {
    const std::string stop_type = job.finish_reason == "length" ? "limit"
                                  : !job.stop_string.empty()    ? "word"
                                  : job.finish_reason == "stop" ? "eos"
                                                                : job.finish_reason;
    json r{{"content", with_text ? job.text : std::string()},
           {"stop", true},
           {"model", model_name_},
           {"tokens_predicted", job.n_generated},
           {"tokens_evaluated", job.n_prompt},
           {"generation_settings", llama_generation_settings(job.params, job.n_probs)},
           {"stop_type", stop_type},
           {"stopping_word", job.stop_string},
           {"timings", job.timings},
           {"moestream", job.moestream}};
    if (with_text && job.n_probs > 0) r["completion_probabilities"] = llama_probs_json(job.logprobs);
    return r;
}

json ReplyWriter::reply_json(const Job & job) const {
    if (job.responses) {
        json r = response_json(response_state(job, true));
        r["moestream"] = job.moestream;
        return r;
    }
    return job.llama_shape ? llama_final_json(job) : final_json(job);
}

void ReplyWriter::stream(const std::shared_ptr<Job> & job, httplib::Response & res,
                         std::function<void(bool)> done) const {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    if (job->responses) {
        auto rs = std::make_shared<ResponsesStream>();
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, job, rs](size_t, httplib::DataSink & sink) { return responses_stream_step(*job, sink, rs.get()); },
            std::move(done));
        return;
    }
    auto sent_role = std::make_shared<bool>(job->llama_shape);  // llama-server: no role chunk
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, sent_role](size_t, httplib::DataSink & sink) { return stream_step(*job, sink, sent_role.get()); },
        std::move(done));
}

ApiError ReplyWriter::job_error(const Job & job) {
    ApiError e;
    e.status = http_status(job.status);
    e.message = job.status.message();
    e.type = e.status == 400 ? "invalid_request_error" : "server_error";
    return e;
}

}  // namespace moestream::server
