#include "worker/ps_client/dense_versions.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(DenseVersions, APushIsComputedFromTheLatestPullOfItsStepOrBefore) {
  DenseVersions v(2);
  EXPECT_EQ(v.ForPush(0, 1), -1);  // nothing pulled yet
  // dense_sync_steps 2: dense pulled at steps 1 and 3, pushed at 2 and 4; the pull of step 3 is
  // prefetched (answered before the push of step 2).
  v.Pulled(0, 1, 10);
  v.Pulled(0, 3, 17);
  v.Pulled(1, 1, 4);
  EXPECT_EQ(v.ForPush(0, 2), 10);
  EXPECT_EQ(v.ForPush(1, 2), 4);  // shards are separate
  EXPECT_EQ(v.ForPush(0, 4), 17);
  EXPECT_EQ(v.ForPush(0, 3), 17);  // the pull of step 1 was forgotten once step 4 passed it
}

TEST(DenseVersions, KeepsABoundedNumberOfPulls) {
  DenseVersions v(1);
  for (int64_t step = 1; step <= 1000; ++step) v.Pulled(0, step, step * 10);
  EXPECT_EQ(v.ForPush(0, 1000 - DenseVersions::kKept), -1);  // older than the kept ones
  EXPECT_EQ(v.ForPush(0, 1001 - DenseVersions::kKept), (1001 - DenseVersions::kKept) * 10);
  EXPECT_EQ(v.ForPush(0, 1000), 10000);
}

}  // namespace
}  // namespace pstrain
