#include "worker/ps_client/pull_versions.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(PullVersions, ADensePushIsComputedFromTheLatestPullOfItsStepOrBefore) {
  PullVersions v(2);
  EXPECT_EQ(v.DenseForPush(0, 1), -1);  // nothing pulled yet
  // dense_sync_steps 2: dense pulled at steps 1 and 3, pushed at 2 and 4; the pull of step 3 is
  // prefetched (answered before the push of step 2).
  v.PulledDense(0, 1, 10);
  v.PulledDense(0, 3, 17);
  v.PulledDense(1, 1, 4);
  EXPECT_EQ(v.DenseForPush(0, 2), 10);
  EXPECT_EQ(v.DenseForPush(1, 2), 4);  // shards are separate
  EXPECT_EQ(v.DenseForPush(0, 4), 17);
  EXPECT_EQ(v.DenseForPush(0, 3), 17);  // the pull of step 1 was forgotten once step 4 passed it
}

TEST(PullVersions, KeepsABoundedNumberOfPulls) {
  PullVersions v(1);
  for (int64_t step = 1; step <= 1000; ++step) v.PulledDense(0, step, step * 10);
  EXPECT_EQ(v.DenseForPush(0, 1000 - PullVersions::kKept), -1);  // older than the kept ones
  EXPECT_EQ(v.DenseForPush(0, 1001 - PullVersions::kKept), (1001 - PullVersions::kKept) * 10);
  EXPECT_EQ(v.DenseForPush(0, 1000), 10000);
}

uint64_t FingerprintOf(std::initializer_list<int64_t> ids) {
  uint64_t h = 0;
  for (int64_t id : ids) h = PullVersions::Fingerprint(h, id);
  return h;
}

TEST(PullVersions, ARowPushTakesTheVersionsOfItsStepsPullOfTheSameIds) {
  PullVersions v(1);
  EXPECT_NE(FingerprintOf({1, 2, 3}), FingerprintOf({1, 3, 2}));  // the order counts
  v.PulledRows(0, 5, FingerprintOf({7, 8, 9}), {3, 0, 12});
  v.PulledRows(0, 6, FingerprintOf({7, 9}), {4, 12});
  EXPECT_TRUE(v.RowsForPush(0, 5, FingerprintOf({7, 9, 8})).empty());  // other ids or order
  v.PulledRows(0, 5, FingerprintOf({7, 8, 9}), {3, 0, 12});
  EXPECT_EQ(v.RowsForPush(0, 5, FingerprintOf({7, 8, 9})), (std::vector<uint32_t>{3, 0, 12}));
  EXPECT_TRUE(v.RowsForPush(0, 5, FingerprintOf({7, 8, 9})).empty());  // taken once
  EXPECT_EQ(v.RowsForPush(0, 6, FingerprintOf({7, 9})), (std::vector<uint32_t>{4, 12}));
}

}  // namespace
}  // namespace pstrain
