#include "ps/store/partition.h"

#include "common/logging.h"

namespace pstrain {

PartitionMap::PartitionMap(int64_t rows, int partitions, int shards)
    : rows_(rows), partitions_(partitions), shards_(shards) {
  PSTRAIN_CHECK(rows >= 0 && partitions >= 1 && shards >= 1)
      << "rows=" << rows << " partitions=" << partitions << " shards=" << shards;
  base_ = rows / partitions;
  rem_ = rows % partitions;
}

int64_t PartitionMap::PartitionBegin(int p) const {
  return p * base_ + (p < rem_ ? p : rem_);
}

int PartitionMap::PartitionOf(int64_t row) const {
  // The first rem_ partitions have base_ + 1 rows.
  const int64_t big = rem_ * (base_ + 1);
  if (row < big) return static_cast<int>(row / (base_ + 1));
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
