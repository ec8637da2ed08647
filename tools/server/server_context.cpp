// server_context.cpp — ServerContext (server_context.h): the chat template read at start, and
// the queue's admission and cancellation as the handlers use them.
#include "server_context.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "chat_jinja.h"
#include "chat_request.h"

namespace moestream::server {

ServerContext::ServerContext(const ServeConfig & cfg, const Engine & engine)
    : cfg_(cfg),
      engine_(engine),
      model_name_(cfg.alias.empty() ? basename_of(cfg.run.model_path) : cfg.alias) {
    std::string bos, eos, err;
    bool bos_added = false;
    engine_.special_texts(&bos, &eos, &bos_added);
    const std::string src = cfg.chat_template.empty() ? engine_.chat_template() : cfg.chat_template;
    if (chat::load_chat_format(src, bos, eos, bos_added, &fmt_, &err)) {
        tmpl_ = fmt_.name;
        renderer_ = fmt_.jinja ? fmt_.jinja->renderer() : std::string();
        if (!cfg.chat_template_from.empty()) tmpl_ += " from " + cfg.chat_template_from;
    } else {
        tmpl_error_ =
            "the chat template (" +
            (cfg.chat_template_from.empty() ? std::string("the model's") : cfg.chat_template_from) +
            ") cannot be rendered (" + err + ")" +
            "; give a template that renders with --chat-template-file";
    }
    drop_cold_block_ = engine_.drop_cold_block();
}

bool ServerContext::enqueue(const std::shared_ptr<Job> & job) {
    if (jobs_.push(job)) return true;
    metrics_.count_rejected();
    return false;
}

int ServerContext::retry_after_s() const {
    const double s =
        std::ceil(std::max(1.0, metrics_.avg_request_s()) * double(jobs_.waiting() + 1));
    return int(std::min(60.0, s));
}

void ServerContext::client_left(const std::shared_ptr<Job> & job) {
    if (!jobs_.leave(job)) return;  // running (it stops at its next token) or done
    metrics_.count_cancelled();
    {
        std::lock_guard<std::mutex> lk(job->m);
        job->status = Status::Runtime("cancelled: the client left");
        job->done = true;
    }
    job->cv.notify_all();
}

void ServerContext::stream_reply(const std::shared_ptr<Job> & job, httplib::Response & res) {
    open_streams_++;
    replies_.stream(job, res, [this, job](bool success) {
        if (!success) client_left(job);
        open_streams_--;
    });
}

GenerateRequest engine_request(const GenParams & p) {
    GenerateRequest r;
    r.prompt = p.prompt;
    r.n_predict = p.max_tokens;
    r.clamp_to_context = true;  // like llama-server: stop when the context is full
    r.sampling = p.sampling;
    r.stop = p.stop;
    r.reuse_prefix = p.cache_prompt;
    r.logprobs = p.logprobs;
    return r;
}

}  // namespace moestream::server
