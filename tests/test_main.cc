// The main of every test binary. Like pstrain's own main, it selects the process's ISA path
// first (PSTRAIN_ISA, else the best this CPU has), so that CTest can run a binary once per path
// (tests/CMakeLists.txt) and the processes a test starts take the same path (they inherit the
// environment).
//
// PSTRAIN_TEST_ISA=<path> (set by CTest's forced-path copies, tests/CMakeLists.txt): the run takes
// that path (as PSTRAIN_ISA, which the processes a test starts inherit) when it is below this
// CPU's best. Otherwise the copy would repeat the default run or ask for what the CPU lacks, and
// every test is skipped with that reason (CTest reports them as skipped). This is decided here,
// at test time, not when the suite is built: the machine that builds may not be the one that runs.
// (One variable on purpose: the copies once carried PSTRAIN_ISA and a second flag in one CTest
// ENVIRONMENT list, gtest_discover_tests's PROPERTIES split that list at its ';', the flag was
// lost, and on an AVX2-only CPU every AVX-512 copy failed at setup instead of skipping.)
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cmd/launcher.h"
#include "common/cpu.h"
#include "gtest/gtest.h"

namespace {

// Skips every test as it starts, with the reason. (A GTEST_SKIP in a global Environment's SetUp,
// as this once did, runs no test but reports each as passed in GoogleTest 1.12, so CTest counted
// them as passed. A skip recorded when a test starts skips its fixture's SetUp and body, and
// GoogleTest prints "[  SKIPPED ]", which CTest's SKIP_REGULAR_EXPRESSION reports as skipped.)
class SkipEveryTest : public testing::EmptyTestEventListener {
 public:
  explicit SkipEveryTest(std::string why) : why_(std::move(why)) {}
  void OnTestStart(const testing::TestInfo&) override { GTEST_SKIP() << why_; }

 private:
  std::string why_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  testing::InitGoogleTest(&argc, argv);
  std::string skip_all;
  if (const char* forced = std::getenv("PSTRAIN_TEST_ISA"); forced != nullptr) {
    const absl::StatusOr<pstrain::Isa> requested = pstrain::ParseIsa(forced);
    if (!requested.ok()) {
      std::fprintf(stderr, "test setup: PSTRAIN_TEST_ISA='%s': %s\n", forced,
                   std::string(requested.status().message()).c_str());
      return 2;
    }
    const pstrain::CpuFeatures cpu = pstrain::DetectCpuFeatures();
    const std::optional<pstrain::Isa> best = pstrain::BestIsa(cpu);
    if (best && *requested < *best) {
      setenv("PSTRAIN_ISA", forced, /*overwrite=*/1);
    } else if (best && *requested == *best) {
      skip_all = absl::StrCat("PSTRAIN_TEST_ISA=", forced, " is this CPU's best path (", cpu.model,
                              "): the default run covers it");
    } else {
      skip_all = absl::StrCat("PSTRAIN_TEST_ISA=", forced, ": this CPU (", cpu.model, ") lacks ",
                              pstrain::MissingFeatures(*requested, cpu), "; its best path is ",
                              best ? pstrain::IsaName(*best) : "none");
    }
  }
  absl::StatusOr<pstrain::LaunchEnvironment> env = pstrain::InitLaunchEnvironment();
  if (!env.ok()) {
    std::fprintf(stderr, "test setup: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  // Once per test run (not when CTest lists the tests at build time).
  if (!::testing::GTEST_FLAG(list_tests)) {
    std::fprintf(stderr, "test process: %s\n", env->Describe().c_str());
  }
  if (!skip_all.empty()) {
    testing::UnitTest::GetInstance()->listeners().Append(new SkipEveryTest(skip_all));
  }
  return RUN_ALL_TESTS();
}
