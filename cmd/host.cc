// `pstrain host`: one process per host running both roles of asynchronous PS training: PS shard i
// of N (in-process ShardServer) and worker i, training its share of the data against a PsClient
// connected to all N shards (worker/ps_client/ps_worker.h, shared with `pstrain worker`). Worker 0 is the
// chief. End of job (docs/PS.md):
//   1. every worker, after its last step, flushes its pushes and reports TRAINING_DONE to shard 0;
//   2. the chief waits (bounded) for all N reports, evaluates, writes summary.json with the
//      whole job's example count, prints the shards' load balance and sets job_finished on
//      shard 0;
//   3. every other host long-polls shard 0's Info (bounded) until job_finished, reports
//      FINISH_SEEN and shuts its shard down; the chief waits (bounded) for those reports before
//      shutting shard 0 down, so no worker loses a shard while it still needs one. The shutdown
//      is bounded too (ShutDownShard), on every way out.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/cluster_security.h"
#include "cmd/cluster_spec.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/ps_setup.h"
#include "cmd/sagemaker.h"
#include "cmd/served_shard.h"
#include "cmd/stop_signal.h"
#include "cmd/worker_supervisor.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"
#include "ps/server/shard_server.h"
#include "worker/ps_client/ps_job.h"
#include "worker/ps_client/ps_worker.h"
#include "worker/ps_client/shard_rpc.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

// Exit code of a host whose shard could not listen on its port (`pstrain local` then retries
// the whole cluster on fresh ports).
constexpr int kExitCannotListen = 3;

// The flags of `pstrain host` that its supervised `pstrain worker` does not take (the metrics
// endpoint stays with the host's shard).
const std::vector<std::string> kHostOnlyFlags = {
    "cluster", "index", "resource_config", "default_port", "bind", "ps_threads", "max_restarts",
    "metrics_port", "metrics_bind"};

// How long the shard's shutdown may take once the host's work is done (ShutDownShard).
constexpr absl::Duration kShardShutdownLimit = absl::Seconds(30);

// Stops the shard, the host's last wait: its calls get `grace` to finish, then gRPC cancels them.
// Every other wait of the end of the job has its own bound (the job_finished wait
// --barrier_timeout_s and, for a silent shard 0, the lease; FINISH_SEEN 60 s; a report the
// ShardRpc budget), but gRPC 1.51's Server::Shutdown then waits without one: for every callback
// reactor to be done (UnrefAndWaitLocked) and for the core's shutdown, i.e. every connection gone
// (the shutdown tag); before HoldCallbackQueue, as the process's last callback-queue user, also
// for the queue's threads to drain it. A host reaches it also on ways out that no stopped worker
// bounded (its worker's own error, a job error, a normal end: ExitSoonAfterFailure covers only a
// worker that must stop). So this wait gets a bound of its own: if the shutdown has not returned
// after kShardShutdownLimit, the process says so on stderr and exits with `code`, the code it was
// about to return.
void ShutDownShard(ShardServer* server, absl::Duration grace, int me, int code) {
  absl::Notification done;
  std::thread watchdog([&done, me, code] {
    if (done.WaitForNotificationWithTimeout(kShardShutdownLimit)) return;
    std::fprintf(stderr,
                 "pstrain host: host %d: its shard did not shut down within %s (a call that "
                 "never ended?); exiting with code %d\n",
                 me, absl::FormatDuration(kShardShutdownLimit).c_str(), code);
    std::fflush(stderr);
    _exit(code);
  });
  server->Shutdown(grace);
  done.Notify();
  watchdog.join();
}

constexpr char kCommand[] = "host";

struct HostFlags {
  TrainingFlags training;
  std::string cluster, bind = "127.0.0.1", resource_config;
  int default_port = kDefaultPsPort;
  int index = -1, ps_threads = 1, connect_timeout_s = 120, barrier_timeout_s = 3600, cores = 0;
  int stop_grace_s = 300, max_restarts = 0;
};

