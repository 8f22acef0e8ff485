// Issue 28: a PS job whose every table is dynamic (a DeepRec user's EmbeddingVariables), with
// real processes on the topic-history CSV of lists_test: `item` (the candidate and the history
// list) and `user` each in a dynamic table, so the shards' fixed row space is empty (rows 0:
// ShardOptionsForJob, PsClient, PartitionMap) and pulls and pushes carry only dynamic ids and the
// dense slices. A 2-host job learns, checkpoints (the manifest's table_rows 0, no fixed row group
// in any shard file), resumes from a stop to the uninterrupted run's dynamic rows, restores onto
// another shard count, and predict / export / serve score as the trainer. `pstrain train` of the
// same config writes checkpoints of the same shape (table_rows 0, no fixed row group).
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/layout.h"
#include "cmd/ps_setup.h"
#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/server/shard.h"
#include "ps/store/dynamic_file.h"
#include "ps/store/store_blocks.h"
#include "serving/export.h"
#include "tests/cmd/job_files.h"
#include "tests/cmd/served_export.h"
#include "tests/cmd/topic_history_csv.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/all_dynamic_ps_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

const char kConfig[] = R"pb(
  data {
    train { name: "train" format: CSV }
    eval { name: "eval" format: CSV }
    shuffle_buffer: 0
    shuffle_files: false
  }
  features {
    preset: NO_PRESET
    field { name: "item" table: "item" }
    field { name: "history" table: "item" list { combiner: MEAN max_length: 12 } }
    field { name: "user" table: "user" }
    table { name: "item" initializer { type: TRUNCATED_NORMAL stddev: 0.02 } dynamic {} }
    table { name: "user" dim: 4 fm_join: EXCLUDE dynamic { ttl_steps: 3 } }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.003 }
  train { global_batch_size: 128 epochs: 6 eval_batch_size: 500 log_every_steps: 100000 }
  threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
  cluster { consistency: SYNC }
  checkpoint { every_seconds: 0 every_steps: 20 incremental_every: 100 }
)pb";

constexpr int kTrainRows = 6000;

class AllDynamicPsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    ASSERT_TRUE(
        WriteFileAtomic(Dir() + "/train.csv", testing::TopicHistoryCsv(kTrainRows, 1)).ok());
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/test.csv", testing::TopicHistoryCsv(1000, 3)).ok());
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", kConfig).ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static std::string Args(const std::string& model_dir) {
    return absl::StrCat("--config ", Dir(), "/config.textproto --train ", Dir(),
                        "/train.csv --eval ", Dir(), "/test.csv --model_dir ", model_dir);
  }
};

// The dynamic rows of the newest checkpoint of `model_dir`, restored onto `shards` shards of the
// job's config (shard s keeps the keys it owns): one snapshot per dynamic table and shard, and
// the number of fixed stores the shards made (none: the fixed row space is empty).
std::vector<DynamicSnapshot> RestoredDynamicRows(const std::string& model_dir, int shards,
                                                 int* fixed_stores) {
  std::vector<DynamicSnapshot> out;
  auto config = LoadConfigFile(model_dir + "/config.textproto");
  EXPECT_TRUE(config.ok()) << config.status();
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  if (!config.ok() || !choice.ok() || !choice->has_value()) return out;
  *fixed_stores = 0;
  for (int s = 0; s < shards; ++s) {
    auto options = ShardOptionsForJob(*config, s, shards);
    EXPECT_TRUE(options.ok()) << options.status();
    if (!options.ok()) return out;
    EXPECT_EQ(options->data.rows, 0);
    auto shard = Shard::Create(options->data);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (!shard.ok()) return out;
    const absl::Status restored = (*shard)->RestoreCheckpoint((*choice)->chain).status();
    EXPECT_TRUE(restored.ok()) << restored;
    *fixed_stores += static_cast<int>((*shard)->stores().size());
    for (const auto& store : (*shard)->dynamic_stores()) {
      out.push_back(store->Snapshot().value());
    }
  }
  return out;
}

// How many blocks of each tag the shard files of the newest checkpoint of `model_dir` hold, and
// how many shard files it lists.
std::map<std::string, int> BlockTags(const std::string& model_dir, int* shard_files) {
  std::map<std::string, int> tags;
  *shard_files = 0;
  auto choice = ChooseCheckpoint(model_dir);
  EXPECT_TRUE(choice.ok() && choice->has_value()) << model_dir;
  if (!choice.ok() || !choice->has_value()) return tags;
  for (const auto& f : (*choice)->manifest.file()) {
    if (!IsShardFileName(f.name())) continue;
    ++*shard_files;
    auto reader = BlockReader::Open((*choice)->dir + "/" + f.name());
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return tags;
    Block b;
    while (true) {
      auto more = (*reader)->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      ++tags[b.tag];
    }
  }
  return tags;
}

