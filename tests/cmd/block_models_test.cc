// DCN_V2 and DLRM (the block grammar, worker/model/model.h) through every mode with the real
// binary: `pstrain train`, then `predict` reproduces its final evaluation to the bit from the
// checkpoint, and an export (f32 rows) scores as the checkpoint (on the AVX-512 paths; on the avx2
// path oneDNN's gemm:jit sums depend on the batch size, so there to float rounding); `pstrain local --hosts 2` (the
// PS: the dense slice is just bigger) and `mpirun -np 2 pstrain allreduce` train them too. DLRM
// runs with DENSE numeric fields, so its bottom MLP is part of every one of these paths.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/cpu.h"
#include "tests/shell.h"
#include "tests/subprocess.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(::testing::TempDir(), "/block_models_", getpid()); }
std::string P() { return PSTRAIN_BINARY; }

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "";
}

double JsonNumber(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = json.find(k);
  EXPECT_NE(at, std::string::npos) << key << " in " << json;
  if (at == std::string::npos) return NAN;
  const size_t end = json.find_first_of(",}", at);
  double v = NAN;
  EXPECT_TRUE(absl::SimpleAtod(json.substr(at + k.size(), end - at - k.size()), &v)) << json;
  return v;
}

// Whether scores computed in batches of other sizes are the same bits: on the AVX-512 paths
// (oneDNN's brgemm); oneDNN 2.6's avx2 gemm:jit rounds by the batch size (DeepFM's MLP too).
bool BatchInvariant() { return KernelIsa() != Isa::kAvx2; }

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// Small models: k = 8, MLP 32-16; the DCN-v2 is the PARALLEL, low-rank variant (the preset's
// default, STACKED full rank, is what model_test checks most).
const char kCommon[] = R"pb(
  data {
    train { name: "train" format: CRITEO_TSV }
    eval { name: "eval" format: CRITEO_TSV }
    shuffle_buffer: 1000
  }
  sparse_optimizer { type: ADAGRAD learning_rate: 0.05 initial_accumulator: 0.0001 }
  dense_optimizer { type: ADAM learning_rate: 0.001 }
  train { batch_size: 64 epochs: 1 eval_batch_size: 250 log_every_steps: 100000 }
  threads { towers: 2 intra_op_threads: 1 inter_op_threads: 1 }
)pb";

struct Case {
  const char* name;
  const char* model;
};

const Case kCases[] = {
    {"dcn_v2", R"pb(
       features { preset: CRITEO categorical_vocab_size: 20000 }
       model {
         type: DCN_V2 embedding_dim: 8 hidden: [ 32, 16 ]
         blocks { cross_layers: 2 cross_rank: 16 join: PARALLEL }
       })pb"},
    {"dlrm", R"pb(
       features { preset: CRITEO categorical_vocab_size: 20000 numeric_mode: DENSE }
       model {
         type: DLRM embedding_dim: 8 hidden: [ 32, 16 ]
         blocks { bottom_hidden: [ 16 ] }
       })pb"},
};

class BlockModelsTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(std::system(("rm -rf " + Dir() + " && mkdir -p " + Dir()).c_str()), 0);
    ASSERT_EQ(testing::RunToExit({P(), "datagen", "--rows", "6000", "--files", "2", "--seed", "1",
                                  "--out", Dir() + "/train"},
                                 120000),
              0);
    ASSERT_EQ(testing::RunToExit({P(), "datagen", "--rows", "1000", "--seed", "2", "--out",
                                  Dir() + "/test"},
                                 120000),
              0);
    for (const Case& c : kCases) {
      ASSERT_TRUE(WriteFileAtomic(absl::StrCat(Dir(), "/", c.name, ".textproto"),
                                  absl::StrCat(kCommon, c.model))
                      .ok());
    }
  }
  static void TearDownTestSuite() { std::system(("rm -rf " + Dir()).c_str()); }

  std::string Config() const { return absl::StrCat(Dir(), "/", GetParam().name, ".textproto"); }
  std::string Model(const std::string& mode) const {
    return absl::StrCat(Dir(), "/", GetParam().name, "_", mode);
  }
  std::string Run(const std::string& command, const std::string& model_dir) const {
    return absl::StrCat(P(), " ", command, " --config ", Config(), " --train '", Dir(),
                        "/train/part-*' --eval '", Dir(), "/test/part-*' --model_dir ", model_dir);
  }
  static std::string TestData() { return Dir() + "/test/part-*"; }
};

