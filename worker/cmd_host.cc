// `pstrain host`: one process per host running both roles of asynchronous PS training: PS shard i
// of N (in-process ShardServer) and worker i, training its share of the data against a PsClient
// connected to all N shards. Worker 0 is the chief. End of job (docs/PS.md):
//   1. every worker, after its last step, flushes its pushes and reports TRAINING_DONE to shard 0;
//   2. the chief waits (bounded) for all N reports, evaluates, writes summary.json with the
//      whole job's example count, prints the shards' load balance and sets job_finished on
//      shard 0;
//   3. every other host polls shard 0's Info (backoff, bounded) until job_finished, reports
//      FINISH_SEEN and shuts its shard down; the chief waits (bounded) for those reports before
//      shutting shard 0 down, so no worker loses a shard while it still needs one.
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"
#include "ps/grpc_status.h"
#include "ps/shard_server.h"
#include "pstrain/ps_service.grpc.pb.h"
#include "worker/cli.h"
#include "worker/cluster_spec.h"
#include "worker/commands.h"
#include "worker/ps_client.h"
#include "worker/ps_setup.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

std::atomic<bool> g_stop{false};
// True while the trainer's step loop runs and checks g_stop. Outside it (connecting, the
// end-of-job waits) a stop signal ends the process at once with the signal's default action:
// there is nothing to save (no PS checkpoints yet) and the waits are long.
std::atomic<bool> g_training{false};

