#include "common/env.h"

#include <cstdlib>
#include <string>

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

}  // namespace
}  // namespace pstrain
