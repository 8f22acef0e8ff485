#include "worker/train/overlap_thread.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

namespace pstrain {

OverlapThread::OverlapThread() : thread_([this] { Loop(); }) {}

OverlapThread::~OverlapThread() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !running_ || done_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OverlapThread::Start(std::function<absl::Status()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = std::move(fn);
    running_ = true;
    done_ = false;
  }
  cv_.notify_all();
}

absl::Status OverlapThread::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!running_) return absl::OkStatus();
  cv_.wait(lock, [&] { return done_; });
  running_ = false;
  return std::exchange(status_, absl::OkStatus());
}

bool OverlapThread::lowered() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_; });
  return lowered_;
}

void OverlapThread::Loop() {
  // Linux's nice value is per thread: PRIO_PROCESS with the thread's id sets this one only.
  // Raising one's own nice value needs no privilege.
  const bool lowered = setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19) == 0;
  std::unique_lock<std::mutex> lock(mu_);
  lowered_ = lowered;
  ready_ = true;
  cv_.notify_all();
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (running_ && !done_ && fn_ != nullptr); });
    if (stop_) return;
    std::function<absl::Status()> fn = std::move(fn_);
    fn_ = nullptr;
    lock.unlock();
    absl::Status status = fn();
    lock.lock();
    status_ = std::move(status);
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace pstrain