// The keys of table t over every shard's snapshots (tables interleaved per shard), sorted.
std::vector<uint64_t> KeysOf(const std::vector<DynamicSnapshot>& snaps, size_t t, size_t tables) {
  std::vector<uint64_t> keys;
  for (size_t i = t; i < snaps.size(); i += tables) {
    keys.insert(keys.end(), snaps[i].keys.begin(), snaps[i].keys.end());
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// A 2-host SYNC job with no fixed row learns the topic data (a model without the item rows
// scores about 0.5), its checkpoint says table_rows 0, its shard files hold the dynamic rows and
// no fixed row group, and predict (checkpoint and export) and serve score as the trainer.
TEST_F(AllDynamicPsTest, TwoHostJobLearnsCheckpointsAndServes) {
  const std::string m = Dir() + "/ps";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m), " 2>&1"), 300,
                              &out),
            0)
      << out;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_THAT(summary.at("mode").string_value(), HasSubstr("ps-"));
  EXPECT_EQ(summary.at("examples").number_value(), 6 * kTrainRows);
  const double auc = summary.at("test_auc").number_value();
  EXPECT_GT(auc, 0.65) << out;
  const auto& tables = summary.at("dynamic_tables").struct_value().fields();
  ASSERT_TRUE(tables.count("item") && tables.count("user")) << out;
  EXPECT_GT(tables.at("item").struct_value().fields().at("rows_live").number_value(), 50);

  auto choice = ChooseCheckpoint(m);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->manifest.table_rows(), 0);
  EXPECT_EQ((*choice)->manifest.num_shards(), 2);
  // Each shard file: its dense slice and its dynamic groups, and no fixed row group.
  int shard_files = 0;
  std::map<std::string, int> tags = BlockTags(m, &shard_files);
  EXPECT_EQ(shard_files, 2);
  EXPECT_EQ(tags[kEmbeddingMetaTag], 0);
  EXPECT_EQ(tags[kEmbeddingRowsTag], 0);
  EXPECT_EQ(tags[kDenseTag], 2);
  EXPECT_GT(tags[kDynamicMetaTag], 0);

  // Restored onto 2 shards (each its own keys) and onto 1 (re-sharding): the same keys, and no
  // shard makes a fixed store.
  int fixed_stores = -1;
  const std::vector<DynamicSnapshot> two = RestoredDynamicRows(m, 2, &fixed_stores);
  EXPECT_EQ(fixed_stores, 0);
  const std::vector<DynamicSnapshot> one = RestoredDynamicRows(m, 1, &fixed_stores);
  EXPECT_EQ(fixed_stores, 0);
  ASSERT_EQ(two.size(), 4u);
  ASSERT_EQ(one.size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    SCOPED_TRACE(t);
    EXPECT_FALSE(KeysOf(one, t, 2).empty());
    EXPECT_EQ(KeysOf(two, t, 2), KeysOf(one, t, 2));
  }

  auto predict = [&](const std::string& model, const std::string& name) {
    const auto predicted = testing::PredictTopicHistory(Dir(), model, name).fields();
    ASSERT_TRUE(predicted.count("auc")) << name;
    EXPECT_EQ(predicted.at("auc").number_value(), auc) << name;
  };
  predict(m, "ckpt_scores");
  ASSERT_TRUE(testing::ExportModel(m, Dir() + "/export", &out));
  auto dir = ResolveExportDir(Dir() + "/export");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto exported = ReadExport(*dir);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ((*exported)->table_rows(), 0);
  ASSERT_EQ((*exported)->dynamic_stores().size(), 2u);
  EXPECT_GE((*exported)->dynamic_rows(), 100);  // the 100 items and the users live
  predict(Dir() + "/export", "export_scores");
  testing::ServedExport served(P(), Dir() + "/export");
  served.ExpectCsvScoresAsPredicted(Dir() + "/test.csv", Dir() + "/export_scores.tsv");
}

