// `pstrain worker`: worker j of M of an asynchronous PS job whose shards run elsewhere
// (`pstrain ps`, one per PS host, or the shards of `pstrain host` processes). It trains its share
// of the data against all the shards; worker 0 is the chief (checkpoints, evaluation,
// summary.json). docs/PS.md "Separate PS and worker processes".

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/cluster_security.h"
#include "cmd/cluster_spec.h"
#include "cmd/commands.h"
#include "cmd/ps_setup.h"
#include "cmd/launcher.h"
#include "cmd/stop_signal.h"
#include "cmd/worker_supervisor.h"
#include "common/flags.h"
#include "common/rpc/security.h"
#include "common/status.h"
#include "worker/ps_client/ps_worker.h"
#include "worker/ps_client/shard_rpc.h"

namespace pstrain {
namespace {

constexpr char kCommand[] = "worker";

struct WorkerFlags {
  TrainingFlags training;
  std::string ps;
  int index = -1, num_workers = 0, connect_timeout_s = 120, barrier_timeout_s = 3600, cores = 0;
  int stop_grace_s = 300, max_restarts = 0;
  std::string log_dir_prefix = "worker";
};

void AddWorkerFlags(FlagSet* flags, WorkerFlags* f) {
  AddTrainingFlags(flags, &f->training);
  flags->Int("max_restarts", &f->max_restarts,
             "ASYNC: run the worker as a child process and restart it up to this many times when "
             "it dies (as torchrun's agent); it resumes from the job's last checkpoint and "
             "rejoins while the other workers train on (docs/PS.md \"Recovery\")");
  flags->String("log_dir_prefix", &f->log_dir_prefix,
                "worker j > 0 logs to <model_dir>/<log_dir_prefix>-<j>/ (`pstrain host` passes "
                "\"host\" for the worker it supervises)");
  flags->Int("stop_grace_s", &f->stop_grace_s,
             "after SIGTERM / SIGINT, seconds the worker may take to checkpoint and stop before "
             "it exits anyway (code 124)");
  flags->String("ps", &f->ps, "PS shard addresses host:port, comma-separated, shard 0 first");
  flags->Int("index", &f->index, "this worker's index j in [0, num_workers)");
  flags->Int("num_workers", &f->num_workers, "workers of the job");
  flags->Int("cores", &f->cores,
             "cores the automatic thread settings divide (0 = the CPUs this process may use: its "
             "affinity mask capped by the cgroup CPU quota)");
  flags->Int("connect_timeout_s", &f->connect_timeout_s,
             "how long to wait for all shards to be up");
  flags->Int("barrier_timeout_s", &f->barrier_timeout_s,
             "how long the end-of-job and checkpoint waits may take");
}

// A Kubeflow chief or worker pod: TF_CONFIG gives the shards, the index and the worker count
// when the flags do not (cmd/cluster_spec.h). Sets *evaluator for an evaluator task.
absl::Status ApplyWorkerTask(WorkerFlags* f, bool* evaluator) {
  *evaluator = false;
  if (!f->ps.empty() || f->index >= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const auto env, ReadClusterEnvironment(""));
  ASSIGN_OR_RETURN(const std::optional<WorkerTask> task, WorkerTaskFromEnvironment(env));
  if (!task) return absl::OkStatus();
  *evaluator = task->evaluator;
  f->ps = absl::StrJoin(task->ps, ",");
  f->index = task->index;
  if (f->num_workers == 0) f->num_workers = task->num_workers;
  return absl::OkStatus();
}

// The shards, index and worker count are usable: INVALID_ARGUMENT naming the flag otherwise.
absl::Status CheckWorkerFlags(const WorkerFlags& f) {
  if (f.ps.empty()) {
    return absl::InvalidArgumentError("--ps: expected the shard addresses host:port,... (or "
                                      "TF_CONFIG)");
  }
  if (f.num_workers < 1 || f.index < 0 || f.index >= f.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--index and --num_workers: expected 0 <= index < num_workers, got ",
                     f.index, " and ", f.num_workers));
  }
  return absl::OkStatus();
}

