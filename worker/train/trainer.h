// Training of one worker: the data pipeline feeds TrainStep (T towers) against the parameters;
// evaluation runs beside training on its own thread; progress, metrics, TensorBoard events,
// checkpoints and summary.json go to the model dir.
//   - `pstrain train`: in-process parameter stores (LocalParams), one worker, checkpoints.
//   - `pstrain host`: external parameters (a PsClient over the PS shards), worker i of N reading
//     its share of the train channels; only the chief evaluates and writes summary.json.
// Checkpoints go through a Checkpointer (worker/train/checkpoint.h) chosen by the caller.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/store/store_memory.h"
#include "pstrain/config.pb.h"
#include "worker/params/params.h"
#include "worker/train/checkpoint.h"
#include "worker/train/progress.h"
#include "common/env.h"
#include "worker/train/job_control.h"

namespace pstrain {

struct TrainSummary {
  double test_auc = 0, test_logloss = 0;
  int64_t eval_examples = 0;
  double examples_per_sec = 0;
  // Of this training pass (worker/train/data_pass.h): since the job began, or since the new pass
  // over new data began; a resumed run counts the pass's earlier runs.
  int64_t examples = 0, steps = 0;
  int64_t examples_this_run = 0;  // trained by this process
  int64_t pass_first_step = 0;    // this worker's step when the pass began
  // The restored pass had finished and nothing was trained, evaluated or written to summary.json.
  bool nothing_to_do = false;
  double wall_seconds = 0;
  int64_t bad_records = 0;
  // Sizes for traffic models (bench/compare): mean unique embedding rows per step of this
  // worker (over the steps of this run), floats per row, floats of the dense vector.
  double unique_rows_per_step = 0;
  int row_dim = 0;
  int64_t dense_params = 0;
  bool preempted = false;  // stopped by SIGTERM after writing a checkpoint
  // train.early_stopping ended the pass (every worker; the pass is finished, not preempted).
  bool stopped_early = false;
  // The chief's periodic evaluations by train.early_stopping.metric (when there was one): the
  // best value, the step of its evaluation, and with checkpoint.keep_best the checkpoint marked
  // BEST by this run ("" if none).
  std::string early_stopping_metric;
  double best_value = 0;
  int64_t best_step = 0;
  std::string best_checkpoint;
  std::string checkpoint;  // path of the last checkpoint written, if any
  // PS training: steps ahead of the slowest worker seen by the training pulls (PsClient
  // staleness), over all workers. Written to summary.json when staleness_pulls > 0.
  int64_t staleness_pulls = 0;
  int64_t staleness_max = 0;
  double staleness_mean = 0;
  // PS training: the factor the shards put on the sparse learning rates for the workers' shares
  // of the global batch (common/config.h SparseLrShareFactor); summary.json
  // "sparse_lr_factor" when it is not 1.
  double sparse_lr_factor = 1;
  // Bytes all workers sent for parameter traffic (allreduce: the collectives, by the ring model
  // of docs/ALLREDUCE.md), set by after_training; -1 (omitted from summary.json) when the mode
  // does not count them.
  int64_t wire_bytes = -1;
  // The parameter memory of each part that holds parameters, at the end of training: one entry
  // for `train` (memory_per "process"), one per PS shard in shard order ("shard"), one per
  // allreduce rank ("rank", each a full replica). summary.json "memory"; empty: omitted.
  std::string memory_per;
  std::vector<StoreMemory> memory;
  // `train`'s dynamic tables at the end of training (summary.json "dynamic_tables", by name);
  // empty: omitted.
  std::vector<DynamicTableMetrics> dynamic_tables;
  // PS training: the workers' restarts by their hosts' supervisors (`--max_restarts`), one line
  // each; written to summary.json as "restarts" and "restart_log" when there were any.
  std::vector<std::string> restart_log;
};

struct TrainerOptions {
  int cores = 0;            // CPUs the automatic thread settings divide; 0 = DetectCpuBudget()
  int omp_num_threads = 0;  // OMP_NUM_THREADS from the launcher (caps intra_op); 0 = unset
  bool tty = false;                          // progress line in place
  const std::atomic<bool>* stop = nullptr;   // set by a SIGTERM handler: checkpoint and stop

  // Parameters to train (not owned; must outlive RunTraining). Null = in-process LocalParams
  // with a LocalCheckpointer (checkpoints and resume in checkpoint.dir or the model dir).
  ParameterAccess* params = nullptr;
  // The in-process replica behind `params` when it has one (`pstrain allreduce`: every rank's
  // LocalParams; not owned). Its dynamic tables are handled as `pstrain train`'s own: the pass
  // set after Resume, their counters in the metrics and summary.json.
  LocalParams* replica = nullptr;
  // How to checkpoint `params` when it is not null (not owned). Null: no checkpoints
  // (summary.checkpoint stays "").
  Checkpointer* checkpointer = nullptr;
  // The job this worker trains in (not owned): its stops, checkpoint requests and pass end
  // (worker/train/job_control.h). Null: a LocalJob of `stop`.
  JobControl* job = nullptr;
  // The training loop's clock (timings, checkpoint.every_seconds). Null: Env::Default().
  Env* env = nullptr;
  // Start the next batch's pull while the current step computes, before its push: asynchronous
  // SGD that reads rows one step stale (PS ASYNC mode). False: each pull follows the previous
  // push (read-after-write; `pstrain train` stays bit-exact). Data reading and dedup run ahead
  // either way (docs/ARCHITECTURE.md, "The pipelined step").
  bool prefetch_pulls = false;
  // Pull the dense vector and push its gradient every k steps (TrainStep::set_dense_sync_steps;
  // PS ASYNC mode's cluster.dense_sync_steps). 1: every step.
  int dense_sync_steps = 1;
  int worker_index = 0;  // this worker's shard of the train channels (Pipeline shard_index)
  int num_workers = 1;   // Pipeline num_shards of the train channels
  // Only the chief evaluates (periodically and at the end), writes summary.json and prints the
  // final summary line.
  bool chief = true;
  std::string mode = "train";  // summary.json "mode" ("ps-async" for PS training)
  int hosts = 1;               // summary.json "hosts"
  // Run by every worker after its last step (not when stopped by `stop`) and before the chief's
  // final evaluation, with this worker's summary so far (steps, examples, examples_per_sec,
  // wall_seconds). It may wait for the other workers (an end-of-job barrier) and may replace
  // examples / examples_per_sec with the whole job's totals. An error ends RunTraining with it.
  std::function<absl::Status(TrainSummary*)> after_training;
  // The dynamic tables' counters when `params` is not null (a PS job's chief: the shards'
  // ShardStats summed), for metrics.jsonl, TensorBoard and Prometheus at each logged step, as
  // `pstrain train` records its own; the summary.json dynamic_tables that after_training sets are
  // recorded once more after it (the final checkpoint's pass end). Null: none (every other
  // worker). An empty answer (the shards did not answer) records nothing.
  std::function<std::vector<DynamicTableMetrics>()> dynamic_metrics;
};

// Runs the job described by `config` (validated) for this worker. The chief writes
// <model_dir>/summary.json. A step whose loss is NaN or infinite ends the run with
// FAILED_PRECONDITION "training diverged at step N: loss is nan (last good checkpoint: DIR)";
// nothing is saved after it, so LATEST keeps naming the last checkpoint written before it
// (worker/train/train_loop.h). The step loop is TrainLoop (worker/train/train_loop.h).
absl::StatusOr<TrainSummary> RunTraining(const Config& config, const TrainerOptions& options);

}  // namespace pstrain