void OnStopSignal(int sig) {
  if (!g_training.load() || g_stop.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

// Exit code of a host whose shard could not listen on its port (`pstrain local` then retries
// the whole cluster on fresh ports).
constexpr int kExitCannotListen = 3;

// Shard 0's end-of-job calls, from a host other than the chief: blocking calls with a deadline,
// UNAVAILABLE retried with backoff up to `deadline`.
class ShardZero {
 public:
  explicit ShardZero(const std::string& address)
      : stub_(ParameterServer::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        address_(address) {}

  absl::Status Report(const ReportRequest& request, absl::Duration timeout) {
    ReportResponse response;
    return Call(timeout, [&](grpc::ClientContext* ctx) {
      return stub_->Report(ctx, request, &response);
    });
  }

  // Polls Info with exponential backoff (100 ms .. 2 s) until job_finished or `timeout`. Shard 0
  // cannot call back, and holding an RPC open for the whole evaluation would need a deferred
  // reactor in the shard: a poll a second or two apart costs nothing here.
  absl::Status WaitJobFinished(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    absl::Duration backoff = absl::Milliseconds(100);
    while (true) {
      InfoResponse info;
      absl::Status s = Call(end - absl::Now(), [&](grpc::ClientContext* ctx) {
        return stub_->Info(ctx, InfoRequest(), &info);
      });
      if (s.ok() && info.job_finished()) return absl::OkStatus();
      if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) return s;
      if (absl::Now() + backoff >= end) {
        return absl::DeadlineExceededError(
            absl::StrCat("shard 0 (", address_, ") did not report the job finished within ",
                         absl::FormatDuration(timeout), " (is the chief still evaluating? see "
                                                        "--barrier_timeout_s)"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(2 * backoff, absl::Seconds(2));
    }
  }

 private:
  template <typename F>
  absl::Status Call(absl::Duration timeout, F f) {
    const absl::Time end = absl::Now() + timeout;
    absl::Duration backoff = absl::Milliseconds(100);
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(std::min(end, absl::Now() + absl::Seconds(10))));
      ctx.set_wait_for_ready(true);
      grpc::Status g = f(&ctx);
      if (g.ok()) return absl::OkStatus();
      absl::Status s = FromGrpcStatus(g);
      const bool retry = g.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         g.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (!retry || absl::Now() + backoff >= end) {
        return Annotate(s, absl::StrCat("shard 0 (", address_, ")"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(2 * backoff, absl::Seconds(2));
    }
  }

  std::unique_ptr<ParameterServer::Stub> stub_;
  const std::string address_;
};

}  // namespace

int RunHost(int argc, char** argv) {
  FlagSet flags(
      "host",
      "Runs PS shard i and worker i of an N-host asynchronous PS job (worker 0 is the chief: it "
      "evaluates and writes <model_dir>/summary.json; host i > 0 logs to <model_dir>/host-<i>/).\n"
      "Cluster: --cluster=h1:port,...,hN:port --index=i, else TF_CONFIG, else SM_HOSTS / "
      "SM_CURRENT_HOST (port 2223), else OMPI_COMM_WORLD_RANK/_SIZE with --cluster.\nSIGTERM or "
      "Ctrl-C stops training and exits 1: PS checkpoints are not implemented yet.");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  std::string cluster, bind = "0.0.0.0";
  int index = -1, ps_threads = 1, connect_timeout_s = 120, barrier_timeout_s = 3600, cores = 0;
  flags.String("cluster", &cluster, "PS shard addresses host:port of hosts 0..N-1, comma-separated");
  flags.Int("index", &index, "this host's index in --cluster (-1 = from the environment)");
  flags.String("bind", &bind, "address the shard listens on (its port is from the cluster spec)");
  flags.Int("ps_threads", &ps_threads, "OpenMP threads per PS request");
  flags.Int("cores", &cores,
            "cores this host's automatic thread settings divide (0 = all of the machine's; "
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
  std::map<std::string, std::string> env;
  for (const std::string& name : ClusterEnvVariables()) {
    if (const char* v = std::getenv(name.c_str())) env[name] = v;
  }
  auto spec = ResolveClusterSpec(cluster, index, env);
  if (!spec.ok()) return fail(std::string(spec.status().message()), 2);
  const int N = static_cast<int>(spec->hosts.size());
  const int me = spec->index;
  const bool chief = me == 0;
  const std::string& my_address = spec->hosts[me];
  const std::string port = my_address.substr(my_address.rfind(':') + 1);

  // The shard.
  auto shard_options = ShardOptionsForJob(config, me, N);
  if (!shard_options.ok()) return fail(std::string(shard_options.status().message()), 2);
  shard_options->threads = ps_threads;
  const int64_t rows = shard_options->rows;
  const int row_dim = shard_options->row_dim;
  const int64_t dense_size = shard_options->dense_size;
  auto server = ShardServer::Create(*std::move(shard_options));
  if (!server.ok()) return fail(std::string(server.status().message()), 2);
  if (absl::Status s = (*server)->Start(absl::StrCat(bind, ":", port)); !s.ok()) {
    return fail(std::string(s.message()), kExitCannotListen);
  }
  signal(SIGTERM, OnStopSignal);
  signal(SIGINT, OnStopSignal);
  PSTRAIN_LOG(INFO) << "host " << me << "/" << N << " (cluster from " << spec->source
                    << "): shard listening on " << bind << ":" << port << ", " << rows
                    << " rows, row_dim " << row_dim << ", dense " << dense_size;

  // The worker.
  const std::string model_dir = config.train().model_dir();
  ClusterConfig* cc = config.mutable_cluster();
  cc->clear_ps();
  for (const std::string& h : spec->hosts) cc->add_ps(h);
  cc->set_index(me);
  if (!chief) config.mutable_train()->set_model_dir(absl::StrCat(model_dir, "/host-", me));
  auto client =
      PsClient::Create(PsClient::OptionsFromConfig(*cc, rows, row_dim, dense_size));
  if (!client.ok()) return fail(std::string(client.status().message()), 2);
  if (absl::Status s = (*client)->WaitForShards(absl::Seconds(connect_timeout_s)); !s.ok()) {
    return fail(absl::StrCat("waiting for the shards: ", s.ToString()), 1);
  }
  ShardZero shard_zero(spec->hosts[0]);
  const absl::Duration barrier = absl::Seconds(barrier_timeout_s);
  const absl::Time t_start = absl::Now();

  TrainerOptions opts;
  opts.tty = chief && isatty(STDERR_FILENO);
  opts.cores = cores;
  opts.stop = &g_stop;
  opts.params = client->get();
  opts.prefetch_pulls =
      config.cluster().consistency() == ASYNC && config.cluster().prefetch_pulls();
  opts.worker_index = me;
  opts.num_workers = N;
  opts.chief = chief;
  opts.mode = "ps-async";
  opts.hosts = N;
  opts.after_training = [&](TrainSummary* summary) -> absl::Status {
    g_training = false;
    RETURN_IF_ERROR(Annotate((*client)->Flush(), "flushing the last pushes"));
    ReportRequest done;
    done.set_worker_id(me);
    done.set_phase(TRAINING_DONE);
    done.set_examples(summary->examples);
    done.set_steps(summary->steps);
    if (!chief) return shard_zero.Report(done, barrier);
    (*server)->Report(done);
    PSTRAIN_LOG(INFO) << "chief: waiting for the " << N << " workers to finish";
    ASSIGN_OR_RETURN(std::vector<ReportRequest> all,
                     (*server)->WaitForReports(TRAINING_DONE, N, barrier));
    summary->examples = 0;
    summary->steps = 0;
    for (const ReportRequest& r : all) {
      summary->examples += r.examples();
      summary->steps += r.steps();
    }
    summary->wall_seconds = absl::ToDoubleSeconds(absl::Now() - t_start);
    summary->examples_per_sec = summary->examples / std::max(1e-9, summary->wall_seconds);
    return absl::OkStatus();
  };
  std::printf("pstrain host: host %d/%d ready, training\n", me, N);
  std::fflush(stdout);
  g_training = true;
  auto summary = RunTraining(config, opts);
  g_training = false;
  if (!summary.ok()) {
    (*server)->Shutdown(absl::Seconds(1));
    return fail(summary.status().ToString(), 1);
  }
  if (summary->preempted) {
    (*server)->Shutdown(absl::Seconds(1));
    return fail(absl::StrCat("host ", me, ": stopped by a signal at step ", summary->steps,
                             "; PS checkpoints are not implemented yet, so this job cannot be "
                             "resumed"),
                1);
  }

  ReportRequest seen;
  seen.set_worker_id(me);
  seen.set_phase(FINISH_SEEN);
  if (chief) {
    if (auto stats = (*client)->GetStats(); stats.ok()) {
      std::fprintf(stderr, "PS shard balance:\n%s\n", FormatShardBalance(*stats).c_str());
    } else {
      PSTRAIN_LOG(WARNING) << "shard stats: " << stats.status();
    }
    (*server)->FinishJob();
    (*server)->Report(seen);
    // Not fatal: the job is done, a host that does not acknowledge only loses its shard early.
    if (auto s = (*server)->WaitForReports(FINISH_SEEN, N, absl::Seconds(60)); !s.ok()) {
      PSTRAIN_LOG(WARNING) << s.status();
    }
  } else {
    if (absl::Status s = shard_zero.WaitJobFinished(barrier); !s.ok()) {
      (*server)->Shutdown(absl::Seconds(1));
      return fail(s.ToString(), 1);
    }
    if (absl::Status s = shard_zero.Report(seen, absl::Seconds(10)); !s.ok()) {
      PSTRAIN_LOG(WARNING) << "reporting FINISH_SEEN: " << s;
    }
  }
  (*server)->Shutdown(absl::Seconds(2));
  PSTRAIN_LOG(INFO) << "host " << me << ": done, shard shut down";
  return 0;
}

}  // namespace pstrain
