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
    // Floats per row of this table in its stores and on the wire (1 + the table's dim;
    // docs/ARCHITECTURE.md "Tables", compact widths). 0: the job's stride (Model::row_dim()).
    int row_dim = 0;
  };

  // Requires rows >= 0, partitions >= 1, shards >= 1. rows 0 is the empty fixed row space of a
  // job whose every table is dynamic: every partition is empty, and no row routes anywhere.
  PartitionMap(int64_t rows, int partitions, int shards);
  // The tables' rows one after the other (requires tables non-empty, shards >= 1).
  PartitionMap(const std::vector<TableSplit>& tables, int shards);

  int64_t rows() const { return rows_; }
  int partitions() const { return partitions_; }
  int shards() const { return shards_; }

  // First row of partition p (p in [0, partitions]; p == partitions gives rows()).
  int64_t PartitionBegin(int p) const;
  int64_t PartitionSize(int p) const { return PartitionBegin(p + 1) - PartitionBegin(p); }
  // Partition holding `row` (row in [0, rows); the callers check the range first).
  int PartitionOf(int64_t row) const;
  int ShardOfPartition(int p) const { return p % shards_; }
  int ShardOf(int64_t row) const { return ShardOfPartition(PartitionOf(row)); }
  // Partitions owned by shard s, ascending.
  std::vector<int> PartitionsOfShard(int s) const;
  // Floats per row of partition p's table (TableSplit::row_dim), or 0 (the stride) for a map of
  // one table or a table that gave none. The one place a row's width is looked up: a row's
  // width is PartitionRowDim(PartitionOf(row)).
  int PartitionRowDim(int p) const { return row_dims_.empty() ? 0 : row_dims_[p]; }
  int64_t RowsOfShard(int s) const;

 private:
  int64_t rows_;
  int partitions_;
  int shards_;
  int64_t base_;  // rows / partitions
  int64_t rem_;   // rows % partitions
  // Several tables: the first row of every partition, then rows (partitions + 1 entries).
  std::vector<int64_t> begins_;
  // Several tables: each partition's TableSplit::row_dim (partitions entries).
  std::vector<int> row_dims_;
};

// Floats per row of partition p in the stores and on the wire: its table's row_dim, at most the
// stride (a model whose rows hold fewer floats than 1 + dim, as LR's w alone, keeps its stride),
// and the stride when the map gives none.
inline int RowWidth(const PartitionMap& map, int p, int stride) {
  const int w = map.PartitionRowDim(p);
  return w > 0 && w < stride ? w : stride;
}

// Every partition's RowWidth in partition order, or empty when each is the stride (no table
// narrower than it): what a shard's Info says and a worker compares (ShardMap.partition_row_dims).
inline std::vector<int> PartitionWidths(const PartitionMap& map, int stride) {
  std::vector<int> widths(map.partitions());
  bool narrow = false;
  for (int p = 0; p < map.partitions(); ++p) {
    widths[p] = RowWidth(map, p, stride);
    narrow = narrow || widths[p] != stride;
  }
  if (!narrow) widths.clear();
  return widths;
}

// Table partitions P of a cluster: cluster.num_partitions, or 4 x shards when it is 0.
int NumPartitions(const ClusterConfig& cluster, int shards);

}  // namespace pstrain
