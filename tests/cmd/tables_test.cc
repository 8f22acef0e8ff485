// Tables (features.table) with real processes, on the topic-history CSV of lists_test: a history
// list and the candidate item share the `item` table, the user field is in a `small` table of
// dim 4 (fm_join EXCLUDE) with its own learning rate and partitions. `pstrain config` shows the
// layout; `pstrain train`, 2-host PS jobs (ASYNC, BOUNDED, SYNC) and a 2-rank `pstrain allreduce`
// learn; predict scores as the trainer did, from the checkpoint and from an export; a train job
// stopped and resumed ends with the uninterrupted run's parameters; a warm start takes every
// table's rows, refuses a table of another dim, and across changed tables takes the tables of
// the same name and starts the new ones; a 2-host PS checkpoint restores onto 3 hosts.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/store/store_blocks.h"
#include "tests/cmd/job_files.h"
#include "tests/cmd/topic_history_csv.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string P() { return PSTRAIN_BINARY; }

const std::string kConfig = std::string(testing::kTopicHistoryData) + R"pb(
  features {
    preset: NO_PRESET
    field { name: "item" table: "item" }
    field { name: "history" table: "item" list { combiner: MEAN max_length: 12 } }
    field { name: "user" table: "small" }
    table { name: "item" rows: 2000 initializer { type: TRUNCATED_NORMAL stddev: 0.02 } }
    table { name: "small" dim: 4 rows: 500 fm_join: EXCLUDE partitions: 3
            optimizer { learning_rate: 0.05 } }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.003 }
  train { global_batch_size: 128 epochs: 6 eval_batch_size: 500 log_every_steps: 100000 }
  threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

constexpr int kTrainRows = 2 * 6000;

// The widths of the embedding groups in the shard files of `model_dir`'s latest checkpoint, in
// file order (compact widths: each table's, or partition's, at 1 + its dim).
std::vector<int> GroupWidths(const std::string& model_dir) {
  std::vector<int> widths;
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << model_dir;
  if (!choice.ok() || !choice->has_value()) return widths;
  for (const auto& f : (*choice)->manifest.file()) {
    if (!IsShardFileName(f.name())) continue;
    auto reader = BlockReader::Open((*choice)->dir + "/" + f.name());
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return widths;
    while (true) {
      auto tag = (*reader)->PeekTag();
      EXPECT_TRUE(tag.ok()) << tag.status();
      if (!tag.ok() || tag->empty()) break;
      if (*tag == kEmbeddingMetaTag) {
        auto meta = LoadEmbeddingRows(reader->get(), [](auto&&...) { return absl::OkStatus(); });
        EXPECT_TRUE(meta.ok()) << meta.status();
        if (!meta.ok()) return widths;
        widths.push_back(meta->dim);
      } else {
        Block b;
        EXPECT_TRUE((*reader)->Next(&b).ok());
      }
    }
  }
  return widths;
}

struct TablesJob {
  static std::string Dir() { return absl::StrCat(::testing::TempDir(), "/tables_", getpid()); }
  static std::string Config() { return kConfig; }
};
using TablesTest = testing::TopicHistoryJobTest<TablesJob>;

TEST_F(TablesTest, ConfigShowsTheTables) {
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " config ", Args(Dir() + "/c")), 60, &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("# Tables"));
  EXPECT_THAT(out, HasSubstr("#   item: dim 8, rows 2000 at offset 0, partitions the cluster's, "
                             "fields item, history"));
  EXPECT_THAT(out, HasSubstr("#   small: dim 4, rows 500 at offset 2000, partitions 3, "
                             "fields user"));
  // --all shows the schema's defaults, but not in place of what a table or a field inherits
  // (a table's initializer scale and optimizer overrides, a field's table): those stay unset.
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " config --all ", Args(Dir() + "/c")), 60, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("fm_join: EXCLUDE"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("stddev: 0\n")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("learning_rate: 0\n")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("table: \"\"")));
  // A table whose dim differs from the model's under the FM term, fm_join left at REFUSE.
  ASSERT_NE(testing::RunShell(absl::StrCat(P(), " config ", Args(Dir() + "/c"),
                                           " --set features.table[1].fm_join=REFUSE"),
                              60, &out),
            0);
  EXPECT_THAT(out, HasSubstr("features.table[1] ('small').dim: 4 differs from "
                             "model.embedding_dim 8"));
}

