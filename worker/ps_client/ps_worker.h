// The worker role of PS training, shared by `pstrain host` (a shard and a worker in one process)
// and `pstrain worker` (a worker alone, against `pstrain ps` shards): connect a PsClient to the
// shards, train this worker's share of the data with RunTraining and a PsJob (the job's control
// and checkpoints, worker/ps_client/ps_job.h), and run the worker's half of the end-of-job
// protocol (docs/PS.md "End of job"; PsJob's calls):
//   1. after its last step the worker flushes its pushes and reports TRAINING_DONE (examples,
//      steps, final WorkerState) to shard 0;
//   2. the chief (worker 0) waits for all the reports, writes the job's final checkpoint,
//      evaluates, writes summary.json with the whole job's counts, prints the shards' load
//      balance and marks the job finished on shard 0.
// What happens to the shards afterwards is the caller's business (a host's: AwaitJobEnd).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/security.h"
#include "pstrain/config.pb.h"
#include "worker/ps_client/local_shard.h"
#include "worker/train/checkpoint.h"
#include "worker/train/trainer.h"

namespace pstrain {

struct PsWorkerOptions {
  int index = 0;        // this worker; 0 is the chief
  int num_workers = 1;  // workers of the job (== shards for `pstrain host`)
  std::vector<std::string> shards;  // every shard's "host:port", shard 0 first
  // Worker i > 0 logs to <model_dir>/<log_dir_prefix>-<i>/ ("host" or "worker").
  std::string log_dir_prefix = "worker";
  int cores = 0;            // TrainerOptions::cores
  int omp_num_threads = 0;  // TrainerOptions::omp_num_threads
  absl::Duration connect_timeout = absl::Seconds(120);
  absl::Duration barrier_timeout = absl::Hours(1);
  // The checkpoint the job resumes from (every process picks the same: ChooseCheckpoint).
  std::optional<CheckpointChoice> restored;
  std::atomic<bool>* stop = nullptr;      // raised by SIGTERM / SIGINT, and by a stopping round
  std::atomic<bool>* training = nullptr;  // set while the step loop runs (for signal handlers)
  // The shard this process serves, if any (`pstrain host`): PsClient::Options::local_server.
  int local_shard = -1;
  LocalShard* local_server = nullptr;
  // The cluster secret, TLS and message cap of every call (cmd/ reads them: a file, the
  // environment, `pstrain local`'s per-job secret). max_message_bytes 0 = MaxMessageBytes of the
  // config.
  RpcSecurity security;
  // Worker i's host for messages (`pstrain host`: host i of the cluster spec), or empty.
  std::vector<std::string> worker_hosts;
  // PsJob::Options::on_failure: this worker must stop (a lost peer, an unreachable
  // shard 0, the job failed).
  std::function<void(const absl::Status&)> on_failure;
  // This worker's restarts so far (cmd/worker_supervisor.h), reported with TRAINING_DONE.
  std::vector<std::string> restart_log;
};

// Runs the worker role. `config` is validated, with the job's model dir (this function derives
// a non-chief's log dir). Returns the summary (preempted when a round stopped the job).
absl::StatusOr<TrainSummary> RunPsWorker(Config config, const PsWorkerOptions& options);

}  // namespace pstrain
