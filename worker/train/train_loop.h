// The step loop of one worker, the core of RunTraining (worker/train/trainer.h) in every mode:
// resume from the checkpointer, train until the input ends, max_steps, a stop signal or a
// divergence, with the checkpoint schedule, the periodic evaluation and the progress lines on the
// way, then save the final (or the stop's) checkpoint. RunTraining builds the parts (model,
// parameters, checkpointer, progress) before it and runs the end of the job after it.
//
// Read-ahead (docs/ARCHITECTURE.md "The pipelined step"). While the towers compute step t, the
// loop reads batch t+1 and stages it (dedup; with prefetch_pulls its pull starts). A checkpoint
// or a stop happens only at a boundary without a read-ahead batch, so that the pipeline's
// position is right after the last trained batch and, after a flush, every push is complete:
//   - a boundary known in advance (the last of max_steps, the chief's checkpoint schedule, a
//     request the checkpointer reports before the step) is reached without reading ahead in the
//     step before it;
//   - a stop or a checkpoint request that arrives while a batch is read ahead is served at the
//     boundary after that batch (one more step).
// The state of the next batch to train is one ReadAhead value; a request owed to the next
// boundary without read-ahead and a stop seen are two more flags.
//
// Divergence. A step whose summed loss is not finite (NaN or +-inf) ends Run at once with
// FAILED_PRECONDITION "training diverged at step N: loss is nan (last good checkpoint: DIR)".
// That step's update has already been pushed (TrainStep::Train starts the push before it
// returns the loss), so nothing is saved after it: no scheduled, requested, stop or final
// checkpoint, and Checkpoint refuses from then on. LATEST keeps naming the last checkpoint
// written before the divergence; a resume starts from it.
//
// Early stopping and the best checkpoint (train.early_stopping, checkpoint.keep_best; the chief
// only, worker/train/early_stopping.h). Each periodic evaluation's result, taken at a step
// boundary, goes to the EarlyStopper. When it says stop, the chief asks the checkpointer to end
// the pass (JobControl::EndPass): every worker then stops at one common point and ends as at
// the end of its input (summary().stopped_early), with the final checkpoint and the pass's end.
// With keep_best, the chief evaluates after every checkpoint it writes (not every
// eval_every_steps), and an evaluation that improves names that checkpoint in <dir>/BEST; before
// the next checkpoint it waits for the running evaluation, so that the candidate is still there
// (retention runs only in a commit) when its result is known.
//
// Memory: two batches (the one training and the one read ahead), TrainStep's buffers and the
// pipeline's prefetch queue. Threading: not thread-safe; the trainer thread calls Resume, Run and
// Finish, in that order, once each. The background evaluator runs on its own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"
#include "worker/data/pipeline.h"
#include "worker/eval/evaluator.h"
#include "worker/model/model.h"
#include "worker/params/params.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data_pass.h"
#include "common/env.h"
#include "worker/train/job_control.h"
#include "worker/train/early_stopping.h"
#include "worker/train/progress.h"
#include "worker/train/train_step.h"
#include "worker/train/trainer.h"

namespace pstrain {

class TrainLoop {
 public:
  // What the loop uses and does not own; everything must outlive it.
  struct Parts {
    const Config* config = nullptr;  // validated, with the thread settings resolved
    const TrainerOptions* options = nullptr;
    const FeatureSpec* spec = nullptr;
    const Model* model = nullptr;
    ParameterAccess* params = nullptr;
    Checkpointer* checkpointer = nullptr;  // null: no checkpoints are restored or written
    JobControl* job = nullptr;             // required: stops, requests, the pass's end
    ProgressReporter* progress = nullptr;
    bool prefetch_pulls = false;  // TrainStep::Stage's start_pull
    // The dynamic tables' counters, recorded at each logged step (ProgressReporter::
    // DynamicTables); null: none.
    std::function<std::vector<DynamicTableMetrics>()> dynamic_metrics;
  };

  explicit TrainLoop(const Parts& parts);
  TrainLoop(const TrainLoop&) = delete;
  TrainLoop& operator=(const TrainLoop&) = delete;

  // Restores the newest usable checkpoint (Checkpointer::Restore), decides between a resume, a
  // new pass and nothing to do (worker/train/data_pass.h; the refusal of changed data under an
  // unfinished job is its error), then opens the pipeline (at the saved position for a resume)
  // and creates the step runner.
  absl::Status Resume();
  // The steps: until the input ends, train.max_steps steps of this pass, or a stop (then
  // summary().preempted); none when the pass had finished (summary().nothing_to_do). Errors:
  // the pipeline's, the step's, the checkpointer's, a background evaluation's, and
  // FAILED_PRECONDITION for a divergence (see the top of this file).
  absl::Status Run();
  // After a successful Run: flushes, waits for the background evaluation, fills the summary
  // (steps and examples of this pass, timings, sizes) and writes the final checkpoint, or the
  // stop's.
  absl::StatusOr<TrainSummary> Finish();

  int64_t step() const { return step_; }
  // The data the pass reads (after Resume).
  const DataSpec& pass_spec() const { return pass_spec_; }
  // What Resume decided for this run's pass (a fresh job, a resumed pass, a new pass, nothing).
  PassAction pass_action() const { return pass_action_; }

