// server_sse.h — the replies of `moestream serve` (server.h): the JSON body of a finished job
// and the SSE stream of a running one, in the shape of the endpoint it came from (chat and
// completions: OpenAI's; /completion: llama-server's; /v1/responses: a Response and its
// events). It reads jobs (job.h) and writes to cpp-httplib's responses; it never touches the
// engine or the queue.
// Invariants: the shape is chosen in one place per form (reply_json, stream); a stream writes
// only text the worker has published into the job under its mutex, ends with the final chunk
// and [DONE] once the job is done, and cancels the job when a write fails (client gone).
// Thread-safety: const after construction; the stream functions run on cpp-httplib's threads
// and lock the Job they read (Job::m).
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <string>

#include "job.h"
#include "responses.h"
#include "server_util.h"

namespace moestream::server {

class ReplyWriter {
public:
    explicit ReplyWriter(std::string model_name) : model_name_(std::move(model_name)) {}

    // The body of a finished job, in its endpoint's shape.
    json reply_json(const Job & job) const;

    // Sets `res` up as the SSE stream of `job` (its endpoint's events); done(success) runs
    // when the stream ends (success false: the client left or a write failed).
    void stream(const std::shared_ptr<Job> & job, httplib::Response & res,
                std::function<void(bool)> done) const;

    // A failed job's error: 400 invalid_request_error for bad input, else 500 server_error.
    static ApiError job_error(const Job & job);

private:
    json chunk_json(const Job & job, const json & delta_or_text, const json & finish) const;
    std::string job_name(const Job & job) const;
    static std::string sse(const json & j) { return "data: " + dump(j) + "\n\n"; }

    // One call of the chunked content provider: writes what is ready, or a keep-alive comment
    // after 0.5 s (so a vanished client is noticed while it waits in the queue).
    bool stream_step(Job & job, httplib::DataSink & sink, bool * sent_role) const;
    static bool write_str(httplib::DataSink & sink, const std::string & s);

    static json usage_json(const Job & job);

    json final_json(const Job & job) const;

    // The Response of a /v1/responses job (done: its final status; else in progress).
    ResponseState response_state(const Job & job, bool done) const;

    // One call of the chunked content provider of a /v1/responses stream: the Responses
    // API's events (response.created, output items opened, text deltas, items done,
    // response.completed), as stream_step writes chat chunks.
    bool responses_stream_step(Job & job, httplib::DataSink & sink, ResponsesStream * st) const;

    // llama-server's /completion reply (with_text: the whole content; streamed, the last event
    // carries none).
    json llama_final_json(const Job & job, bool with_text = true) const;

    const std::string model_name_;  // the model's name in the API (--alias or the file's)
};

}  // namespace moestream::server
