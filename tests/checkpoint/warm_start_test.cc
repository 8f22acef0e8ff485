// ChooseWarmStartCheckpoint (checkpoint/warm_start.h) on the committed fixtures: a model dir or
// one ckpt-<step>; the model description compared (the field named), the optimizer types unless
// reset_optimizer; a version-1 MANIFEST accepted; a missing source refused.
#include "checkpoint/warm_start.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
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

// A resolved description with tables, as FeatureSpec::Resolved lays them out: `user` (vocab 50)
// in the default table, then the named tables.
ModelDescription Tables(const std::string& tables_and_fields) {
  ModelDescription d;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(features { preset: NO_PRESET hash_seed: 3
                      field { name: "user" kind: CATEGORICAL vocab_size: 50 } )pb" +
          tables_and_fields + R"pb( }
           model { type: DEEPFM embedding_dim: 8 hidden: 16 })pb",
      &d));
  return d;
}

const char kSource[] = R"pb(
  field { name: "item" kind: CATEGORICAL table: "item" }
  field { name: "dev" kind: CATEGORICAL table: "small" }
  table { name: "item" dim: 8 rows: 1000 }
  table { name: "small" dim: 4 rows: 30 })pb";

// A table of the same name, dim and rows is taken wherever it now lies; one the source lacks is
// fresh; the dense vector is copied when the fields feeding it are the same.
TEST(TableWarmStart, TakesTablesByNameAndInitializesNewOnes) {
  // A new field `geo` names a new table `extra`, listed before `small`: `small`'s rows move, and
  // the dense vector's inputs change.
  const ModelDescription target = Tables(R"pb(
    field { name: "item" kind: CATEGORICAL table: "item" }
    field { name: "dev" kind: CATEGORICAL table: "small" }
    field { name: "geo" kind: CATEGORICAL table: "extra" }
    table { name: "item" dim: 8 rows: 1000 }
    table { name: "extra" dim: 4 rows: 7 }
    table { name: "small" dim: 4 rows: 30 })pb");
  auto plan = PlanTableWarmStart(Tables(kSource), target);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->taken.size(), 3u);
  EXPECT_EQ(plan->taken[0].name, "");  // the default table: user's 50 rows, in place
  EXPECT_EQ(plan->taken[0].from_begin, 0);
  EXPECT_EQ(plan->taken[0].from_end, 50);
  EXPECT_EQ(plan->taken[0].to_begin, 0);
  EXPECT_EQ(plan->taken[1].name, "item");
  EXPECT_EQ(plan->taken[1].from_begin, 50);
  EXPECT_EQ(plan->taken[1].to_begin, 50);
  EXPECT_EQ(plan->taken[2].name, "small");  // behind `extra` now
  EXPECT_EQ(plan->taken[2].from_begin, 1050);
  EXPECT_EQ(plan->taken[2].from_end, 1080);
  EXPECT_EQ(plan->taken[2].to_begin, 1057);
  EXPECT_EQ(plan->fresh, std::vector<std::string>{"extra"});
  EXPECT_FALSE(plan->dense);
  EXPECT_THAT(plan->dense_reason, HasSubstr("'geo' (CATEGORICAL, dim 4) only in the config"));
  EXPECT_THAT(plan->Summary(),
              HasSubstr("tables taken: the default table, 'item', 'small'; new (initialized): "
                        "'extra'; the dense vector starts fresh"));

  // A field moved to a new table of the same dim: the dense vector's inputs are the same.
  const ModelDescription moved = Tables(R"pb(
    field { name: "item" kind: CATEGORICAL table: "item" }
    field { name: "dev" kind: CATEGORICAL table: "small2" }
    table { name: "item" dim: 8 rows: 1000 }
    table { name: "small2" dim: 4 rows: 30 })pb");
  plan = PlanTableWarmStart(Tables(kSource), moved);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->fresh, std::vector<std::string>{"small2"});
  EXPECT_TRUE(plan->dense);
}

