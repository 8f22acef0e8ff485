#include "cmd/ps_setup.h"

#include <gtest/gtest.h>

#include <vector>

#include "worker/data/feature_spec.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

// PS shards start from exactly the parameters single-process training starts from.
TEST(PsSetup, ShapeAndInitialValuesAreTheModels) {
  Config config;
  config.mutable_features()->set_categorical_vocab_size(1000);
  config.mutable_train()->set_seed(42);
  auto spec = FeatureSpec::Create(config.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Create(config.model(), spec->num_fields());
  ASSERT_TRUE(model.ok()) << model.status();
  auto o = ShardOptionsForJob(config, 1, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->data.shard, 1);
  EXPECT_EQ(o->data.num_shards, 3);
  EXPECT_EQ(o->data.rows, static_cast<int64_t>(spec->total_rows()));
  EXPECT_EQ(o->data.row_dim, (*model)->row_dim());
  EXPECT_EQ(o->data.dense_size, (*model)->dense_size());
  const int d = o->data.row_dim;
  for (int64_t row : {int64_t{0}, int64_t{17}, static_cast<int64_t>(spec->total_rows()) - 1}) {
    std::vector<float> want(d), got(d);
    (*model)->InitRow(row, 42, want.data());
    o->data.row_init(row, got.data());
    EXPECT_EQ(want, got) << "row " << row;
  }
  std::vector<float> want(o->data.dense_size), got(o->data.dense_size);
  (*model)->InitDense(42, want.data());
  o->data.dense_init(got.data());
  EXPECT_EQ(want, got);

  // A wider row than the model's: the model's values, then zeros.
  auto wide = ShardOptionsForJob(config, 0, 1, {10, d + 2, 5});
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->data.rows, 10);
  std::vector<float> row(d + 2, -1.f), model_row(d);
  wide->data.row_init(3, row.data());
  (*model)->InitRow(3, 42, model_row.data());
  EXPECT_EQ(std::vector<float>(row.begin(), row.begin() + d), model_row);
  EXPECT_EQ(row[d], 0.f);
  EXPECT_EQ(row[d + 1], 0.f);
}

}  // namespace
}  // namespace pstrain
