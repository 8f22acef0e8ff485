// ShardRouter: where a PS client's ids and dense vector go. Rows: PartitionMap(V, P, S) (fixed-size
// partitions, partition p on shard p mod S, ps/store/partition.h). Dynamic tables' rows (negative
// ids, common/dynamic_rows.h): the shard of their key's hash (DynamicShardOf,
// ps/store/dynamic_routing.h). The dense vector: S slices by size, slice s on shard s.
// Immutable; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ps/store/partition.h"
#include "pstrain/ps_service.pb.h"

namespace pstrain {

class ShardRouter {
 public:
  // V rows in `partitions` partitions over `shards` shards; a dense vector of `dense_size` floats.
  // `table_splits` not empty: the tables' own partitions (PartitionMap's second form) instead.
  // `dynamic_row_dims`: the dynamic tables' floats per row (1 + dim each, in dynamic index
  // order), as every shard has them (ShardMap.dynamic_row_dims).
  ShardRouter(int64_t rows, int partitions, int shards, int64_t dense_size,
              const std::vector<PartitionMap::TableSplit>& table_splits = {},
              std::vector<int> dynamic_row_dims = {});

  int shards() const { return map_.shards(); }
  const PartitionMap& map() const { return map_; }
  int64_t dense_begin(int shard) const { return dense_.PartitionBegin(shard); }
  int64_t dense_size(int shard) const { return dense_.PartitionSize(shard); }
  // Floats per row of dynamic table `table` (an index GroupByShard accepted).
  int dynamic_row_dim(int table) const { return dynamic_row_dims_[table]; }

  // Orders ids by owning shard, then partition (each shard handles a partition's ids in one
  // run), a shard's dynamic ids after its partitions' (in call order): *order lists the positions
  // of ids so sorted, shard s's ids being (*order)[bounds[s], bounds[s + 1]). INVALID_ARGUMENT for
  // an id outside [0, V) or of a dynamic table this router does not have (naming it and its
  // position) or more than 2^31 - 1 ids.
  absl::Status GroupByShard(absl::Span<const int64_t> ids, std::vector<int32_t>* order,
                            std::vector<int64_t>* bounds) const;

  // Whether shard `shard`'s Info (at `address`) says it serves this table: shard `shard` of S with
  // these V, P, `row_dim`, dense size and dynamic tables' row dims (FAILED_PRECONDITION naming
  // both sides otherwise), and is
  // ready (UNAVAILABLE otherwise), in a job that has a worker `worker` (FAILED_PRECONDITION).
  absl::Status CheckShard(int shard, const std::string& address, const InfoResponse& info,
                          int row_dim, int worker) const;

 private:
  const PartitionMap map_;
  const PartitionMap dense_;  // PartitionMap(dense_size, S, S)
  const std::vector<int> dynamic_row_dims_;
  // Partitions in shard-major order (shard 0's ascending, then, with dynamic tables, one rank for
  // its dynamic ids, then shard 1's, ...): the rank of each partition, the rank of each shard's
  // dynamic ids (empty without dynamic tables), and the first rank of each shard (S + 1 entries).
  std::vector<int> partition_rank_;
  std::vector<int> dynamic_rank_;
  std::vector<int> shard_rank_begin_;
};

}  // namespace pstrain