// A table of the same name but another dim or rows is refused naming it and both values; so is
// a default table whose fields changed, another model, or another hash seed.
TEST(TableWarmStart, RefusesATableThatChangedShape) {
  const ModelDescription source = Tables(kSource);
  auto refused = [&](const ModelDescription& target) {
    auto plan = PlanTableWarmStart(source, target);
    EXPECT_FALSE(plan.ok());
    return std::string(plan.status().message());
  };
  std::string other = kSource;
  other.replace(other.find("dim: 4"), 6, "dim: 6");
  EXPECT_THAT(refused(Tables(other)),
              HasSubstr("table 'small': dim 4 in the warm-start checkpoint, 6 in the config"));
  other = kSource;
  other.replace(other.find("rows: 30"), 8, "rows: 31");
  EXPECT_THAT(refused(Tables(other)),
              HasSubstr("table 'small': 30 rows in the warm-start checkpoint, 31 in the config"));
  ModelDescription target = Tables(kSource);
  target.mutable_features()->mutable_field(0)->set_name("visitor");
  EXPECT_THAT(refused(target), HasSubstr("the default table (the fields that name no table) has "
                                         "other fields: field[0] 'user' of 50 rows in the "
                                         "warm-start checkpoint, field[0] 'visitor' of 50 rows"));
  target = Tables(kSource);
  target.mutable_model()->set_embedding_dim(16);
  EXPECT_THAT(refused(target), HasSubstr("model.embedding_dim"));
  target = Tables(kSource);
  target.mutable_features()->set_hash_seed(4);
  EXPECT_THAT(refused(target), HasSubstr("features.hash_seed: 3 in the warm-start checkpoint"));
}

// A dynamic table (issue 28) of the same name and dim is taken by name (no row range: its rows
// are keyed by the raw id's hash), whatever the fixed tables around it; a dynamic table the
// config drops is left out; fixed <-> dynamic is refused naming both kinds.
TEST(TableWarmStart, TakesADynamicTableByNameAndRefusesAKindChange) {
  const ModelDescription source = Tables(R"pb(
    field { name: "item" kind: CATEGORICAL table: "item" }
    field { name: "dev" kind: CATEGORICAL table: "small" }
    field { name: "gone" kind: CATEGORICAL table: "gone" }
    table { name: "item" dim: 8 dynamic { admit_count: 2 } }
    table { name: "small" dim: 4 rows: 30 }
    table { name: "gone" dim: 8 dynamic {} })pb");
  const ModelDescription target = Tables(R"pb(
    field { name: "item" kind: CATEGORICAL table: "item" }
    field { name: "dev" kind: CATEGORICAL table: "small" }
    field { name: "geo" kind: CATEGORICAL table: "geo" }
    table { name: "geo" dim: 8 dynamic {} }
    table { name: "item" dim: 8 dynamic { admission: COUNT admit_count: 3 } }
    table { name: "small" dim: 4 rows: 30 })pb");
  auto plan = PlanTableWarmStart(source, target);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->taken.size(), 3u);
  EXPECT_FALSE(plan->taken[0].dynamic);  // the default table
  EXPECT_EQ(plan->taken[1].name, "item");
  EXPECT_TRUE(plan->taken[1].dynamic);
  EXPECT_EQ(plan->taken[1].from_end - plan->taken[1].from_begin, 0);
  EXPECT_EQ(plan->taken[2].name, "small");  // a dynamic table has no rows in the row space
  EXPECT_FALSE(plan->taken[2].dynamic);
  EXPECT_EQ(plan->taken[2].from_begin, 50);
  EXPECT_EQ(plan->taken[2].to_begin, 50);
  EXPECT_EQ(plan->fresh, std::vector<std::string>{"geo"});
  EXPECT_THAT(plan->Summary(), HasSubstr("tables taken: the default table, 'item' (dynamic), "
                                         "'small'; new (initialized): 'geo'"));

  auto refused = [&](const ModelDescription& from, const ModelDescription& to) {
    auto p = PlanTableWarmStart(from, to);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
    return std::string(p.status().message());
  };
  const ModelDescription fixed_item = Tables(R"pb(
    field { name: "item" kind: CATEGORICAL table: "item" }
    table { name: "item" dim: 8 rows: 1000 })pb");
  const ModelDescription dynamic_item = Tables(R"pb(
    field { name: "item" kind: CATEGORICAL table: "item" }
    table { name: "item" dim: 8 dynamic {} })pb");
  EXPECT_THAT(refused(dynamic_item, fixed_item),
              HasSubstr("table 'item': dynamic (a row per 64-bit hash of one raw id) in the "
                        "warm-start checkpoint, fixed (a row per hash bucket of many raw ids) in "
                        "the config"));
  EXPECT_THAT(refused(fixed_item, dynamic_item),
              HasSubstr("table 'item': fixed (a row per hash bucket of many raw ids) in the "
                        "warm-start checkpoint, dynamic"));
  ModelDescription other_dim = dynamic_item;
  other_dim.mutable_features()->mutable_table(0)->set_dim(4);
  EXPECT_THAT(refused(dynamic_item, other_dim),
              HasSubstr("table 'item': dim 8 in the warm-start checkpoint, 4 in the config"));
}

}  // namespace
}  // namespace pstrain
