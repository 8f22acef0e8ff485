// BuildConfig: the effective config of the pstrain commands (repeated --config files merge in
// order; an absent dense optimizer is Adam).
#include "cmd/cli.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(BuildConfigTest, LaterConfigFilesMergeOverEarlierOnes) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/cli_", getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/base.textproto",
                              "model { embedding_dim: 8 hidden: [32] }\n"
                              "threads { towers: 4 inter_op_threads: 3 }\n"
                              "data { train { name: 'a' path: 'x' } }\n")
                  .ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/tuned.textproto",
                              "threads { towers: 2 intra_op_threads: 1 }\n"
                              "data { train { name: 'b' path: 'y' } }\n")
                  .ok());
  TrainingFlags flags;
  flags.config = {dir + "/base.textproto", dir + "/tuned.textproto"};
  flags.set = {"model.embedding_dim=4"};
  auto config = BuildConfig(flags);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->threads().towers(), 2);            // replaced by the later file
  EXPECT_EQ(config->threads().intra_op_threads(), 1);  // added by the later file
  EXPECT_EQ(config->threads().inter_op_threads(), 3);  // kept from the earlier file
  EXPECT_EQ(config->model().hidden_size(), 1);
  EXPECT_EQ(config->model().embedding_dim(), 4);       // --set comes last
  ASSERT_EQ(config->data().train_size(), 2);           // repeated fields append (MergeFrom)
  EXPECT_EQ(config->data().train(1).name(), "b");

  flags.config.push_back(dir + "/missing.textproto");
  auto missing = BuildConfig(flags);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.textproto"), std::string::npos);
  std::system(("rm -rf " + dir).c_str());
}

// Without --config the dense optimizer is Adam 1e-3, and --set tunes that Adam.
TEST(BuildConfigTest, AbsentDenseOptimizerIsAdamBeforeOverrides) {
  TrainingFlags flags;
  flags.train = {"/nonexistent/train.tsv"};
  flags.format = "criteo_tsv";
  auto c = BuildConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dense_optimizer().type(), ADAM);
  EXPECT_FLOAT_EQ(c->dense_optimizer().learning_rate(), 1e-3f);

  flags.set = {"dense_optimizer.learning_rate=0.003"};
  c = BuildConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dense_optimizer().type(), ADAM);
  EXPECT_FLOAT_EQ(c->dense_optimizer().learning_rate(), 3e-3f);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Every training command's --help names the environment it reads (the issue: OMP_NUM_THREADS
// bounds intra_op_threads in every command, "say so in --help").
TEST(TrainingFlagsTest, HelpNamesTheEnvironmentAndTheCpuBudget) {
  FlagSet flags("train", "test");
  TrainingFlags tf;
  AddTrainingFlags(&flags, &tf);
  const std::string usage = flags.Usage();
  EXPECT_THAT(usage, ::testing::HasSubstr("OMP_NUM_THREADS=N  bounds threads.intra_op_threads"));
  EXPECT_THAT(usage, ::testing::HasSubstr("PSTRAIN_ISA=P"));
  EXPECT_THAT(usage, ::testing::HasSubstr("cgroup CPU quota"));
}

}  // namespace
}  // namespace pstrain
