#include "worker/train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/cpu.h"
#include "common/file.h"
#include "common/json_writer.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/data/pipeline.h"
#include "worker/eval/evaluator.h"
#include "worker/model/isa.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/train/checkpoint.h"
#include "worker/train/progress.h"
#include "worker/train/train_step.h"

namespace pstrain {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status WriteSummary(const std::string& path, const TrainSummary& s, const Config& config,
                          const TrainerOptions& opts) {
  const ThreadConfig& t = config.threads();
  JsonObject j;
  j.Add("test_auc", s.test_auc)
      .Add("test_logloss", s.test_logloss)
      .Add("eval_examples", s.eval_examples)
      .Add("examples_per_sec", s.examples_per_sec)
      .Add("examples", s.examples)
      .Add("examples_this_run", s.examples_this_run)
      .Add("steps", s.steps)
      .Add("wall_seconds", s.wall_seconds)
      .Add("mode", opts.mode)
      .Add("model", ModelType_Name(config.model().type()))
      .Add("precision", Precision_Name(config.model().precision()))
      .Add("isa", IsaName(KernelIsa()))
      .Add("onednn_isa", OneDnnIsaName())
      .Add("towers", t.towers())
      .Add("intra_op_threads", t.intra_op_threads())
      .Add("inter_op_threads", t.inter_op_threads())
      .Add("batch_size_per_tower", config.train().batch_size())
      .Add("hosts", opts.hosts)
      .Add("bad_records", s.bad_records)
      .Add("unique_rows_per_step", s.unique_rows_per_step)
      .Add("row_dim", s.row_dim)
      .Add("dense_params", s.dense_params)
      .Add("preempted", s.preempted)
      .Add("checkpoint", s.checkpoint);
  if (s.staleness_pulls > 0) {
    j.Add("staleness_max", s.staleness_max).Add("staleness_mean", s.staleness_mean);
  }
  if (s.wire_bytes >= 0) j.Add("wire_bytes", s.wire_bytes);
  return WriteFileAtomic(path, j.str() + "\n");
}

}  // namespace

