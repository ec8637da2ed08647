// test_job_queue.cpp — the server's job queue (tools/server/job_queue.h) without HTTP or an
// engine: admission up to the limit (an idle queue always admits), admission order, one job
// at a time, a waiting job that leaves, the running job cancelled, stop, and the release that
// frees the queue before the job is reported finished. No timing: the tests synchronise on
// the queue's state (JobQueue::wait_for_state) and on their own condition variables.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "job_queue.h"

namespace {

using moestream::server::JobQueue;

struct TestJob {
    explicit TestJob(std::string n) : name(std::move(n)) {}
    uint64_t id = 0;
    std::atomic<bool> cancelled{false};
    std::string name;
};

std::shared_ptr<TestJob> job(const char * name) { return std::make_shared<TestJob>(name); }

// `running` admitted and taken by the worker, then each of `waiting` admitted behind it.
void run_then_queue(JobQueue<TestJob> & q, const std::shared_ptr<TestJob> & running,
                    std::initializer_list<std::shared_ptr<TestJob>> waiting) {
    ASSERT_TRUE(q.push(running));
    ASSERT_EQ(q.take(), running);
    for (const auto & j : waiting) ASSERT_TRUE(q.push(j)) << j->name << " is admitted";
}

// A worker function that holds each job until the test opens the gate, and records the order.
struct GatedWorker {
    std::mutex m;
    std::condition_variable cv;
    bool open = false;
    int active = 0, max_active = 0;
    std::vector<std::string> ran;

    void operator()(TestJob & j) {
        std::unique_lock<std::mutex> lk(m);
        max_active = std::max(max_active, ++active);
        cv.wait(lk, [&] { return open; });
        ran.push_back(j.name);
        --active;
        cv.notify_all();
    }
    void open_gate() {
        std::lock_guard<std::mutex> lk(m);
        open = true;
        cv.notify_all();
    }
    void wait_ran(size_t n) {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return ran.size() >= n; });
    }
};

TEST(JobQueue, RefusesBeyondTheLimitBehindARunningJob) {
    JobQueue<TestJob> q(1);
    auto a = job("a"), b = job("b"), c = job("c");
    ASSERT_NO_FATAL_FAILURE(run_then_queue(q, a, {b}));  // one may wait behind the running job
    EXPECT_FALSE(q.push(c)) << "a second waiting job is over the limit";
    EXPECT_EQ(q.waiting(), 1u);
    // Control: once the waiting job is taken there is room again.
    q.release(*a);
    ASSERT_EQ(q.take(), b);
    EXPECT_TRUE(q.push(c));
}

TEST(JobQueue, AnIdleQueueAdmitsWithALimitOfZero) {
    JobQueue<TestJob> q(0);
    auto a = job("a"), b = job("b");
    ASSERT_TRUE(q.push(a)) << "nothing waits or runs: taken whatever the limit";
    EXPECT_FALSE(q.push(b)) << "control: behind a waiting job, a limit of 0 refuses";
    ASSERT_EQ(q.take(), a);
    EXPECT_FALSE(q.push(b)) << "control: behind the running job too";
}

TEST(JobQueue, ReleaseFreesTheQueueBeforeTheJobIsReported) {
    JobQueue<TestJob> q(0);
    auto a = job("a"), b = job("b");
    ASSERT_TRUE(q.push(a));
    ASSERT_EQ(q.take(), a);
    EXPECT_FALSE(q.push(b)) << "control: not released, the job still runs";
    q.release(*a);
    EXPECT_FALSE(q.busy());
    EXPECT_TRUE(q.push(b)) << "released: the next request is admitted at once";
}

TEST(JobQueue, RunsJobsInAdmissionOrderOneAtATime) {
    JobQueue<TestJob> q(8);
    GatedWorker w;
    std::thread worker([&] { q.run(std::ref(w)); });
    // Created a, b, c; admitted b, c, a: the ids and the run order follow admission.
    auto a = job("a"), b = job("b"), c = job("c");
    ASSERT_TRUE(q.push(b));
    ASSERT_TRUE(q.push(c));
    ASSERT_TRUE(q.push(a));
    EXPECT_EQ(b->id, 1u);
    EXPECT_EQ(c->id, 2u);
    EXPECT_EQ(a->id, 3u);
    // The first one runs, held at the gate; the others wait rather than run beside it.
    q.wait_for_state([](size_t waiting, bool running) { return running && waiting == 2; });
    w.open_gate();
    w.wait_ran(3);
    q.wait_for_state([](size_t waiting, bool running) { return !running && waiting == 0; });
    q.stop();
    worker.join();
    EXPECT_EQ(w.ran, (std::vector<std::string>{"b", "c", "a"}));
    EXPECT_EQ(w.max_active, 1);
    EXPECT_FALSE(a->cancelled || b->cancelled || c->cancelled) << "stopped after they ran";
}

TEST(JobQueue, AWaitingJobThatLeavesIsTakenOut) {
    JobQueue<TestJob> q(8);
    auto a = job("a"), b = job("b"), c = job("c");
    ASSERT_NO_FATAL_FAILURE(run_then_queue(q, a, {b, c}));
    EXPECT_TRUE(q.leave(b)) << "it waited: the caller finishes it";
    EXPECT_TRUE(b->cancelled);
    EXPECT_EQ(q.waiting(), 1u);
    EXPECT_FALSE(c->cancelled) << "control: the job behind it stays";
    q.release(*a);
    EXPECT_EQ(q.take(), c) << "the worker never sees the job that left";
}

TEST(JobQueue, TheRunningJobThatLeavesIsCancelledInPlace) {
    JobQueue<TestJob> q(8);
    auto a = job("a"), b = job("b");
    ASSERT_NO_FATAL_FAILURE(run_then_queue(q, a, {b}));
    EXPECT_FALSE(q.leave(a)) << "it runs: the worker stops it and finishes it";
    EXPECT_TRUE(a->cancelled);
    EXPECT_TRUE(q.busy()) << "still running until the worker releases it";
    EXPECT_FALSE(b->cancelled) << "control: the waiting job is untouched";
    EXPECT_EQ(q.waiting(), 1u);
}

TEST(JobQueue, StopCancelsEveryJobAndAdmitsNoMore) {
    JobQueue<TestJob> q(8);
    auto a = job("a"), b = job("b"), c = job("c");
    ASSERT_NO_FATAL_FAILURE(run_then_queue(q, a, {b}));  // control: admitted before the stop
    q.stop();
    EXPECT_TRUE(q.stopping());
    EXPECT_TRUE(a->cancelled) << "the running job";
    EXPECT_TRUE(b->cancelled) << "the waiting job";
    EXPECT_FALSE(q.push(c));
    EXPECT_EQ(c->id, 0u) << "refused: never given an id";
    q.release(*a);
    EXPECT_EQ(q.take(), b) << "the worker still takes the waiting job, cancelled, to answer it";
    EXPECT_EQ(q.take(), nullptr) << "then the worker returns";
}

}  // namespace