void AddHostFlags(FlagSet* flags, HostFlags* f) {
  AddTrainingFlags(flags, &f->training);
  f->resource_config = SageMakerPath(kSageMakerResourceConfig);
  flags->Int("max_restarts", &f->max_restarts,
             "ASYNC: run the worker as a child process and restart it up to this many times when "
             "it dies, while the shard (and the other hosts) go on; it resumes from the job's "
             "last checkpoint (docs/PS.md \"Recovery\"). BOUNDED / SYNC cannot wait for a "
             "restarted worker: there the worker runs in this process and its failure ends the "
             "host");
  flags->String("cluster", &f->cluster,
                "PS shard addresses host:port of hosts 0..N-1, comma-separated");
  flags->Int("index", &f->index, "this host's index in --cluster (-1 = from the environment)");
  flags->String("resource_config", &f->resource_config,
                "SageMaker's resource config, read when present (after SM_HOSTS in the order)");
  flags->Int("default_port", &f->default_port,
             "PS port of hosts named without one (SageMaker's host names, bare --cluster names)");
  flags->String("bind", &f->bind,
                "address the shard listens on (its port is from the cluster spec); default "
                "loopback only. Another address (e.g. 0.0.0.0 for a multi-host job) needs the "
                "cluster secret in cluster.secret_file or PSTRAIN_CLUSTER_SECRET");
  flags->Int("stop_grace_s", &f->stop_grace_s,
             "after SIGTERM / SIGINT, seconds the host may take to checkpoint and stop before it "
             "exits anyway (code 124)");
  flags->Int("ps_threads", &f->ps_threads, "OpenMP threads per PS request");
  flags->Int("cores", &f->cores,
             "cores this host's automatic thread settings divide (0 = the CPUs this process may "
             "use: its affinity mask capped by the cgroup CPU quota; "
             "`local` passes its share when several hosts share one machine)");
  flags->Int("connect_timeout_s", &f->connect_timeout_s,
             "how long to wait for all shards to be up");
  flags->Int("barrier_timeout_s", &f->barrier_timeout_s,
             "how long the end-of-job waits may take (the slowest worker, the chief's "
             "evaluation)");
}

// This host's shard and what the worker needs of it. Created by CreateShard, which restores the
// job's checkpoint into it; started later (after the stop signals are installed).
struct HostShard {
  std::unique_ptr<ShardServer> server;
  RpcSecurity security;
  std::optional<CheckpointChoice> restored;
  int64_t rows = 0;  // the table's shape, for the log
  int row_dim = 0;
  int64_t dense_size = 0;
};

// The shard of host `spec.index`, restored. On failure *code is the exit code: 2 for a config or
// security error (reported by its message), 1 for a checkpoint that cannot be restored (by its
// status).
absl::StatusOr<HostShard> CreateShard(const Config& config, const ClusterSpec& spec,
                                      const HostFlags& f, int* code) {
  const int me = spec.index;
  const std::string& my_address = spec.hosts[me];
  *code = 2;
  ASSIGN_OR_RETURN(ShardServer::Options options,
                   ShardOptionsForJob(config, me, static_cast<int>(spec.hosts.size())));
  options.data.threads = f.ps_threads;
  options.data.checkpoint_dir = JobCheckpointDir(config);
  HostShard shard;
  absl::StatusOr<RpcSecurity> security = ClusterSecurity(config, SecretEnvironment(), f.bind,
                                                         options.security.max_message_bytes);
  // Reported with its code, as the checkpoint errors below.
  if (!security.ok()) return absl::Status(security.status().code(), security.status().ToString());
  shard.security = *security;
  options.security = shard.security;
  shard.rows = options.data.rows;
  shard.row_dim = options.data.row_dim;
  shard.dense_size = options.data.dense_size;
  if (IsLoopbackAddress(f.bind) && !IsLoopbackAddress(my_address)) {
    PSTRAIN_LOG(WARNING) << "host " << me << " listens on " << f.bind << " only, but the cluster "
                         << "spec names it " << my_address << ": the other hosts cannot reach "
                         << "its shard; pass --bind 0.0.0.0 (or its address) and a cluster secret";
  }
  ASSIGN_OR_RETURN(shard.server, ShardServer::Create(std::move(options)));
  // Resume: every host picks the same checkpoint (the same verification of the same files).
  *code = 1;
  ASSIGN_OR_RETURN(shard.restored, ChooseJobCheckpoint(config));
  RETURN_IF_ERROR(RestoreShard(config, shard.restored, me, shard.server.get()));
  return shard;
}

