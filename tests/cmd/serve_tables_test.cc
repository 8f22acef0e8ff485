// Tables (docs/CONFIG.md "Tables") through the serving commands, with real processes: `pstrain
// train` of a config whose history list and candidate share an `item` table, `pstrain predict`
// of its checkpoint scoring as the trainer's final evaluation did, `pstrain export` writing each
// table's rows at its width (format version 2), and `pstrain serve` of the export scoring CSV
// rows as predict did. The mixed-dims case: a table wider than model.embedding_dim makes the
// checkpoint's rows 1 + the largest dim (the stride), and each table still exports and serves at
// its own width.
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "serving/export.h"
#include "tests/cmd/job_files.h"
#include "tests/cmd/served_export.h"
#include "tests/cmd/topic_history_csv.h"
#include "tests/shell.h"

namespace pstrain {
namespace {

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/serve_tables_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

// `item` (dim `item_dim`, its initializer NORMAL with the model's stddev: Model::InitRow's rule)
// shared by the candidate and the history; `user` in the default table (dim k = 8).
std::string Config(int item_dim, const std::string& fm_join) {
  return absl::StrCat(R"pb(
    data { train { name: "train" format: CSV } eval { name: "eval" format: CSV }
           shuffle_buffer: 1000 }
    features {
      preset: NO_PRESET
      field { name: "item" table: "item" }
      field { name: "history" table: "item" list { combiner: MEAN max_length: 12 } }
      field { name: "user" vocab_size: 500 }
      table { name: "item" rows: 2000 dim: )pb", item_dim, " ", fm_join, R"pb( }
    }
    model { type: DEEPFM embedding_dim: 8 hidden: [ 32 ] }
    sparse_optimizer { type: ADAGRAD learning_rate: 0.1 initial_accumulator: 0.0001 }
    dense_optimizer { type: ADAM learning_rate: 0.003 }
    train { global_batch_size: 128 epochs: 4 eval_batch_size: 500 log_every_steps: 100000 }
    threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
  )pb");
}

class ServeTablesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/train.csv", testing::TopicHistoryCsv(12000, 1)).ok());
    ASSERT_TRUE(WriteFileAtomic(Dir() + "/test.csv", testing::TopicHistoryCsv(1000, 3)).ok());
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  // Trains `config` in Dir()/<name>; false (a skip) when its checkpoint's rows are not
  // `want_row_dim` floats.
  static bool Train(const std::string& name, const std::string& config, int want_row_dim) {
    const std::string d = Dir() + "/" + name;
    EXPECT_TRUE(MakeDirs(d).ok());
    EXPECT_TRUE(WriteFileAtomic(d + "/config.textproto", config).ok());
    std::string out;
    EXPECT_EQ(testing::RunShell(absl::StrCat(P(), " train --config ", d, "/config.textproto "
                                             "--train ", Dir(), "/train.csv --eval ", Dir(),
                                             "/test.csv --model_dir ", d, "/m"),
                                300, &out),
              0)
        << out;
    auto choice = ChooseCheckpoint(d + "/m");
    EXPECT_TRUE(choice.ok() && choice->has_value()) << out;
    if (!choice.ok() || !choice->has_value()) return false;
    return (*choice)->manifest.row_dim() == want_row_dim;
  }

  // predict scores as the trainer's final evaluation; the export stores the `item` rows at
  // `item_width` floats and the default table's at 9; serve scores as predict.
  static void PredictExportServe(const std::string& name, int item_width) {
    const std::string d = Dir() + "/" + name;
    std::string out;
    ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " predict --model_dir ", d, "/m --input ",
                                             Dir(), "/test.csv --format csv --out ", d,
                                             "/scores.tsv --summary ", d,
                                             "/predict.json --batch_size 500 --threads 2"),
                                300, &out),
              0)
        << out;
    const double auc = testing::ReadSummary(d + "/m").fields().at("test_auc").number_value();
    EXPECT_GT(auc, 0.7);
    EXPECT_EQ(testing::ReadJsonFile(d + "/predict.json").fields().at("auc").number_value(), auc);
    ASSERT_TRUE(testing::ExportModel(d + "/m", d + "/export"));
    auto dir = ResolveExportDir(d + "/export");
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto exported = ReadExport(*dir);
    ASSERT_TRUE(exported.ok()) << exported.status();
    const auto& tables = (*exported)->row_tables();
    ASSERT_EQ(tables.size(), 2u);
    EXPECT_EQ(tables[0].width, 9);
    EXPECT_EQ(tables[1].name, "item");
    EXPECT_EQ(tables[1].width, item_width);
    EXPECT_GT((*exported)->StoredTableRows(1, tables[1].begin, tables[1].end).rows(), 90);
    testing::ServedExport served(P(), d + "/export");
    served.ExpectCsvScoresAsPredicted(Dir() + "/test.csv", d + "/scores.tsv");
  }
};

TEST_F(ServeTablesTest, ASharedTableServesAsPredictedAndTrained) {
  ASSERT_TRUE(Train("same", Config(8, ""), 9));
  PredictExportServe("same", 9);
}

// `item` of dim 16 (k = 8, out of the FM term): the stride is 17 floats, the default table's rows
// stay 9 floats in the export and in serve's memory.
TEST_F(ServeTablesTest, MixedDimsServeAsPredictedAndTrained) {
  ASSERT_TRUE(Train("mixed", Config(16, "fm_join: EXCLUDE"), 17))
      << "the checkpoint's rows are not the stride 1 + the largest dim (17)";
  PredictExportServe("mixed", 17);
}

}  // namespace
}  // namespace pstrain
