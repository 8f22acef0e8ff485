// `pstrain serve`: the gRPC Predictor service over an export (serving/server/predict_server.h).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cmd/cli.h"
#include "cmd/commands.h"
#include "cmd/launcher.h"
#include "cmd/serving_setup.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/logging.h"
#include "serving/server/predict_server.h"

namespace pstrain {

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
  std::string model_path, bind = "127.0.0.1", token_file;
  int port = 8500, threads = 0, grace_s = 5, max_delay_us = 500;
  bool watch = true;
  PredictServer::Options o;
  flags.String("model", &model_path, "export base directory, or one version directory (required)");
  flags.Int("port", &port, "port to listen on (0 = pick a free one and print it)");
  flags.String("bind", &bind,
               "address to listen on: loopback unless you mean it (0.0.0.0 = every interface)");
  flags.Int("threads", &threads, "scoring threads (0 = the CPUs)");
  flags.Int("max_batch", &o.batching.max_batch, "rows scored together at most");
  flags.Int("batch_timeout_us", &max_delay_us,
            "how long the oldest queued request may wait for more rows to fill a batch");
  flags.Int("max_queue_rows", &o.batching.max_queue_rows,
            "rows waiting at most; beyond, Predict answers RESOURCE_EXHAUSTED");
  flags.Int("max_request_rows", &o.max_request_rows,
            "rows one request may carry; more is INVALID_ARGUMENT");
  flags.Bool("watch", &watch, "load a newer version as soon as it appears under --model");
  flags.String("admin_token_file", &token_file,
               "file holding the token the Reload RPC needs (metadata 'authorization: Bearer "
               "<token>'); without it Reload is refused");
  int metrics_port = 0;
  std::string metrics_bind = "127.0.0.1";
  flags.Int("metrics_port", &metrics_port,
            "serve Prometheus metrics on http://<metrics_bind>:PORT/metrics (0 = off)");
  flags.String("metrics_bind", &metrics_bind,
               "address of the metrics endpoint (0.0.0.0 to let a Prometheus on another host "
               "scrape)");
  flags.Int("grace_s", &grace_s, "on SIGTERM, how long calls in flight may take to finish");
  auto fail = [](const std::string& msg, int code) { return CommandError("serve", msg, code); };
  if (std::optional<int> code = ParseCommandFlags("serve", flags, argc, argv)) return *code;
  if (model_path.empty()) return fail("--model is required (see --help)", 2);
  if (port < 0 || port > 65535) return fail("--port must be in [0, 65535]", 2);
  if (threads < 0 || max_delay_us < 0 || grace_s < 0) {
    return fail("--threads, --batch_timeout_us and --grace_s must be >= 0", 2);
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFileToString(token_file);
    if (!token.ok()) return fail(absl::StrCat("--admin_token_file: ", token.status().message()), 2);
    o.admin_token = std::string(absl::StripAsciiWhitespace(*token));
    if (o.admin_token.size() < 16) {
      return fail(absl::StrCat("--admin_token_file ", token_file,
                               ": the token must be at least 16 characters"), 2);
    }
  }
  o.model_path = model_path;
  o.address = absl::StrCat(bind, ":", port);
  o.batching.threads = threads > 0 ? threads : Launch().cpus.cpus;
  o.batching.intra_op_threads = 1;
  o.batching.max_delay = absl::Microseconds(max_delay_us);
  o.watch = watch;

  // The stop signals are taken synchronously below; every thread (gRPC's too) inherits the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  absl::StatusOr<std::unique_ptr<PredictServer>> server = PredictServer::Start(o);
  if (!server.ok()) {
    return fail(server.status().ToString(),
                server.status().code() == absl::StatusCode::kUnavailable ? 1 : 2);
  }
  if (absl::Status m = StartMetricsEndpoint(metrics_bind, metrics_port); !m.ok()) {
    return fail(m.ToString(), m.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  const std::shared_ptr<const ServingModel> model = (*server)->model();
  absl::PrintF("pstrain serve: version %d (%s, step %d, %d rows) on %d threads, listening on %s:%d\n",
               model->origin().version, model->origin().path, model->origin().step,
               model->stored_rows(), o.batching.threads, bind, (*server)->port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  PSTRAIN_LOG(INFO) << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                    << ": answering the calls in flight, then stopping";
  (*server)->Shutdown(absl::Seconds(grace_s));
  const PredictServer::Stats st = (*server)->stats();
  PSTRAIN_LOG(INFO) << "served " << st.requests << " requests (" << st.rejected << " refused) in "
                    << st.batcher.batches << " batches of " << st.batcher.rows << " rows ("
                    << st.batcher.padded_rows << " with padding); " << st.reloads << " reloads";
  return 0;
}

}  // namespace pstrain
