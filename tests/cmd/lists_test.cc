// List fields with real processes: `pstrain train`, 2-host PS jobs (`pstrain local`, ASYNC,
// BOUNDED and SYNC) and a 2-rank `pstrain allreduce` learn from a history list that shares the
// item field's rows (CSV); `pstrain predict` scores the trained model exactly as the trainer's
// final evaluation did; `train` and a PS job warm-start from its checkpoint; `pstrain export` of
// it served by `pstrain serve` scores CSV rows carrying the lists as predict did, and refuses a
// bad list naming the row and field; `pstrain convert` round-trips the lists; a train job
// stopped and resumed ends with the uninterrupted run's parameters; a PS checkpoint restores
// onto another shard count and trains on.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pstrain/serving.grpc.pb.h"
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
    field { name: "history" share_rows_with: "item" list { combiner: MEAN max_length: 12 } }
    field { name: "user" vocab_size: 500 }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.003 }
  train { global_batch_size: 128 epochs: 6 eval_batch_size: 500 log_every_steps: 100000 }
  threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

struct ListsJob {
  static std::string Dir() { return absl::StrCat(::testing::TempDir(), "/lists_", getpid()); }
  static std::string Config() { return kConfig; }
};
using ListsTest = testing::TopicHistoryJobTest<ListsJob>;

TEST_F(ListsTest, TrainLearnsFromTheHistoryAndPredictScoresAsTheTrainerDid) {
  const std::string m = Dir() + "/m";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m)), 300, &out), 0) << out;
  const auto summary = testing::ReadSummary(m).fields();
  const double auc = summary.at("test_auc").number_value();
  EXPECT_GT(auc, 0.7) << out;
  EXPECT_EQ(summary.at("examples").number_value(), 6 * 12000);

  const auto predicted = testing::PredictTopicHistory(Dir(), m, "scores").fields();
  ASSERT_TRUE(predicted.count("auc"));
  EXPECT_EQ(predicted.at("auc").number_value(), auc);
  EXPECT_EQ(predicted.at("examples").number_value(), 2000);

  // A warm start of a fresh model dir from it (the model, lists included, must match), then a
  // PS job warm-started from the same checkpoint (re-sharded onto 2 shards).
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(Dir() + "/warm"),
                                           " --epochs 1 --warm_start_from ", m),
                              300, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("warm start from " + m));
  EXPECT_GT(testing::ReadSummary(Dir() + "/warm").fields().at("test_auc").number_value(), auc - 0.02);
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(Dir() + "/warm_ps"),
                                           " --epochs 1 --warm_start_from ", m),
                              300, &out),
            0)
      << out;
  EXPECT_GT(testing::ReadSummary(Dir() + "/warm_ps").fields().at("test_auc").number_value(),
            auc - 0.02);

  // Export and serve: the test rows as CSV requests (with the label column) of several sizes,
  // batched by the server, score as predict did (one scorer, other batch cuts: to 1e-6).
  ASSERT_TRUE(testing::ExportModel(m, Dir() + "/export"));
  testing::ServedExport served(P(), Dir() + "/export");
  served.ExpectCsvScoresAsPredicted(Dir() + "/test.csv", Dir() + "/scores.tsv");
  PredictRequest bad;
  bad.set_row_format(PredictRequest::CSV);
  bad.add_rows("i1,i2|i3,u1");
  bad.add_rows("i1,i2||i3,u1");
  PredictResponse resp;
  const grpc::Status s = served.Predict(bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("row 1, field 2 (history): empty id 2"));
}

