// A fake Env for tests: its clocks move only when the test (or a SleepFor) moves them, so a test
// of a timeout or a lease runs in no time and never depends on the machine's load.
#pragma once

#include "absl/synchronization/mutex.h"
#include "common/env.h"

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

}  // namespace pstrain
