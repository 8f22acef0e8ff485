// The CPU module (common/cpu.h): ISA names, the path each kind of CPU gets, the kernel path
// switch, the cgroup quota from fake /proc/self/cgroup and controller files, the CPU budget, and
// OMP_NUM_THREADS / taskset as pstrain train sees them.
#include "common/cpu.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_cgroup.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

CpuFeatures Zen3() {  // AMD EPYC Milan: AVX2 + FMA only
  CpuFeatures c;
  c.avx2 = c.fma = c.f16c = c.bmi1 = c.bmi2 = c.lzcnt = c.movbe = true;
  return c;
}
CpuFeatures SkylakeX() {  // AVX-512 without bf16
  CpuFeatures c = Zen3();
  c.avx512f = c.avx512bw = c.avx512vl = c.avx512dq = true;
  return c;
}
CpuFeatures Zen4() {  // AVX-512 with bf16, no AMX
  CpuFeatures c = SkylakeX();
  c.avx512_bf16 = true;
  return c;
}
CpuFeatures SapphireRapids() {
  CpuFeatures c = Zen4();
  c.amx_tile = c.amx_bf16 = true;
  return c;
}

TEST(Isa, NamesRoundTripAndOneDnnSpellingsParse) {
  for (Isa isa : kAllIsas) {
    auto parsed = ParseIsa(IsaName(isa));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(*ParseIsa("AVX512_CORE_AMX"), Isa::kAvx512CoreAmx);  // ONEDNN_MAX_CPU_ISA's case
  EXPECT_EQ(*ParseIsa(" avx2_vnni "), Isa::kAvx2);
  EXPECT_EQ(*ParseIsa("avx512_core_vnni"), Isa::kAvx512Core);
  auto bad = ParseIsa("avx3");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("expected one of avx2"));
}

TEST(Isa, EachKindOfCpuGetsItsBestPathAndTheMissingFeaturesAreNamed) {
  EXPECT_EQ(BestIsa(Zen3()), Isa::kAvx2);
  EXPECT_EQ(BestIsa(SkylakeX()), Isa::kAvx512Core);
  EXPECT_EQ(BestIsa(Zen4()), Isa::kAvx512CoreBf16);
  EXPECT_EQ(BestIsa(SapphireRapids()), Isa::kAvx512CoreAmx);
  CpuFeatures sandy_bridge = Zen3();
  sandy_bridge.avx2 = sandy_bridge.fma = sandy_bridge.f16c = false;
  EXPECT_EQ(BestIsa(sandy_bridge), std::nullopt);
  EXPECT_EQ(MissingFeatures(Isa::kAvx2, sandy_bridge), "avx2, fma, f16c");
  EXPECT_EQ(MissingFeatures(Isa::kAvx512CoreBf16, SkylakeX()), "avx512_bf16");
  EXPECT_EQ(MissingFeatures(Isa::kAvx512CoreAmx, Zen4()), "amx_tile, amx_bf16");
  EXPECT_EQ(MissingFeatures(Isa::kAvx512CoreBf16, SapphireRapids()), "");
}

TEST(Isa, KernelPathLowersAndRefusesWhatTheCpuLacks) {
  const CpuFeatures cpu = DetectCpuFeatures();
  ASSERT_TRUE(BestIsa(cpu).has_value()) << "a process that runs has AVX2";
  const Isa best = *BestIsa(cpu);
  const Isa before = KernelIsa();
  EXPECT_LE(before, best);
  ASSERT_TRUE(SetKernelIsa(Isa::kAvx2).ok());
  EXPECT_EQ(KernelIsa(), Isa::kAvx2);
  if (best < Isa::kAvx512CoreAmx) {
    const Isa above = static_cast<Isa>(static_cast<int>(best) + 1);
    absl::Status s = SetKernelIsa(above);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()), HasSubstr(MissingFeatures(above, cpu)));
    EXPECT_EQ(KernelIsa(), Isa::kAvx2);  // unchanged by the refusal
  }
  ASSERT_TRUE(SetKernelIsa(before).ok());
}

// ---- cgroup quota, from fake files --------------------------------------------------------------

class CgroupTest : public testing::FakeCgroupTest {
 protected:
  absl::StatusOr<std::optional<double>> Quota() {
    return CgroupCpuQuota(proc_self_cgroup(), cgroup_root());
  }
};

TEST_F(CgroupTest, V2QuotaOfTheProcessCgroupAndItsAncestors) {
  Write("proc_self_cgroup", "0::/kubepods/pod1/ctr\n");
  Write("sys/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  Write("sys/kubepods/pod1/cpu.max", "150000 100000\n");  // 1.5 CPUs: the pod's limit
  Write("sys/kubepods/cpu.max", "800000 100000\n");
  auto q = Quota();
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(q->has_value());
  EXPECT_DOUBLE_EQ(**q, 1.5);
}

TEST_F(CgroupTest, V2InsideAContainerReadsTheRoot) {
  Write("proc_self_cgroup", "0::/\n");
  Write("sys/cpu.max", "200000 100000\n");
  auto q = Quota();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(q->value(), 2.0);
}

TEST_F(CgroupTest, V2WithoutALimitHasNone) {
  Write("proc_self_cgroup", "0::/user.slice\n");
  Write("sys/user.slice/cpu.max", "max 100000\n");
  auto q = Quota();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->has_value());
}

