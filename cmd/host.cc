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
#include <string>
#include <thread>
#include <vector>

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

}  // namespace

int RunHost(int argc, char** argv) {
  FlagSet flags(
      "host",
      "Runs PS shard i and worker i of an N-host asynchronous PS job (worker 0 is the chief: it "
      "evaluates and writes <model_dir>/summary.json; host i > 0 logs to <model_dir>/host-<i>/).\n"
      "Cluster: --cluster=h1:port,...,hN:port --index=i, else SM_HOSTS / SM_CURRENT_HOST or "
      "--resource_config (port --default_port), else TF_CONFIG (ps task i on the host of worker "
      "i, the chief first; separate PS and worker pods run `pstrain ps` and `pstrain worker`), "
      "else OMPI_COMM_WORLD_RANK/_SIZE with --cluster (docs/PS.md).\nCheckpoints: "
      "ckpt-<step>/shard-<i>-of-<N> in checkpoint.dir (default: the chief's model_dir, which must "
      "be shared by the hosts); a job resumes from LATEST. SIGTERM or Ctrl-C during training "
      "writes a checkpoint of the whole job and exits 0.");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  std::string cluster, bind = "127.0.0.1", resource_config = SageMakerPath(kSageMakerResourceConfig);
  int default_port = kDefaultPsPort;
  int index = -1, ps_threads = 1, connect_timeout_s = 120, barrier_timeout_s = 3600, cores = 0;
  int stop_grace_s = 300, max_restarts = 0;
  flags.Int("max_restarts", &max_restarts,
            "ASYNC: run the worker as a child process and restart it up to this many times when "
            "it dies, while the shard (and the other hosts) go on; it resumes from the job's "
            "last checkpoint (docs/PS.md \"Recovery\"). BOUNDED / SYNC cannot wait for a "
            "restarted worker: there the worker runs in this process and its failure ends the host");
  flags.String("cluster", &cluster, "PS shard addresses host:port of hosts 0..N-1, comma-separated");
  flags.Int("index", &index, "this host's index in --cluster (-1 = from the environment)");
  flags.String("resource_config", &resource_config,
               "SageMaker's resource config, read when present (after SM_HOSTS in the order)");
  flags.Int("default_port", &default_port,
            "PS port of hosts named without one (SageMaker's host names, bare --cluster names)");
  flags.String("bind", &bind,
               "address the shard listens on (its port is from the cluster spec); default "
               "loopback only. Another address (e.g. 0.0.0.0 for a multi-host job) needs the "
               "cluster secret in cluster.secret_file or PSTRAIN_CLUSTER_SECRET");
  flags.Int("stop_grace_s", &stop_grace_s,
            "after SIGTERM / SIGINT, seconds the host may take to checkpoint and stop before it "
            "exits anyway (code 124)");
  flags.Int("ps_threads", &ps_threads, "OpenMP threads per PS request");
  flags.Int("cores", &cores,
            "cores this host's automatic thread settings divide (0 = the CPUs this process may "
            "use: its affinity mask capped by the cgroup CPU quota; "
            "`local` passes its share when several hosts share one machine)");
  flags.Int("connect_timeout_s", &connect_timeout_s, "how long to wait for all shards to be up");
  flags.Int("barrier_timeout_s", &barrier_timeout_s,
            "how long the end-of-job waits may take (the slowest worker, the chief's evaluation)");
  auto fail = [](const std::string& msg, int code) {
    std::fprintf(stderr, "pstrain host: %s\n", msg.c_str());
    return code;
  };
  Config config;
  if (auto code = ParseTrainingCommand("host", argc, argv, &flags, tf, &config)) return *code;
  if (config.data().train_size() == 0) {
    return fail("no training data: pass --train PATH or set data.train", 2);
  }
  auto env = ReadClusterEnvironment(resource_config);
  if (!env.ok()) return fail(env.status().ToString(), 2);
  auto spec = ResolveClusterSpec(cluster, index, *env, default_port);
  if (!spec.ok()) return fail(std::string(spec.status().message()), 2);
  if (spec->evaluator) {
    std::printf("pstrain host: TF_CONFIG task is an evaluator: the chief evaluates in pstrain, "
                "nothing to do here\n");
    return 0;
  }
  const int N = static_cast<int>(spec->hosts.size());
  const int me = spec->index;
  const bool chief = me == 0;
  const std::string& my_address = spec->hosts[me];
  const std::string port = my_address.substr(my_address.rfind(':') + 1);

  // The shard.
  auto shard_options = ShardOptionsForJob(config, me, N);
  if (!shard_options.ok()) return fail(std::string(shard_options.status().message()), 2);
  shard_options->data.threads = ps_threads;
  shard_options->data.checkpoint_dir = JobCheckpointDir(config);
  auto security = ClusterSecurity(config, SecretEnvironment(), bind,
                                  shard_options->security.max_message_bytes);
  if (!security.ok()) return fail(security.status().ToString(), 2);
  shard_options->security = *security;
  if (IsLoopbackAddress(bind) && !IsLoopbackAddress(my_address)) {
    PSTRAIN_LOG(WARNING) << "host " << me << " listens on " << bind << " only, but the cluster "
                         << "spec names it " << my_address << ": the other hosts cannot reach "
                         << "its shard; pass --bind 0.0.0.0 (or its address) and a cluster secret";
  }
  const int64_t rows = shard_options->data.rows;
  const int row_dim = shard_options->data.row_dim;
  const int64_t dense_size = shard_options->data.dense_size;
  auto server = ShardServer::Create(*std::move(shard_options));
  if (!server.ok()) return fail(std::string(server.status().message()), 2);
  // Resume: every host picks the same checkpoint (the same verification of the same files).
  auto choice = ChooseJobCheckpoint(config);
  if (!choice.ok()) return fail(choice.status().ToString(), 1);
  if (absl::Status s = RestoreShard(config, *choice, me, server->get()); !s.ok()) {
    return fail(s.ToString(), 1);
  }
  // From here on a stop signal is a preemption: the job checkpoints (the other hosts need this
  // shard for it), also if it comes while this host still connects to the others.
  SetStopGrace(stop_grace_s);
  StopSignals& signals = InstallStopSignals();
  signals.served = true;
  if (absl::Status s = (*server)->Start(absl::StrCat(bind, ":", port)); !s.ok()) {
    return fail(std::string(s.message()), kExitCannotListen);
  }
  PSTRAIN_LOG(INFO) << "host " << me << "/" << N << " (cluster from " << spec->source
                    << "): shard listening on " << bind << ":" << (*server)->port()
                    << (security->secret.empty() ? " (no cluster secret)" : "") << ", " << rows
                    << " rows, row_dim " << row_dim << ", dense " << dense_size;

  // The worker.
  PsWorkerOptions wo;
  wo.index = me;
  wo.num_workers = N;
  wo.shards = spec->hosts;
  wo.log_dir_prefix = "host";
  wo.cores = cores;
  wo.omp_num_threads = Launch().omp_num_threads;
  wo.connect_timeout = absl::Seconds(connect_timeout_s);
  wo.barrier_timeout = absl::Seconds(barrier_timeout_s);
  if (*choice) wo.restored = **choice;
  wo.stop = &signals.stop;
  wo.on_failure = [](const absl::Status& why) { ExitSoonAfterFailure("host", why); };
  wo.training = &signals.served;
  wo.local_shard = me;
  ServedShard served(server->get());
  wo.local_server = &served;
  wo.security = *security;
  wo.worker_hosts = spec->hosts;
  ShardRpc shard_zero(spec->hosts[0], *security);
  bool preempted = false;
  if (max_restarts > 0 && config.cluster().consistency() == ASYNC) {
    // The worker as a supervised child process (cmd/worker_supervisor.h): the shard stays up
    // while a dead worker is restarted. Its calls to this shard go over loopback TCP.
    std::vector<std::string> args = ForwardedArgs(argc, argv, kHostOnlyFlags);
    args.push_back("--ps=" + absl::StrJoin(spec->hosts, ","));
    args.push_back(absl::StrCat("--index=", me));
    args.push_back(absl::StrCat("--num_workers=", N));
    args.push_back("--log_dir_prefix=host");
    if (!Succeeded(SuperviseWorker("host", me, max_restarts, args, JobCheckpointDir(config),
                                   &signals, &shard_zero))) {
      ShutDownShard(server->get(), absl::Seconds(1), me, 1);
      return fail(absl::StrCat("host ", me, ": its worker failed; last good checkpoint: ",
                               LatestPathOr(JobCheckpointDir(config), "none")),
                  1);
    }
    preempted = signals.stop.load();
  } else {
    if (max_restarts > 0) {
      PSTRAIN_LOG(INFO) << "host " << me << ": --max_restarts restarts the worker in ASYNC only: "
                        << Consistency_Name(config.cluster().consistency())
                        << " cannot wait for a restarted worker (its failure ends this host; "
                        << "`pstrain local --max_restarts` restarts the whole job)";
    }
    auto summary = RunPsWorker(config, wo);
    if (!summary.ok()) {
      ShutDownShard(server->get(), absl::Seconds(1), me, 1);
      return fail(summary.status().ToString(), 1);
    }
    preempted = summary->preempted;
    if (preempted) {
      std::fprintf(stderr,
                   "pstrain host: host %d stopped by a signal at step %lld; checkpoint %s; run "
                   "the same command to resume\n",
                   me, static_cast<long long>(summary->steps),
                   summary->checkpoint.empty() ? "(written by the chief)"
                                               : summary->checkpoint.c_str());
    }
  }

  // Keep every shard up until no worker needs it: the chief's evaluation reads them all.
  HostEnd end;
  end.host = me;
  end.num_hosts = N;
  end.preempted = preempted;
  end.barrier_timeout = absl::Seconds(barrier_timeout_s);
  end.lease = absl::Milliseconds(config.cluster().lease_ms());
  end.checkpoint_dir = JobCheckpointDir(config);
  if (absl::Status s = AwaitJobEnd(shard_zero, end); !s.ok()) {
    ShutDownShard(server->get(), absl::Seconds(1), me, 1);
    return fail(std::string(s.message()), 1);
  }
  ShutDownShard(server->get(), absl::Seconds(2), me, 0);
  PSTRAIN_LOG(INFO) << "host " << me << ": done, shard shut down";
  return 0;
}

}  // namespace pstrain