// A job stopped after 30 steps (train.max_steps: its last checkpoint) and resumed ends with the
// uninterrupted run's dynamic rows of both tables, to the bit (the user table's TTL evictions on
// the every-20-steps schedule in between), and its test AUC.
TEST_F(AllDynamicPsTest, ResumedAfterAStopEqualsAnUninterruptedRun) {
  const std::string whole = Dir() + "/whole", parts = Dir() + "/parts";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(whole), " 2>&1"), 300,
                              &out),
            0)
      << out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(parts),
                                           " --set train.max_steps=30 2>&1"),
                              300, &out),
            0)
      << out;
  // The summary counts the steps of both workers: 30 rounds of 2, ckpt-60.
  EXPECT_EQ(testing::ReadSummary(parts).fields().at("steps").number_value(), 60);
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(parts), " 2>&1"), 300,
                              &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("resumed from " + parts + "/ckpt-60 at step 30"));
  const auto w = testing::ReadSummary(whole).fields();
  const auto p = testing::ReadSummary(parts).fields();
  EXPECT_EQ(p.at("steps").number_value(), w.at("steps").number_value());
  EXPECT_EQ(p.at("test_auc").number_value(), w.at("test_auc").number_value());
  int fixed_stores = -1;
  const std::vector<DynamicSnapshot> a = RestoredDynamicRows(whole, 1, &fixed_stores);
  const std::vector<DynamicSnapshot> b = RestoredDynamicRows(parts, 1, &fixed_stores);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    SCOPED_TRACE(t);
    EXPECT_GT(a[t].rows(), 0);
    EXPECT_EQ(a[t].keys, b[t].keys);
    EXPECT_TRUE(a[t].weights == b[t].weights) << "dynamic rows' weights differ";
    EXPECT_TRUE(a[t].state == b[t].state) << "dynamic rows' optimizer slots differ";
    EXPECT_EQ(a[t].counts, b[t].counts);
    EXPECT_EQ(a[t].last_step_of, b[t].last_step_of);
  }
}

// `pstrain train` of the same config holds a placeholder row (a store needs one) that its
// checkpoint neither saves nor counts (worker/train/checkpoint.cc CheckpointRows): table_rows 0
// and no fixed row group, as the PS job's. So predict and export take it (they refused "holds
// rows 1 x 9 ..., but its model description makes rows 0 x 9" before), it resumes, and PS
// shards of the config restore it (each its own keys).
TEST_F(AllDynamicPsTest, TrainersCheckpointIsThePsJobsShape) {
  const std::string m = Dir() + "/train";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m), " --epochs 2 2>&1"), 120,
                              &out),
            0)
      << out;
  auto choice = ChooseCheckpoint(m);
  ASSERT_TRUE(choice.ok() && choice->has_value()) << choice.status();
  EXPECT_EQ((*choice)->manifest.table_rows(), 0);
  int shard_files = 0;
  std::map<std::string, int> tags = BlockTags(m, &shard_files);
  EXPECT_EQ(shard_files, 1);
  EXPECT_EQ(tags[kEmbeddingMetaTag], 0);
  EXPECT_EQ(tags[kDenseTag], 1);
  const double auc = testing::ReadSummary(m).fields().at("test_auc").number_value();
  EXPECT_GT(auc, 0.6);
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " predict --model_dir ", m, " --input ", Dir(),
                                           "/test.csv --format csv --out ", Dir(),
                                           "/train_scores.tsv --summary ", Dir(),
                                           "/train_scores.json --batch_size 500 2>&1"),
                              120, &out),
            0)
      << out;
  EXPECT_NEAR(
      testing::ReadJsonFile(Dir() + "/train_scores.json").fields().at("auc").number_value(), auc,
      1e-5);
  ASSERT_TRUE(testing::ExportModel(m, Dir() + "/train_export", &out));
  // A resume takes its own checkpoint (rows 0 on both sides).
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(m),
                                           " --epochs 2 --on_new_data=new_pass 2>&1"),
                              120, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("new training pass over train csv"));
  EXPECT_THAT(out, HasSubstr("from the parameters and optimizer slots of " + m + "/ckpt-"));
  int fixed_stores = -1;
  const std::vector<DynamicSnapshot> two = RestoredDynamicRows(m, 2, &fixed_stores);
  EXPECT_EQ(fixed_stores, 0);
  ASSERT_EQ(two.size(), 4u);
  for (size_t t = 0; t < 2; ++t) EXPECT_FALSE(KeysOf(two, t, 2).empty()) << t;
  // Warm starts both ways: a 2-host job from the trainer's checkpoint, and `train` from the
  // job's (it refused "rows 0 x 9" against its own 1 row before).
  const std::string warm_ps = Dir() + "/warm_ps", warm_train = Dir() + "/warm_train";
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(warm_ps),
                                           " --warm_start_from ", m,
                                           " --set train.max_steps=2 2>&1"),
                              120, &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("shard 0: warm start from " + m + "/ckpt-"));
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " train ", Args(warm_train),
                                           " --warm_start_from ", warm_ps,
                                           " --set train.max_steps=2 2>&1"),
                              120, &out),
            0)
      << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("warm start from .*warm_ps/ckpt-[0-9]+ \\(2 "
                                            "shard\\(s\\)\\): 0 embedding rows, [1-9][0-9]* "
                                            "dynamic rows"));
}

}  // namespace
}  // namespace pstrain
