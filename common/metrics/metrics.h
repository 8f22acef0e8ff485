// The process's Prometheus metrics (prometheus-cpp): one registry that every layer reports into,
// scrape-time callbacks for values that are read rather than counted (a shard's statistics), and
// the HTTP endpoint that serves them (`--metrics_port`).
//
// One registry per process, as Prometheus' client libraries do with their default registry:
// the PS shard (ps/server) and the trainer (worker/train) report into it without plumbing, and
// the endpoint, started by the launcher (cmd/), serves whatever was registered. Metric names
// start with `pstrain_`; the families are listed in docs/DEPLOY.md "Metrics".
//
// Memory: families and their label sets live until the process ends (label values are shard and
// worker indices, so the set is bounded). Thread-safety: everything here is thread-safe;
// counters, gauges and histograms are prometheus-cpp's (atomic updates; a histogram observation
// takes its own mutex). Scrape callbacks run on the endpoint's HTTP thread and must not block.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace pstrain {

// The process's registry.
prometheus::Registry& Metrics();

// Latency buckets in seconds for request and step timings: 100 us to 10 s, x2.5.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

// Families computed at every scrape (e.g. from a server's counters). The callback is kept until
// the returned handle is destroyed; it must not block.
class ScrapeCallback {
 public:
  virtual ~ScrapeCallback() = default;
};
std::unique_ptr<ScrapeCallback> AddScrapeCallback(
    std::function<std::vector<prometheus::MetricFamily>()> collect);

// One gauge or counter sample for a scrape callback's families.
prometheus::ClientMetric GaugeSample(double value, prometheus::ClientMetric::Label label);
prometheus::ClientMetric CounterSample(double value, prometheus::ClientMetric::Label label);

// Everything registered, in the text exposition format (version 0.0.4) the endpoint serves.
std::string ScrapeText();

// The HTTP endpoint: GET /metrics. `address` is "host:port" (port 0 picks a free one); the
// launcher binds loopback unless told otherwise. UNAVAILABLE naming the address when it cannot
// listen.
//
// Hostile clients: civetweb gives each connection one of `threads` threads until its request is
// read and answered, so a client that opens a connection and sends part of a request holds a
// thread. Every read or write of a request is bounded by `request_timeout_ms`: K such
// connections delay a scrape by at most ceil((K + 1) / threads) x request_timeout_ms (issue 26
// item 8: with one thread and civetweb's 30 s default, two of them blocked scrapes for 60 s).
// Prometheus sends its whole request at once, so the bound is far above any honest scrape's.
class MetricsEndpoint {
 public:
  struct Options {
    int threads = 4;                 // civetweb's num_threads, >= 1
    int request_timeout_ms = 2000;   // civetweb's request_timeout_ms, >= 1
  };
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                                const Options& options);
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address) {
    return Start(address, Options());
  }
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace pstrain
