// One training step over T towers: dedup ids, pull the unique rows and the dense vector,
// forward/backward each tower's slice, sum the tower gradients into one update (the tower
// method: effective batch = the whole batch), average, push.
//
// Pipelining. A step is split so that the trainer can overlap its parts:
//   Stage(batch t+1)  dedups the batch's ids and, if asked, starts its pull (StartPull) once
//                     the push of step t-1 has completed;
//   Train(step t)     trains the oldest staged batch: waits for its pull (starting it first,
//                     after the previous push completed, when Stage did not), starts the towers,
//                     runs `overlap` while they compute (the trainer reads and stages batch t+1
//                     there; on a thread of the lowest CPU priority, overlap_thread.h, while the
//                     calling thread waits), sums and averages the tower gradients (an
//                     OpenMP team of T x I threads), then starts the push (StartPush) after
//                     waiting for the previous one;
//   Flush()           waits for the last push (checkpoints, the end of training, evaluation).
//
// In-process parameters (ParameterAccess::in_process(), `pstrain train`'s LocalParams), when the
// batch's pull was not started by Stage and dense_sync_steps is 1: Train runs the pull, the
// towers and the update on the tower threads, each tower gathering, summing and applying its own
// share of the rows and of the dense vector between barriers; nothing is left in flight, and the
// parameters equal those of the Pull / summed gradients / Push path to the bit
// (docs/ARCHITECTURE.md "The in-process step").
//
// Dense sync every k steps (set_dense_sync_steps, PS ASYNC mode's cluster.dense_sync_steps):
// every pull fetches rows, but only every k-th fetches the dense vector; each step's dense
// gradient is summed, and every k-th push carries the mean of the k steps (the other pushes carry
// rows only). For the dense layers this is the tower method over k steps: k batches computed on
// the same dense weights, one update with their mean gradient, as `train` does with k towers.
// Flush pushes a partial sum (fewer than k steps) as its mean, so that a checkpoint, an
// evaluation or the end of training sees every gradient; the next pull then fetches the dense
// vector again. k = 1 (the default) pulls and pushes the dense vector every step.
// With a synchronous ParameterAccess (LocalParams) and pulls not started by Stage, every pull
// follows the previous push: results are exactly those of Run in a loop. A pull started by
// Stage(t+1) before Train(t) pushed sees every update of this worker up to step t-1 but not step
// t's: asynchronous SGD with a staleness of exactly one step from this worker's own updates
// (deterministic in one process; other workers' updates arrive whenever they do).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/data/batch.h"
#include "worker/model/model.h"
#include "worker/params/dedup.h"
#include "worker/params/params.h"
#include "worker/train/overlap_thread.h"
#include "worker/train/step_barrier.h"
#include "worker/train/tower_pool.h"

