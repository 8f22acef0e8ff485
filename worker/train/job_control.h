// JobControl: what the training loop (worker/train/train_loop.h) asks of the job it is part of,
// at every step boundary, from its training thread. The loop trains; the job decides when to
// stop, when to checkpoint, where a synchronous job stops, and whether this worker may go on.
// One implementation per mode:
//   - LocalJob (below): one process (`pstrain train`): a stop signal's flag, nothing else;
//   - PsJob (worker/ps_client/ps_job.h): the PS mode's protocol with shard 0 (checkpoint rounds,
//     the lease, the end of the job);
//   - AllreduceJob (worker/allreduce/allreduce_params.h): the ranks' round headers.
// Checkpoints themselves (what is written and restored) are the Checkpointer's
// (worker/train/checkpoint.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"

namespace pstrain {

// The training loop's heartbeat, for a job whose lease watches the loop rather than the process
// (PsJob: a worker whose loop is stuck, e.g. on a shard of a stopped host, stops renewing its
// lease and stops). The loop (TrainLoop) Beat()s after every step it trains. A wait that is
// bounded by deadlines of its own, during which no step can be trained, is a BoundedWait scope:
// a checkpoint after its flush (a PS checkpoint round: its waits have the round's timeout, a lost
// peer aborts it, and its COPY gets at most the lease; it includes the wait for a running
// evaluation with checkpoint.keep_best, whose pulls have the call budget). The watch is armed by the first beat (before it, start-up has its own
// timeouts: connect, restore, the first contact) and disarmed for good by End(), at the end of
// the steps (the end of the job has its own bounded waits, and a worker that reported
// TRAINING_DONE holds no lease).
// Covered without a scope, because each of them ends in steps: a slow but live step; an
// evaluation in the background (it never blocks the loop); a BOUNDED / SYNC pull held for a
// slower peer (answered when that peer pushes its step, so it is as slow as the slowest live
// peer's step; a peer that stops is itself lost). Not covered: a single step that takes longer
// than the lease (cluster.lease_ms must exceed the slowest step).
// Thread-safety: Beat, End and the scopes from the trainer thread; Silence from any thread.
class LoopHeartbeat {
 public:
  explicit LoopHeartbeat(Env* env = Env::Default()) : env_(env) {}
  LoopHeartbeat(const LoopHeartbeat&) = delete;
  LoopHeartbeat& operator=(const LoopHeartbeat&) = delete;

  // The loop trained step `step`.
  void Beat(int64_t step) {
    last_step_.store(step);
    Touch();
    armed_.store(true);
  }
  // The steps are over: Silence() is zero from now on.
  void End() { ended_.store(true); }
  // A wait with deadlines of its own (see above); the loop counts as live while one is open, and
  // its end counts as a beat. Null `heartbeat`: nothing.
  class BoundedWait {
   public:
    explicit BoundedWait(LoopHeartbeat* heartbeat) : h_(heartbeat) {
      if (h_ != nullptr) h_->waits_.fetch_add(1);
    }
    ~BoundedWait() {
      if (h_ == nullptr) return;
      h_->Touch();  // before the count drops: Silence never sees the old time without the wait
      h_->waits_.fetch_sub(1);
    }
    BoundedWait(const BoundedWait&) = delete;
    BoundedWait& operator=(const BoundedWait&) = delete;

   private:
    LoopHeartbeat* const h_;
  };

  // How long the loop has gone without a beat outside a bounded wait; zero before the first beat,
  // during a bounded wait and after End().
  absl::Duration Silence() const {
    if (!armed_.load() || ended_.load() || waits_.load() > 0) return absl::ZeroDuration();
    return env_->MonotonicNow() - absl::Nanoseconds(last_ns_.load());
  }
  // The last step beaten (0 before the first).
  int64_t last_step() const { return last_step_.load(); }

 private:
  void Touch() { last_ns_.store(absl::ToInt64Nanoseconds(env_->MonotonicNow())); }

  Env* const env_;
  std::atomic<int64_t> last_ns_{0};  // env_'s monotonic clock
  std::atomic<int64_t> last_step_{0};
  std::atomic<int> waits_{0};
  std::atomic<bool> armed_{false};
  std::atomic<bool> ended_{false};
};

class JobControl {
 public:
  virtual ~JobControl() = default;

  // Whether this worker should stop at its next boundary (SIGTERM / SIGINT, or a stopping round
  // of the job). Cheap: sampled at every boundary.
  virtual bool StopRequested() const = 0;
  // Whether the job wants a checkpoint at the boundary after `step` steps (another worker's
  // round, the allreduce schedule). Cheap: asked before every step. True also once Failure() is
  // not OK: the checkpointer's Save then returns the failure (naming the last good checkpoint).
  virtual bool CheckpointRequested(int64_t /*step*/) { return false; }
  // Once StopRequested(): the step to train on to (a synchronous job stops at one common step).
  virtual absl::StatusOr<int64_t> StopStep(int64_t step) { return step; }
  // The chief's early stopping ends the job's training pass after `step` steps
  // (train.early_stopping). true: the job stops every worker at one common point, as a stop
  // signal does (StopRequested() becomes true), and PassEnded() is then true on every worker;
  // false (one worker): the loop stops at its next step boundary by itself.
  virtual absl::StatusOr<bool> EndPass(int64_t /*step*/) { return false; }
  // Whether the stop this worker saw ends the job's training pass (the chief's EndPass): the
  // worker then ends as at the end of its input (final checkpoint, pass end), not as after
  // SIGTERM.
  virtual bool PassEnded() const { return false; }
  // Why this worker may not go on (its lease was lost, a peer was lost, the job failed), or OK.
  virtual absl::Status Failure() const { return absl::OkStatus(); }
  // The heartbeat the loop keeps for this job's lease (LoopHeartbeat above), or null: no job
  // watches the loop (LocalJob, AllreduceJob).
  virtual LoopHeartbeat* heartbeat() { return nullptr; }
};

// One process: stops when `stop` (a stop signal's flag, may be null) is raised.
class LocalJob : public JobControl {
 public:
  explicit LocalJob(const std::atomic<bool>* stop) : stop_(stop) {}
  bool StopRequested() const override { return stop_ != nullptr && stop_->load(); }

 private:
  const std::atomic<bool>* const stop_;
};

}  // namespace pstrain
