#include "worker/params/dedup.h"

#include <set>

#include "common/random.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(Deduper, SlotsMapBackToIdsAndUniqueIsDistinct) {
  Rng rng(7);
  Deduper d;
  std::vector<int64_t> unique;
  std::vector<int32_t> slots;
  for (int round = 0; round < 3; ++round) {  // reuse across steps
    std::vector<int64_t> ids(5000);
    for (auto& id : ids) id = static_cast<int64_t>(rng.Uniform(700 + round * 1000));
    d.Run(ids, &unique, &slots);
    ASSERT_EQ(slots.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(unique[slots[i]], ids[i]);
    std::set<int64_t> distinct(ids.begin(), ids.end());
    EXPECT_EQ(unique.size(), distinct.size());
    EXPECT_EQ(std::set<int64_t>(unique.begin(), unique.end()), distinct);
    // First-occurrence order: slots never jump ahead by more than one new id.
    int32_t next = 0;
    for (int32_t s : slots) {
      ASSERT_LE(s, next);
      if (s == next) ++next;
    }
  }
}

TEST(Deduper, Empty) {
  Deduper d;
  std::vector<int64_t> unique{1, 2};
  std::vector<int32_t> slots{3};
  d.Run({}, &unique, &slots);
  EXPECT_TRUE(unique.empty());
  EXPECT_TRUE(slots.empty());
}

}  // namespace
}  // namespace pstrain
