// TensorFlow fixed_size_partitioner semantics for a table of V rows split into P partitions that
// live on S shards:
//   - partition p holds a contiguous row range; the first V mod P partitions get one extra row;
//   - partition p lives on shard p mod S.
// A flat dense vector is split the same way, by size (P = S).
//
// Tables (FeatureConfig.table, docs/PS.md "Tables"): a row space made of tables, each a
// contiguous range, is split table by table: table t's rows into its own P_t fixed-size
// partitions (TF's semantics within the table; P_t at most the table's rows, so that no partition
// is empty), numbered globally in table order, and global partition g lives on shard g mod S, so
// the tables spread over the shards. One table of V rows and P partitions is exactly the map
// above.
#pragma once

#include "pstrain/config.pb.h"

#include <cstdint>
#include <vector>

namespace pstrain {

class PartitionMap {
 public:
  // One table's rows in a row space of several, in row order.
  struct TableSplit {
    int64_t rows = 0;    // >= 1
    int partitions = 1;  // >= 1; more than rows are clamped to rows
  };

  // Requires rows >= 0, partitions >= 1, shards >= 1.
  PartitionMap(int64_t rows, int partitions, int shards);
  // The tables' rows one after the other (requires tables non-empty, shards >= 1).
  PartitionMap(const std::vector<TableSplit>& tables, int shards);

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
  // Several tables: the first row of every partition, then rows (partitions + 1 entries).
  std::vector<int64_t> begins_;
};

// Table partitions P of a cluster: cluster.num_partitions, or 4 x shards when it is 0.
int NumPartitions(const ClusterConfig& cluster, int shards);

}  // namespace pstrain
