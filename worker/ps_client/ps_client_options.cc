// PsClient::Options: from a cluster config, and their validation (worker/ps_client/ps_client.h).
#include "absl/strings/str_cat.h"
#include "common/dynamic_rows.h"
#include "worker/ps_client/ps_client.h"

namespace pstrain {

PsClient::Options PsClient::OptionsFromConfig(const ClusterConfig& cluster, int64_t rows,
                                              int row_dim, int64_t dense_size) {
  Options o;
  o.shards.assign(cluster.ps().begin(), cluster.ps().end());
  o.rows = rows;
  o.partitions = NumPartitions(cluster, cluster.ps_size());
  o.row_dim = row_dim;
  o.dense_size = dense_size;
  o.worker_id = cluster.index();
  o.rpc_deadline_ms = cluster.rpc_deadline_ms();
  o.rpc_retries = cluster.rpc_retries();
  o.call_deadline_ms = cluster.rpc_call_deadline_ms();
  o.initial_backoff_ms = cluster.rpc_backoff_ms();
  o.max_backoff_ms = cluster.rpc_max_backoff_ms();
  o.max_pushes_in_flight = cluster.max_pushes_in_flight();
  o.consistency = cluster.consistency();
  return o;
}

absl::Status PsClient::Options::Validate() const {
  const Options& o = *this;
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("PsClient options: ", what));
  };
  if (o.shards.empty()) return bad("no shard addresses");
  // No fixed row at all is a job whose every table is dynamic (its ids are keys, not rows).
  if (o.rows < 0 || (o.rows == 0 && o.dynamic_row_dims.empty())) {
    return bad(absl::StrCat("rows must be > 0 (or 0 with dynamic tables: every table dynamic), "
                            "got ", o.rows));
  }
  if (o.partitions < 0) return bad(absl::StrCat("partitions must be >= 0, got ", o.partitions));
  if (o.row_dim < 1) return bad(absl::StrCat("row_dim must be > 0, got ", o.row_dim));
  if (o.dense_size < 0) return bad(absl::StrCat("dense_size must be >= 0, got ", o.dense_size));
  if (o.dynamic_row_dims.size() > static_cast<size_t>(kMaxDynamicTables)) {
    return bad(absl::StrCat("dynamic_row_dims: ", o.dynamic_row_dims.size(), " tables, at most ",
                            kMaxDynamicTables));
  }
  for (size_t t = 0; t < o.dynamic_row_dims.size(); ++t) {
    if (o.dynamic_row_dims[t] < 1 || o.dynamic_row_dims[t] > o.row_dim) {
      return bad(absl::StrCat("dynamic_row_dims[", t, "] must be in [1, ", o.row_dim,
                              "] (row_dim), got ", o.dynamic_row_dims[t]));
    }
  }
  if (o.rpc_deadline_ms < 1 || o.rpc_retries < 0 || o.call_deadline_ms < 0 ||
      o.initial_backoff_ms < 1 || o.max_backoff_ms < o.initial_backoff_ms) {
    return bad(absl::StrCat("need rpc_deadline_ms > 0 (", o.rpc_deadline_ms,
                            "), rpc_retries >= 0 (", o.rpc_retries, "), call_deadline_ms >= 0 (",
                            o.call_deadline_ms, "), 0 < initial_backoff_ms (", o.initial_backoff_ms,
                            ") <= max_backoff_ms (", o.max_backoff_ms, ")"));
  }
  if (o.local_shard >= static_cast<int>(o.shards.size()) ||
      (o.local_shard >= 0) != (o.local_server != nullptr)) {
    return bad(absl::StrCat("local_shard ", o.local_shard, " needs a local_server and must name ",
                            "one of the ", o.shards.size(), " shards"));
  }
  if (absl::Status s = ValidateRpcSecurity(o.security); !s.ok()) return s;
  if (o.max_pushes_in_flight < 1) {
    return bad(absl::StrCat("max_pushes_in_flight must be >= 1, got ", o.max_pushes_in_flight));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
