// DIN (model.type DIN: the history list pooled by target attention against the candidate item)
// with real processes: `pstrain train` learns from the history, `pstrain predict` scores the
// checkpoint exactly as the trainer's final evaluation did, a 2-host ASYNC PS job and a 2-rank
// `pstrain allreduce` train it (the attention MLP is part of the dense vector, so both carry it
// unchanged), and its export, served by `pstrain serve`, scores as predict did. The data is
// tests/cmd/lists_test.cc's.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/cmd/served_export.h"
#include "tests/cmd/topic_history_csv.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string P() { return PSTRAIN_BINARY; }

const std::string kConfig = std::string(testing::kTopicHistoryData) + R"pb(
  features {
    preset: NO_PRESET
    field { name: "item" vocab_size: 2000 }
    field {
      name: "history"
      share_rows_with: "item"
      list { combiner: SUM max_length: 12 attention_target: "item" attention_hidden: [ 16 ] }
    }
    field { name: "user" vocab_size: 500 }
  }
  model { type: DIN embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.003 }
  train { global_batch_size: 128 epochs: 4 eval_batch_size: 500 log_every_steps: 100000 }
  threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

struct DinJob {
  static std::string Dir() { return absl::StrCat(::testing::TempDir(), "/din_", getpid()); }
  static std::string Config() { return kConfig; }
};
using DinTest = testing::TopicHistoryJobTest<DinJob>;

TEST_F(DinTest, TrainLearnsAndPredictScoresAsTheTrainerDid) {
  const std::string m = Dir() + "/m";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m)), 300, &out), 0) << out;
  const auto summary = testing::ReadSummary(m).fields();
  const double auc = summary.at("test_auc").number_value();
  EXPECT_GT(auc, 0.7) << out;
  EXPECT_EQ(summary.at("examples").number_value(), 4 * 12000);

  const auto predicted = testing::PredictTopicHistory(Dir(), m, "scores").fields();
  ASSERT_TRUE(predicted.count("auc"));
  EXPECT_EQ(predicted.at("auc").number_value(), auc);
  EXPECT_EQ(predicted.at("examples").number_value(), 2000);

  // Its export, served by `pstrain serve`, scores the test rows as predict did.
  ASSERT_TRUE(testing::ExportModel(m, Dir() + "/export"));
  testing::ServedExport served(P(), Dir() + "/export");
  served.ExpectCsvScoresAsPredicted(Dir() + "/test.csv", Dir() + "/scores.tsv");
}

TEST_F(DinTest, AsyncPsJobLearns) {
  const std::string m = Dir() + "/ps";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m),
                                           " --set cluster.consistency=ASYNC"),
                              300, &out),
            0)
      << out;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_THAT(summary.at("mode").string_value(), HasSubstr("ps-"));
  // ASYNC's staleness depends on the machine's load: idle, this 752-step job scores 0.719-0.729
  // (6 runs); in the full suite on 2 loaded vCPUs once 0.691 (staleness max 6). Chance is 0.5.
  EXPECT_GT(summary.at("test_auc").number_value(), 0.67) << out;
}

TEST_F(DinTest, AllreduceLearns) {
  const std::string m = Dir() + "/allreduce";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat("mpirun --allow-run-as-root --oversubscribe -np 2 ",
                                           P(), " allreduce ", Args(m), " 2>&1"),
                              300, &out),
            0)
      << out;
  EXPECT_GT(testing::ReadSummary(m).fields().at("test_auc").number_value(), 0.7) << out;
}

// A model type that cannot attend is refused before anything trains, naming the field.
TEST_F(DinTest, DeepFmWithAnAttendedFieldIsRefused) {
  std::string out;
  EXPECT_NE(testing::RunShell(absl::StrCat(P(), " train ", Args(Dir() + "/bad"),
                                           " --set model.type=DEEPFM"),
                              120, &out),
            0);
  EXPECT_THAT(out, HasSubstr("attention_target"));
}

}  // namespace
}  // namespace pstrain
