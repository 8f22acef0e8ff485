// The trainer's overlap work (TrainStep::Train's `overlap`: read and stage batch t+1 while the
// towers compute step t) on one long-lived thread at the lowest CPU priority (nice 19).
//
// Why: with a tower on every core, a trainer thread at the towers' priority preempts one of them
// while it stages, and the whole step then waits for that tower at its next barrier (DIN on 2
// vCPUs: the first MLP layer's forward 2.6x slower once every ~9 steps; docs/PERFORMANCE.md
// "The trainer's read-ahead at the lowest priority"). At nice 19 the staging runs on the time
// the towers leave idle (at their barriers, in their pulls and pushes), and what is left when
// they finish runs at full speed while the trainer waits: never later than staging after the
// towers. On a machine with a free core it changes nothing.
//
// Threads that a callback starts inherit its priority; the trainer's callbacks start none (the
// input pipeline's threads start with the pipeline, on the trainer's thread).
//
// Thread-safety: Start and Wait are called by one thread (the trainer's), in turn.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace pstrain {

class OverlapThread {
 public:
  OverlapThread();
  ~OverlapThread();  // finishes a started callback, then joins
  OverlapThread(const OverlapThread&) = delete;
  OverlapThread& operator=(const OverlapThread&) = delete;

  // Runs fn on the thread; the caller must Wait before starting another.
  void Start(std::function<absl::Status()> fn);
  // fn's status, once it returned.
  absl::Status Wait();
  // Whether the thread's priority was lowered (setpriority may be refused, e.g. by a seccomp
  // profile: it then runs at the trainer's priority, as the callback did before).
  bool lowered();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<absl::Status()> fn_;  // set: a callback to run
  bool running_ = false;              // fn_ started and not yet waited for
  bool done_ = false;                 // fn_ returned: status_ holds its status
  bool stop_ = false;
  bool ready_ = false;  // the thread has set its priority
  bool lowered_ = false;
  absl::Status status_;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace pstrain
