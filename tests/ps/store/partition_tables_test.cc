// PartitionMap over tables (FeatureConfig.table): each table split into its own fixed-size
// partitions with TF's semantics, numbered globally in table order, partition g on shard g mod S.
#include <vector>

#include "gtest/gtest.h"
#include "ps/store/partition.h"

namespace pstrain {
namespace {

TEST(PartitionTables, EachTableHasItsOwnPartitions) {
  // 10 rows in 3 partitions (4, 3, 3), 5 rows asking 10 (clamped to 5 of 1), 7 rows in 1.
  const PartitionMap map({{10, 3}, {5, 10}, {7, 1}}, 2);
  EXPECT_EQ(map.rows(), 22);
  EXPECT_EQ(map.partitions(), 9);
  const std::vector<int64_t> begins = {0, 4, 7, 10, 11, 12, 13, 14, 15, 22};
  for (int p = 0; p <= map.partitions(); ++p) EXPECT_EQ(map.PartitionBegin(p), begins[p]) << p;
  for (int p = 0; p < map.partitions(); ++p) {
    EXPECT_GT(map.PartitionSize(p), 0) << p;
    for (int64_t r = begins[p]; r < begins[p + 1]; ++r) EXPECT_EQ(map.PartitionOf(r), p) << r;
    EXPECT_EQ(map.ShardOfPartition(p), p % 2);
  }
  EXPECT_EQ(map.PartitionsOfShard(1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(map.RowsOfShard(0) + map.RowsOfShard(1), 22);
  EXPECT_EQ(map.RowsOfShard(1), 3 + 1 + 1 + 1);
}

// One table is the map of before tables, row for row.
TEST(PartitionTables, OneTableIsTheClassicMap) {
  for (int shards : {1, 3}) {
    const PartitionMap a(1000, 7, shards);
    const PartitionMap b({{1000, 7}}, shards);
    ASSERT_EQ(a.partitions(), b.partitions());
    for (int p = 0; p <= a.partitions(); ++p) EXPECT_EQ(a.PartitionBegin(p), b.PartitionBegin(p));
    for (int64_t r = 0; r < 1000; r += 13) EXPECT_EQ(a.PartitionOf(r), b.PartitionOf(r));
    for (int s = 0; s < shards; ++s) EXPECT_EQ(a.PartitionsOfShard(s), b.PartitionsOfShard(s));
  }
}

// The empty fixed row space of a PS job whose every table is dynamic (issue 28): every partition
// is empty, no shard owns a row, every width is the stride, and no row routes anywhere (the
// callers check [0, rows) first; PartitionOf past it is a broken invariant, not a division by
// zero).
TEST(PartitionTables, EmptyRowSpaceHasEmptyPartitions) {
  const PartitionMap map(0, 8, 2);
  EXPECT_EQ(map.rows(), 0);
  EXPECT_EQ(map.partitions(), 8);
  for (int p = 0; p <= map.partitions(); ++p) EXPECT_EQ(map.PartitionBegin(p), 0) << p;
  for (int p = 0; p < map.partitions(); ++p) EXPECT_EQ(map.PartitionSize(p), 0) << p;
  EXPECT_EQ(map.RowsOfShard(0), 0);
  EXPECT_EQ(map.RowsOfShard(1), 0);
  EXPECT_EQ(map.PartitionsOfShard(1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_TRUE(PartitionWidths(map, 9).empty());
  EXPECT_DEATH(map.PartitionOf(0), "outside \\[0, 0\\)");
}

}  // namespace
}  // namespace pstrain
