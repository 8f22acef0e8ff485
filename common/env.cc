#include "common/env.h"

#include <sys/stat.h>

#include <chrono>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace pstrain {
namespace {

class PosixEnv final : public Env {
 public:
  absl::Duration MonotonicNow() override {
    return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }
  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  bool IsRealDirectory(const std::string& path) override {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  void Schedule(std::function<void()> work) override {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
    if (running_) return;
    if (thread_.joinable()) thread_.join();  // the previous run's thread, finished
    running_ = true;
    thread_ = std::thread([this] { RunScheduled(); });
  }
  void WaitForScheduled() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* running) { return !*running; }, &running_));
    if (thread_.joinable()) thread_.join();
  }

 private:
  // The background thread: runs the queue until it is empty, then ends.
  void RunScheduled() {
    absl::MutexLock lock(&mu_);
    while (!queue_.empty()) {
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      work();
      mu_.Lock();
    }
    running_ = false;
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a thread runs the queue
  std::thread thread_ ABSL_GUARDED_BY(mu_);     // the last one started
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv;  // never destroyed: background work may outlive main
  return env;
}

}  // namespace pstrain
