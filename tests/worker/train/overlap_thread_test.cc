// OverlapThread (worker/train/overlap_thread.h): the trainer's read-ahead runs on one other
// thread, at nice 19 without touching the trainer's own priority, returns its status, runs
// again and again, and is waited for on destruction.
#include "worker/train/overlap_thread.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

pid_t Tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// The calling thread's nice value (getpriority returns -1 both as a value and as an error).
int Nice(pid_t tid) {
  errno = 0;
  const int n = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  EXPECT_EQ(errno, 0);
  return n;
}

TEST(OverlapThreadTest, RunsTheCallbackOnAnotherThreadAtTheLowestPriority) {
  const int caller_nice = Nice(Tid());
  OverlapThread thread;
  pid_t ran_on = 0;
  int ran_nice = 0;
  thread.Start([&] {
    ran_on = Tid();
    ran_nice = Nice(ran_on);
    return absl::OkStatus();
  });
  ASSERT_TRUE(thread.Wait().ok());
  EXPECT_NE(ran_on, 0);
  EXPECT_NE(ran_on, Tid());
  if (thread.lowered()) {
    EXPECT_EQ(ran_nice, 19);
  } else {
    std::printf("setpriority was refused here: the callback ran at nice %d\n", ran_nice);
  }
  EXPECT_EQ(Nice(Tid()), caller_nice) << "the trainer's own priority changed";
}

TEST(OverlapThreadTest, ReturnsEachCallbacksStatus) {
  OverlapThread thread;
  EXPECT_TRUE(thread.Wait().ok()) << "nothing started";
  thread.Start([] { return absl::DataLossError("batch 7: bad record"); });
  const absl::Status failed = thread.Wait();
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(failed.message(), "batch 7: bad record");
  thread.Start([] { return absl::OkStatus(); });
  EXPECT_TRUE(thread.Wait().ok()) << "the last status leaked into the next run";
}

TEST(OverlapThreadTest, RunsManyTimesInTurn) {
  OverlapThread thread;
  int runs = 0;  // written by the thread, read here after each Wait
  for (int i = 0; i < 2000; ++i) {
    thread.Start([&] {
      ++runs;
      return absl::OkStatus();
    });
    ASSERT_TRUE(thread.Wait().ok());
    ASSERT_EQ(runs, i + 1);
  }
}

TEST(OverlapThreadTest, DestructionFinishesAStartedCallback) {
  std::atomic<bool> finished{false};
  {
    OverlapThread thread;
    thread.Start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      finished = true;
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace pstrain
