// A reusable barrier for the tower threads of one training step (TrainStep's in-process step):
// the phases of a step (pull, compute, update) follow each other within a few microseconds on a
// machine with a core per tower, so a waiter spins first; on a machine with fewer cores than
// towers spinning would only delay the towers it waits for, so after a short spin it sleeps on a
// condition variable until the last thread arrives.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace pstrain {

// Thread-safe. `parties` threads call Wait() for each phase; none returns before all arrived.
class StepBarrier {
 public:
  explicit StepBarrier(int parties) : parties_(parties) {}
  StepBarrier(const StepBarrier&) = delete;
  StepBarrier& operator=(const StepBarrier&) = delete;

  void Wait() {
    const uint32_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
      // The last: reset the count before releasing the others (they may arrive at the next
      // phase at once; they see the reset through the generation's release/acquire).
      arrived_.store(0, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(mu_);  // no waiter can miss the change below
        generation_.store(gen + 1, std::memory_order_release);
      }
      cv_.notify_all();
      return;
    }
    // About 20-50 microseconds of pauses, then sleep.
    for (int i = 0; i < kSpins; ++i) {
      if (generation_.load(std::memory_order_acquire) != gen) return;
      _mm_pause();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != gen; });
  }

 private:
  static constexpr int kSpins = 1000;
  const int parties_;
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> generation_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace pstrain
