// server_worker.cpp — Server's worker (server_impl.h): the thread that owns the Engine, runs
// one job at a time from the queue (job_queue.h), and what a finished job reports.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "chat_format.h"
#include "llama_completion.h"
#include "moestream/log.h"
#include "request_report.h"
#include "server_impl.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`

void Server::stop() {
    ctx_.jobs_.stop();
    const double deadline = now_s() + 3.0;
    while (ctx_.open_streams_.load() > 0 && now_s() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    http_.stop();
}

void Server::shutdown() {
    ctx_.jobs_.stop();
    if (worker_.joinable()) worker_.join();
}

void Server::finish(Job & job, Status st) {
    ctx_.jobs_.release(job);
    {
        std::lock_guard<std::mutex> lk(job.m);
        job.status = std::move(st);
        job.done = true;
    }
    job.cv.notify_all();
}

void Server::run_job(Job & job) {
    const GenParams & p = job.params;
    if (job.cancelled) {  // gone while it waited
        ctx_.metrics_.count_cancelled();
        return finish(job, Status::Runtime("cancelled"));
    }
    if (job.action) return finish(job, job.action(*engine_, &job.moestream));
    Status st = ctx_.cfg().run.stream ? engine_->set_drop_cold(p.drop_cold) : Status::Ok();
    if (!st.ok()) {
        ctx_.metrics_.count_error();
        // In the server's words (its flags), not the library's option names.
        if (ctx_.cfg().option_words) st = Status::Error(st.code(), ctx_.cfg().option_words(st.message()));
        return finish(job, st);
    }
    GenerateRequest r = engine_request(p);
    // A client that leaves (or SIGTERM) during a long prompt stops it between micro-batches.
    r.on_prefill = [&job, this](int, int) {
        // Tests only: the prompt stays in prefill while the hold file exists.
        while (!ctx_.cfg().prefill_hold.empty() && !job.cancelled &&
               ::access(ctx_.cfg().prefill_hold.c_str(), F_OK) == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return !job.cancelled;
    };
    int n_prompt = 0;  // for /stats while the prompt is processed (checked before queueing)
    if (!engine_->check_request(r, &n_prompt).ok()) n_prompt = 0;
    ctx_.metrics_.begin_job(job.id, n_prompt);
    Utf8Stream utf8;
    std::unique_ptr<ReplyParser> parser;
    if (job.plan.parse)
        parser = std::make_unique<ReplyParser>(ctx_.chat_format(), job.plan.tools, job.plan.thinking);
    GenerateResult g;
    size_t logprobs_taken = 0;  // of g.logprobs, passed on to the job
    // Text -> the job: through the reply parser when the chat format splits replies; the
    // new tokens' log probabilities go with it.
    auto deliver = [&](const std::string & t, bool last) {
        ReplyDelta d;
        if (parser) {
            d = parser->push(t);
            if (last) {
                ReplyDelta e = parser->finish();
                d.content += e.content;
                d.reasoning += e.reasoning;
                for (auto & c : e.calls) d.calls.push_back(std::move(c));
            }
        } else {
            d.content = t;
        }
        if (d.empty() && g.logprobs.size() == logprobs_taken) return;
        {
            std::lock_guard<std::mutex> lk(job.m);
            while (logprobs_taken < g.logprobs.size())
                job.unsent_logprobs.push_back(g.logprobs[logprobs_taken++]);
            job.unsent += d.content;
            job.text += d.content;
            job.unsent_reasoning += d.reasoning;
            job.reasoning += d.reasoning;
            for (ToolCall & c : d.calls) {
                c.id = next_call_id();
                job.calls.push_back(std::move(c));
            }
        }
        job.cv.notify_all();
    };
    const double t0 = now_s();
    st = engine_->generate(
        r,
        [&](const std::string & piece) {
            if (ctx_.cfg().token_delay_ms > 0)
                std::this_thread::sleep_for(std::chrono::milliseconds(ctx_.cfg().token_delay_ms));
            deliver(utf8.push(piece), false);
            ctx_.metrics_.publish_live(engine_->stats());
            // A reply that may hold one call ends with it (ChatPlan::stop_after_call).
            if (job.plan.stop_after_call && !job.calls.empty()) return false;
            return !job.cancelled.load();
        },
        &g);
    const double dt = now_s() - t0;
    deliver(utf8.finish(), true);
    const RunStats & s = engine_->stats();
    const bool cancelled = job.cancelled.load();
    {
        std::lock_guard<std::mutex> lk(job.m);
        job.tokens = g.tokens;
        job.logprobs = g.logprobs;
        job.n_prompt = s.n_prompt;
        job.n_generated = s.n_generated;
        job.finish_reason = cancelled                           ? "cancelled"
                            : g.finish == FinishReason::kLength ? "length"
                            : !job.calls.empty()                ? "tool_calls"
                                                                : "stop";
        job.stop_string = g.stop_string;
        job.moestream = request_report(ctx_, job, g, s,
                                       json::parse(engine_->settings_json(), nullptr, false),
                                       cancelled);
        job.timings = llama_timings(s);
        if (!cancelled && g.finish == FinishReason::kCancelled && !job.calls.empty())
            job.moestream["stats"]["finish"] = "tool_call";  // ended after its call
    }
    ctx_.metrics_.publish_live(s);
    publish_after_job(dt, st.ok() && !cancelled);
    // The worker is free before /stats says so: a client that sees "generating": false and
    // sends a request is never refused as busy by a job that has ended.
    ctx_.jobs_.release(job);
    ctx_.metrics_.end_job(!st.ok(), cancelled);
    if (cancelled)
        MS_LOG_INFO("request %llu cancelled after %d tokens (client gone)",
                    (unsigned long long)job.id, s.n_generated);
    finish(job, st);
}

void Server::publish_after_job(double dt, bool ok) {
    ctx_.metrics_.publish_after_job(engine_->stats(),
                                    json::parse(engine_->settings_json(), nullptr, false),
                                    engine_->lossy(), dt, ok);
}

std::string Server::next_call_id() {
    static const char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    uint64_t n = uint64_t(ctx_.started_unix()) * 1000 + ++calls_made_;
    std::string id(9, '0');
    for (int i = 8; i >= 0 && n; --i, n /= 36) id[size_t(i)] = kDigits[n % 36];
    return id;
}

}  // namespace moestream::server
