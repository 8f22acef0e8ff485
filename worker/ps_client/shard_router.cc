#include "worker/ps_client/shard_router.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dynamic_rows.h"
#include "ps/store/dynamic_routing.h"

namespace pstrain {

ShardRouter::ShardRouter(int64_t rows, int partitions, int shards, int64_t dense_size,
                         const std::vector<PartitionMap::TableSplit>& table_splits,
                         std::vector<int> dynamic_row_dims)
    : map_(table_splits.empty() ? PartitionMap(rows, partitions, shards)
                                : PartitionMap(table_splits, shards)),
      dense_(dense_size, shards, shards),
      dynamic_row_dims_(std::move(dynamic_row_dims)) {
  partition_rank_.resize(map_.partitions());
  int rank = 0;
  for (int s = 0; s < shards; ++s) {
    shard_rank_begin_.push_back(rank);
    for (int p : map_.PartitionsOfShard(s)) partition_rank_[p] = rank++;
    if (!dynamic_row_dims_.empty()) dynamic_rank_.push_back(rank++);
  }
  shard_rank_begin_.push_back(rank);
}

absl::Status ShardRouter::GroupByShard(absl::Span<const int64_t> ids, std::vector<int32_t>* order,
                                    std::vector<int64_t>* bounds) const {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("too many ids in one call: ", n));
  }
  // Counting sort by partition rank: shards come out in order, each shard's ids grouped by
  // partition so that the shard handles each partition's ids in one run.
  const int R = shard_rank_begin_.back();
  std::vector<int32_t> rank(n);
  std::vector<int64_t> start(R + 1, 0);
  const int num_dynamic = static_cast<int>(dynamic_row_dims_.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (IsDynamicRow(id)) {
      if (DynamicTableOf(id) >= num_dynamic) {
        return absl::InvalidArgumentError(absl::StrCat(
            "row id ", id, " (position ", i, ") is of dynamic table ", DynamicTableOf(id),
            ", but the job has ", num_dynamic, " dynamic tables"));
      }
      rank[i] = dynamic_rank_[DynamicShardOf(id, shards())];
      ++start[rank[i] + 1];
      continue;
    }
    if (id < 0 || id >= map_.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row id ", id, " (position ", i, ") is outside the table [0, ", map_.rows(), ")"));
    }
    rank[i] = partition_rank_[map_.PartitionOf(id)];
    ++start[rank[i] + 1];
  }
  for (int r = 0; r < R; ++r) start[r + 1] += start[r];
  bounds->resize(shards() + 1);
  for (int s = 0; s <= shards(); ++s) (*bounds)[s] = start[shard_rank_begin_[s]];
  order->resize(n);
  for (int64_t i = 0; i < n; ++i) (*order)[start[rank[i]]++] = static_cast<int32_t>(i);
  return absl::OkStatus();
}

absl::Status ShardRouter::CheckShard(int shard, const std::string& address,
                                     const InfoResponse& info, int row_dim, int worker) const {
  const ShardMap& m = info.map();
  const std::vector<int> their_dynamic(m.dynamic_row_dims().begin(), m.dynamic_row_dims().end());
  if (their_dynamic != dynamic_row_dims_) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, " serves shard ", info.shard(), " with ", their_dynamic.size(),
        " dynamic tables of row dims [", absl::StrJoin(their_dynamic, ", "),
        "], but this worker expects ", dynamic_row_dims_.size(), " of row dims [",
        absl::StrJoin(dynamic_row_dims_, ", "),
        "]: the shard and the worker run different configs (features.table[*].dynamic)"));
  }
  if (info.shard() != shard || m.shards() != shards() || m.rows() != map_.rows() ||
      m.partitions() != map_.partitions() || m.row_dim() != row_dim ||
      m.dense_size() != dense_.rows()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s serves shard %d of %d with rows=%d partitions=%d row_dim=%d dense_size=%d, but "
        "this worker expects shard %d of %d with rows=%d partitions=%d row_dim=%d "
        "dense_size=%d: check the cluster spec and the config",
        address, info.shard(), m.shards(), m.rows(), m.partitions(), m.row_dim(), m.dense_size(),
        shard, shards(), map_.rows(), map_.partitions(), row_dim, dense_.rows()));
  }
  const std::vector<int> their_widths(m.partition_row_dims().begin(),
                                      m.partition_row_dims().end());
  const std::vector<int> widths = PartitionWidths(map_, row_dim);
  if (their_widths != widths) {
    auto list = [](const std::vector<int>& w) {
      return w.empty() ? std::string("every row at the stride")
                       : absl::StrCat("[", absl::StrJoin(w, ", "), "]");
    };
    return absl::FailedPreconditionError(absl::StrCat(
        address, " serves shard ", info.shard(), " with partition row widths ",
        list(their_widths), ", but this worker expects ", list(widths),
        ": the shard and the worker run different configs (features.table[*].dim)"));
  }
  if (info.num_workers() > 0 && worker >= info.num_workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, " serves a job of ", info.num_workers(), " workers, but this is worker ", worker,
        ": start every `pstrain ps` with --num_workers set to the job's workers"));
  }
  if (!info.ready()) {
    return absl::UnavailableError(absl::StrCat("shard ", shard, " (", address, ") is not ready"));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
