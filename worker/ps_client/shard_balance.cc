#include "worker/ps_client/shard_balance.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pstrain {

std::string FormatShardBalance(const std::vector<ShardStats>& stats) {
  std::string out =
      absl::StrFormat("%-6s %12s %12s %10s %10s %10s %10s %10s %14s %14s", "shard",
                      "rows_owned", "rows_trained", "memory_MB", "pull_qps", "push_qps", "in_MB",
                      "out_MB", "dense_tau_avg", "row_tau_avg");
  // Staleness columns: mean (max) over the pushes that named their versions, "-" for none.
  auto tau = [](int64_t n, double mean, int64_t max) {
    return n > 0 ? absl::StrFormat("%.2f (max %d)", mean, max) : std::string("-");
  };
  for (const ShardStats& s : stats) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "\n%-6d %12d %12d %10.1f %10.1f %10.1f %10.1f %10.1f %14s %14s", s.shard(),
                  s.rows_owned(), s.rows_initialized(), s.bytes() / 1e6, s.pull_qps(),
                  s.push_qps(), s.bytes_in() / 1e6, s.bytes_out() / 1e6,
                  tau(s.dense_versioned_pushes(), s.dense_staleness_mean(), s.dense_staleness_max()),
                  tau(s.row_versioned_updates(), s.row_staleness_mean(), s.row_staleness_max())));
  }
  // max/mean: 1.0 is perfect balance; S means one shard does everything.
  auto imbalance = [&](auto field) {
    double max = 0, sum = 0;
    for (const ShardStats& s : stats) {
      const double v = static_cast<double>(field(s));
      max = std::max(max, v);
      sum += v;
    }
    return sum > 0 ? max * stats.size() / sum : 1.0;
  };
  absl::StrAppend(
      &out,
      absl::StrFormat("\nmax/mean imbalance: rows_owned %.3f  rows_trained %.3f  memory %.3f  "
                      "pulled_rows %.3f  bytes_in %.3f  bytes_out %.3f",
                      imbalance([](const ShardStats& s) { return s.rows_owned(); }),
                      imbalance([](const ShardStats& s) { return s.rows_initialized(); }),
                      imbalance([](const ShardStats& s) { return s.bytes(); }),
                      imbalance([](const ShardStats& s) { return s.pull_rows(); }),
                      imbalance([](const ShardStats& s) { return s.bytes_in(); }),
                      imbalance([](const ShardStats& s) { return s.bytes_out(); })));
  return out;
}

std::vector<DynamicTableMetrics> SumDynamicTables(const std::vector<ShardStats>& stats) {
  std::vector<DynamicTableMetrics> out;
  for (const ShardStats& s : stats) {
    for (const DynamicTableStats& t : s.dynamic_tables()) {
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const DynamicTableMetrics& m) { return m.table == t.name(); });
      if (it == out.end()) {
        out.push_back({});
        out.back().table = t.name();
        it = out.end() - 1;
      }
      it->rows_live += t.rows_live();
      it->admitted += t.admitted();
      it->rejected += t.rejected();
      it->evicted_ttl += t.evicted_ttl();
      it->evicted_capacity += t.evicted_capacity();
      it->new_ids_last_step += t.new_keys_last_step();
      it->bytes += t.bytes();
    }
  }
  return out;
}

}  // namespace pstrain