TEST_F(CgroupTest, V1CfsQuotaAndPeriod) {
  Write("proc_self_cgroup",
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n");
  Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
  Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  Write("sys/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("sys/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  auto q = Quota();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(q->value(), 3.0);
}

TEST_F(CgroupTest, V1ContainerWithoutNamespaceFindsTheMountRoot) {
  // The path names the host's cgroup, but the container sees its own at the mount root.
  Write("proc_self_cgroup", "4:cpu,cpuacct:/docker/abc\n");
  Write("sys/cpu,cpuacct/cpu.cfs_quota_us", "50000\n");
  Write("sys/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  auto q = Quota();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(q->value(), 0.5);
}

TEST_F(CgroupTest, MalformedFilesAreErrorsNamingThem) {
  Write("proc_self_cgroup", "0::/a\n");
  Write("sys/a/cpu.max", "lots 100000\n");
  auto q = Quota();
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(std::string(q.status().message()),
              ::testing::AllOf(HasSubstr("a/cpu.max"), HasSubstr("expected '<quota|max> <period>'")));
  Write("proc_self_cgroup", "garbage\n");
  q = Quota();
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(std::string(q.status().message()), HasSubstr("proc_self_cgroup"));
}

TEST_F(CgroupTest, NoCgroupFileOrNoCpuControllerMeansNoQuota) {
  auto q = Quota();  // no proc_self_cgroup at all
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->has_value());
  Write("proc_self_cgroup", "3:memory:/x\n");
  q = Quota();
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->has_value());
}

TEST(CpuBudget, AffinityCappedByTheQuotaRoundedDown) {
  EXPECT_EQ(MakeCpuBudget(96, 8.0).cpus, 8);   // an 8-CPU pod on a 96-core node
  EXPECT_EQ(MakeCpuBudget(96, 1.5).cpus, 1);   // throttled beyond 1: rounded down
  EXPECT_EQ(MakeCpuBudget(96, 0.5).cpus, 1);   // never below 1
  EXPECT_EQ(MakeCpuBudget(2, 8.0).cpus, 2);    // the mask binds
  EXPECT_EQ(MakeCpuBudget(4, std::nullopt).cpus, 4);
  EXPECT_EQ(MakeCpuBudget(96, 8.0).Describe(), "8 CPUs (affinity 96, cgroup quota 8)");
  EXPECT_EQ(AffinityCpus(), DetectCpuBudget().affinity);
}

TEST(CpuBudget, OmpNumThreadsBoundsIntraOpThreads) {
  Config automatic;
  EXPECT_EQ(ResolveThreadDefaults(8, &automatic, /*omp_num_threads=*/0), "");
  Config one_tower;
  one_tower.mutable_threads()->set_towers(1);
  EXPECT_EQ(ResolveThreadDefaults(8, &one_tower, 2), "");  // the automatic value, bounded quietly
  EXPECT_EQ(one_tower.threads().intra_op_threads(), 2);
  Config configured;
  configured.mutable_threads()->set_towers(1);
  configured.mutable_threads()->set_intra_op_threads(6);
  EXPECT_THAT(ResolveThreadDefaults(8, &configured, 4),
              HasSubstr("OMP_NUM_THREADS=4 lowers threads.intra_op_threads from 6 to 4"));
  EXPECT_EQ(configured.threads().intra_op_threads(), 4);
}

// ---- The budget as `pstrain train` sees it: taskset and OMP_NUM_THREADS -------------------------

int RunCommand(const std::string& command, std::string* output) {
  return testing::RunShell(command, 120, output);
}

class TrainBudgetTest : public ::testing::Test {
 protected:
  static std::string Dir() {
    return ::testing::TempDir() + "pstrain_cpu_budget_" + std::to_string(getpid());
  }
  static void SetUpTestSuite() {
    std::string out;
    ASSERT_EQ(RunCommand("rm -rf " + Dir() + " && " PSTRAIN_BINARY " datagen --rows 3000 --seed 1 --out " +
                      Dir() + "/data",
                  &out),
              0)
        << out;
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }
  // Trains 1 epoch on the tiny data with `prefix` before the binary; returns summary.json.
  std::string Train(const std::string& prefix, const std::string& name, const std::string& extra) {
    std::string out;
    const std::string model = Dir() + "/" + name;
    EXPECT_EQ(RunCommand(prefix + " " PSTRAIN_BINARY " train --train " + Dir() + "/data/part-00000.tsv" +
                      " --model_dir " + model +
                      " --set model.hidden=[16] --set features.categorical_vocab_size=5000 " + extra,
                  &out),
              0)
        << out;
    auto summary = ReadFileToString(model + "/summary.json");
    EXPECT_TRUE(summary.ok()) << summary.status() << "\n" << out;
    return summary.ok() ? *summary : "";
  }
};

TEST_F(TrainBudgetTest, TasksetOneCpuGivesOneTower) {
  const std::string s = Train("taskset -c 0", "taskset", "");
  EXPECT_THAT(s, HasSubstr("\"towers\":1,\"intra_op_threads\":1"));
}

TEST_F(TrainBudgetTest, OmpNumThreadsBoundsAConfiguredIntraOp) {
  const std::string s = Train("OMP_NUM_THREADS=1", "omp",
                              "--set threads.towers=1 --set threads.intra_op_threads=2");
  EXPECT_THAT(s, HasSubstr("\"towers\":1,\"intra_op_threads\":1"));
}

}  // namespace
}  // namespace pstrain
