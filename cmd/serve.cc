// `pstrain serve`: the gRPC Predictor service over an export (serving/server/predict_server.h).
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/serving_setup.h"
#include "cmd/stop_signal.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/rpc/security.h"
#include "serving/server/predict_server.h"

namespace pstrain {
namespace {

struct ServeFlags {
  std::string model_path, bind = "127.0.0.1", token_file;
  int port = 8500, threads = 0, grace_s = 5, max_delay_us = 500;
  bool watch = true;
  int metrics_port = 0;
  std::string metrics_bind = "127.0.0.1";
};

void AddServeFlags(FlagSet* flags, ServeFlags* f, PredictServer::Options* o) {
  flags->String("model", &f->model_path,
                "export base directory, or one version directory (required)");
  flags->Int("port", &f->port, "port to listen on (0 = pick a free one and print it)");
  flags->String("bind", &f->bind,
                "address to listen on: loopback unless you mean it (0.0.0.0 = every interface)");
  flags->Int("threads", &f->threads, "scoring threads (0 = the CPUs)");
  flags->Int("max_batch", &o->batching.max_batch, "rows scored together at most");
  flags->Int("batch_timeout_us", &f->max_delay_us,
             "how long the oldest queued request may wait for more rows to fill a batch");
  flags->Int("max_queue_rows", &o->batching.max_queue_rows,
             "rows waiting at most; beyond, Predict answers RESOURCE_EXHAUSTED");
  flags->Int("max_request_rows", &o->max_request_rows,
             "rows one request may carry; more is INVALID_ARGUMENT");
  flags->Bool("watch", &f->watch, "load a newer version as soon as it appears under --model");
  flags->String("admin_token_file", &f->token_file,
                "file holding the token the Reload RPC needs (metadata 'authorization: Bearer "
                "<token>'; at least 16 printable characters, the file chmod 600); without it "
                "Reload is refused");
  flags->Int("metrics_port", &f->metrics_port,
             "serve Prometheus metrics on http://<metrics_bind>:PORT/metrics (0 = off)");
  flags->String("metrics_bind", &f->metrics_bind,
                "address of the metrics endpoint (0.0.0.0 to let a Prometheus on another host "
                "scrape)");
  flags->Int("grace_s", &f->grace_s, "on SIGTERM, how long calls in flight may take to finish");
}

// Completes the server's options from the flags; INVALID_ARGUMENT names the flag at fault.
absl::Status ServerOptionsFromFlags(const ServeFlags& f, PredictServer::Options* o) {
  if (f.model_path.empty()) return absl::InvalidArgumentError("--model is required (see --help)");
  if (f.port < 0 || f.port > 65535) {
    return absl::InvalidArgumentError("--port must be in [0, 65535]");
  }
  if (f.threads < 0 || f.max_delay_us < 0 || f.grace_s < 0) {
    return absl::InvalidArgumentError("--threads, --batch_timeout_us and --grace_s must be >= 0");
  }
  if (!f.token_file.empty()) {
    // As the cluster secret's file: only its owner may read it, at most 4096 bytes, at least 16
    // printable characters without spaces (what a Bearer token in gRPC metadata can carry).
    absl::StatusOr<std::string> token = ReadCredentialFile(f.token_file, "the admin token");
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--admin_token_file: ", token.status().message()));
    }
    o->admin_token = *std::move(token);
  }
  o->model_path = f.model_path;
  o->address = absl::StrCat(f.bind, ":", f.port);
  o->batching.threads = f.threads > 0 ? f.threads : Launch().cpus.cpus;
  o->batching.intra_op_threads = 1;
  o->batching.max_delay = absl::Microseconds(f.max_delay_us);
  o->watch = f.watch;
  return absl::OkStatus();
}

// Until the first stop signal; then the calls in flight get `grace`.
void ServeUntilStopped(PredictServer* server, StopSignals& signals, absl::Duration grace) {
  const int sig = signals.WaitForStop();
  PSTRAIN_LOG(INFO) << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                    << ": answering the calls in flight, then stopping";
  server->Shutdown(grace);
  const PredictServer::Stats st = server->stats();
  PSTRAIN_LOG(INFO) << "served " << st.requests << " requests (" << st.rejected << " refused) in "
                    << st.batcher.batches << " batches of " << st.batcher.rows << " rows ("
                    << st.batcher.padded_rows << " with padding); " << st.reloads << " reloads";
}

}  // namespace

int RunServe(int argc, char** argv) {
  FlagSet flags(
      "serve",
      "Serves an export (`pstrain export`) over gRPC: pstrain.Predictor (proto/pstrain/\n"
      "serving.proto: Predict, GetModelInfo, Reload) and the standard health service\n"
      "grpc.health.v1.Health. Requests arriving together are scored as one batch. --model is an\n"
      "export base directory (the newest <version>/ is served, and a newer one is loaded as soon\n"
      "as it appears, without dropping a request) or one version directory. Prints 'pstrain\n"
      "serve: ... listening on HOST:PORT' once ready; SIGTERM or Ctrl-C stops it (exit 0) after\n"
      "the requests in flight are answered. docs/SERVING.md.");
  ServeFlags f;
  PredictServer::Options o;
  AddServeFlags(&flags, &f, &o);
  if (std::optional<int> code = ParseCommandFlags("serve", flags, argc, argv)) return *code;
  if (absl::Status s = ServerOptionsFromFlags(f, &o); !s.ok()) {
    return CommandError("serve", s.message(), 2);
  }
  // From here a stop signal stops the server: one arriving while it starts ends the first load
  // (Start returns CANCELLED), one arriving later shuts it down, which cancels a reload in
  // progress; a second one is ignored: the shutdown has its own bound (the grace, then 200 ms).
  // Whatever no check can interrupt (a read blocked in the kernel) is bounded by the grace timer:
  // the process ends kStopSlack after the grace, exit code 124, saying so.
  constexpr int kStopSlack = 3;
  StopSignals& signals = InstallStopSignals();
  signals.repeat_ends_process = false;
  SetStopGrace(f.grace_s + kStopSlack);
  signals.served = true;
  o.stop = &signals.stopped;
  absl::StatusOr<std::unique_ptr<PredictServer>> server = PredictServer::Start(o);
  if (!server.ok() && absl::IsCancelled(server.status()) && signals.stop.load()) {
    PSTRAIN_LOG(INFO) << "stopped while loading the model: " << server.status().message();
    return 0;
  }
  if (!server.ok()) {
    return CommandError("serve", server.status().ToString(),
                        server.status().code() == absl::StatusCode::kUnavailable ? 1 : 2);
  }
  if (absl::Status m = StartMetricsEndpoint(f.metrics_bind, f.metrics_port); !m.ok()) {
    return CommandError("serve", m.ToString(),
                        m.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  const std::shared_ptr<const ServingModel> model = (*server)->model();
  absl::PrintF("pstrain serve: version %d (%s, step %d, %d rows) on %d threads, listening on %s:%d\n",
               model->origin().version, model->origin().path, model->origin().step,
               model->stored_rows(), o.batching.threads, f.bind, (*server)->port());
  std::fflush(stdout);
  ServeUntilStopped(server->get(), signals, absl::Seconds(f.grace_s));
  return 0;
}

}  // namespace pstrain
