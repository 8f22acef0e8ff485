#include "common/env.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/fake_env.h"

namespace pstrain {
namespace {

TEST(EnvTest, DefaultMonotonicClockMovesForwardAcrossASleep) {
  Env* env = Env::Default();
  const absl::Duration t0 = env->MonotonicNow();
  env->SleepFor(absl::Milliseconds(5));
  const absl::Duration t1 = env->MonotonicNow();
  EXPECT_GE(t1 - t0, absl::Milliseconds(5));
  EXPECT_LT(t1 - t0, absl::Seconds(30));
  EXPECT_LT(absl::AbsDuration(env->Now() - absl::Now()), absl::Seconds(5));
}

TEST(EnvTest, FakeClockMovesOnlyWhenAdvancedOrSlept) {
  FakeEnv env;
  const absl::Duration t0 = env.MonotonicNow();
  EXPECT_EQ(env.MonotonicNow(), t0);
  env.SleepFor(absl::Seconds(90));  // returns at once
  EXPECT_EQ(env.MonotonicNow() - t0, absl::Seconds(90));
  env.Advance(absl::Milliseconds(250));
  EXPECT_DOUBLE_EQ(env.MonotonicSeconds() - absl::ToDoubleSeconds(t0), 90.25);
  env.SleepFor(absl::Seconds(-1));  // no move
  EXPECT_EQ(env.advances(), 2);
}

TEST(EnvTest, DirectoriesAndSymlinksToThem) {
  const std::string dir = ::testing::TempDir() + "/env_test_dirs";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/real && touch " + dir +
                         "/file && ln -s real " + dir + "/link")
                            .c_str()),
            0);
  Env* env = Env::Default();
  EXPECT_TRUE(env->IsDirectory(dir + "/real"));
  EXPECT_TRUE(env->IsRealDirectory(dir + "/real"));
  EXPECT_TRUE(env->IsDirectory(dir + "/link"));
  EXPECT_FALSE(env->IsRealDirectory(dir + "/link"));
  EXPECT_FALSE(env->IsDirectory(dir + "/file"));
  EXPECT_FALSE(env->IsDirectory(dir + "/missing"));
  EXPECT_FALSE(env->IsRealDirectory(dir + "/missing"));
}

TEST(EnvTest, BackgroundWorkRunsInOrderAndWaitForScheduledWaitsForAllOfIt) {
  Env* env = Env::Default();
  absl::Mutex mu;
  std::vector<int> ran;
  for (int round = 0; round < 3; ++round) {  // the thread ends between rounds and starts again
    for (int i = 0; i < 50; ++i) {
      env->Schedule([&, i] {
        absl::MutexLock lock(&mu);
        ran.push_back(i);
      });
    }
    // Work that schedules more work: WaitForScheduled waits for that too.
    env->Schedule([&] {
      env->Schedule([&] {
        absl::MutexLock lock(&mu);
        ran.push_back(50);
      });
    });
    env->WaitForScheduled();
    absl::MutexLock lock(&mu);
    ASSERT_EQ(ran.size(), 51u);
    for (int i = 0; i <= 50; ++i) EXPECT_EQ(ran[i], i);
    ran.clear();
  }
  env->WaitForScheduled();  // nothing scheduled: returns at once
}

}  // namespace
}  // namespace pstrain
