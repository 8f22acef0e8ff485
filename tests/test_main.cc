// The main of every test binary. Like pstrain's own main, it selects the process's ISA path
// first (PSTRAIN_ISA, else the best this CPU has), so that CTest can run a binary once per path
// (tests/CMakeLists.txt) and the processes a test starts take the same path (they inherit the
// environment).
//
// PSTRAIN_ISA_ONLY_IF_LOWER=1 (set by CTest's forced-path runs): when PSTRAIN_ISA is not below
// this CPU's best path, the run would repeat the default one (or ask for what the CPU lacks), so
// every test is skipped with that reason.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cmd/launcher.h"
#include "gtest/gtest.h"

namespace {

class SkipAll : public testing::Environment {
 public:
  explicit SkipAll(std::string why) : why_(std::move(why)) {}
  void SetUp() override { GTEST_SKIP() << why_; }

 private:
  std::string why_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  testing::InitGoogleTest(&argc, argv);
  std::string skip_all;
  const char* forced = std::getenv("PSTRAIN_ISA");
  if (forced != nullptr && std::getenv("PSTRAIN_ISA_ONLY_IF_LOWER") != nullptr) {
    const auto requested = pstrain::ParseIsa(forced);
    const auto best = pstrain::BestIsa(pstrain::DetectCpuFeatures());
    if (requested.ok() && best && *requested >= *best) {
      skip_all = absl::StrCat("PSTRAIN_ISA=", forced, " is not below this CPU's best path (",
                              pstrain::IsaName(*best), "): the default run covers it");
      unsetenv("PSTRAIN_ISA");
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
  if (!skip_all.empty()) testing::AddGlobalTestEnvironment(new SkipAll(skip_all));
  return RUN_ALL_TESTS();
}
