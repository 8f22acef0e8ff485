// `pstrain ps`: one parameter-server shard (ps/server/shard_server.h) serving until SIGTERM / SIGINT.
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
#include "cmd/stop_signal.h"
#include "common/flags.h"
#include "common/logging.h"
#include "ps/server/shard_server.h"
#include "worker/ps_client/shard_balance.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/ps_worker.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

struct PsFlags {
  int port = 0, shard = 0, num_shards = 1, row_dim = 0, partitions = 0, threads = 1;
  int num_workers = 0;
  int64_t rows = 0, dense_size = -1;
  std::string bind = "127.0.0.1";
  int stop_grace_s = 30;
};

void AddPsFlags(FlagSet* flags, PsFlags* f) {
  flags->Int("port", &f->port, "port to listen on (0 = pick a free one and print it)");
  flags->String("bind", &f->bind,
                "address to listen on (default loopback only; another address needs the cluster "
                "secret: cluster.secret_file or PSTRAIN_CLUSTER_SECRET)");
  flags->Int("stop_grace_s", &f->stop_grace_s,
             "after SIGTERM, seconds to finish the calls in progress before the process exits "
             "anyway");
  flags->Int("shard", &f->shard, "this shard's index i in [0, num_shards)");
  flags->Int("num_shards", &f->num_shards, "number of PS shards S");
  flags->Int64("rows", &f->rows,
                "rows of the embedding table V (0 = the FeatureSpec's total rows)");
  flags->Int64("dense_size", &f->dense_size,
               "floats of the flat dense vector (-1 = the model's dense_size)");
  flags->Int("row_dim", &f->row_dim, "floats per row (0 = the model's, 1 + model.embedding_dim)");
  flags->Int("partitions", &f->partitions,
             "table partitions P (0 = cluster.num_partitions, or 4 x num_shards if that is 0)");
  flags->Int("num_workers", &f->num_workers,
             "workers of the job, ids [0, N) (0 = num_shards): the only worker ids the shard "
             "accepts, and those BOUNDED / SYNC wait for");
  flags->Int("threads", &f->threads,
             "OpenMP threads per request (gRPC already runs requests in "
             "parallel)");
}

// A Kubeflow PS pod: TF_CONFIG gives the shard, the shard count, the port and the workers when
// the flags do not (cmd/cluster_spec.h).
absl::Status ApplyPsTask(const FlagSet& flags, PsFlags* f) {
  if (flags.WasSet("shard") || flags.WasSet("num_shards")) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto env, ReadClusterEnvironment(""));
  ASSIGN_OR_RETURN(std::optional<PsTask> task, PsTaskFromEnvironment(env));
  if (!task) return absl::OkStatus();
  f->shard = task->shard;
  f->num_shards = task->num_shards;
  if (!flags.WasSet("port")) f->port = task->port;
  if (!flags.WasSet("num_workers")) f->num_workers = task->num_workers;
  PSTRAIN_LOG(INFO) << "TF_CONFIG: ps task " << f->shard << " of " << f->num_shards << ", port "
                    << f->port << ", " << f->num_workers << " workers";
  return absl::OkStatus();
}

// The shard of the flags and the config, restored from the job's checkpoint when the job has a
// model dir (or checkpoint.dir), picked the way every other process of the job picks it; or the
// exit code after the error is printed.
std::optional<int> CreateShard(const Config& config, const TrainingFlags& tf, PsFlags* f,
                               std::unique_ptr<ShardServer>* server, RpcSecurity* security) {
  // A shape given by flags (tests and benchmarks of the PS alone) is not the config's model, so
  // only a shard of the config's own shape compares the checkpoint's model description with it.
  const bool own_shape = f->rows == 0 && f->row_dim == 0 && f->dense_size < 0;
  auto o =
      ShardOptionsForJob(config, f->shard, f->num_shards, {f->rows, f->row_dim, f->dense_size},
                         f->num_workers);
  if (!o.ok()) return CommandError("ps", o.status().message(), 2);
  if (f->partitions > 0) o->data.partitions = f->partitions;
  auto sec = ClusterSecurity(config, SecretEnvironment(), f->bind, o->security.max_message_bytes);
  if (!sec.ok()) return CommandError("ps", sec.status().ToString(), 2);
  o->security = *security = *sec;
  if (sec->secret.empty()) {
    PSTRAIN_LOG(WARNING) << "shard " << f->shard << ": no cluster secret: every process of this "
                         << "machine that reaches " << f->bind << " may call the shard";
  }
  o->data.threads = f->threads;
  if (f->num_workers > 0) o->num_workers = f->num_workers;
  f->rows = o->data.rows;
  f->dense_size = o->data.dense_size;
  const bool has_job_dir =
      !tf.model_dir.empty() || config.train().has_model_dir() || config.checkpoint().has_dir();
  if (has_job_dir) o->data.checkpoint_dir = JobCheckpointDir(config);
  auto created = ShardServer::Create(*std::move(o));
  if (!created.ok()) return CommandError("ps", created.status().message(), 2);
  *server = *std::move(created);
  if (!has_job_dir) return std::nullopt;
  auto choice =
      own_shape ? ChooseJobCheckpoint(config) : ChooseCheckpoint(JobCheckpointDir(config));
  if (!choice.ok()) return CommandError("ps", choice.status().ToString(), 1);
  if (absl::Status s = RestoreShard(config, *choice, f->shard, server->get()); !s.ok()) {
    return CommandError("ps", s.ToString(), 1);
  }
  return std::nullopt;
}

