// The evaluator on real parameters: a healthy model gets its metrics, a poisoned one (NaN
// weights, as a diverged run leaves them) an INVALID_ARGUMENT status instead of an abort.
#include "worker/eval/evaluator.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/params/local_params.h"

namespace pstrain {
namespace {

class EvaluatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/evaluator_", getpid());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    // 200 Criteo TSV records: label, I1..I13, C1..C26, half of each class.
    std::string tsv;
    for (int r = 0; r < 200; ++r) {
      absl::StrAppend(&tsv, r % 2);
      for (int i = 0; i < 13; ++i) absl::StrAppend(&tsv, "\t", (r * 7 + i) % 50);
      for (int c = 0; c < 26; ++c) absl::StrAppend(&tsv, "\t", absl::Hex((r * 31 + c) % 97 + 1));
      tsv += "\n";
    }
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/eval.tsv", tsv).ok());
    auto c = LoadConfigFile(std::string(PSTRAIN_SOURCE_DIR) + "/configs/deepfm_criteo.textproto");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    config_.mutable_data()->mutable_eval(0)->add_path(dir_ + "/eval.tsv");
    for (const char* set : {"features.categorical_vocab_size=1000", "model.hidden=[16]"}) {
      ASSERT_TRUE(ApplyOverride(set, &config_).ok()) << set;
    }
    auto spec = FeatureSpec::Create(config_.features());
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = std::make_unique<FeatureSpec>(*std::move(spec));
    auto model = Model::Create(config_.model(), spec_->num_fields());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto params = LocalParams::Create(*model_, spec_->total_rows(), config_, 1);
    ASSERT_TRUE(params.ok()) << params.status();
    params_ = *std::move(params);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  // Every dense weight becomes NaN.
  void Poison() {
    params_->dense()->Set(
        std::vector<float>(params_->dense_size(), std::numeric_limits<float>::quiet_NaN()).data());
  }

  std::string dir_;
  Config config_;
  std::unique_ptr<FeatureSpec> spec_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<LocalParams> params_;
};

TEST_F(EvaluatorTest, HealthyModelIsEvaluated) {
  auto r = Evaluate(config_, *spec_, *model_, params_.get(), 3, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->examples, 200);
  EXPECT_EQ(r->step, 3);
  EXPECT_TRUE(std::isfinite(r->auc));
  EXPECT_TRUE(std::isfinite(r->logloss));
}

// Synchronously (the final evaluation) and on the background thread (periodic evaluations).
TEST_F(EvaluatorTest, PoisonedModelIsAnInvalidArgumentNotAnAbort) {
  Poison();
  auto r = Evaluate(config_, *spec_, *model_, params_.get(), 7, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr("evaluation at step 7: 200 of 200 scores are NaN"));

  BackgroundEvaluator background(config_, *spec_, *model_, params_.get(), 1);
  ASSERT_TRUE(background.Start(9));
  background.Wait();
  auto taken = background.Take();
  ASSERT_TRUE(taken.has_value());
  ASSERT_FALSE(taken->ok());
  EXPECT_EQ(taken->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(taken->status().message()),
              ::testing::HasSubstr("evaluation at step 9: 200 of 200 scores are NaN"));
}

}  // namespace
}  // namespace pstrain
