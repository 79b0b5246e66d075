// Work: the contract between polling and waiting that keeps device collectives overlapped, and
// what a timeout does when the job abort is not armed.
//
// A device communicator's Work (NCCL) makes the compute stream wait for the collective in
// order_consumers(). The reducer polls with test() right after launching each bucket; if polling
// inserted that dependency, every later backward kernel would queue behind the all-reduce and
// the overlap would be gone. This fake records each inserted wait in a fake stream.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/job_abort.h"

namespace meshtrain {
namespace {

struct FakeStream {
  std::vector<std::string> waits;  // operations the stream was made to wait for, in order
};

class FakeDeviceWork final : public Work::Impl {
 public:
  FakeDeviceWork(FakeStream& stream, std::string name, int polls_until_done)
      : stream_(stream), name_(std::move(name)), remaining_(polls_until_done) {}
  bool test() override { return remaining_-- <= 0; }
  void order_consumers() override { stream_.waits.push_back(name_); }
  std::string describe() const override { return name_; }

 private:
  FakeStream& stream_;
  std::string name_;
  int remaining_;
};

Work fake(FakeStream& s, const std::string& name, int polls, double timeout = 60.0) {
  return Work(std::make_unique<FakeDeviceWork>(s, name, polls), std::chrono::duration<double>(timeout));
}

TEST(Work, PollingNeverMakesTheStreamWait) {
  FakeStream stream;
  Work w = fake(stream, "bucket 0", 3);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(w.test());
  EXPECT_TRUE(stream.waits.empty()) << "a poll inserted " << stream.waits.front();
  EXPECT_TRUE(w.test());
  EXPECT_FALSE(w.pending());
  EXPECT_TRUE(stream.waits.empty());
}

TEST(Work, WaitMakesTheStreamWaitOnceBeforeCompletion) {
  FakeStream stream;
  Work polled = fake(stream, "bucket 0", 100);
  Work waited = fake(stream, "bucket 1", 100);
  EXPECT_FALSE(polled.test());
  waited.wait();
  EXPECT_EQ(stream.waits, std::vector<std::string>{"bucket 1"});
  polled.wait();
  EXPECT_EQ(stream.waits, (std::vector<std::string>{"bucket 1", "bucket 0"}));
  polled.wait();  // complete: nothing more
  EXPECT_EQ(stream.waits.size(), 2u);
}

// Assigning over a pending Work completes it first (its buffers may be freed right after);
// assigning over a finished one waits for nothing.
TEST(Work, AssigningOverAPendingWorkWaitsForIt) {
  FakeStream stream;
  Work w = fake(stream, "old", 5);
  w = fake(stream, "new", 100);
  EXPECT_EQ(stream.waits, std::vector<std::string>{"old"});
  EXPECT_TRUE(w.pending());
  w.wait();
  w = fake(stream, "newest", 0);
  EXPECT_EQ(stream.waits, (std::vector<std::string>{"old", "new"}));
  Work& same = w;
  w = std::move(same);  // self-assignment keeps the operation
  EXPECT_TRUE(w.pending());
}

// The reducer's pattern: launch every bucket, poll them all while "backward" runs, then wait at
// the end of the step. Only the final waits order the stream.
TEST(Work, ReducerPatternOrdersTheStreamOnlyAtTheEnd) {
  FakeStream stream;
  std::vector<Work> buckets;
  for (int b = 0; b < 4; ++b) {
    buckets.push_back(fake(stream, "bucket " + std::to_string(b), 2));
    for (Work& w : buckets) w.test();
  }
  EXPECT_TRUE(stream.waits.empty());
  wait_all(buckets);
  // Buckets 0 and 1 completed under polling; only the others needed an ordering wait.
  EXPECT_EQ(stream.waits, (std::vector<std::string>{"bucket 2", "bucket 3"}));
}

TEST(Work, UnarmedTimeoutThrowsNamingTheOperation) {
  ASSERT_FALSE(job_abort_armed());
  FakeStream stream;
  Work stuck = fake(stream, "all_reduce(sum) of 4 fp32 on group 'dp'", 1 << 30, 0.05);
  try {
    stuck.wait();
    ADD_FAILURE() << "a stuck operation completed";
  } catch (const CommTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce(sum) of 4 fp32 on group 'dp' did not complete "
                                         "within 0 s (run.comm_timeout)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(stuck.pending());
}

TEST(JobAbort, HooksRegisterAndUnregister) {
  int calls = 0;
  const uint64_t a = add_abort_hook([&] { ++calls; });
  const uint64_t b = add_abort_hook([&] { ++calls; });
  EXPECT_NE(a, b);
  remove_abort_hook(a);
  remove_abort_hook(b);
  remove_abort_hook(b);  // twice is harmless
  EXPECT_EQ(calls, 0);
  arm_job_abort(3);
  EXPECT_TRUE(job_abort_armed());
  disarm_job_abort();
  EXPECT_FALSE(job_abort_armed());
}

}  // namespace
}  // namespace meshtrain