// The worker as a supervised child process (cmd/worker_supervisor.h): the shard stays up while a
// dead worker is restarted. Its calls to this shard go over loopback TCP. The worker's failure,
// naming the last good checkpoint, or OK with *preempted.
absl::Status SuperviseHostWorker(const Config& config, const ClusterSpec& spec,
                                 const HostFlags& f, StopSignals* signals, ShardRpc* shard_zero,
                                 int argc, char** argv, bool* preempted) {
  const int me = spec.index;
  std::vector<std::string> args = ForwardedArgs(argc, argv, kHostOnlyFlags);
  args.push_back("--ps=" + absl::StrJoin(spec.hosts, ","));
  args.push_back(absl::StrCat("--index=", me));
  args.push_back(absl::StrCat("--num_workers=", spec.hosts.size()));
  args.push_back("--log_dir_prefix=host");
  if (!Succeeded(SuperviseWorker(kCommand, me, f.max_restarts, args, JobCheckpointDir(config),
                                 signals, shard_zero))) {
    return absl::AbortedError(absl::StrCat("host ", me,
                                           ": its worker failed; last good checkpoint: ",
                                           LatestPathOr(JobCheckpointDir(config), "none")));
  }
  *preempted = signals->stop.load();
  return absl::OkStatus();
}

// The worker in this process, against the shards (its own shard by direct calls). Its error (the
// message: the error as text), or OK with *preempted.
absl::Status RunWorkerHere(const Config& config, const ClusterSpec& spec, const HostFlags& f,
                           HostShard* shard, StopSignals* signals, bool* preempted) {
  const int me = spec.index;
  if (f.max_restarts > 0) {
    PSTRAIN_LOG(INFO) << "host " << me << ": --max_restarts restarts the worker in ASYNC only: "
                      << Consistency_Name(config.cluster().consistency())
                      << " cannot wait for a restarted worker (its failure ends this host; "
                      << "`pstrain local --max_restarts` restarts the whole job)";
  }
  PsWorkerOptions wo;
  wo.index = me;
  wo.num_workers = static_cast<int>(spec.hosts.size());
  wo.shards = spec.hosts;
  wo.log_dir_prefix = "host";
  wo.cores = f.cores;
  wo.omp_num_threads = Launch().omp_num_threads;
  wo.connect_timeout = absl::Seconds(f.connect_timeout_s);
  wo.barrier_timeout = absl::Seconds(f.barrier_timeout_s);
  wo.restored = shard->restored;
  wo.stop = &signals->stop;
  wo.on_failure = [](const absl::Status& why) { ExitSoonAfterFailure(kCommand, why); };
  wo.training = &signals->served;
  wo.local_shard = me;
  ServedShard served(shard->server.get());
  wo.local_server = &served;
  wo.security = shard->security;
  wo.worker_hosts = spec.hosts;
  const absl::StatusOr<TrainSummary> run = RunPsWorker(config, wo);
  if (!run.ok()) return absl::Status(run.status().code(), run.status().ToString());
  const TrainSummary& summary = *run;
  *preempted = summary.preempted;
  if (*preempted) {
    std::fprintf(stderr,
                 "pstrain host: host %d stopped by a signal at step %lld; checkpoint %s; run the "
                 "same command to resume\n",
                 me, static_cast<long long>(summary.steps),
                 summary.checkpoint.empty() ? "(written by the chief)"
                                            : summary.checkpoint.c_str());
  }
  return absl::OkStatus();
}

// Starts `server` on --bind at the port the cluster spec gives this host's `address` (an IPv6
// bind address bracketed: ShardServer::ListenAddress).
absl::Status StartShard(ShardServer* server, const std::string& bind, const std::string& address) {
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("cluster spec: no port in ", address));
  }
  return server->Start(ShardServer::ListenAddress(bind, port));
}

// The end of a host that failed: its shard goes down (bounded), the error is reported.
int FailHost(ShardServer* server, int me, absl::string_view message) {
  ShutDownShard(server, absl::Seconds(1), me, 1);
  return CommandError(kCommand, message, 1);
}

}  // namespace