TEST_F(TablesTest, TrainLearnsAndPredictScoresAsTheTrainerDid) {
  const std::string m = Dir() + "/m";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m)), 300, &out), 0) << out;
  const auto summary = testing::ReadSummary(m).fields();
  const double auc = summary.at("test_auc").number_value();
  EXPECT_GT(auc, 0.7) << out;
  EXPECT_EQ(summary.at("examples").number_value(), 6 * kTrainRows);
  // One embedding group per table, each at its width (item dim 8, small dim 4), not the stride.
  EXPECT_EQ(GroupWidths(m), (std::vector<int>{9, 5}));
  auto predicted = testing::PredictTopicHistory(Dir(), m, "scores").fields();
  ASSERT_TRUE(predicted.count("auc"));
  EXPECT_EQ(predicted.at("auc").number_value(), auc);
  // An export of it (rows at the model's stride) scores the same.
  ASSERT_TRUE(testing::ExportModel(m, Dir() + "/export"));
  predicted = testing::PredictTopicHistory(Dir(), Dir() + "/export", "export_scores").fields();
  ASSERT_TRUE(predicted.count("auc"));
  EXPECT_EQ(predicted.at("auc").number_value(), auc);
}

TEST_F(TablesTest, PsJobsOfEveryConsistencyLearn) {
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
    EXPECT_EQ(summary.at("examples").number_value(), 6 * kTrainRows) << consistency;
    EXPECT_GT(summary.at("test_auc").number_value(), 0.7) << consistency << "\n" << out;
    // ASYNC and BOUNDED workers push their halves of the global batch as updates: the shards
    // scale the sparse rates (the job's and `small`'s override) by sqrt(1/2); SYNC applies one
    // update of the whole batch and keeps them (cluster.scale_sparse_lr_by_share).
    if (std::string(consistency) == "SYNC") {
      EXPECT_EQ(summary.count("sparse_lr_factor"), 0u);
    } else {
      ASSERT_EQ(summary.count("sparse_lr_factor"), 1u) << consistency;
      EXPECT_NEAR(summary.at("sparse_lr_factor").number_value(), std::sqrt(0.5), 1e-9);
    }
  }
}

TEST_F(TablesTest, AllreduceLearns) {
  const std::string m = Dir() + "/allreduce";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat("mpirun --allow-run-as-root --oversubscribe -np 2 ",
                                           P(), " allreduce ", Args(m), " 2>&1"),
                              300, &out),
            0)
      << out;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_EQ(summary.at("examples").number_value(), 6 * kTrainRows);
  EXPECT_GT(summary.at("test_auc").number_value(), 0.7) << out;
}

// A train job stopped mid-epoch and resumed ends with the uninterrupted run's parameters, to the
// byte: the tables' initializers and optimizers are the same after the restore.
TEST_F(TablesTest, StopAndResumeEqualsUninterrupted) {
  testing::ExpectStopAndResumeEqualsUninterrupted(Args, Dir() + "/straight", Dir() + "/stopped");
}

