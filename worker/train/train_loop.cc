#include "worker/train/train_loop.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/train/data_pass.h"

namespace pstrain {

TrainLoop::TrainLoop(const Parts& parts)
    : config_(*parts.config),
      opts_(*parts.options),
      spec_(*parts.spec),
      model_(*parts.model),
      params_(parts.params),
      checkpointer_(parts.checkpointer),
      job_(parts.job),
      heartbeat_(parts.job->heartbeat()),
      env_(parts.options->env != nullptr ? parts.options->env : Env::Default()),
      progress_(parts.progress),
      prefetch_pulls_(parts.prefetch_pulls),
      dynamic_metrics_(parts.dynamic_metrics),
      max_steps_(config_.train().max_steps()),
      log_every_(std::max<int64_t>(1, config_.train().log_every_steps())),
      eval_every_(config_.train().eval_every_steps()),
      ckpt_every_(config_.checkpoint().every_steps()),
      ckpt_seconds_(config_.checkpoint().every_seconds()),
      have_eval_(opts_.chief && HasPeriodicEvalData(config_.data())),
      keep_best_(have_eval_ && config_.checkpoint().keep_best()),
      background_(config_, spec_, model_, params_, /*threads=*/1) {}

bool TrainLoop::Stopped() const {
  return end_pass_local_ || job_->StopRequested();
}

absl::Status TrainLoop::Resume() {
  ASSIGN_OR_RETURN(const DataSpec now, ResolveDataSpec(config_.data()));
  std::optional<std::string> restored;
  std::optional<PassEnd> pass_end;
  if (checkpointer_ != nullptr) {
    ASSIGN_OR_RETURN(restored, checkpointer_->Restore(&restored_));
    if (restored) {
      ASSIGN_OR_RETURN(pass_end, ReadPassEnd(*restored));
      last_checkpoint_ = *restored;
    }
  } else {
    progress_->Message("no checkpointer: no checkpoints are written or restored");
  }
  ASSIGN_OR_RETURN(const PassDecision pass,
                   DecidePass(restored ? &restored_ : nullptr, pass_end ? &*pass_end : nullptr,
                              restored.value_or(""), now, config_.train()));
  pass_spec_ = now;
  if (pass.action != PassAction::kFresh) {
    pass_first_step_ = restored_.step();
    pass_first_examples_ = restored_.examples();
  }
  if (pass.action == PassAction::kResume || pass.action == PassAction::kNothing) {
    progress_->Message(absl::StrCat("resumed from ", *restored, " at step ", restored_.step()));
    // The saved pass goes on with its own data (checkpoints before the spec was recorded: this
    // run's).
    if (restored_.has_data_spec()) pass_spec_ = restored_.data_spec();
    if (restored_.has_pass_first_step()) {
      pass_first_step_ = restored_.pass_first_step();
      pass_first_examples_ = restored_.pass_first_examples();
    } else {
      pass_first_step_ = pass_first_examples_ = 0;
    }
  } else {
    restored_.clear_position();  // a new pass reads its data from the start
  }
  nothing_to_do_ = pass.action == PassAction::kNothing;
  pass_action_ = pass.action;
  if (have_eval_ && (config_.train().has_early_stopping() || keep_best_)) {
    // A resumed pass goes on counting its patience; a new pass starts afresh.
    stopper_.emplace(config_.train().early_stopping(),
                     pass.action == PassAction::kResume ? restored_.early_stopping()
                                                        : EarlyStoppingState());
  }
  if (!pass.message.empty()) progress_->Message(pass.message);
  const ThreadConfig& t = config_.threads();
  const int T = t.towers(), B = config_.train().batch_size();
  // The step's batch: this worker's share of train.global_batch_size, or T x B.
  const int64_t step_batch =
      StepBatch(config_.train(), t, opts_.worker_index, opts_.num_workers);
  PipelineOptions po = OptionsFromConfig(config_.data(), /*train=*/true,
                                         static_cast<int>(step_batch),
                                         opts_.worker_index, opts_.num_workers,
                                         config_.train().epochs());
  po.reader_threads = t.inter_op_threads();
  if (restored_.has_position()) po.start = restored_.position();
  ASSIGN_OR_RETURN(pipeline_, Pipeline::Create(std::move(po), spec_));
  ASSIGN_OR_RETURN(step_runner_, TrainStep::Create(model_, T, B, t.intra_op_threads()));
  step_runner_->set_dense_sync_steps(std::max(1, opts_.dense_sync_steps));

  step_ = first_step_ = restored_.step();
  examples_ = restored_.examples();
  total_steps_estimate_ = max_steps_ > 0 ? pass_first_step_ + max_steps_ : 0;
  if (keep_best_ && stopper_ && pass.action == PassAction::kResume &&
      restored_.early_stopping().has_evaluating_step() &&
      restored_.early_stopping().evaluating_step() == step_ && background_.Start(step_)) {
    // The evaluation of the checkpoint resumed from never reported (the job crashed, or stopped
    // at that checkpoint's step): run it now, as the uninterrupted job did.
    eval_checkpoint_ = *restored;
    progress_->Message(absl::StrCat("evaluating ", *restored,
                                    " (its evaluation was not in the checkpoint)"));
  }
  t_start_ = t_last_log_ = t_last_ckpt_ = env_->MonotonicSeconds();
  return absl::OkStatus();
}

absl::StatusOr<bool> TrainLoop::ReadNext(int slot) {
  while (true) {
    ASSIGN_OR_RETURN(bool more, pipeline_->Next(&batches_[slot], &batch_epoch_[slot]));
    if (!more || batches_[slot].size > 0) return more;
  }
}

absl::Status TrainLoop::StageNext(int slot) {
  ASSIGN_OR_RETURN(bool more, ReadNext(slot));
  if (!more) {
    read_ahead_ = ReadAhead::kInputDone;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(step_runner_->Stage(batches_[slot], params_, prefetch_pulls_));
  read_ahead_ = ReadAhead::kStaged;
  return absl::OkStatus();
}

absl::Status TrainLoop::Run() {
  if (nothing_to_do_) return absl::OkStatus();
  // The steps end here, however they end: what follows has bounded waits of its own.
  absl::Cleanup steps_over = [this] {
    if (heartbeat_ != nullptr) heartbeat_->End();
  };
  while (max_steps_ == 0 || step_ - pass_first_step_ < max_steps_) {
    const bool stop = Stopped();
    stop_seen_ = stop_seen_ || stop;
    if (read_ahead_ != ReadAhead::kStaged) {
      ASSIGN_OR_RETURN(const Boundary next, AtBoundary(stop));
      if (next == Boundary::kEnd) break;
      if (next == Boundary::kRecheck) continue;
    }
    RETURN_IF_ERROR(RunStep());
  }
  PSTRAIN_CHECK(read_ahead_ != ReadAhead::kStaged) << "a read-ahead batch was left untrained";
  return absl::OkStatus();
}

absl::StatusOr<TrainLoop::Boundary> TrainLoop::AtBoundary(bool stop) {
  // This worker may not go on (a lost lease or peer, a failed job): the job's reason, which
  // names the last good checkpoint.
  RETURN_IF_ERROR(job_->Failure());
  if (stop) {
    // A synchronous job stops at one common step: train on to it (JobControl::StopStep). Its
    // calls to shard 0 have deadlines of their own.
    LoopHeartbeat::BoundedWait wait(heartbeat_);
    ASSIGN_OR_RETURN(const int64_t stop_at, job_->StopStep(step_));
    if (step_ >= stop_at) {
      // The chief's early stopping ends the pass; a signal preempts it.
      summary_.stopped_early = end_pass_local_ || job_->PassEnded();
      summary_.preempted = !summary_.stopped_early;
      return Boundary::kEnd;
    }
  }
  if (checkpoint_owed_ || job_->CheckpointRequested(step_)) {
    checkpoint_owed_ = false;
    RETURN_IF_ERROR(Checkpoint(/*final=*/false));
    // A stop raised by the round (it ended the job) or by a signal during it: serve it at this
    // boundary, through StopStep (a synchronous job may have to train on to a common step: the
    // other workers were released and go on).
    if (Stopped()) return Boundary::kRecheck;
  }
  checkpoint_owed_ = false;
  if (read_ahead_ == ReadAhead::kInputDone) return Boundary::kEnd;
  RETURN_IF_ERROR(StageNext(cur_));
  return read_ahead_ == ReadAhead::kStaged ? Boundary::kTrain : Boundary::kEnd;
}

absl::Status TrainLoop::RunStep() {
  epoch_ = batch_epoch_[cur_];
  if (epoch_ != last_epoch_) {
    // After the first epoch the steps per epoch are known: estimate the total for the ETA.
    if (max_steps_ == 0 && last_epoch_ == 0) {
      total_steps_estimate_ =
          pass_first_step_ + (step_ - pass_first_step_) * config_.train().epochs();
    }
    last_epoch_ = epoch_;
  }
  ++step_;
  const double t_step = env_->MonotonicSeconds();
  const bool ckpt_due =
      opts_.chief && ((ckpt_every_ > 0 && step_ % ckpt_every_ == 0) ||
                      (ckpt_seconds_ > 0 && t_step - t_last_ckpt_ > ckpt_seconds_));
  // A checkpoint wanted at the boundary after this step (another worker's round) needs that
  // boundary without a read-ahead batch. Asked before the step trains: with BOUNDED / SYNC the
  // round's target leaves a step of margin for exactly this (worker/ps_client/ps_job.h).
  checkpoint_owed_ = checkpoint_owed_ || job_->CheckpointRequested(step_);
  const bool read_ahead =
      !(max_steps_ > 0 && step_ - pass_first_step_ >= max_steps_) && !ckpt_due && !stop_seen_ &&
      !checkpoint_owed_;
  const int next = 1 - cur_;
  read_ahead_ = ReadAhead::kNone;  // batches_[cur_] is being trained
  ASSIGN_OR_RETURN(StepResult r, step_runner_->Train(step_, params_, [&]() -> absl::Status {
    return read_ahead ? StageNext(next) : absl::OkStatus();
  }));
  cur_ = next;
  if (!std::isfinite(r.loss_sum)) return Diverged(r.loss_sum);
  if (heartbeat_ != nullptr) heartbeat_->Beat(step_);  // the job's lease watches the loop
  examples_ += r.examples;
  unique_rows_ += r.unique_rows;
  ex_since_log_ += r.examples;
  loss_since_log_ += r.loss_sum;

  const double now = env_->MonotonicSeconds();
  if (step_ % log_every_ == 0 || (opts_.tty && now - t_last_log_ > 0.5)) {
    progress_->Train(step_, epoch_, loss_since_log_ / std::max<int64_t>(1, ex_since_log_),
                     ex_since_log_ / std::max(1e-9, now - t_last_log_), total_steps_estimate_,
                     now - t_start_);
    const StepProfile& prof = step_runner_->profile();
    progress_->StepPhases(prof.dedup, prof.pull, prof.compute, prof.reduce, prof.push);
    progress_->Examples(ex_since_log_);
    if (dynamic_metrics_) progress_->DynamicTables(step_, dynamic_metrics_());
    t_last_log_ = now;
    ex_since_log_ = 0;
    loss_since_log_ = 0;
  }
  RETURN_IF_ERROR(DrainEval());
  if (have_eval_ && !keep_best_ && eval_every_ > 0 && step_ % eval_every_ == 0) {
    // The evaluation should see this step's update.
    RETURN_IF_ERROR(step_runner_->Flush());
    background_.Start(step_);
  }
  if (ckpt_due) RETURN_IF_ERROR(Checkpoint(/*final=*/false, /*scheduled=*/true));
  return absl::OkStatus();
}

absl::Status TrainLoop::Checkpoint(bool final, bool scheduled) {
  // The divergence's update was pushed: a checkpoint now would capture it.
  if (!diverged_.ok()) return diverged_;
  if (checkpointer_ == nullptr) return absl::OkStatus();
  // Every push completes, and the pipeline's position is right after the last trained batch
  // (there is no read-ahead batch at a checkpoint). Not a bounded wait: a push that a stopped
  // host's shard never answers is what the job's lease must find.
  RETURN_IF_ERROR(step_runner_->Flush());
  // The checkpoint's waits (a running evaluation, a PS round: on peers that hold leases of their
  // own, on shard 0, whose silence the lease's other side finds, on the round's COPY, which gets
  // at most the lease) have deadlines of their own: the job's lease expects no step meanwhile.
  LoopHeartbeat::BoundedWait wait(heartbeat_);
  if (keep_best_ || (stopper_ && (final || Stopped()))) {
    // keep_best: the running evaluation's checkpoint may be the best: know it before this
    // commit's retention could remove it. A stop: the running evaluation's result belongs in the
    // state a resumed job goes on counting from.
    background_.Wait();
    RETURN_IF_ERROR(DrainEval(/*may_stop=*/!final));
  }
  // keep_best evaluates each checkpoint the chief writes on the way (not the final or a stop's).
  // A scheduled one a signal came before is not evaluated now, but the state says it is owed.
  // A PS chief answers its schedule by arranging a round a few steps later (Save returns "");
  // the next round it commits stands for that scheduled one, even a stop's.
  const bool evaluate = keep_best_ && !final && !Stopped();
  const bool owed = evaluate || (keep_best_ && !final && !end_pass_asked_ &&
                                 (scheduled || scheduled_round_owed_));
  WorkerState ws;
  ws.set_step(step_);
  ws.set_examples(examples_);
  *ws.mutable_position() = pipeline_->position();
  *ws.mutable_data_spec() = pass_spec_;
  ws.set_finished(final);
  ws.set_max_steps_reached(final && max_steps_ > 0 && step_ - pass_first_step_ >= max_steps_);
  ws.set_pass_first_step(pass_first_step_);
  ws.set_pass_first_examples(pass_first_examples_);
  if (stopper_) {
    *ws.mutable_early_stopping() = stopper_->state();
    if (owed) {
      ws.mutable_early_stopping()->set_evaluating_step(step_);
    } else {
      ws.mutable_early_stopping()->clear_evaluating_step();
    }
  }
  ASSIGN_OR_RETURN(std::string dir, checkpointer_->Save(ws, final));
  if (!dir.empty()) {
    scheduled_round_owed_ = false;
    if (evaluate && background_.Start(step_)) eval_checkpoint_ = dir;
    summary_.checkpoint = dir;
    last_checkpoint_ = dir;
    unnamed_checkpoint_ = false;
  } else {
    // Arranged for later (a PS round): the next committed checkpoint stands for a scheduled one.
    if (scheduled) scheduled_round_owed_ = true;
    unnamed_checkpoint_ = true;
  }
  t_last_ckpt_ = env_->MonotonicSeconds();
  return absl::OkStatus();
}

absl::Status TrainLoop::DrainEval(bool may_stop) {
  if (auto r = background_.Take()) {
    if (!r->ok()) return Annotate(r->status(), "evaluation");
    progress_->Eval((*r)->step, (*r)->auc, (*r)->logloss, (*r)->examples, false);
    RETURN_IF_ERROR(ObserveEval(**r, may_stop));
  }
  return absl::OkStatus();
}

absl::Status TrainLoop::ObserveEval(const EvalResult& result, bool may_stop) {
  const std::string evaluated = std::exchange(eval_checkpoint_, "");
  if (!stopper_) return absl::OkStatus();
  const EarlyStopper::Outcome out = stopper_->Observe(result);
  if (out.improved && !evaluated.empty()) {
    const size_t slash = evaluated.rfind('/');
    const std::string root = slash == std::string::npos ? "." : evaluated.substr(0, slash);
    const std::optional<int64_t> step = ParseCheckpointName(evaluated.substr(slash + 1));
    PSTRAIN_CHECK(step.has_value()) << "not a checkpoint directory: " << evaluated;
    RETURN_IF_ERROR(Annotate(WriteBest(root, *step), "marking the best checkpoint"));
    summary_.best_checkpoint = evaluated;
    progress_->Message(absl::StrFormat("best checkpoint: %s (%s %.6f at step %d)", evaluated,
                                       stopper_->metric_name(), stopper_->Value(result),
                                       result.step));
  }
  if (!out.stop || !may_stop || end_pass_asked_) return absl::OkStatus();
  const EarlyStoppingState& st = stopper_->state();
  progress_->Message(absl::StrFormat(
      "early stopping at step %d: %s has not improved by more than %g in %d evaluations (best "
      "%.6f at step %d); ending the training pass",
      step_, stopper_->metric_name(), config_.train().early_stopping().min_delta(),
      st.evals_since_best(), st.best(), st.best_step()));
  end_pass_asked_ = true;
  ASSIGN_OR_RETURN(const bool handled, job_->EndPass(step_));
  end_pass_local_ = !handled;
  return absl::OkStatus();
}

absl::Status TrainLoop::Diverged(double loss) {
  // x86 computes inf - inf as a NaN with the sign bit set, which printf writes "-nan".
  const char* value = std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf";
  std::string last = last_checkpoint_.empty() ? "none" : last_checkpoint_;
  if (unnamed_checkpoint_) last = "the one LATEST names in the job's checkpoint directory";
  diverged_ = absl::FailedPreconditionError(absl::StrCat(
      "training diverged at step ", step_, ": loss is ", value, " (last good checkpoint: ", last,
      "); nothing is saved after it: lower the learning rates, or look for extreme values in the "
      "data of this step"));
  return diverged_;
}

absl::StatusOr<TrainSummary> TrainLoop::Finish() {
  if (!diverged_.ok()) return diverged_;
  PSTRAIN_CHECK(read_ahead_ != ReadAhead::kStaged) << "a read-ahead batch was left untrained";
  RETURN_IF_ERROR(step_runner_->Flush());
  const double train_seconds = env_->MonotonicSeconds() - t_start_;
  background_.Wait();
  RETURN_IF_ERROR(DrainEval(/*may_stop=*/false));
  if (stopper_ && stopper_->state().evals() > 0) {
    summary_.early_stopping_metric = stopper_->metric_name();
    summary_.best_value = stopper_->state().best();
    summary_.best_step = stopper_->state().best_step();
  }

  summary_.steps = step_ - pass_first_step_;
  summary_.pass_first_step = pass_first_step_;
  summary_.nothing_to_do = nothing_to_do_;
  summary_.unique_rows_per_step =
      step_ > first_step_ ? static_cast<double>(unique_rows_) / (step_ - first_step_) : 0;
  summary_.row_dim = params_->row_dim();
  summary_.dense_params = params_->dense_size();
  summary_.examples = examples_ - pass_first_examples_;
  summary_.wall_seconds = train_seconds;
  summary_.examples_this_run = examples_ - restored_.examples();
  summary_.examples_per_sec = train_seconds > 0 ? summary_.examples_this_run / train_seconds : 0;
  summary_.bad_records = static_cast<int64_t>(pipeline_->stats().bad_records);
  // With nothing to do this saves nothing (the step is committed), but a PS worker's final
  // state still takes part in the job's end.
  RETURN_IF_ERROR(Checkpoint(/*final=*/!summary_.preempted));
  if (nothing_to_do_) return summary_;
  if (checkpointer_ != nullptr) {
    // A PS worker's final state is committed by the job's chief once every worker is done
    // (worker/ps_client/ps_job.h): no path to name here.
    progress_->Message(absl::StrCat(
        summary_.preempted        ? "stopped by SIGTERM; "
        : summary_.stopped_early ? "stopped early; "
                                 : "",
        summary_.checkpoint.empty() ? "final state handed to the job's checkpoint (the chief "
                                      "commits it)"
                                    : absl::StrCat("checkpoint written: ", summary_.checkpoint)));
  } else if (summary_.preempted) {
    progress_->Message("stopped by a signal; no checkpointer, so nothing was saved");
  }
  const StepProfile& prof = step_runner_->profile();
  progress_->Message(absl::StrFormat(
      "step time: dedup %.1f%%  pull %.1f%%  towers %.1f%%  reduce %.1f%%  push %.1f%%",
      100 * prof.dedup / train_seconds, 100 * prof.pull / train_seconds,
      100 * prof.compute / train_seconds, 100 * prof.reduce / train_seconds,
      100 * prof.push / train_seconds));
  return summary_;
}

}  // namespace pstrain
