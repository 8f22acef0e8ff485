// ChooseWarmStartCheckpoint (checkpoint/warm_start.h) on the committed fixtures: a model dir or
// one ckpt-<step>; the model description compared (the field named), the optimizer types unless
// reset_optimizer; a version-1 MANIFEST accepted; a missing source refused.
#include "checkpoint/warm_start.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

const std::string kTestdata = PSTRAIN_SOURCE_DIR "/tests/checkpoint/testdata";

WarmStart From(const std::string& from, bool reset_optimizer = false) {
  WarmStart w;
  w.set_from(from);
  w.set_reset_optimizer(reset_optimizer);
  return w;
}

// train_v2's own description (its MANIFEST's).
ModelDescription V2Description() {
  CheckpointManifest manifest;
  EXPECT_TRUE(VerifyCheckpoint(kTestdata + "/train_v2/ckpt-3", &manifest).ok());
  EXPECT_TRUE(manifest.has_model());
  return manifest.model();
}

TEST(WarmStart, ChoosesTheModelDirsLatestOrTheCheckpointGiven) {
  const ModelDescription wanted = V2Description();
  for (const std::string& from :
       {kTestdata + "/train_v2", kTestdata + "/train_v2/", kTestdata + "/train_v2/ckpt-3"}) {
    auto c = ChooseWarmStartCheckpoint(From(from), wanted);
    ASSERT_TRUE(c.ok()) << from << ": " << c.status();
    EXPECT_THAT(c->dir, HasSubstr("train_v2"));
    EXPECT_THAT(c->dir, HasSubstr("ckpt-3"));
    EXPECT_EQ(c->manifest.step(), 3);
  }
}

TEST(WarmStart, AnotherModelIsRefusedNamingTheField) {
  ModelDescription wanted = V2Description();
  wanted.mutable_model()->set_embedding_dim(wanted.model().embedding_dim() + 1);
  auto c = ChooseWarmStartCheckpoint(From(kTestdata + "/train_v2"), wanted);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("model.embedding_dim: 2 in the warm-start checkpoint, 3 in the config"));
  // --reset_optimizer does not make another model acceptable.
  EXPECT_FALSE(ChooseWarmStartCheckpoint(From(kTestdata + "/train_v2", true), wanted).ok());
}

TEST(WarmStart, AnotherOptimizerOnlyWithAReset) {
  ModelDescription wanted = V2Description();
  const OptimizerType saved = wanted.dense_optimizer().type();
  const OptimizerType other = saved == SGD ? ADAGRAD : SGD;
  wanted.mutable_dense_optimizer()->set_type(other);
  auto c = ChooseWarmStartCheckpoint(From(kTestdata + "/train_v2"), wanted);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr(absl::StrCat("dense_optimizer.type: ", OptimizerType_Name(saved),
                                     " in the warm-start checkpoint, ", OptimizerType_Name(other),
                                     " in the config; --reset_optimizer")));
  EXPECT_TRUE(ChooseWarmStartCheckpoint(From(kTestdata + "/train_v2", true), wanted).ok());
}

// Version 1 has no description to compare: accepted (with a warning), whatever is wanted; the
// restore's shape check is what guards it.
TEST(WarmStart, AVersion1ManifestIsAccepted) {
  ModelDescription wanted = V2Description();
  wanted.mutable_model()->set_embedding_dim(64);
  auto c = ChooseWarmStartCheckpoint(From(kTestdata + "/train_v1"), wanted);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->manifest.has_model());
}

TEST(WarmStart, AMissingSourceIsNotFound) {
  auto c = ChooseWarmStartCheckpoint(From(kTestdata + "/no_such_model"), V2Description());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("no_such_model: no such directory"));
  // A directory that is not a model dir: no LATEST.
  auto none = ChooseWarmStartCheckpoint(From(kTestdata), V2Description());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("no checkpoint there"));
}

}  // namespace
}  // namespace pstrain