// --warm_start_from a model with tables: a new model dir starts from the source's rows of every
// table (one step from it scores about as the source did; one step from scratch does not), and a
// source whose `small` table has another dim is refused, naming the table.
TEST_F(TablesTest, WarmStartTakesEveryTablesRowsAndRefusesAnotherDim) {
  const std::string src = Dir() + "/warm_src";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(src), " --epochs 2"), 300, &out),
            0)
      << out;
  const double source_auc = testing::ReadSummary(src).fields().at("test_auc").number_value();
  ASSERT_GT(source_auc, 0.7) << out;
  const std::string warm = Dir() + "/warm_dst", cold = Dir() + "/cold_dst";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(warm), " --warm_start_from ", src,
                                           " --set train.max_steps=1"),
                              300, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("warm start from " + src));
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(cold), " --set train.max_steps=1"),
                              300, &out),
            0)
      << out;
  const double warm_auc = testing::ReadSummary(warm).fields().at("test_auc").number_value();
  const double cold_auc = testing::ReadSummary(cold).fields().at("test_auc").number_value();
  EXPECT_NEAR(warm_auc, source_auc, 0.02);
  EXPECT_LT(cold_auc, source_auc - 0.05) << "one step from scratch should not reach the source";

  std::string other = kConfig;
  const std::string from = "table { name: \"small\" dim: 4";
  ASSERT_NE(other.find(from), std::string::npos);
  other.replace(other.find(from), from.size(), "table { name: \"small\" dim: 8");
  ASSERT_TRUE(WriteFileAtomic(Dir() + "/other_dim.textproto", other).ok());
  const std::string refused = Dir() + "/warm_refused";
  EXPECT_NE(testing::RunShell(absl::StrCat(P(), " train --config ", Dir(),
                                           "/other_dim.textproto --train '", Dir(),
                                           "/train/*.csv' --eval ", Dir(),
                                           "/test.csv --model_dir ", refused,
                                           " --warm_start_from ", src, " --set train.max_steps=1"),
                              300, &out),
            0);
  EXPECT_THAT(out, HasSubstr("table 'small': dim 4 in the warm-start checkpoint, 8 in the "
                            "config"));

  // Changed tables (the `user` field moved to a new table `fresh` of the same dim): `item` is
  // taken by name, `fresh` starts new, the dense vector (same inputs) is copied; in `train` and
  // in a PS job. One step from it is far better than one step from scratch.
  std::string changed = kConfig;
  for (const auto& [a, b] :
       {std::make_pair(std::string("table: \"small\" }"), std::string("table: \"fresh\" }")),
        std::make_pair(std::string("table { name: \"small\""),
                       std::string("table { name: \"fresh\""))}) {
    ASSERT_NE(changed.find(a), std::string::npos) << a;
    changed.replace(changed.find(a), a.size(), b);
  }
  ASSERT_TRUE(WriteFileAtomic(Dir() + "/changed.textproto", changed).ok());
  auto changed_args = [](const std::string& model_dir) {
    return absl::StrCat("--config ", Dir(), "/changed.textproto --train '", Dir(),
                        "/train/*.csv' --eval ", Dir(), "/test.csv --model_dir ", model_dir);
  };
  const std::string taken = Dir() + "/warm_changed";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", changed_args(taken),
                                           " --warm_start_from ", src,
                                           " --set train.max_steps=1 2>&1"),
                              300, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("tables taken: 'item'; new (initialized): 'fresh'; the dense "
                             "vector copied"));
  const double changed_auc = testing::ReadSummary(taken).fields().at("test_auc").number_value();
  EXPECT_GT(changed_auc, cold_auc + 0.05) << out;
  const std::string ps_taken = Dir() + "/warm_changed_ps";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", changed_args(ps_taken),
                                           " --warm_start_from ", src,
                                           " --set train.max_steps=1 2>&1"),
                              300, &out),
            0)
      << out;
  // Host 0's log is the command's output; host 1's shard logs the same plan.
  EXPECT_THAT(out, HasSubstr("tables taken: 'item'; new (initialized): 'fresh'"));
  auto host1 = ReadFileToString(ps_taken + "/host-1/output.log");
  ASSERT_TRUE(host1.ok()) << host1.status();
  EXPECT_THAT(*host1, HasSubstr("shard 1: warm start from " + src));
  EXPECT_THAT(*host1, HasSubstr("tables taken: 'item'; new (initialized): 'fresh'"));
  EXPECT_GT(testing::ReadSummary(ps_taken).fields().at("test_auc").number_value(),
            cold_auc + 0.05);
}

// A 2-host PS checkpoint stopped mid-run restores onto 3 hosts and trains on to the end.
TEST_F(TablesTest, PsCheckpointRestoresOntoThreeHosts) {
  const std::string m = Dir() + "/reshard";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m),
                                           " --epochs 2 --set train.max_steps=40"),
                              300, &out),
            0)
      << out;
  const auto first = testing::ReadSummary(m).fields();
  EXPECT_LT(first.at("examples").number_value(), 2 * kTrainRows) << "not stopped mid-run";
  // Each shard file's groups are its partitions at their tables' widths: item's (4 x 2 shards
  // partitions of dim 8) and small's (3 partitions of dim 4), all over the two files.
  std::vector<int> widths = GroupWidths(m);
  std::sort(widths.begin(), widths.end());
  EXPECT_EQ(widths, (std::vector<int>{5, 5, 5, 9, 9, 9, 9, 9, 9, 9, 9}));
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 3 ", Args(m), " --epochs 2"), 300,
                              &out),
            0)
      << out;
  auto host1 = ReadFileToString(m + "/host-1/output.log");
  ASSERT_TRUE(host1.ok()) << host1.status();
  EXPECT_THAT(*host1, HasSubstr("(re-partitioned onto 3 shards)"));
  EXPECT_THAT(*host1, HasSubstr("resumed from " + m + "/ckpt-"));
  const auto second = testing::ReadSummary(m).fields();
  EXPECT_GT(second.at("steps").number_value(), first.at("steps").number_value()) << *host1;
  EXPECT_GT(second.at("test_auc").number_value(), 0.7) << out;
}

}  // namespace
}  // namespace pstrain
