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

namespace pstrain {

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
