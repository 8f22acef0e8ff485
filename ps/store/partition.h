// TensorFlow fixed_size_partitioner semantics for a table of V rows split into P partitions that
// live on S shards:
//   - partition p holds a contiguous row range; the first V mod P partitions get one extra row;
//   - partition p lives on shard p mod S.
// A flat dense vector is split the same way, by size (P = S).
#pragma once

#include "pstrain/config.pb.h"

#include <cstdint>
#include <vector>

namespace pstrain {

class PartitionMap {
 public:
  // Requires rows >= 0, partitions >= 1, shards >= 1.
  PartitionMap(int64_t rows, int partitions, int shards);

  int64_t rows() const { return rows_; }
  int partitions() const { return partitions_; }
  int shards() const { return shards_; }

  // First row of partition p (p in [0, partitions]; p == partitions gives rows()).
  int64_t PartitionBegin(int p) const;
  int64_t PartitionSize(int p) const { return PartitionBegin(p + 1) - PartitionBegin(p); }
  // Partition holding `row` (row in [0, rows)).
  int PartitionOf(int64_t row) const;
  int ShardOfPartition(int p) const { return p % shards_; }
  int ShardOf(int64_t row) const { return ShardOfPartition(PartitionOf(row)); }
  // Partitions owned by shard s, ascending.
  std::vector<int> PartitionsOfShard(int s) const;
  int64_t RowsOfShard(int s) const;

 private:
  int64_t rows_;
  int partitions_;
  int shards_;
  int64_t base_;  // rows / partitions
  int64_t rem_;   // rows % partitions
};

// Table partitions P of a cluster: cluster.num_partitions, or 4 x shards when it is 0.
int NumPartitions(const ClusterConfig& cluster, int shards);

}  // namespace pstrain