TEST_P(BlockModelsTest, TrainPredictAndExportAgree) {
  std::string out;
  const std::string m = Model("train");
  ASSERT_EQ(testing::RunShell(Run("train", m), 300, &out), 0) << out;
  const std::string summary = Slurp(m + "/summary.json");
  ASSERT_FALSE(summary.empty()) << out;
  // 6,000 rows of a teacher whose Bayes AUC is ~0.80: well above chance.
  EXPECT_GT(JsonNumber(summary, "test_auc"), 0.6) << summary;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " predict --model_dir ", m, " --input '",
                                           TestData(), "' --out ", Dir(), "/", GetParam().name,
                                           "_scores.tsv --summary ", m, "/predict.json ",
                                           "--batch_size 250 --threads 2"),
                              300, &out),
            0)
      << out;
  const std::string mine = Slurp(m + "/predict.json");
  if (BatchInvariant()) {
    EXPECT_EQ(JsonNumber(mine, "auc"), JsonNumber(summary, "test_auc"));
    EXPECT_EQ(JsonNumber(mine, "logloss"), JsonNumber(summary, "test_logloss"));
  } else {
    EXPECT_NEAR(JsonNumber(mine, "auc"), JsonNumber(summary, "test_auc"), 1e-5);
    EXPECT_NEAR(JsonNumber(mine, "logloss"), JsonNumber(summary, "test_logloss"), 1e-7);
  }

  // The export holds the model's whole dense layout: it scores as the checkpoint, bit for bit.
  const std::string x = Model("export");
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " export --model_dir ", m, " --out ", x,
                                           " --rows f32"),
                              120, &out),
            0)
      << out;
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " predict --model_dir ", x, " --input '",
                                           TestData(), "' --out ", x, "/scores.tsv"),
                              300, &out),
            0)
      << out;
  const std::vector<std::string> from_export = ReadLines(x + "/scores.tsv");
  const std::vector<std::string> from_ckpt =
      ReadLines(absl::StrCat(Dir(), "/", GetParam().name, "_scores.tsv"));
  ASSERT_EQ(from_export.size(), 1000u);
  ASSERT_EQ(from_ckpt.size(), 1000u);
  if (BatchInvariant()) {
    EXPECT_EQ(from_export, from_ckpt);
  } else {
    for (size_t i = 0; i < from_ckpt.size(); ++i) {
      double a = 0, b = 0;
      ASSERT_TRUE(absl::SimpleAtod(from_export[i].substr(0, from_export[i].find('\t')), &a));
      ASSERT_TRUE(absl::SimpleAtod(from_ckpt[i].substr(0, from_ckpt[i].find('\t')), &b));
      ASSERT_NEAR(a, b, 1e-6) << "row " << i;
    }
  }
}

TEST_P(BlockModelsTest, ThePsModeTrainsIt) {
  std::string out;
  const std::string m = Model("ps");
  ASSERT_EQ(testing::RunShell(Run("local --hosts 2", m), 600, &out), 0) << out;
  const std::string summary = Slurp(m + "/summary.json");
  ASSERT_FALSE(summary.empty()) << out;
  EXPECT_GT(JsonNumber(summary, "test_auc"), 0.6) << summary;
  // Its 2-shard checkpoint holds the whole dense vector: predict reproduces the evaluation
  // (within the ulps PredictTest.APsCheckpointEqualsItsJobsEvaluation explains).
  ASSERT_EQ(testing::RunShell(absl::StrCat(P(), " predict --model_dir ", m, " --input '",
                                           TestData(), "' --summary ", m, "/predict.json"),
                              300, &out),
            0)
      << out;
  EXPECT_NEAR(JsonNumber(Slurp(m + "/predict.json"), "auc"), JsonNumber(summary, "test_auc"),
              1e-5);
}

TEST_P(BlockModelsTest, TheAllreduceModeTrainsIt) {
  std::string out;
  const std::string m = Model("allreduce");
  const int code = testing::RunShell(
      absl::StrCat("mpirun --allow-run-as-root --oversubscribe -np 2 ", Run("allreduce", m),
                   " --set threads.towers=1"),
      600, &out);
  ASSERT_EQ(code, 0) << out;
  const std::string summary = Slurp(m + "/summary.json");
  ASSERT_FALSE(summary.empty()) << out;
  EXPECT_GT(JsonNumber(summary, "test_auc"), 0.6) << summary;
  EXPECT_THAT(summary, HasSubstr("allreduce"));
}

INSTANTIATE_TEST_SUITE_P(Presets, BlockModelsTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pstrain