// `pstrain convert` CSV -> TFRecord (shuffled, through its bucket files) -> CSV keeps every
// list: the same rows, as a multiset, with the same ids in the same order.
TEST_F(ListsTest, ConvertRoundTripsLists) {
  const std::string cfg = Dir() + "/config.textproto";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " convert --config ", cfg, " --input ", Dir(),
                                           "/test.csv --from csv --to tfrecord --shuffle_seed 3 "
                                           "--target_file_mb 1 --out ", Dir(), "/tf"),
                              120, &out),
            0)
      << out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " convert --config ", cfg, " --input '", Dir(),
                                           "/tf/part-*' --from tfrecord --to csv --out ", Dir(),
                                           "/csv"),
                              120, &out),
            0)
      << out;
  // The same rows as the input converted straight to CSV (keys hashed from "i123" are written
  // in hex either way), in another order.
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " convert --config ", cfg, " --input ", Dir(),
                                           "/test.csv --from csv --to csv --out ", Dir(),
                                           "/direct"),
                              120, &out),
            0)
      << out;
  std::string diff;
  EXPECT_EQ(testing::RunShell(absl::StrCat("cd ", Dir(), " && sort direct/part-* > a.sorted && "
                                           "sort csv/part-* > b.sorted && cmp a.sorted b.sorted && "
                                           "! cmp -s direct/part-00000.csv csv/part-00000.csv"),
                              60, &diff),
            0)
      << diff;
  std::string lines;
  ASSERT_EQ(testing::RunShell(absl::StrCat("cat ", Dir(), "/csv/part-* | grep -c '|'"), 60, &lines),
            0);
  EXPECT_GT(std::stoi(lines), 1000);  // multi-id lists made it through
}

// Every PS consistency mode: the workers' pulls and pushes are by unique row, as before.
TEST_F(ListsTest, PsJobsOfEveryConsistencyLearnFromTheHistory) {
  for (const char* consistency : {"ASYNC", "BOUNDED", "SYNC"}) {
    const std::string m = absl::StrCat(Dir(), "/ps_", consistency);
    std::string out;
    ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m),
                                             " --set cluster.consistency=", consistency),
                                300, &out),
              0)
        << out;
    const auto summary = testing::ReadSummary(m).fields();
    EXPECT_THAT(summary.at("mode").string_value(), HasSubstr("ps-")) << consistency;
    EXPECT_EQ(summary.at("examples").number_value(), 6 * 12000) << consistency;
    EXPECT_GT(summary.at("test_auc").number_value(), 0.7) << consistency << "\n" << out;
  }
}

TEST_F(ListsTest, AllreduceLearnsFromTheHistory) {
  const std::string m = Dir() + "/allreduce";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat("mpirun --allow-run-as-root --oversubscribe -np 2 ",
                                           P(), " allreduce ", Args(m), " 2>&1"),
                              300, &out),
            0)
      << out;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_EQ(summary.at("examples").number_value(), 6 * 12000);
  EXPECT_GT(summary.at("test_auc").number_value(), 0.7) << out;
}

// A train job stopped mid-epoch (train.max_steps) and resumed ends with the uninterrupted run's
// parameters, to the byte, having trained the same examples.
TEST_F(ListsTest, StopAndResumeEqualsUninterrupted) {
  testing::ExpectStopAndResumeEqualsUninterrupted(Args, Dir() + "/straight", Dir() + "/stopped");
}

// A checkpoint of a 3-host PS job stopped mid-run (train.max_steps; the list model's rows on 3
// shards) restores onto 2 hosts, the rows re-partitioned, and trains on to the end.
TEST_F(ListsTest, PsCheckpointRestoresOntoAnotherShardCount) {
  const std::string m = Dir() + "/reshard";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 3 ", Args(m),
                                           " --epochs 2 --set train.max_steps=100"),
                              300, &out),
            0)
      << out;
  const auto first = testing::ReadSummary(m).fields();
  EXPECT_LT(first.at("examples").number_value(), 2 * 12000) << "not stopped mid-run";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m), " --epochs 2"),
                              300, &out),
            0)
      << out;
  auto host1 = ReadFileToString(m + "/host-1/output.log");
  ASSERT_TRUE(host1.ok()) << host1.status();
  EXPECT_THAT(*host1, HasSubstr("(re-partitioned onto 2 shards)"));
  EXPECT_THAT(*host1, HasSubstr("resumed from " + m + "/ckpt-"));
  const auto second = testing::ReadSummary(m).fields();
  // The data starts over (another number of readers): two more epochs after the first steps.
  EXPECT_GT(second.at("steps").number_value(), first.at("steps").number_value()) << *host1;
  EXPECT_GE(second.at("examples").number_value(), 2 * 12000) << *host1;
  EXPECT_GT(second.at("test_auc").number_value(), 0.7) << out;
}

}  // namespace
}  // namespace pstrain
