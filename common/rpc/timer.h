// Timer: runs functions at given times on one thread of its own, waiting on a
// condition variable until the earliest is due. Used where a gRPC callback
// thread must not sleep: the PS client's retry backoff and the PS shard's
// expiry of held (deferred) pulls. grpc::Alarm cannot be re-armed safely from
// its own callback, hence this.
//
// Times are the Env's wall clock (Env::Now(), as gRPC deadlines are). With a fake Env,
// whose clock does not move by itself, a test moves the clock and then calls Poke.
//
// Thread-safety: At, Poke and Stop may be called from any thread, also from inside a
// function the timer runs. The destructor stops the timer, runs what is still
// pending and joins the thread.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"

namespace pstrain {

class Timer {
 public:
  // `env` must outlive the timer.
  explicit Timer(Env *env = Env::Default()) : env_(env), thread_([this] { Loop(); }) {}
  ~Timer() {
    Stop();
    thread_.join();
  }
  Timer(const Timer &) = delete;
  Timer &operator=(const Timer &) = delete;

  // Runs fn on the timer thread at `when`; after Stop(), runs it on the caller
  // at once.
  void At(absl::Time when, std::function<void()> fn) {
    {
      absl::MutexLock lock(&mu_);
      if (!stopped_) {
        queue_.push(Entry{when, seq_++, std::move(fn)});
        cv_.Signal();
        return;
      }
    }
    fn();
  }
  // Looks at the clock again (after a test moved a fake Env's clock): runs what is due.
  void Poke() {
    absl::MutexLock lock(&mu_);
    cv_.Signal();
  }
  // Runs every pending function now, without waiting for its time.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    cv_.Signal();
  }

 private:
  struct Entry {
    absl::Time when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Entry &o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };

  void Loop() {
    absl::MutexLock lock(&mu_);
    while (true) {
      if (queue_.empty()) {
        if (stopped_) return;
        cv_.Wait(&mu_);
        continue;
      }
      const absl::Time now = env_->Now();
      if (!stopped_ && now < queue_.top().when) {
        cv_.WaitWithTimeout(&mu_, queue_.top().when - now);
        continue;
      }
      std::function<void()> fn = std::move(const_cast<Entry &>(queue_.top()).fn);
      queue_.pop();
      mu_.Unlock();
      fn();
      mu_.Lock();
    }
  }

  Env *const env_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pstrain