// Serves until the first stop signal, then stops the shard (its calls get 2 s) within
// --stop_grace_s.
void ServeUntilStopped(ShardServer* server, const PsFlags& f, StopSignals& signals) {
  const int sig = signals.WaitForStop();
  PSTRAIN_LOG(INFO) << "shard " << f.shard << ": " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                    << ", shutting down";
  // Whatever a handler might be stuck in, the process ends: SIGALRM's default action.
  signal(SIGALRM, SIG_DFL);
  alarm(static_cast<unsigned>(std::max(1, f.stop_grace_s)));
  server->Shutdown(absl::Seconds(2));
  PSTRAIN_LOG(INFO) << "shard " << f.shard << " stats:\n" << FormatShardBalance({server->Stats()});
}

}  // namespace

int RunPs(int argc, char** argv) {
  FlagSet flags("ps",
                "Serves one parameter-server shard: the table partitions p with p mod num_shards "
                "== shard and the shard's slice of the dense vector.\nPrints 'pstrain ps: shard "
                "i/S listening on HOST:PORT' once ready; SIGTERM or Ctrl-C stops it (exit 0), like a TF "
                "ps task it serves until stopped. With --model_dir (or checkpoint.dir) it resumes "
                "from the job's latest checkpoint. Without --shard/--num_shards, TF_CONFIG's ps task gives them (a Kubeflow PS pod).");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  PsFlags f;
  AddPsFlags(&flags, &f);
  Config config;
  if (auto code = ParseTrainingCommand("ps", argc, argv, &flags, tf, &config)) return *code;
  // From here a stop signal stops the shard once it serves (one arriving during set-up waits for
  // that, and the shard then stops cleanly); a second one is ignored: the shutdown is bounded by
  // --stop_grace_s.
  StopSignals& signals = InstallStopSignals();
  signals.repeat_ends_process = false;
  signals.served = true;
  if (absl::Status s = ApplyPsTask(flags, &f); !s.ok()) return CommandError("ps", s.message(), 2);
  if (f.port < 0 || f.port > 65535) return CommandError("ps", "--port must be in [0, 65535]", 2);
  std::unique_ptr<ShardServer> server;
  RpcSecurity security;
  if (auto code = CreateShard(config, tf, &f, &server, &security)) return *code;
  if (absl::Status s = server->Start(ShardServer::ListenAddress(f.bind, f.port)); !s.ok()) {
    return CommandError("ps", s.message(), 1);
  }
  // The address it really listens on (0.0.0.0 / [::]: every interface).
  std::printf("pstrain ps: shard %d/%d listening on %s%s\n", f.shard, f.num_shards,
              ShardServer::ListenAddress(f.bind, server->port()).c_str(),
              security.secret.empty() ? "" : " (calls need the cluster secret)");
  std::fflush(stdout);
  PSTRAIN_LOG(INFO) << "shard " << f.shard << "/" << f.num_shards << ": " << f.rows << " rows in "
                    << server->map().partitions() << " partitions ("
                    << server->map().RowsOfShard(f.shard) << " here), dense slice ["
                    << server->dense_begin() << ", "
                    << server->dense_begin() + server->dense_slice_size() << ") of "
                    << f.dense_size;
  ServeUntilStopped(server.get(), f, signals);
  return 0;
}

}  // namespace pstrain
