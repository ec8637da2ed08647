// job.h — one generation request of `moestream serve` (server.h) as the HTTP thread that owns
// its connection and the worker that runs it share it (Job), and where a /v1/responses
// stream is (ResponsesStream).
// Invariants: a Job's fields below its mutex change only under it; `done` is set once, last.
// Thread-safety: Job::m guards the fields declared after it; `cancelled` is atomic; the
// fields above the mutex are written before the job is queued and only read after.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "api.h"
#include "chat_request.h"
#include "server_util.h"

namespace moestream::server {

// One generation request, shared by the HTTP thread that owns the connection and the worker.
struct Job {
    uint64_t id = 0;
    GenParams params;
    ChatPlan plan;  // chat: how the reply is split (chat_request.h)
    int64_t created = 0;  // unix seconds (the OpenAI "created" field)
    std::atomic<bool> cancelled{false};

    std::mutex m;  // guards everything below
    std::condition_variable cv;
    std::string unsent;  // streamed text (valid UTF-8) not yet written to the client
    std::string unsent_reasoning;  // the same for reasoning_content
    std::string reasoning;         // the whole reasoning_content
    std::vector<chat::ToolCall> calls;   // parsed tool calls; calls_sent of them streamed
    size_t calls_sent = 0;
    bool done = false;
    Status status;     // when done
    std::string text;  // the whole completion (valid UTF-8)
    std::vector<int32_t> tokens;
    std::string finish_reason;
    std::string stop_string;  // finish "stop" on a stop string: which
    std::vector<TokenLogprob> logprobs;         // params.logprobs >= 0: every token's
    std::vector<TokenLogprob> unsent_logprobs;  // streamed: not yet written
    size_t logprobs_offset = 0;  // streamed completions: text_offset of the next token
    json moestream;  // settings, lossy, per-request stats
    // A slot action (POST /slots/{id}) instead of a generation: run on the worker, which
    // owns the engine and passes it; it fills `moestream` with the response.
    std::function<Status(Engine &, json *)> action;
    int n_prompt = 0, n_generated = 0;
    bool llama_shape = false;  // llama-server's /completion reply shape (set before it runs)
    int n_probs = 0;           // /completion's n_probs (0: no completion_probabilities)
    json timings;              // llama-server's timings of the request (when done)
    bool responses = false;    // /v1/responses: a Response object and its events
};

// Where a /v1/responses stream is (responses.h): the items opened so far and their text.
struct ResponsesStream {
    int seq = 0;  // sequence_number of the next event
    bool created = false;
    int next_index = 0;  // output_index of the next item
    int reasoning_index = -1, message_index = -1;
    bool reasoning_closed = false;
    std::string text, reasoning;
};

}  // namespace moestream::server
