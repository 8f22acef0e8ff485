// `pstrain tune` with the real binary: a tiny budget writes a fragment within the allowed space,
// and `pstrain train --config base --config fragment` accepts it and trains with its settings.
// No timing assertions.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "gmock/gmock.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using testing::RunToExit;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/tune_", getpid()); }

class TuneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir()).c_str()), 0);
    ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "3000", "--seed", "1", "--out",
                         Dir() + "/train"},
                        120000),
              0);
    ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "datagen", "--rows", "1000", "--seed", "2", "--out",
                         Dir() + "/test"},
                        120000),
              0);
    // A small model: the test is about the contract, not the speed.
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/base.textproto",
                                "features { categorical_vocab_size: 5000 }\n"
                                "model { hidden: [16] }\n"
                                "train { batch_size: 64 epochs: 1 }\n")
                    .ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static std::vector<std::string> Tune(const std::string& out) {
    return {PSTRAIN_BINARY, "tune", "--config", Dir() + "/base.textproto", "--budget_s", "8",
            "--window_s", "0.05", "--windows", "2", "--warmup_steps", "1", "--out", out};
  }
};

TEST_F(TuneTest, FragmentIsWithinTheSpaceAndTrainAcceptsIt) {
  const std::string out = Dir() + "/tuned.textproto";
  std::vector<std::string> args = Tune(out);
  args.insert(args.end(), {"--train", Dir() + "/train/part-*", "--batch_sizes", "32,64"});
  ASSERT_EQ(RunToExit(args, 120000), 0);

  auto fragment = LoadConfigFile(out);
  ASSERT_TRUE(fragment.ok()) << fragment.status();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const ThreadConfig& t = fragment->threads();
  EXPECT_GE(t.towers(), 1);
  EXPECT_GE(t.intra_op_threads(), 1);
  EXPECT_LE(t.towers() * t.intra_op_threads(), cores);
  EXPECT_GE(t.inter_op_threads(), 1);
  EXPECT_LE(t.inter_op_threads(), cores);
  // The global batch of the base config (64 per tower x `cores` automatic towers) is kept: the
  // fragment writes the per-tower size that keeps it when its towers differ, and never one of
  // --batch_sizes that would change it (no --allow_batch_change).
  const int batch = fragment->train().has_batch_size() ? fragment->train().batch_size() : 64;
  EXPECT_EQ(t.towers() * batch, static_cast<int>(cores) * 64) << ConfigToText(*fragment);
  // Nothing but the tuned fields: the fragment must not override the base config.
  Config expected;
  *expected.mutable_threads() = t;
  if (batch != 64) expected.mutable_train()->set_batch_size(batch);
  EXPECT_EQ(ConfigToText(*fragment), ConfigToText(expected));

  const std::string model_dir = Dir() + "/model";
  ASSERT_EQ(RunToExit({PSTRAIN_BINARY, "train", "--config", Dir() + "/base.textproto", "--config",
                       out, "--train", Dir() + "/train/part-*", "--eval", Dir() + "/test/part-*",
                       "--model_dir", model_dir},
                      120000),
            0);
  auto text = ReadFileToString(model_dir + "/summary.json");
  ASSERT_TRUE(text.ok()) << text.status();
  google::protobuf::Struct summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*text, &summary).ok()) << *text;
  const auto& f = summary.fields();
  EXPECT_EQ(f.at("towers").number_value(), t.towers());
  EXPECT_EQ(f.at("intra_op_threads").number_value(), t.intra_op_threads());
  EXPECT_EQ(f.at("inter_op_threads").number_value(), t.inter_op_threads());
  EXPECT_EQ(f.at("batch_size_per_tower").number_value(), batch);  // the fragment's, else 64
  EXPECT_EQ(f.at("examples").number_value(), 3000);  // the base config's one epoch
}

TEST_F(TuneTest, WithoutDataUsesDatagenAndCapsIntraOpAtOmpNumThreads) {
  const std::string out = Dir() + "/datagen/tuned.textproto";
  // OMP_NUM_THREADS=1 is the cap on intra_op_threads.
  std::vector<std::string> args = {"/usr/bin/env", "OMP_NUM_THREADS=1"};
  for (const std::string& a : Tune(out)) args.push_back(a);
  ASSERT_EQ(RunToExit(args, 120000), 0);
  auto fragment = LoadConfigFile(out);
  ASSERT_TRUE(fragment.ok()) << fragment.status();
  EXPECT_EQ(fragment->threads().intra_op_threads(), 1);
  EXPECT_GE(fragment->threads().towers(), 1);
  Config defaults;
  ResolveThreadDefaults(std::max(1u, std::thread::hardware_concurrency()), &defaults);
  EXPECT_EQ(fragment->threads().inter_op_threads(), defaults.threads().inter_op_threads());
  // Not searched: the per-tower size is written only to keep the global batch (64 x the
  // automatic towers) when the towers changed.
  const int batch = fragment->train().has_batch_size() ? fragment->train().batch_size() : 64;
  EXPECT_EQ(fragment->threads().towers() * batch,
            static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) * 64);
}

// The README's command as written: the shipped config has an eval channel without a path, which
// tune never uses; it must not be required. The output says why the search ended and keeps the
// global batch.
TEST_F(TuneTest, ReadmeCommandWorksWithoutEvalAndSaysWhyTheSearchEnded) {
  const std::string out = Dir() + "/readme/tuned.textproto";
  std::string output;
  const std::string cmd = absl::StrCat(
      PSTRAIN_BINARY, " tune --config ", PSTRAIN_SOURCE_DIR, "/configs/deepfm_criteo.textproto",
      " --train '", Dir(), "/train/part-*' --budget_s 8 --out ", out,
      " --set features.categorical_vocab_size=5000 --set model.hidden=[16]",
      " --window_s 0.05 --windows 2 --warmup_steps 1 --batch_sizes 512");
  ASSERT_EQ(testing::RunShell(cmd, 120, &output), 0) << output;
  // The shipped config states its update batch: the towers split it on any machine.
  EXPECT_THAT(output, ::testing::HasSubstr("global batch 512 (train.global_batch_size) is kept"));
  EXPECT_THAT(output, ::testing::ContainsRegex("search complete|budget spent"));
  auto fragment = LoadConfigFile(out);
  ASSERT_TRUE(fragment.ok()) << fragment.status() << output;
  // Threads only: neither the per-tower batch (derived) nor another global batch (not allowed).
  EXPECT_FALSE(fragment->train().has_batch_size()) << output;
  EXPECT_FALSE(fragment->train().has_global_batch_size()) << output;
  EXPECT_GE(fragment->threads().towers(), 1);
  if (output.find("not chosen") != std::string::npos) {
    // The larger batch was faster: its AUC cost is reported, not silently taken.
    EXPECT_THAT(output, ::testing::HasSubstr("changes what the model learns"));
  }
}

TEST_F(TuneTest, BadFlagsAreRejected) {
  std::vector<std::string> args = Tune(Dir() + "/bad.textproto");
  args.push_back("--batch_sizes=64,x");
  EXPECT_EQ(RunToExit(args, 60000), 2);
  EXPECT_FALSE(PathExists(Dir() + "/bad.textproto"));
}

}  // namespace
}  // namespace pstrain
