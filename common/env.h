// Env: what library code asks of its surroundings (the clocks, directory checks and background
// work), as leveldb's Env. Code takes an `Env*` (in its Options, or as a constructor or function
// argument) that defaults to Env::Default(), the real one; tests pass a fake (tests/fake_env.h)
// to drive time instead of waiting for it. No library code reads a clock, sleeps or starts a
// background thread of its own except through an Env.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace pstrain {

class Env {
 public:
  Env() = default;
  virtual ~Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // The real environment: the system clocks. Process-wide, thread-safe, never destroyed.
  static Env* Default();

  // Monotonic time for durations and deadlines: never goes back, unrelated to the date.
  virtual absl::Duration MonotonicNow() = 0;
  // Seconds of MonotonicNow(), for timings that are printed or summed.
  double MonotonicSeconds() { return absl::ToDoubleSeconds(MonotonicNow()); }
  // The wall clock, for timestamps that are written out (logs, metrics, file names).
  virtual absl::Time Now() = 0;
  // Now() in seconds since the Unix epoch, as files record it (wall_time fields).
  double WallSeconds() { return absl::ToDoubleSeconds(Now() - absl::UnixEpoch()); }
  // Blocks the calling thread for `d` (<= 0: returns at once).
  virtual void SleepFor(absl::Duration d) = 0;

  // Files.
  // `path` is a directory, or a symlink to one.
  virtual bool IsDirectory(const std::string& path) = 0;
  // `path` itself is a directory, not a symlink to one (what pstrain made and may delete).
  virtual bool IsRealDirectory(const std::string& path) = 0;

  // Background work.
  // Runs `work` on the Env's background thread, after everything scheduled before it: one at a
  // time, in order. The real Env starts its thread when there is work and lets it end when the
  // queue is empty; work still queued when the process exits is not run.
  virtual void Schedule(std::function<void()> work) = 0;
  // Blocks until the background work is done: everything scheduled before the call, and what
  // that work or other threads schedule while it waits. pstrain's main calls it before exiting
  // (checkpoint/layout.h: retention deletes in the background).
  virtual void WaitForScheduled() = 0;
};

// An Env that forwards every call to another one; a fake overrides what it fakes.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }
  absl::Duration MonotonicNow() override { return target_->MonotonicNow(); }
  absl::Time Now() override { return target_->Now(); }
  void SleepFor(absl::Duration d) override { target_->SleepFor(d); }
  bool IsDirectory(const std::string& path) override { return target_->IsDirectory(path); }
  bool IsRealDirectory(const std::string& path) override {
    return target_->IsRealDirectory(path);
  }
  void Schedule(std::function<void()> work) override { target_->Schedule(std::move(work)); }
  void WaitForScheduled() override { target_->WaitForScheduled(); }

 private:
  Env* const target_;
};

}  // namespace pstrain