absl::StatusOr<TrainSummary> RunTraining(const Config& config_in, const TrainerOptions& opts) {
  Config config = config_in;
  const int cores = opts.cores > 0 ? opts.cores : DetectCpuBudget().cpus;
  const std::string thread_note =
      ResolveThreadDefaults(cores, config.mutable_threads(), opts.omp_num_threads);
  const int T = config.threads().towers();
  const int I = config.threads().intra_op_threads();
  const int J = config.threads().inter_op_threads();
  const int B = config.train().batch_size();
  const std::string model_dir = config.train().model_dir();
  const std::string ckpt_dir = JobCheckpointDir(config);
  RETURN_IF_ERROR(MakeDirs(model_dir));

  ASSIGN_OR_RETURN(FeatureSpec spec, FeatureSpec::Create(config.features()));
  ASSIGN_OR_RETURN(auto model, Model::Create(config.model(), spec.num_fields()));
  // Local parameters (with checkpoints) unless the caller brings its own.
  const bool async_local = opts.params == nullptr && config.train().async_local_updates();
  const bool prefetch_pulls = opts.prefetch_pulls || async_local;
  std::unique_ptr<LocalParams> local;
  std::unique_ptr<LocalCheckpointer> local_checkpointer;
  ParameterAccess* params = opts.params;
  Checkpointer* checkpointer = opts.checkpointer;
  if (params == nullptr) {
    // Asynchronous updates keep the optimizer and the gather off the towers' cores' OpenMP
    // teams: one thread each, overlapping the towers.
    ASSIGN_OR_RETURN(local, LocalParams::Create(*model, spec.total_rows(), config,
                                                async_local ? 1 : T * I));
    if (async_local) local->EnableBackgroundPush();
    params = local.get();
    local_checkpointer = std::make_unique<LocalCheckpointer>(ckpt_dir, local.get(),
                                                             config.checkpoint().keep());
    checkpointer = local_checkpointer.get();
  }
  ASSIGN_OR_RETURN(auto progress, ProgressReporter::Create(model_dir, opts.tty));
  progress->Message(absl::StrFormat(
      "pstrain %s: %s %s k=%d, %d fields (%d rows), towers=%d intra_op=%d inter_op=%d, batch %d x "
      "%d%s; isa %s (oneDNN %s), %d cores",
      opts.mode, ModelType_Name(config.model().type()), Precision_Name(config.model().precision()),
      config.model().embedding_dim(), spec.num_fields(), spec.total_rows(), T, I, J, T, B,
      opts.num_workers == 1 ? ""
                            : absl::StrFormat(", worker %d of %d", opts.worker_index,
                                              opts.num_workers),
      IsaName(KernelIsa()), OneDnnIsaName(), cores));
  if (!thread_note.empty()) progress->Message(thread_note);

  // Resume from the latest good checkpoint, if any.
  WorkerState state;
  if (checkpointer != nullptr) {
    ASSIGN_OR_RETURN(std::optional<std::string> restored, checkpointer->Restore(&state));
    if (restored) {
      progress->Message(absl::StrCat("resumed from ", *restored, " at step ", state.step()));
    }
  } else {
    progress->Message("no checkpointer: no checkpoints are written or restored");
  }

  PipelineOptions po =
      OptionsFromConfig(config.data(), /*train=*/true, T * B, opts.worker_index,
                        opts.num_workers, config.train().epochs());
  po.reader_threads = J;
  if (state.has_position()) po.start = state.position();
  ASSIGN_OR_RETURN(auto pipeline, Pipeline::Create(std::move(po), spec));
  ASSIGN_OR_RETURN(auto step_runner, TrainStep::Create(*model, T, B, I));
  step_runner->set_dense_sync_steps(std::max(1, opts.dense_sync_steps));

  const bool have_eval = opts.chief && config.data().eval_size() > 0;
  BackgroundEvaluator background(config, spec, *model, params, /*threads=*/1);

  TrainSummary summary;
  int64_t step = state.step();
  int64_t examples = state.examples();
  int64_t unique_rows = 0;  // this run's steps only (not restored)
  const int64_t first_step = step;
  const int64_t max_steps = config.train().max_steps();
  const int64_t log_every = std::max<int64_t>(1, config.train().log_every_steps());
  const int64_t eval_every = config.train().eval_every_steps();
  const int64_t ckpt_every = config.checkpoint().every_steps();
  const double ckpt_seconds = config.checkpoint().every_seconds();
  const double t_start = Now();
  double t_last_log = t_start, t_last_ckpt = t_start;
  int64_t ex_since_log = 0;
  double loss_since_log = 0;
  int64_t total_steps_estimate = max_steps;
  int64_t epoch = 0, last_epoch = 0;

  auto drain_eval = [&]() -> absl::Status {
    if (auto r = background.Take()) {
      if (!r->ok()) return Annotate(r->status(), "evaluation");
      progress->Eval((*r)->step, (*r)->auc, (*r)->logloss, (*r)->examples, false);
    }
    return absl::OkStatus();
  };
  // Every push is complete and the pipeline's position is right after the last trained batch
  // (the loop below never holds a read-ahead batch when it checkpoints).
  auto checkpoint = [&](bool final) -> absl::Status {
    if (checkpointer == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(step_runner->Flush());
    WorkerState ws;
    ws.set_step(step);
    ws.set_examples(examples);
    *ws.mutable_position() = pipeline->position();
    ASSIGN_OR_RETURN(std::string dir, checkpointer->Save(ws, final));
    if (!dir.empty()) summary.checkpoint = dir;
    t_last_ckpt = Now();
    return absl::OkStatus();
  };

  // Pipelined loop (worker/train/train_step.h): while the towers compute step t, this thread reads
  // batch t+1 from the pipeline, dedups it and, with prefetch_pulls, starts its pull. A step
  // boundary where a checkpoint or a stop must happen has no read-ahead batch: the step before
  // it does not read ahead when that is known in advance (max_steps, the checkpoint schedule),
  // and a stop or checkpoint request that arrives while a batch is read ahead is served after
  // that batch is trained.
  Batch batches[2];
  int64_t batch_epoch[2] = {0, 0};
  int cur = 0;               // batches[cur] is trained next
  bool staged = false;       // batches[cur] is read and staged (a read-ahead batch)
  bool input_done = false;   // the pipeline has no more batches
  bool serve_request = false;  // a checkpoint is wanted at the next boundary without read-ahead
  bool stop_seen = false;
  // Reads the next non-empty batch into *b; false at the end of the input.
  auto read = [&](Batch* b, int64_t* ep) -> absl::StatusOr<bool> {
    while (true) {
      ASSIGN_OR_RETURN(bool more, pipeline->Next(b, ep));
      if (!more || b->size > 0) return more;
    }
  };
  auto stopped = [&]() { return opts.stop != nullptr && opts.stop->load(); };
  while (max_steps == 0 || step < max_steps) {
    const bool stop = stopped();
    stop_seen = stop_seen || stop;
    if (!staged) {
      if (stop) {
        // A synchronous job stops at one common step: train on to it (Checkpointer::StopStep).
        int64_t stop_at = step;
        if (checkpointer != nullptr) {
          ASSIGN_OR_RETURN(stop_at, checkpointer->StopStep(step));
        }
        if (step >= stop_at) {
          summary.preempted = true;
          break;
        }
      }
      if (serve_request || (checkpointer != nullptr && checkpointer->Requested(step))) {
        serve_request = false;
        RETURN_IF_ERROR(checkpoint(false));
        // A stop raised by the round (it ended the job) or by a signal during it: serve it at
        // this boundary, through StopStep (a synchronous job may have to train on to a common
        // step: the other workers were released and go on).
        if (stopped()) continue;
      }
      serve_request = false;
      if (input_done) break;
      ASSIGN_OR_RETURN(bool more, read(&batches[cur], &batch_epoch[cur]));
      if (!more) break;
      RETURN_IF_ERROR(step_runner->Stage(batches[cur], params, prefetch_pulls));
    }
    epoch = batch_epoch[cur];
    if (epoch != last_epoch) {
      // After the first epoch the steps per epoch are known: estimate the total for the ETA.
      if (max_steps == 0 && last_epoch == 0) total_steps_estimate = step * config.train().epochs();
      last_epoch = epoch;
    }
    ++step;
    const double t_step = Now();
    const bool ckpt_due = opts.chief && ((ckpt_every > 0 && step % ckpt_every == 0) ||
                                         (ckpt_seconds > 0 && t_step - t_last_ckpt > ckpt_seconds));
    // A checkpoint wanted at the boundary after this step (another worker's round) needs that
    // boundary without a read-ahead batch. Asked before the step trains: with BOUNDED / SYNC the
    // round's target leaves a step of margin for exactly this (worker/ps_client/ps_checkpoint.h).
    serve_request = serve_request || (checkpointer != nullptr && checkpointer->Requested(step));
    const bool read_ahead = !(max_steps > 0 && step >= max_steps) && !ckpt_due && !stop_seen &&
                            !serve_request;
    const int next = 1 - cur;
    bool next_staged = false;
    auto stage_next = [&]() -> absl::Status {
      if (!read_ahead) return absl::OkStatus();
      ASSIGN_OR_RETURN(bool more, read(&batches[next], &batch_epoch[next]));
      if (!more) {
        input_done = true;
        return absl::OkStatus();
      }
      RETURN_IF_ERROR(step_runner->Stage(batches[next], params, prefetch_pulls));
      next_staged = true;
      return absl::OkStatus();
    };
    ASSIGN_OR_RETURN(StepResult r, step_runner->Train(step, params, stage_next));
    cur = next;
    staged = next_staged;
    examples += r.examples;
    unique_rows += r.unique_rows;
    ex_since_log += r.examples;
    loss_since_log += r.loss_sum;

    const double now = Now();
    if (step % log_every == 0 || (opts.tty && now - t_last_log > 0.5)) {
      progress->Train(step, epoch, loss_since_log / std::max<int64_t>(1, ex_since_log),
                      ex_since_log / std::max(1e-9, now - t_last_log), total_steps_estimate,
                      now - t_start);
      t_last_log = now;
      ex_since_log = 0;
      loss_since_log = 0;
    }
    RETURN_IF_ERROR(drain_eval());
    if (have_eval && eval_every > 0 && step % eval_every == 0) {
      // The evaluation should see this step's update.
      RETURN_IF_ERROR(step_runner->Flush());
      background.Start(step);
    }
    if (ckpt_due) RETURN_IF_ERROR(checkpoint(false));
  }
  PSTRAIN_CHECK(!staged) << "a read-ahead batch was left untrained";
  RETURN_IF_ERROR(step_runner->Flush());
  const double train_seconds = Now() - t_start;
  background.Wait();
  RETURN_IF_ERROR(drain_eval());

  summary.steps = step;
  summary.unique_rows_per_step =
      step > first_step ? static_cast<double>(unique_rows) / (step - first_step) : 0;
  summary.row_dim = params->row_dim();
  summary.dense_params = params->dense_size();
  summary.examples = examples;
  summary.wall_seconds = train_seconds;
  summary.examples_this_run = examples - state.examples();
  summary.examples_per_sec = train_seconds > 0 ? summary.examples_this_run / train_seconds : 0;
  summary.bad_records = static_cast<int64_t>(pipeline->stats().bad_records);
  RETURN_IF_ERROR(checkpoint(/*final=*/!summary.preempted));
  if (checkpointer != nullptr) {
    progress->Message(absl::StrCat(summary.preempted ? "stopped by SIGTERM; " : "",
                                   "checkpoint written: ", summary.checkpoint));
  } else if (summary.preempted) {
    progress->Message("stopped by a signal; no checkpointer, so nothing was saved");
  }
  const StepProfile& prof = step_runner->profile();
  progress->Message(absl::StrFormat(
      "step time: dedup %.1f%%  pull %.1f%%  towers %.1f%%  reduce %.1f%%  push %.1f%%",
      100 * prof.dedup / train_seconds, 100 * prof.pull / train_seconds,
      100 * prof.compute / train_seconds, 100 * prof.reduce / train_seconds,
      100 * prof.push / train_seconds));

  if (opts.after_training && !summary.preempted) {
    RETURN_IF_ERROR(opts.after_training(&summary));
  }

  summary.test_auc = std::nan("");
  summary.test_logloss = std::nan("");
  if (have_eval && !summary.preempted) {
    ASSIGN_OR_RETURN(EvalResult e, Evaluate(config, spec, *model, params, step, T * I));
    summary.test_auc = e.auc;
    summary.test_logloss = e.logloss;
    summary.eval_examples = e.examples;
    progress->Eval(step, e.auc, e.logloss, e.examples, true);
  }
  progress->Flush();
  if (!opts.chief) return summary;
  RETURN_IF_ERROR(WriteSummary(model_dir + "/summary.json", summary, config, opts));
  progress->Message(absl::StrFormat(
      "done: %d steps, %d examples in %.1f s (%.0f ex/s), test auc %.5f logloss %.5f -> %s",
      summary.steps, summary.examples, summary.wall_seconds, summary.examples_per_sec,
      summary.test_auc, summary.test_logloss, model_dir + "/summary.json"));
  return summary;
}

}  // namespace pstrain
