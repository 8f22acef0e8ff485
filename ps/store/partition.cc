#include "ps/store/partition.h"

#include <algorithm>

#include "common/logging.h"

namespace pstrain {

PartitionMap::PartitionMap(int64_t rows, int partitions, int shards)
    : rows_(rows), partitions_(partitions), shards_(shards) {
  PSTRAIN_CHECK(rows >= 0 && partitions >= 1 && shards >= 1)
      << "rows=" << rows << " partitions=" << partitions << " shards=" << shards;
  base_ = rows / partitions;
  rem_ = rows % partitions;
}

PartitionMap::PartitionMap(const std::vector<TableSplit>& tables, int shards)
    : rows_(0), partitions_(0), shards_(shards), base_(0), rem_(0) {
  PSTRAIN_CHECK(!tables.empty() && shards >= 1)
      << "tables=" << tables.size() << " shards=" << shards;
  begins_.push_back(0);
  for (const TableSplit& t : tables) {
    PSTRAIN_CHECK(t.rows >= 1 && t.partitions >= 1)
        << "rows=" << t.rows << " partitions=" << t.partitions;
    const int p = static_cast<int>(std::min<int64_t>(t.partitions, t.rows));
    const int64_t base = t.rows / p, rem = t.rows % p;
    PSTRAIN_CHECK(t.row_dim >= 0) << "row_dim=" << t.row_dim;
    for (int i = 0; i < p; ++i) {
      begins_.push_back(begins_.back() + base + (i < rem ? 1 : 0));
      row_dims_.push_back(t.row_dim);
    }
    rows_ += t.rows;
    partitions_ += p;
  }
}

int64_t PartitionMap::PartitionBegin(int p) const {
  if (!begins_.empty()) return begins_[p];
  return p * base_ + (p < rem_ ? p : rem_);
}

int PartitionMap::PartitionOf(int64_t row) const {
  if (!begins_.empty()) {
    // The last partition starting at or before `row` (none is empty).
    return static_cast<int>(std::upper_bound(begins_.begin(), begins_.end(), row) -
                            begins_.begin()) - 1;
  }
  // The first rem_ partitions have base_ + 1 rows.
  const int64_t big = rem_ * (base_ + 1);
  if (row < big) return static_cast<int>(row / (base_ + 1));
  // base_ 0: every row is in the first rem_ partitions (none at all in an empty row space, a job
  // whose every table is dynamic), so a row here is outside [0, rows) and routes nowhere.
  PSTRAIN_CHECK(base_ > 0) << "row " << row << " outside [0, " << rows_ << ")";
  return static_cast<int>(rem_ + (row - big) / base_);
}

std::vector<int> PartitionMap::PartitionsOfShard(int s) const {
  std::vector<int> out;
  for (int p = s; p < partitions_; p += shards_) out.push_back(p);
  return out;
}

int64_t PartitionMap::RowsOfShard(int s) const {
  int64_t n = 0;
  for (int p : PartitionsOfShard(s)) n += PartitionSize(p);
  return n;
}

int NumPartitions(const ClusterConfig& cluster, int shards) {
  return cluster.num_partitions() > 0 ? cluster.num_partitions() : 4 * shards;
}

}  // namespace pstrain
