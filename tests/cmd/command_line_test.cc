// The command line as a new user meets it, with the real binary: --version, `pstrain config`,
// <model_dir>/config.textproto, the traps of an unquoted glob and of a single-dash flag, and a
// datagen directory used as `--train DIR`.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testing::RunShell;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/command_line_", getpid()); }
const std::string kBin = PSTRAIN_BINARY;
// A small model: these tests are about the contract, not the speed.
const std::string kSmall =
    " --set features.categorical_vocab_size=2000 --set model.hidden=[8] --set train.batch_size=64"
    " --set threads.towers=1 --set threads.intra_op_threads=1 --set threads.inter_op_threads=1";

class CommandLineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string out;
    ASSERT_EQ(RunShell("rm -rf " + Dir(), 30, &out), 0);
    ASSERT_EQ(RunShell(kBin + " datagen --rows 1200 --files 2 --seed 1 --out " + Dir() + "/train", 120,
                       &out),
              0)
        << out;
    ASSERT_EQ(RunShell(kBin + " datagen --rows 400 --seed 2 --out " + Dir() + "/test", 120, &out), 0)
        << out;
  }
  static void TearDownTestSuite() {
    std::string out;
    RunShell("rm -rf " + Dir(), 30, &out);
  }
};

TEST_F(CommandLineTest, VersionNamesTheBuildAndTheIsaPath) {
  std::string out;
  ASSERT_EQ(RunShell(kBin + " --version", 30, &out), 0) << out;
  EXPECT_THAT(out, ContainsRegex("^pstrain [^ ]+ \\(Release build for x86-64-v3; runs on isa "));
  EXPECT_THAT(out, HasSubstr("oneDNN"));
  // Not "unknown": the tests run in a git checkout.
  EXPECT_THAT(out, ::testing::Not(HasSubstr("unknown")));
}

TEST_F(CommandLineTest, ConfigPrintsTheEffectiveConfigThatConfigAccepts) {
  std::string out;
  ASSERT_EQ(RunShell(kBin + " config --print --config " + PSTRAIN_SOURCE_DIR +
                         "/configs/deepfm_criteo.textproto --train x.tsv --eval y.tsv --set "
                         "train.global_batch_size=128 2>/dev/null",
                     30, &out),
            0)
      << out;
  auto c = ParseConfigText(out, "pstrain config output");
  ASSERT_TRUE(c.ok()) << c.status() << out;
  EXPECT_EQ(c->train().global_batch_size(), 128);
  EXPECT_FALSE(c->train().has_batch_size());  // derived from the global batch: not printed
  EXPECT_EQ(c->data().train(0).path(0), "x.tsv");
  EXPECT_EQ(c->dense_optimizer().type(), ADAM);
  EXPECT_FALSE(c->data().has_shuffle_seed());  // left at its default: not printed

  ASSERT_EQ(RunShell(kBin + " config --all --train x.tsv 2>/dev/null", 30, &out), 0) << out;
  c = ParseConfigText(out, "pstrain config --all output");
  ASSERT_TRUE(c.ok()) << c.status() << out;
  EXPECT_TRUE(c->data().has_shuffle_seed());  // every default is shown
  EXPECT_EQ(c->data().shuffle_seed(), 1u);
  EXPECT_THAT(out, HasSubstr("model_dir: "));

  // A bad override is refused with the field's path.
  EXPECT_EQ(RunShell(kBin + " config --set model.embedding_dim=-3", 30, &out), 2);
  EXPECT_THAT(out, HasSubstr("model.embedding_dim"));
}

TEST_F(CommandLineTest, UnquotedGlobAndSingleDashFlagAreErrors) {
  std::string out;
  // The shell expands the glob into two words: the second is not silently dropped.
  EXPECT_EQ(RunShell("cd " + Dir() + " && " + kBin + " train --train train/part-* --model_dir m", 30,
                     &out),
            2);
  EXPECT_THAT(out, HasSubstr("unexpected argument 'train/part-00001.tsv'"));
  EXPECT_THAT(out, HasSubstr("quote it"));
  EXPECT_EQ(RunShell(kBin + " train -epochs 3 --train x", 30, &out), 2);
  EXPECT_THAT(out, HasSubstr("did you mean --epochs?"));
  EXPECT_FALSE(PathExists(Dir() + "/m"));
}

// `pstrain datagen --out D` then `--train D`: teacher.json beside the parts is not data. The
// run writes the config it used, threads resolved, and `--config` reproduces it.
TEST_F(CommandLineTest, DatagenDirectoryTrainsAndTheModelDirHoldsTheConfig) {
  std::string out;
  const std::string model = Dir() + "/model";
  ASSERT_EQ(RunShell(kBin + " train --train " + Dir() + "/train --eval " + Dir() + "/test" +
                         " --model_dir " + model + kSmall + " --set threads.towers=0",
                     300, &out),
            0)
      << out;
  auto text = ReadFileToString(model + "/summary.json");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("\"examples\":1200"));
  auto config = LoadConfigFile(model + "/config.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_GE(config->threads().towers(), 1);  // 0 (automatic) resolved
  EXPECT_EQ(config->train().batch_size(), 64);
  EXPECT_EQ(config->data().train(0).path(0), Dir() + "/train");
  EXPECT_EQ(config->train().model_dir(), model);
}

}  // namespace
}  // namespace pstrain
