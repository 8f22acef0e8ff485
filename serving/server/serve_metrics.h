// `pstrain serve`'s Prometheus metrics (common/metrics/metrics.h; served by `--metrics_port`):
// the server's counters read at every scrape (Predict calls accepted and refused, rows scored,
// batches, reloads; the version served as a gauge) and the time from a Predict call's arrival to
// its answer as a histogram (parsing, queueing, batching and scoring; gRPC's transport aside).
// docs/DEPLOY.md "Metrics and health" lists the families.
//
// Thread-safety: ObservePredict from any thread; the counters callback runs on the metrics
// endpoint's thread, must not block, and must stay valid while this object lives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/metrics/metrics.h"

namespace pstrain {

struct ServeCounters {
  int64_t requests = 0;     // Predict calls accepted
  int64_t rejected = 0;     // Predict calls refused (bad request, full queue, stopping)
  int64_t rows = 0;         // rows scored
  int64_t padded_rows = 0;  // rows computed, batch padding included
  int64_t batches = 0;
  int64_t reloads = 0;  // newer versions swapped in
  int64_t version = 0;  // the export version served
};

class ServeMetrics {
 public:
  explicit ServeMetrics(std::function<ServeCounters()> counters);
  void ObservePredict(double seconds) { latency_->Observe(seconds); }

 private:
  prometheus::Histogram* latency_;
  std::unique_ptr<ScrapeCallback> callback_;
};

}  // namespace pstrain
