// job_queue.h — the job queue of `moestream serve` (server.h): admission into a bounded FIFO,
// one job at a time handed to the worker, and cancellation (a client that leaves, /stop,
// shutdown). It knows nothing of HTTP or the engine: the request handlers push jobs from the
// HTTP threads (ServerContext::enqueue) and the Server runs the worker loop (run()) on its
// worker thread with the function that executes one job. Unit-tested without HTTP (tests/unit/test_job_queue.cpp).
//
// T is the job type: it has `uint64_t id` (set here on admission, 1, 2, ...) and
// `std::atomic<bool> cancelled` (set here on cancellation; the running function polls it).
//
// Invariants: a job is waiting, or running, or neither (never admitted, taken out, or
// released) — never two of these; jobs run in the order they were admitted, one at a time;
// an idle queue (nothing waiting, nothing running) admits a job whatever the limit, so a
// limit of 0 still serves one request at a time; once stopping, nothing is admitted and every
// waiting job and the running one are cancelled (the worker still takes the waiting ones,
// cancelled, so each is answered).
// Thread-safety: every method may be called from any thread; one mutex guards the state.
// run() is called by one thread (the worker).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

namespace moestream::server {

template <class T>
class JobQueue {
public:
    // max_waiting: jobs that may wait behind the running one (--queue).
    explicit JobQueue(int max_waiting) : max_waiting_(max_waiting) {}

    // Admits `job` (its id set) unless the queue is stopping or max_waiting jobs already wait
    // behind a running one. False = refused (the caller answers 503).
    bool push(const std::shared_ptr<T> & job) {
        {
            std::lock_guard<std::mutex> lk(m_);
            const bool idle = !running_ && queue_.empty();
            if (stopping_ || (!idle && int(queue_.size()) >= max_waiting_)) return false;
            job->id = ++next_id_;
            queue_.push_back(job);
        }
        cv_.notify_all();
        return true;
    }

    // The worker: the oldest waiting job, now running; waits for one. nullptr once stopping
    // with nothing waiting (the worker then returns).
    std::shared_ptr<T> take() {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return nullptr;
        running_ = queue_.front();
        queue_.pop_front();
        cv_.notify_all();
        return running_;
    }

    // `job` no longer runs (no-op if it is not the running job): from here a pushed job is
    // taken at once. Called by the worker before it reports the job finished, so a client
    // that hears back and sends its next request never finds the queue busy.
    void release(const T & job) {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (running_.get() == &job) running_.reset();
        }
        cv_.notify_all();
    }

    // The worker loop: takes each job, runs fn(job) and releases it, until stop() with
    // nothing waiting. fn may release the job itself earlier (release() is idempotent).
    template <class Fn>
    void run(Fn && fn) {
        while (std::shared_ptr<T> job = take()) {
            fn(*job);
            release(*job);
        }
    }

    // The client of a waiting job left: cancels it and takes it out of the queue. True when
    // it was waiting (the caller finishes it: the worker never sees it); false when it runs
    // or ran (the running function sees `cancelled` and stops).
    bool leave(const std::shared_ptr<T> & job) {
        job->cancelled = true;
        bool removed = false;
        {
            std::lock_guard<std::mutex> lk(m_);
            auto it = std::find(queue_.begin(), queue_.end(), job);
            if (it != queue_.end()) {
                queue_.erase(it);
                removed = true;
            }
        }
        if (removed) cv_.notify_all();
        return removed;
    }

    // Stop (SIGTERM, shutdown): admits nothing more and cancels every waiting job and the
    // running one; the worker drains the waiting ones (cancelled) and run() returns.
    void stop() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stopping_ = true;
            for (auto & j : queue_) j->cancelled = true;
            if (running_) running_->cancelled = true;
        }
        cv_.notify_all();
    }

    // Waits until `pred(waiting(), running())` holds, for whoever needs to synchronise on the
    // queue's state (tests; nothing in the server blocks on it).
    template <class Pred>
    void wait_for_state(Pred && pred) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return pred(queue_.size(), running_ != nullptr); });
    }

    size_t waiting() const {  // jobs admitted and not yet taken
        std::lock_guard<std::mutex> lk(m_);
        return queue_.size();
    }
    bool busy() const {  // a job runs
        std::lock_guard<std::mutex> lk(m_);
        return running_ != nullptr;
    }
    bool stopping() const {
        std::lock_guard<std::mutex> lk(m_);
        return stopping_;
    }
    int max_waiting() const { return max_waiting_; }

private:
    const int max_waiting_;
    mutable std::mutex m_;  // guards everything below
    std::condition_variable cv_;  // notified on every change of queue_, running_, stopping_
    std::deque<std::shared_ptr<T>> queue_;
    std::shared_ptr<T> running_;
    bool stopping_ = false;
    uint64_t next_id_ = 0;
};

}  // namespace moestream::server