PsWorkerOptions WorkerOptions(const WorkerFlags& f, const RpcSecurity& security,
                              const std::optional<CheckpointChoice>& restored) {
  PsWorkerOptions wo;
  wo.index = f.index;
  wo.num_workers = f.num_workers;
  wo.shards = absl::StrSplit(f.ps, ',');
  wo.log_dir_prefix = f.log_dir_prefix;
  if (const char* log = std::getenv(kRestartLogEnv); log != nullptr) {
    wo.restart_log = absl::StrSplit(log, '\n', absl::SkipEmpty());
  }
  wo.cores = f.cores;
  wo.omp_num_threads = Launch().omp_num_threads;
  wo.connect_timeout = absl::Seconds(f.connect_timeout_s);
  wo.barrier_timeout = absl::Seconds(f.barrier_timeout_s);
  wo.security = security;
  wo.restored = restored;
  return wo;
}

// This process as the worker's agent: the worker runs (and is restarted) as its child. It only
// asks shard 0 for the job's state: small answers, while `security` leaves the message cap (0)
// to RunPsWorker, which computes it from the model.
int SuperviseThisWorker(const WorkerFlags& f, const PsWorkerOptions& wo, RpcSecurity security,
                        const Config& config, StopSignals* signals, int argc, char** argv) {
  security.max_message_bytes = kDefaultMaxMessageBytes;
  ShardRpc shard_zero(wo.shards[0], security);
  const WorkerSupervisor::Result run = SuperviseWorker(
      kCommand, f.index, f.max_restarts,
      ForwardedArgs(argc, argv, {"max_restarts", "metrics_port", "metrics_bind"}),
      JobCheckpointDir(config), signals, &shard_zero);
  return Succeeded(run) ? 0 : 1;
}

}  // namespace

int RunWorker(int argc, char** argv) {
  FlagSet flags(
      kCommand,
      "Runs worker --index of --num_workers of an asynchronous PS job against the shards of "
      "--ps (shard 0 first; it coordinates the job). Worker 0 is the chief: it writes the "
      "checkpoints (into checkpoint.dir, default the model dir, shared by every process), "
      "evaluates and writes <model_dir>/summary.json; worker j > 0 logs to "
      "<model_dir>/worker-<j>/. The shards must hold the same model (start `pstrain ps` with the "
      "same config and --model_dir, so that they resume from the same checkpoint).\nSIGTERM or "
      "Ctrl-C during training writes a checkpoint of the whole job and exits 0.\nWithout --ps and "
      "--index, TF_CONFIG's chief/master/worker task gives them (a Kubeflow worker pod; the "
      "chief is worker 0).");
  WorkerFlags f;
  AddWorkerFlags(&flags, &f);
  Config config;
  if (auto code = ParseTrainingCommand(kCommand, argc, argv, &flags, f.training, &config)) {
    return *code;
  }
  if (config.data().train_size() == 0) {
    return CommandError(kCommand, "no training data: pass --train PATH or set data.train", 2);
  }
  bool evaluator = false;
  if (absl::Status s = ApplyWorkerTask(&f, &evaluator); !s.ok()) {
    return CommandError(kCommand, s.message(), 2);
  }
  if (evaluator) {
    std::printf("pstrain worker: TF_CONFIG task is an evaluator: the chief evaluates in "
                "pstrain, nothing to do here\n");
    return 0;
  }
  if (absl::Status s = CheckWorkerFlags(f); !s.ok()) return CommandError(kCommand, s.message(), 2);
  auto choice = ChooseJobCheckpoint(config);
  if (!choice.ok()) return CommandError(kCommand, choice.status().ToString(), 1);
  // max_message_bytes 0: RunPsWorker computes it from the config.
  auto security = ClusterSecurity(config, SecretEnvironment(), "", 0);
  if (!security.ok()) return CommandError(kCommand, security.status().ToString(), 2);
  PsWorkerOptions wo = WorkerOptions(f, *security, *choice);
  SetStopGrace(f.stop_grace_s);
  StopSignals& signals = InstallStopSignals();
  signals.served = true;  // a stop while connecting is served at the first step boundary
  if (f.max_restarts > 0 && config.cluster().consistency() == ASYNC) {
    return SuperviseThisWorker(f, wo, *security, config, &signals, argc, argv);
  }
  wo.stop = &signals.stop;
  wo.on_failure = [](const absl::Status& why) { ExitSoonAfterFailure(kCommand, why); };
  wo.training = &signals.served;
  auto summary = RunPsWorker(config, wo);
  if (!summary.ok()) return CommandError(kCommand, summary.status().ToString(), 1);
  if (summary->preempted) {
    std::fprintf(stderr, "pstrain worker: worker %d stopped by a signal; checkpoint %s\n",
                 f.index,
                 summary->checkpoint.empty() ? "(written by the chief)"
                                             : summary->checkpoint.c_str());
  }
  return 0;
}

}  // namespace pstrain
