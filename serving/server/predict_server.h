// PredictServer: `pstrain serve`, the gRPC Predictor service of proto/pstrain/serving.proto over
// an export (serving/export.h), with the standard health service (grpc.health.v1, grpc++'s
// default implementation: "" and "pstrain.Predictor" are SERVING while the server takes
// requests, NOT_SERVING once it stops).
//
// A request is validated and parsed on the gRPC thread that delivers it (its size against
// max_request_rows, then every value: serving/request_rows.h), encoded with the model served at
// that moment, and queued for the Batcher (serving/server/batcher.h), whose threads score it with
// other requests and finish the call; no handler ever waits.
//
// Versions (TensorFlow Serving's layout): `model_path` is an export base directory, whose newest
// <version>/MODEL is served, or one version directory (then nothing is reloaded). A newer version
// is loaded by a loader thread when the directory changes (inotify: a version appears by the
// rename WriteExport ends with) or when Reload is called, verified completely, and swapped in
// atomically: requests already accepted are scored by the model they were parsed for, new ones by
// the new model, and none is dropped. A version that fails to load (corrupt, another format, a
// MODEL that is a FIFO or a device: never opened for reading, so never waited on) is logged,
// naming it, and skipped: the newest version that loads is served (at the start too), and the
// server keeps serving what it has when none newer loads.
//
// Stopping: Shutdown cancels a load in progress (checked between the export's blocks), so that a
// stop is never held up by a reload; the process bounds what no check can interrupt (a read
// blocked in the kernel) with its stop signal's grace timer (cmd/serve.cc).
//
// A request that is not a PredictRequest at all is answered INVALID_ARGUMENT saying so (the method
// is registered raw, so that the parse is the server's own and not gRPC's, which answers a bad
// message UNIMPLEMENTED with no detail).
//
// Security: binds loopback unless told otherwise; Reload changes what is served, so it needs the
// admin token (metadata "authorization: Bearer <token>", compared in constant time) and is refused
// when the server has none. Predict and GetModelInfo change nothing.
//
// Metrics: serving/server/serve_metrics.h, in the process's registry (served when the process
// starts common/metrics' endpoint).
//
// Thread-safety: all public methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "serving/server/batcher.h"
#include "serving/export.h"
#include "serving/server/serve_metrics.h"
#include "serving/serving_model.h"

namespace grpc {
class Server;
}

namespace pstrain {

class PredictorService;

class PredictServer {
 public:
  struct Options {
    std::string model_path;               // export base directory, or one version directory
    std::string address = "127.0.0.1:0";  // host:port; port 0 picks a free one (see port())
    Batcher::Options batching;  // batching.env is the clock and directory checks of the server
    int max_request_rows = 4096;  // rows (or examples) one request may carry
    bool watch = true;            // reload when a newer version appears under model_path
    std::string admin_token;      // "" = Reload is refused
    // The process's stop (may be null): once notified, the first load, inside Start, gives up
    // (Start returns CANCELLED), so that a stop signal during a long start is not held up.
    const absl::Notification* stop = nullptr;
    // How a version directory is read (empty: ReadExport). Tests fake a slow or failing load.
    ExportReader read_export;
  };
  struct Stats {
    int64_t requests = 0;  // Predict calls accepted
    int64_t rejected = 0;  // Predict calls refused (bad request, full queue, stopping)
    int64_t reloads = 0;   // newer versions swapped in
    Batcher::Stats batcher;
  };

  // Loads the newest version (errors name the path), starts the scoring threads, the loader and
  // the watcher, and listens. UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<PredictServer>> Start(Options options);
  ~PredictServer();  // Shutdown(absl::ZeroDuration())
  PredictServer(const PredictServer&) = delete;
  PredictServer& operator=(const PredictServer&) = delete;

  int port() const { return port_; }
  // The model served now.
  std::shared_ptr<const ServingModel> model() const;
  // Loads the newest version that reads if it is newer than the one served (on the calling
  // thread; the loader thread and Reload never load two at a time), skipping newer ones that do
  // not read (each logged). Returns whether the model changed; an error naming the versions tried
  // when versions newer than the one served exist but none reads (the served model stays);
  // CANCELLED when Shutdown stopped it.
  absl::StatusOr<bool> LoadNewest();
  // Stops in order: marks the health NOT_SERVING and answers new Predict calls UNAVAILABLE (a
  // client retries elsewhere); waits until every accepted request is answered (at most
  // `grace`); then stops gRPC within 200 ms more (a call that reaches it in that last instant is
  // CANCELLED by gRPC itself; idle client connections are closed), and every thread. A load in
  // progress is cancelled first (its Reload call gets CANCELLED). Idempotent.
  void Shutdown(absl::Duration grace);
  Stats stats() const;

 private:
  friend class PredictorService;
  explicit PredictServer(Options options);
  absl::Status Listen();
  void LoaderLoop();
  void WatchLoop();
  // Asks the loader thread for a LoadNewest; `done` (may be null) gets its result.
  void RequestLoad(std::function<void(absl::StatusOr<bool>)> done);

  const Options opt_;
  bool versioned_ = false;  // model_path is a base directory of versions
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<PredictorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  mutable absl::Mutex mu_;
  std::shared_ptr<const ServingModel> model_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // accepted Predict calls not yet answered
  std::vector<std::function<void(absl::StatusOr<bool>)>> load_requests_ ABSL_GUARDED_BY(mu_);
  bool load_wanted_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar load_cv_;

  absl::Mutex load_mu_;  // held while a version loads: one at a time
  absl::Notification cancel_loads_;  // notified by Shutdown: a load in progress gives up
  std::thread loader_;
  std::thread watcher_;
  int watch_fd_ = -1;  // inotify
  int wake_fd_ = -1;   // eventfd that ends the watcher
  std::atomic<bool> shut_down_{false};
  // Last: its scrape callback reads the members above, so it goes first.
  std::unique_ptr<ServeMetrics> metrics_;
};

}  // namespace pstrain
