// `pstrain ps`: one parameter-server shard (ps/server/shard_server.h) serving until SIGTERM / SIGINT.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "cmd/cli.h"
#include "cmd/cluster_spec.h"
#include "cmd/commands.h"
#include "cmd/ps_setup.h"
#include "common/flags.h"
#include "common/logging.h"
#include "ps/server/shard_server.h"
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
  std::string bind = "0.0.0.0";
  flags.Int("port", &port, "port to listen on (0 = pick a free one and print it)");
  flags.String("bind", &bind, "address to listen on");
  flags.Int("shard", &shard, "this shard's index i in [0, num_shards)");
  flags.Int("num_shards", &num_shards, "number of PS shards S");
  flags.Int64("rows", &rows, "rows of the embedding table V (0 = the FeatureSpec's total rows)");
  flags.Int64("dense_size", &dense_size, "floats of the flat dense vector (-1 = the model's dense_size)");
  flags.Int("row_dim", &row_dim, "floats per row (0 = the model's, 1 + model.embedding_dim)");
  flags.Int("partitions", &partitions,
            "table partitions P (0 = cluster.num_partitions, or 4 x num_shards if that is 0)");
  flags.Int("num_workers", &num_workers,
            "workers of the job, ids [0, N), that BOUNDED / SYNC wait for (0 = num_shards)");
  flags.Int("threads", &threads,
            "OpenMP threads per request (gRPC already runs requests in "
            "parallel)");
  auto fail = [](const std::string& msg, int code) {
    std::fprintf(stderr, "pstrain ps: %s\n", msg.c_str());
    return code;
  };
  Config config;
  if (auto code = ParseTrainingCommand("ps", argc, argv, &flags, tf, &config)) return *code;
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
  if (partitions > 0) o->partitions = partitions;
  o->threads = threads;
  if (num_workers > 0) o->num_workers = num_workers;
  rows = o->rows;
  dense_size = o->dense_size;
  auto server = ShardServer::Create(*std::move(o));
  if (!server.ok()) return fail(std::string(server.status().message()), 2);
  // A shard of a job with a model dir (or checkpoint.dir) resumes from the job's checkpoint,
  // picked the way every other process of the job picks it.
  if (!tf.model_dir.empty() || config.train().has_model_dir() || config.checkpoint().has_dir()) {
    auto choice =
        own_shape ? ChooseJobCheckpoint(config) : ChooseCheckpoint(JobCheckpointDir(config));
    if (!choice.ok()) return fail(choice.status().ToString(), 1);
    if (*choice) {
      if (absl::Status s = (*server)->RestoreCheckpoint((*choice)->dir, (*choice)->manifest);
          !s.ok()) {
        return fail(s.ToString(), 1);
      }
      PSTRAIN_LOG(INFO) << "shard " << shard << ": restored from " << (*choice)->dir << " ("
                        << (*choice)->manifest.num_shards() << " shards)";
    }
  }

  // Block the stop signals in every thread (gRPC's threads inherit this mask) and take them
  // synchronously below: no handler, no polling.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  const std::string address = absl::StrCat(bind, ":", port);
  if (absl::Status s = (*server)->Start(address); !s.ok()) return fail(std::string(s.message()), 1);
  const std::string shown_host = bind == "0.0.0.0" || bind == "[::]" ? "127.0.0.1" : bind;
  std::printf("pstrain ps: shard %d/%d listening on %s:%d\n", shard, num_shards, shown_host.c_str(),
              (*server)->port());
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
  (*server)->Shutdown(absl::Seconds(2));
  PSTRAIN_LOG(INFO) << "shard " << shard << " stats:\n" << FormatShardBalance({(*server)->Stats()});
  return 0;
}

}  // namespace pstrain
