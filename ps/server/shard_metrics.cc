#include "ps/server/shard_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pstrain {

ShardMetrics::ShardMetrics(int shard, std::function<ShardStats()> stats) {
  const std::string id = absl::StrCat(shard);
  auto& latency = prometheus::BuildHistogram()
                      .Name("pstrain_ps_request_seconds")
                      .Help("Handling time of a shard's Pull and Push requests")
                      .Register(Metrics());
  pull_ = &latency.Add({{"shard", id}, {"rpc", "pull"}}, LatencyBuckets());
  push_ = &latency.Add({{"shard", id}, {"rpc", "push"}}, LatencyBuckets());
  callback_ = AddScrapeCallback([id, stats = std::move(stats)] {
    const ShardStats s = stats();
    const prometheus::ClientMetric::Label label{"shard", id};
    std::vector<prometheus::MetricFamily> out;
    auto add = [&](const char* name, const char* help, prometheus::MetricType type, double v) {
      out.push_back({name, help, type,
                     {type == prometheus::MetricType::Counter ? CounterSample(v, label)
                                                              : GaugeSample(v, label)}});
    };
    using T = prometheus::MetricType;
    add("pstrain_ps_pull_requests_total", "Pull requests served", T::Counter, s.pull_requests());
    add("pstrain_ps_push_requests_total", "Push requests applied", T::Counter, s.push_requests());
    add("pstrain_ps_duplicate_pushes_total", "Pushes recognized as retries and not applied again",
        T::Counter, s.duplicate_pushes());
    add("pstrain_ps_pull_rows_total", "Rows returned by pulls", T::Counter, s.pull_rows());
    add("pstrain_ps_push_rows_total", "Rows updated by pushes", T::Counter, s.push_rows());
    add("pstrain_ps_received_bytes_total", "Request payload bytes", T::Counter, s.bytes_in());
    add("pstrain_ps_sent_bytes_total", "Response payload bytes", T::Counter, s.bytes_out());
    add("pstrain_ps_pull_qps", "Pulls per second since the shard started", T::Gauge, s.pull_qps());
    add("pstrain_ps_push_qps", "Pushes per second since the shard started", T::Gauge, s.push_qps());
    add("pstrain_ps_rows_owned", "Rows of the table this shard holds", T::Gauge, s.rows_owned());
    add("pstrain_ps_rows_initialized", "Rows trained so far (stored); load balance is their "
        "spread over the shards", T::Gauge, s.rows_initialized());
    add("pstrain_ps_memory_bytes", "Memory of the shard's embedding stores and dense slice",
        T::Gauge, s.bytes());
    add("pstrain_ps_last_step", "Highest training step seen in a request", T::Gauge, s.last_step());
    // Each dynamic table's share on this shard, labelled {table, shard}: one family per metric
    // with a sample per table (a family named twice would be two families to a scraper).
    if (s.dynamic_tables_size() > 0) {
      auto add_dynamic = [&](const char* name, const char* help, prometheus::MetricType type,
                             int64_t (DynamicTableStats::*field)() const) {
        prometheus::MetricFamily family{name, help, type, {}};
        for (const DynamicTableStats& t : s.dynamic_tables()) {
          prometheus::ClientMetric sample =
              type == prometheus::MetricType::Counter
                  ? CounterSample(static_cast<double>((t.*field)()), label)
                  : GaugeSample(static_cast<double>((t.*field)()), label);
          sample.label.push_back({"table", t.name()});
          family.metric.push_back(std::move(sample));
        }
        out.push_back(std::move(family));
      };
      add_dynamic("pstrain_shard_dynamic_rows_live", "A dynamic table's live rows on the shard",
                  T::Gauge, &DynamicTableStats::rows_live);
      add_dynamic("pstrain_shard_dynamic_admitted_total", "Rows a dynamic table created",
                  T::Counter, &DynamicTableStats::admitted);
      add_dynamic("pstrain_shard_dynamic_rejected_total",
                  "Updates a dynamic table dropped: key not admitted", T::Counter,
                  &DynamicTableStats::rejected);
      add_dynamic("pstrain_shard_dynamic_evicted_ttl_total", "Rows evicted by TTL", T::Counter,
                  &DynamicTableStats::evicted_ttl);
      add_dynamic("pstrain_shard_dynamic_evicted_capacity_total",
                  "Rows evicted above the per-shard row or byte cap", T::Counter,
                  &DynamicTableStats::evicted_capacity);
      add_dynamic("pstrain_shard_dynamic_new_ids_last_step",
                  "Rows a dynamic table created at its last step", T::Gauge,
                  &DynamicTableStats::new_keys_last_step);
      add_dynamic("pstrain_shard_dynamic_bytes", "A dynamic table's measured memory on the shard",
                  T::Gauge, &DynamicTableStats::bytes);
    }
    return out;
  });
}

}  // namespace pstrain