 private:
  // The next batch to train, batches_[cur_].
  enum class ReadAhead {
    kNone,       // none read: the boundary before it may checkpoint or stop
    kStaged,     // read and staged (by the previous step's read-ahead, or at the boundary)
    kInputDone,  // reading found the end of the input
  };
  // What a boundary without read-ahead leads to.
  enum class Boundary {
    kTrain,    // a batch is staged: train it
    kRecheck,  // a stop was raised during the checkpoint: look at the boundary again
    kEnd,      // stopped, or the input ended
  };

  bool Stopped() const;
  // Reads the next non-empty batch into batches_[slot]; false at the end of the input.
  absl::StatusOr<bool> ReadNext(int slot);
  // ReadNext, then stages the batch (ReadAhead::kStaged) or notes the end (kInputDone).
  absl::Status StageNext(int slot);
  // A boundary without a read-ahead batch after step_ steps: serves a stop (`stop`, sampled at
  // the top of the loop) and a checkpoint request, then stages the next batch.
  absl::StatusOr<Boundary> AtBoundary(bool stop);
  // Trains batches_[cur_] as step step_ + 1, reading the next batch ahead while the towers
  // compute unless a boundary without read-ahead must follow; then progress, evaluation and the
  // scheduled checkpoint. FAILED_PRECONDITION if the step's loss is not finite.
  absl::Status RunStep();
  // Flushes the pushes and saves the worker's state (refused after a divergence). `scheduled`:
  // the chief's own schedule (every_steps / every_seconds) asked for it, so an uninterrupted job
  // writes it too: with keep_best its evaluation is owed even when a stop signal came first (the
  // state says evaluating_step, and the resumed job runs it). The same holds for the next
  // checkpoint committed after a scheduled one the checkpointer put off (a PS round).
  absl::Status Checkpoint(bool final, bool scheduled = false);
  // Takes a finished evaluation's result: logs it, feeds the EarlyStopper (marks BEST; with
  // `may_stop`, ends the pass when patience runs out).
  absl::Status DrainEval(bool may_stop = true);
  absl::Status ObserveEval(const EvalResult& result, bool may_stop);
  // The divergence error of step step_ with `loss`; remembered, so that nothing is saved after.
  absl::Status Diverged(double loss);

  const Config& config_;
  const TrainerOptions& opts_;
  const FeatureSpec& spec_;
  const Model& model_;
  ParameterAccess* const params_;
  Checkpointer* const checkpointer_;
  JobControl* const job_;
  LoopHeartbeat* const heartbeat_;  // job_->heartbeat(): beaten after every step; may be null
  Env* const env_;  // TrainerOptions::env: the timings' and the checkpoint schedule's clock
  ProgressReporter* const progress_;
  const bool prefetch_pulls_;
  const std::function<std::vector<DynamicTableMetrics>()> dynamic_metrics_;
  const int64_t max_steps_, log_every_, eval_every_, ckpt_every_;
  const double ckpt_seconds_;
  const bool have_eval_;  // the chief with an eval channel evaluates
  const bool keep_best_;  // the chief evaluates each checkpoint and marks the best

  WorkerState restored_;  // the state resumed from (empty for a fresh start)
  // The pass this run trains: the data it reads, where it began, whether it had finished.
  DataSpec pass_spec_;
  PassAction pass_action_ = PassAction::kFresh;
  int64_t pass_first_step_ = 0, pass_first_examples_ = 0;
  bool nothing_to_do_ = false;
  std::unique_ptr<Pipeline> pipeline_;
  Batch batches_[2];
  int64_t batch_epoch_[2] = {0, 0};
  std::unique_ptr<TrainStep> step_runner_;  // after batches_: destroyed first (it points at them)
  BackgroundEvaluator background_;

  // The loop's state.
  int cur_ = 0;  // batches_[cur_] is trained next
  ReadAhead read_ahead_ = ReadAhead::kNone;
  bool checkpoint_owed_ = false;  // a checkpoint is due at the next boundary without read-ahead
  bool stop_seen_ = false;        // a stop was seen: no more reading ahead
  absl::Status diverged_;         // set by Diverged: no checkpoint after it
  // Early stopping (the chief with early_stopping or keep_best): the bookkeeping, whether the
  // pass end was asked for, and whether this trainer stops by itself (JobControl::EndPass
  // returned false).
  std::optional<EarlyStopper> stopper_;
  bool end_pass_asked_ = false, end_pass_local_ = false;
  std::string eval_checkpoint_;  // keep_best: the checkpoint the running evaluation evaluates
  // The chief's schedule asked for a checkpoint that the checkpointer arranged for later (PS):
  // the next one committed stands for it (keep_best evaluates it, or says it is owed).
  bool scheduled_round_owed_ = false;

  int64_t step_ = 0, examples_ = 0, first_step_ = 0;
  int64_t unique_rows_ = 0;  // this run's steps only (not restored)
  int64_t epoch_ = 0, last_epoch_ = 0, total_steps_estimate_ = 0;
  // The last checkpoint known to be written (restored or saved), for the divergence message;
  // unnamed_checkpoint_ when a later Save did not learn its name (a PS worker that is not the
  // chief).
  std::string last_checkpoint_;
  bool unnamed_checkpoint_ = false;
  double t_start_ = 0, t_last_log_ = 0, t_last_ckpt_ = 0;
  int64_t ex_since_log_ = 0;
  double loss_since_log_ = 0;
  TrainSummary summary_;
};

}  // namespace pstrain
