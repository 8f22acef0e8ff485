// The default build on CPUs this machine is not: pstrain run under QEMU's user-mode emulator
// (qemu-x86_64 from Debian's qemu-user, installed by scripts/install_deps.sh), whose -cpu model
// sets what CPUID reports and which instructions exist. An AVX-512 instruction on an emulated
// AVX2-only CPU dies of SIGILL, as on the real one.
//   - EPYC-Milan (AMD Zen 3: AVX2 + FMA, no AVX-512): the CPU the portability issue was found on.
//     datagen and train run end to end on the avx2 path, and bf16 is refused before any data is
//     read, with the missing feature and the fix.
//   - SandyBridge (AVX, no AVX2): below the baseline; pstrain says so and exits 1, no SIGILL.
// The model tests themselves also run under EPYC-Milan (tests/CMakeLists.txt, Emulated.*).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// pstrain re-executes itself to set OMP_WAIT_POLICY unless it is set; under qemu-user that exec
// would leave the emulator, so the policy is set here.
const char kQemu[] = "OMP_WAIT_POLICY=PASSIVE qemu-x86_64 -cpu ";

int RunCommand(const std::string& command, std::string* output) {
  return testing::RunShell(command, 300, output);
}

class EmulatedCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string out;
    ASSERT_EQ(RunCommand("command -v qemu-x86_64", &out), 0)
        << "qemu-x86_64 is missing: scripts/install_deps.sh installs Debian's qemu-user";
    dir_ = ::testing::TempDir() + "pstrain_emulated_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_EQ(RunCommand("rm -rf " + dir_ + " && mkdir -p " + dir_, &out), 0) << out;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(EmulatedCpuTest, Zen3TrainsEndToEndOnTheAvx2Path) {
  std::string out;
  const std::string q = std::string(kQemu) + "EPYC-Milan " PSTRAIN_BINARY;
  ASSERT_EQ(RunCommand(q + " datagen --rows 4000 --seed 1 --out " + dir_ + "/train", &out), 0) << out;
  ASSERT_EQ(RunCommand(q + " datagen --rows 1000 --seed 2 --out " + dir_ + "/test", &out), 0) << out;
  ASSERT_EQ(RunCommand(q + " train --train " + dir_ + "/train/part-00000.tsv --eval " + dir_ +
                    "/test/part-00000.tsv --model_dir " + dir_ +
                    "/model --set model.hidden=[32] --set features.categorical_vocab_size=20000",
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("isa avx2 (oneDNN avx2)"));
  auto summary = ReadFileToString(dir_ + "/model/summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(*summary, HasSubstr("\"isa\":\"avx2\",\"onednn_isa\":\"avx2\""));
  EXPECT_THAT(*summary, HasSubstr("\"examples\":4000"));
  // It learned: 4,000 rows of the teacher's data give well above chance.
  const size_t at = summary->find("\"test_auc\":");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stod(summary->substr(at + 11)), 0.55) << *summary;
}

TEST_F(EmulatedCpuTest, Zen3RefusesBf16BeforeReadingData) {
  std::string out;
  const int code = RunCommand(std::string(kQemu) + "EPYC-Milan " PSTRAIN_BINARY +
                           " train --train " + dir_ + "/no_such_file.tsv --model_dir " + dir_ +
                           "/m --set model.precision=BF16",
                       &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("model.precision: BF16 needs a CPU with AVX512-BF16 or AMX"));
  EXPECT_THAT(out, HasSubstr("lacks avx512f"));
  EXPECT_THAT(out, HasSubstr("--set model.precision=F32"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("no_such_file")));  // refused before the data
}

TEST_F(EmulatedCpuTest, ForcingAPathTheCpuLacksIsRefused) {
  std::string out;
  const int code = RunCommand("PSTRAIN_ISA=avx512_core " + std::string(kQemu) + "EPYC-Milan " +
                           PSTRAIN_BINARY " train --help",
                       &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("PSTRAIN_ISA=avx512_core: the requested ISA path avx512_core needs "
                             "avx512f, avx512bw, avx512vl, avx512dq"));
}

TEST_F(EmulatedCpuTest, BelowTheBaselineSaysSoInsteadOfSigill) {
  std::string out;
  const int code = RunCommand(std::string(kQemu) + "SandyBridge " PSTRAIN_BINARY " --help", &out);
  EXPECT_EQ(code, 1) << out;  // not 132 (SIGILL)
  EXPECT_THAT(out, HasSubstr("this CPU lacks the features this build needs (x86-64-v3: AVX2 and "
                             "FMA): avx2 fma f16c"));
}

}  // namespace
}  // namespace pstrain