namespace pstrain {

struct StepResult {
  double loss_sum = 0;     // summed loss over the batch
  int examples = 0;
  int64_t unique_rows = 0;
};

// Time spent in each phase, accumulated over steps (seconds), for profiles. `compute` is the
// towers' wall time, including the `overlap` work the trainer does meanwhile; `dedup` is counted
// in Stage even when it overlaps the towers; `pull` and `push` are the time the trainer thread
// waited for (or ran) them; `reduce` is the gradient sum.
struct StepProfile {
  double dedup = 0, pull = 0, compute = 0, reduce = 0, push = 0;
};

// Not thread-safe: one trainer thread calls Stage / Train / Flush / Run.
class TrainStep {
 public:
  // `env` is the clock of profile() (its monotonic one); it must outlive the step.
  static absl::StatusOr<std::unique_ptr<TrainStep>> Create(const Model& model, int towers,
                                                           int batch_per_tower,
                                                           int intra_op_threads,
                                                           Env* env = Env::Default());
  // Waits for what an error left in flight (a staged batch's pull, the last push), so that no
  // ParameterAccess writes into these buffers after they are freed. Their statuses are dropped:
  // the error that ended training is the one to report.
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Stages `batch` (up to towers x batch_per_tower examples, with the model's field count): its
  // ids are deduplicated now and, if `start_pull`, its pull is started. At most two batches are
  // staged at once (the one Train trains next and the one after it). `batch` must stay unchanged
  // until its Train returned.
  absl::Status Stage(const Batch& batch, ParameterAccess* params, bool start_pull);

  // Trains the oldest staged batch (see the top of this file); `step` is the 1-based global step
  // passed to the optimizers. `overlap`, if set, runs on the calling thread while the towers
  // compute; its error is returned after they finished. FAILED_PRECONDITION when nothing is
  // staged. A shorter batch is split evenly over the towers.
  absl::StatusOr<StepResult> Train(int64_t step, ParameterAccess* params,
                                   const std::function<absl::Status()>& overlap = nullptr);

  // Waits for the last push started by Train, then pushes a partial block's dense gradient mean
  // (dense_sync_steps > 1) and waits for that too; returns the first error.
  absl::Status Flush();

  // Synchronous step: Stage(batch, params, false), Train, Flush.
  absl::StatusOr<StepResult> Run(const Batch& batch, int64_t step, ParameterAccess* params);

  // k >= 1, see the top of this file. Call before the first Stage.
  void set_dense_sync_steps(int k) { dense_sync_steps_ = k; }

  const StepProfile& profile() const { return profile_; }
  int towers() const { return pool_->size(); }
  int batch_per_tower() const { return batch_per_tower_; }

 private:
  // A staged batch: its ids deduplicated, and the buffers its pull fills.
  struct Staged {
    const Batch* batch = nullptr;
    std::vector<int64_t> unique;
    std::vector<int32_t> slots;
    std::vector<float> rows;
    int dense = 0;  // dense_[dense] holds the weights this batch computes with
    bool pull_started = false;
    ParamsOp pull;
  };

  TrainStep(const Model& model, std::unique_ptr<TowerPool> pool, int batch_per_tower, int intra,
            Env* env)
      : model_(model),
        pool_(std::move(pool)),
        batch_per_tower_(batch_per_tower),
        intra_(intra),
        env_(env) {}

  const Model& model_;
  std::unique_ptr<TowerPool> pool_;
  int batch_per_tower_;
  int intra_;
  Env* const env_;
  Deduper dedup_;
  std::unique_ptr<OverlapThread> overlap_thread_;  // created by the first overlap
  Staged staged_[2];
  int head_ = 0;    // staged_[head_] is trained next
  int staged_count_ = 0;
  using TowerFn = std::function<absl::Status(int, Tower*)>;
  // Tower t's forward and backward over its share of st's batch, with `dense` weights, into
  // row_grads_[t] (indexed like st.unique) and dense_grads_[t].
  absl::Status ComputeTower(int t, Tower* tower, const Staged& st, const float* dense);
  // Train with in-process parameters: pull, compute and update on the tower threads.
  absl::StatusOr<StepResult> TrainInProcess(Staged& st, int64_t step, InProcessParams* params,
                                            const std::function<absl::Status()>& overlap);
  // Runs `overlap` (if any) on overlap_thread_ and waits for it.
  absl::Status RunOverlap(const std::function<absl::Status()>& overlap);
  // Waits for the last push started by Train.
  absl::Status WaitPush();
  // Starts st's pull: rows, and the dense vector when due (into the dense_ buffer not in use).
  ParamsOp StartPull(Staged* st, ParameterAccess* params);

  ParamsOp push_;  // the last push started
  int64_t last_step_ = 0;                 // of the last push started
  ParameterAccess* last_params_ = nullptr;  // its ParameterAccess
  // Dense weights as last pulled: two buffers, so that a pull started while a step computes
  // writes the one that step does not read.
  std::vector<float> dense_[2];
  int dense_latest_ = 0;  // the buffer of the last dense pull
  int dense_sync_steps_ = 1;
  int pulls_since_dense_ = 0;  // pulls since the last one fetching the dense vector
  std::vector<float> dense_sum_;  // dense gradients summed since the last dense push
  int dense_sum_steps_ = 0;
  std::vector<std::vector<float>> row_grads_, dense_grads_;  // per tower
  std::vector<double> losses_;
  std::unique_ptr<StepBarrier> barrier_;  // the towers' phases of an in-process step
  StepProfile profile_;
};

}  // namespace pstrain
