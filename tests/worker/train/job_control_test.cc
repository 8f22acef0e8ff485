// worker/train/job_control.h LoopHeartbeat: the training loop's heartbeat that a job's lease
// watches. Silent only between beats outside a bounded wait, on the fake clock.
#include "worker/train/job_control.h"

#include "gtest/gtest.h"
#include "tests/fake_env.h"

namespace pstrain {
namespace {

TEST(LoopHeartbeat, SilentOnlyBetweenStepsOutsideABoundedWait) {
  FakeEnv env;
  LoopHeartbeat heartbeat(&env);
  // Start-up is not watched: no silence before the first step.
  env.Advance(absl::Seconds(100));
  EXPECT_EQ(heartbeat.Silence(), absl::ZeroDuration());
  heartbeat.Beat(1);
  env.Advance(absl::Seconds(3));
  EXPECT_EQ(heartbeat.Silence(), absl::Seconds(3));
  EXPECT_EQ(heartbeat.last_step(), 1);
  heartbeat.Beat(2);
  EXPECT_EQ(heartbeat.Silence(), absl::ZeroDuration());
  {
    // A checkpoint: no step is expected while it waits, and its end counts as a beat.
    LoopHeartbeat::BoundedWait wait(&heartbeat);
    env.Advance(absl::Seconds(50));
    EXPECT_EQ(heartbeat.Silence(), absl::ZeroDuration());
    {
      LoopHeartbeat::BoundedWait nested(&heartbeat);  // waits nest
    }
    env.Advance(absl::Seconds(1));
    EXPECT_EQ(heartbeat.Silence(), absl::ZeroDuration());
  }
  env.Advance(absl::Seconds(2));
  EXPECT_EQ(heartbeat.Silence(), absl::Seconds(2));
  EXPECT_EQ(heartbeat.last_step(), 2);
  // The steps are over: the end of the job is not watched.
  heartbeat.End();
  env.Advance(absl::Seconds(100));
  EXPECT_EQ(heartbeat.Silence(), absl::ZeroDuration());
  // A null heartbeat's scope does nothing (a job that watches no loop).
  LoopHeartbeat::BoundedWait none(nullptr);
}

}  // namespace
}  // namespace pstrain
