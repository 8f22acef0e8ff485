// Dynamic tables (issue 28) in PS jobs with real processes, on the topic-history CSV of
// lists_test: the `item` table (the candidate and the history list) is dynamic, its rows keyed by
// the hash of the raw id and owned by the shards by key hash. A 2-host `pstrain local` job learns
// as the fixed-table job of tables_test does, and the shards hold the items' rows.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cmd/job_files.h"
#include "tests/cmd/topic_history_csv.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/dynamic_ps_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

const char kConfig[] = R"pb(
  data {
    train { name: "train" format: CSV }
    eval { name: "eval" format: CSV }
    shuffle_buffer: 1000
  }
  features {
    preset: NO_PRESET
    field { name: "item" table: "item" }
    field { name: "history" table: "item" list { combiner: MEAN max_length: 12 } }
    field { name: "user" table: "small" }
    table { name: "item" initializer { type: TRUNCATED_NORMAL stddev: 0.02 } dynamic {} }
    table { name: "small" dim: 4 rows: 500 fm_join: EXCLUDE }
  }
  model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.003 }
  train { global_batch_size: 128 epochs: 6 eval_batch_size: 500 log_every_steps: 100000 }
  threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

constexpr int kTrainRows = 2 * 6000;

class DynamicPsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir() + "/train").c_str()), 0);
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/train/a.csv", testing::TopicHistoryCsv(6000, 1)).ok());
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/train/b.csv", testing::TopicHistoryCsv(6000, 2)).ok());
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/test.csv", testing::TopicHistoryCsv(2000, 3)).ok());
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/config.textproto", kConfig).ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  static std::string Args(const std::string& model_dir) {
    return absl::StrCat("--config ", Dir(), "/config.textproto --train '", Dir(),
                        "/train/*.csv' --eval ", Dir(), "/test.csv --model_dir ", model_dir);
  }
};

// The topic data needs the item rows (a click follows the candidate's topic against the
// history's): a model that did not learn them scores about 0.5; tables_test's fixed `item` table
// reaches above 0.7 on the same data.
TEST_F(DynamicPsTest, TwoHostJobLearns) {
  const std::string m = Dir() + "/ps";
  std::string out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " local --hosts 2 ", Args(m),
                                           " --set cluster.consistency=SYNC"),
                              300, &out),
            0)
      << out;
  const auto summary = testing::ReadSummary(m).fields();
  EXPECT_THAT(summary.at("mode").string_value(), HasSubstr("ps-"));
  EXPECT_EQ(summary.at("examples").number_value(), 6 * kTrainRows);
  EXPECT_GT(summary.at("test_auc").number_value(), 0.7) << out;
}

}  // namespace
}  // namespace pstrain
