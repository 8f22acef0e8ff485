#include "common/memory.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_cgroup.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

class CgroupMemoryTest : public testing::FakeCgroupTest {
 protected:
  absl::StatusOr<std::optional<int64_t>> Limit() {
    return CgroupMemoryLimit(proc_self_cgroup(), cgroup_root());
  }
};

TEST_F(CgroupMemoryTest, V2SmallestLimitFromTheCgroupUp) {
  Write("proc_self_cgroup", "0::/emul/h0\n");
  Write("sys/emul/h0/memory.max", "1073741824\n");
  Write("sys/emul/memory.max", "536870912\n");  // the parent's is smaller: it binds
  Write("sys/memory.max", "max\n");
  auto l = Limit();
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->value(), 536870912);
}

TEST_F(CgroupMemoryTest, V2MaxIsNoLimit) {
  Write("proc_self_cgroup", "0::/\n");
  Write("sys/memory.max", "max\n");
  auto l = Limit();
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->has_value());
}

// A hybrid hierarchy (this machine's: v1 controllers plus an empty v2 line): the v1 memory
// controller is read, and v1's "unlimited" (LONG_MAX rounded to a page) is no limit.
TEST_F(CgroupMemoryTest, V1MemoryControllerOfAHybridHierarchy) {
  Write("proc_self_cgroup", "4:memory:/process_api/abc/pstrain-emul-1-h0\n1:cpu:/\n0::/\n");
  Write("sys/memory/process_api/abc/pstrain-emul-1-h0/memory.limit_in_bytes", "268435456\n");
  Write("sys/memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n");
  Write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  auto l = Limit();
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->value(), 268435456);
}

TEST_F(CgroupMemoryTest, NoMemoryControllerNoLimit) {
  Write("proc_self_cgroup", "4:cpu,cpuacct:/docker/abc\n");
  auto l = Limit();
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->has_value());
}

TEST_F(CgroupMemoryTest, AGarbledLimitNamesTheFile) {
  Write("proc_self_cgroup", "0::/\n");
  Write("sys/memory.max", "lots\n");
  auto l = Limit();
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("memory.max"));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("'lots"));
}

constexpr int64_t kMb = 1 << 20;

TEST(MemoryBudget, TheSmallestSourceBindsAndIsNamed) {
  // cgroup 1024 MB with 100 MB resident: 924 MB left; RLIMIT_AS 4096 MB with 3500 MB mapped:
  // 596 MB left; MemAvailable 20 GB.
  MemoryBudget b = MakeMemoryBudget(1024 * kMb, 100 * kMb, 4096 * kMb, 3500 * kMb, 20480 * kMb);
  EXPECT_EQ(b.bytes, 596 * kMb);
  EXPECT_THAT(b.source, HasSubstr("RLIMIT_AS 4096 MB"));
  b = MakeMemoryBudget(1024 * kMb, 100 * kMb, std::nullopt, 3500 * kMb, 20480 * kMb);
  EXPECT_EQ(b.bytes, 924 * kMb);
  EXPECT_THAT(b.source, HasSubstr("cgroup memory limit 1024 MB"));
  b = MakeMemoryBudget(std::nullopt, 100 * kMb, std::nullopt, 0, 512 * kMb);
  EXPECT_EQ(b.bytes, 512 * kMb);
  EXPECT_THAT(b.source, HasSubstr("MemAvailable 512 MB"));
}

TEST(MemoryBudget, NothingKnownIsNoBudgetAndOverdrawnIsZero) {
  EXPECT_EQ(MakeMemoryBudget(std::nullopt, 0, std::nullopt, 0, std::nullopt).bytes, -1);
  EXPECT_EQ(MakeMemoryBudget(10 * kMb, 20 * kMb, std::nullopt, 0, std::nullopt).bytes, 0);
}

// This process has some budget (at least the machine's MemAvailable is readable here).
TEST(MemoryBudget, DetectedForThisProcess) {
  const MemoryBudget b = DetectMemoryBudget();
  EXPECT_GT(b.bytes, 0) << b.source;
  EXPECT_FALSE(b.source.empty());
}

}  // namespace
}  // namespace pstrain
