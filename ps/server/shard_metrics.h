// A shard's Prometheus metrics (common/metrics/metrics.h): its ShardStats read at every scrape
// (requests, rows and bytes as counters; QPS, stored rows, memory and the last step as gauges,
// labelled shard="i", so that load balance is max/avg over the shard label), and the handling
// time of pulls and pushes as histograms (a BOUNDED / SYNC pull held for the slow workers is not
// timed: its wait is the consistency mode's, docs/PS.md).
//
// Thread-safety: Observe* from any thread (gRPC's); the stats callback runs on the metrics
// endpoint's thread and must stay valid while this object lives.
#pragma once

#include <functional>
#include <memory>

#include "common/metrics/metrics.h"
#include "pstrain/ps_service.pb.h"

namespace pstrain {

class ShardMetrics {
 public:
  ShardMetrics(int shard, std::function<ShardStats()> stats);
  void ObservePull(double seconds) { pull_->Observe(seconds); }
  void ObservePush(double seconds) { push_->Observe(seconds); }

 private:
  prometheus::Histogram* pull_;
  prometheus::Histogram* push_;
  std::unique_ptr<ScrapeCallback> callback_;
};

}  // namespace pstrain
