// A fake Env for tests: its clocks move only when the test (or a SleepFor) moves them, so a test
// of a timeout or a lease runs in no time and never depends on the machine's load. Files and
// background work are the real Env's.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/env.h"
#include "common/rpc/timer.h"
#include "gtest/gtest.h"

namespace pstrain {

class FakeEnv : public EnvWrapper {
 public:
  FakeEnv() : EnvWrapper(Env::Default()) {}

  absl::Duration MonotonicNow() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  absl::Time Now() override { return absl::UnixEpoch() + MonotonicNow(); }
  // Sleeping advances the fake clock by `d` and returns at once.
  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) Advance(d);
  }

  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
    ++advances_;
  }
  int64_t advances() {
    absl::MutexLock lock(&mu_);
    return advances_;
  }

 private:
  absl::Mutex mu_;
  absl::Duration now_ ABSL_GUARDED_BY(mu_) = absl::Hours(1);
  int64_t advances_ ABSL_GUARDED_BY(mu_) = 0;
};

// Moves `env`'s clock to `when` (not back) and waits until `timer` (made with `env`) has run
// everything due by then: the entries run in time order, so a marker at `when` runs after them.
inline void RunTimerUntil(FakeEnv* env, Timer* timer, absl::Time when) {
  absl::Notification reached;
  timer->At(when, [&reached] { reached.Notify(); });
  if (when > env->Now()) env->Advance(when - env->Now());
  timer->Poke();
  ASSERT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

}  // namespace pstrain
