// `pstrain ps`: one parameter-server shard (ps/server/shard_server.h) serving until SIGTERM / SIGINT.
#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/cluster_security.h"
#include "cmd/cluster_spec.h"
#include "cmd/commands.h"
#include "cmd/ps_setup.h"
#include "common/flags.h"
#include "common/logging.h"
#include "ps/server/shard_server.h"
#include "worker/ps_client/shard_balance.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/ps_worker.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
int RunPs(int argc, char** argv) {
  FlagSet flags("ps",
                "Serves one parameter-server shard: the table partitions p with p mod num_shards "
                "== shard and the shard's slice of the dense vector.\nPrints 'pstrain ps: shard "
                "i/S listening on HOST:PORT' once ready; SIGTERM or Ctrl-C stops it (exit 0), like a TF "
                "ps task it serves until stopped. With --model_dir (or checkpoint.dir) it resumes "
                "from the job's latest checkpoint. Without --shard/--num_shards, TF_CONFIG's ps task gives them (a Kubeflow PS pod).");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  int port = 0, shard = 0, num_shards = 1, row_dim = 0, partitions = 0, threads = 1;
  int num_workers = 0;
  int64_t rows = 0, dense_size = -1;
  std::string bind = "127.0.0.1";
  int stop_grace_s = 30;
  flags.Int("port", &port, "port to listen on (0 = pick a free one and print it)");
  flags.String("bind", &bind,
               "address to listen on (default loopback only; another address needs the cluster "
               "secret: cluster.secret_file or PSTRAIN_CLUSTER_SECRET)");
  flags.Int("stop_grace_s", &stop_grace_s,
            "after SIGTERM, seconds to finish the calls in progress before the process exits "
            "anyway");
  flags.Int("shard", &shard, "this shard's index i in [0, num_shards)");
  flags.Int("num_shards", &num_shards, "number of PS shards S");
  flags.Int64("rows", &rows, "rows of the embedding table V (0 = the FeatureSpec's total rows)");
  flags.Int64("dense_size", &dense_size, "floats of the flat dense vector (-1 = the model's dense_size)");
  flags.Int("row_dim", &row_dim, "floats per row (0 = the model's, 1 + model.embedding_dim)");
  flags.Int("partitions", &partitions,
            "table partitions P (0 = cluster.num_partitions, or 4 x num_shards if that is 0)");
  flags.Int("num_workers", &num_workers,
            "workers of the job, ids [0, N) (0 = num_shards): the only worker ids the shard "
            "accepts, and those BOUNDED / SYNC wait for");
  flags.Int("threads", &threads,
            "OpenMP threads per request (gRPC already runs requests in "
            "parallel)");
  auto fail = [](const std::string& msg, int code) {
    std::fprintf(stderr, "pstrain ps: %s\n", msg.c_str());
    return code;
  };
  Config config;
  if (auto code = ParseTrainingCommand("ps", argc, argv, &flags, tf, &config)) return *code;
  // Block the stop signals before any thread exists (gRPC's and OpenMP's threads inherit this
  // mask) and take them synchronously once the shard serves (sigwait below): no handler, no
  // polling. Blocked only later, a thread made during set-up (the server's, a restore's) kept
  // them unblocked, and a SIGTERM arriving while the main thread was not yet in sigwait went to
  // that thread and killed the process (seen once in a full test run). One arriving during
  // set-up now waits for it, and the shard then stops cleanly.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  // A Kubeflow PS pod: TF_CONFIG gives the shard, the shard count, the port and the workers when
  // the flags do not (cmd/cluster_spec.h).
  if (!flags.WasSet("shard") && !flags.WasSet("num_shards")) {
    auto env = ReadClusterEnvironment("");
    auto task = env.ok() ? PsTaskFromEnvironment(*env)
                         : absl::StatusOr<std::optional<PsTask>>(env.status());
    if (!task.ok()) return fail(std::string(task.status().message()), 2);
    if (*task) {
      shard = (*task)->shard;
      num_shards = (*task)->num_shards;
      if (!flags.WasSet("port")) port = (*task)->port;
      if (!flags.WasSet("num_workers")) num_workers = (*task)->num_workers;
      PSTRAIN_LOG(INFO) << "TF_CONFIG: ps task " << shard << " of " << num_shards << ", port "
                        << port << ", " << num_workers << " workers";
    }
  }
  if (port < 0 || port > 65535) return fail(absl::StrCat("--port must be in [0, 65535]"), 2);
  // A shape given by flags (tests and benchmarks of the PS alone) is not the config's model, so
  // only a shard of the config's own shape compares the checkpoint's model description with it.
  const bool own_shape = rows == 0 && row_dim == 0 && dense_size < 0;
  auto o = ShardOptionsForJob(config, shard, num_shards, {rows, row_dim, dense_size});
  if (!o.ok()) return fail(std::string(o.status().message()), 2);
  if (partitions > 0) o->data.partitions = partitions;
  auto security = ClusterSecurity(config, SecretEnvironment(), bind,
                                  o->security.max_message_bytes);
  if (!security.ok()) return fail(security.status().ToString(), 2);
  o->security = *security;
  if (security->secret.empty()) {
    PSTRAIN_LOG(WARNING) << "shard " << shard << ": no cluster secret: every process of this "
                         << "machine that reaches " << bind << " may call the shard";
  }
  o->data.threads = threads;
  if (num_workers > 0) o->num_workers = num_workers;
  rows = o->data.rows;
  dense_size = o->data.dense_size;
  // A shard of a job with a model dir (or checkpoint.dir) resumes from the job's checkpoint,
  // picked the way every other process of the job picks it.
  const bool has_job_dir =
      !tf.model_dir.empty() || config.train().has_model_dir() || config.checkpoint().has_dir();
  if (has_job_dir) o->data.checkpoint_dir = JobCheckpointDir(config);
  auto server = ShardServer::Create(*std::move(o));
  if (!server.ok()) return fail(std::string(server.status().message()), 2);
  if (has_job_dir) {
    auto choice =
        own_shape ? ChooseJobCheckpoint(config) : ChooseCheckpoint(JobCheckpointDir(config));
    if (!choice.ok()) return fail(choice.status().ToString(), 1);
    if (absl::Status s = RestoreShard(config, *choice, shard, server->get()); !s.ok()) {
      return fail(s.ToString(), 1);
    }
  }

  const std::string address = absl::StrCat(bind, ":", port);
  if (absl::Status s = (*server)->Start(address); !s.ok()) return fail(std::string(s.message()), 1);
  // The address it really listens on (0.0.0.0 / [::]: every interface).
  std::printf("pstrain ps: shard %d/%d listening on %s:%d%s\n", shard, num_shards, bind.c_str(),
              (*server)->port(),
              security->secret.empty() ? "" : " (calls need the cluster secret)");
  std::fflush(stdout);
  PSTRAIN_LOG(INFO) << "shard " << shard << "/" << num_shards << ": " << rows << " rows in "
                    << (*server)->map().partitions() << " partitions ("
                    << (*server)->map().RowsOfShard(shard) << " here), dense slice ["
                    << (*server)->dense_begin() << ", "
                    << (*server)->dense_begin() + (*server)->dense_slice_size() << ") of "
                    << dense_size;

  int sig = 0;
  sigwait(&stop, &sig);
  PSTRAIN_LOG(INFO) << "shard " << shard << ": " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                    << ", shutting down";
  // Whatever a handler might be stuck in, the process ends: SIGALRM's default action.
  sigset_t alarm_set;
  sigemptyset(&alarm_set);
  sigaddset(&alarm_set, SIGALRM);
  pthread_sigmask(SIG_UNBLOCK, &alarm_set, nullptr);
  signal(SIGALRM, SIG_DFL);
  alarm(static_cast<unsigned>(std::max(1, stop_grace_s)));
  (*server)->Shutdown(absl::Seconds(2));
  PSTRAIN_LOG(INFO) << "shard " << shard << " stats:\n" << FormatShardBalance({(*server)->Stats()});
  return 0;
}

}  // namespace pstrain