int RunHost(int argc, char** argv) {
  FlagSet flags(
      kCommand,
      "Runs PS shard i and worker i of an N-host asynchronous PS job (worker 0 is the chief: it "
      "evaluates and writes <model_dir>/summary.json; host i > 0 logs to <model_dir>/host-<i>/).\n"
      "Cluster: --cluster=h1:port,...,hN:port --index=i, else SM_HOSTS / SM_CURRENT_HOST or "
      "--resource_config (port --default_port), else TF_CONFIG (ps task i on the host of worker "
      "i, the chief first; separate PS and worker pods run `pstrain ps` and `pstrain worker`), "
      "else OMPI_COMM_WORLD_RANK/_SIZE with --cluster (docs/PS.md).\nCheckpoints: "
      "ckpt-<step>/shard-<i>-of-<N> in checkpoint.dir (default: the chief's model_dir, which must "
      "be shared by the hosts); a job resumes from LATEST. SIGTERM or Ctrl-C during training "
      "writes a checkpoint of the whole job and exits 0.");
  HostFlags f;
  AddHostFlags(&flags, &f);
  Config config;
  if (auto code = ParseTrainingCommand(kCommand, argc, argv, &flags, f.training, &config)) {
    return *code;
  }
  if (config.data().train_size() == 0) {
    return CommandError(kCommand, "no training data: pass --train PATH or set data.train", 2);
  }
  auto env = ReadClusterEnvironment(f.resource_config);
  if (!env.ok()) return CommandError(kCommand, env.status().ToString(), 2);
  auto spec = ResolveClusterSpec(f.cluster, f.index, *env, f.default_port);
  if (!spec.ok()) return CommandError(kCommand, spec.status().message(), 2);
  if (spec->evaluator) {
    std::printf("pstrain host: TF_CONFIG task is an evaluator: the chief evaluates in pstrain, "
                "nothing to do here\n");
    return 0;
  }
  const int me = spec->index;
  int code = 0;
  absl::StatusOr<HostShard> shard = CreateShard(config, *spec, f, &code);
  if (!shard.ok()) {
    return CommandError(kCommand,
                        code == 2 ? std::string(shard.status().message())
                                  : shard.status().ToString(),
                        code);
  }
  ShardServer* server = shard->server.get();
  // From here on a stop signal is a preemption: the job checkpoints (the other hosts need this
  // shard for it), also if it comes while this host still connects to the others.
  SetStopGrace(f.stop_grace_s);
  StopSignals& signals = InstallStopSignals();
  signals.served = true;
  if (absl::Status s = StartShard(server, f.bind, spec->hosts[me]); !s.ok()) {
    return CommandError(kCommand, s.message(), kExitCannotListen);
  }
  PSTRAIN_LOG(INFO) << "host " << me << "/" << spec->hosts.size() << " (cluster from "
                    << spec->source << "): shard listening on "
                    << ShardServer::ListenAddress(f.bind, server->port())
                    << (shard->security.secret.empty() ? " (no cluster secret)" : "") << ", "
                    << shard->rows << " rows, row_dim " << shard->row_dim << ", dense "
                    << shard->dense_size;
  ShardRpc shard_zero(spec->hosts[0], shard->security);
  bool preempted = false;
  const absl::Status worker =
      f.max_restarts > 0 && config.cluster().consistency() == ASYNC
          ? SuperviseHostWorker(config, *spec, f, &signals, &shard_zero, argc, argv, &preempted)
          : RunWorkerHere(config, *spec, f, &*shard, &signals, &preempted);
  if (!worker.ok()) return FailHost(server, me, worker.message());
  // Keep every shard up until no worker needs it: the chief's evaluation reads them all.
  HostEnd end;
  end.host = me;
  end.num_hosts = static_cast<int>(spec->hosts.size());
  end.preempted = preempted;
  end.barrier_timeout = absl::Seconds(f.barrier_timeout_s);
  end.lease = absl::Milliseconds(config.cluster().lease_ms());
  end.checkpoint_dir = JobCheckpointDir(config);
  if (absl::Status s = AwaitJobEnd(shard_zero, end); !s.ok()) {
    return FailHost(server, me, s.message());
  }
  ShutDownShard(server, absl::Seconds(2), me, 0);
  PSTRAIN_LOG(INFO) << "host " << me << ": done, shard shut down";
  return 0;
}

}  // namespace pstrain
