#include "cmd/ps_setup.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/config.h"
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

// A worker's share of the global batch is an update of its own in ASYNC and BOUNDED: the adaptive
// sparse optimizers' rate is scaled by sqrt(1 / N) there, and nowhere else.
TEST(PsSetup, SparseLrScaledToAWorkersShareOnlyWhereItIsAnUpdate) {
  Config c;
  c.mutable_train()->set_global_batch_size(512);
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(c, 4), 0.5);  // ASYNC, ADAGRAD
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(c, 2), std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(c, 1), 1.0);
  Config ftrl = c;
  ftrl.mutable_sparse_optimizer()->set_type(FTRL);
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(ftrl, 4), 0.5);
  for (OptimizerType type : {SGD, ADAM}) {  // not scaled: not measured to gain
    Config t = c;
    t.mutable_sparse_optimizer()->set_type(type);
    EXPECT_DOUBLE_EQ(SparseLrShareFactor(t, 4), 1.0) << OptimizerType_Name(type);
  }
  Config bounded = c;
  bounded.mutable_cluster()->set_consistency(BOUNDED);
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(bounded, 4), 0.5);
  Config sync = c;
  sync.mutable_cluster()->set_consistency(SYNC);  // the shard applies one update of 512
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(sync, 4), 1.0);
  Config per_tower = c;
  per_tower.mutable_train()->set_global_batch_size(0);  // every push a full update batch
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(per_tower, 4), 1.0);
  Config off = c;
  off.mutable_cluster()->set_scale_sparse_lr_by_share(false);
  EXPECT_DOUBLE_EQ(SparseLrShareFactor(off, 4), 1.0);
}

// The shard's optimizers carry the scaled rates: the job's, a fixed table's override and a
// dynamic table's; the worker count comes from num_workers when given (a `pstrain ps` of a
// job with more workers than shards).
TEST(PsSetup, ShardOptimizersTakeTheScaledRates) {
  auto parsed = ParseConfigText(R"pb(
    features {
      categorical_vocab_size: 1000
      field { name: "C1" table: "own" }
      field { name: "C2" table: "plain" }
      field { name: "C3" table: "fresh" }
      table { name: "own" dim: 8 rows: 100 optimizer { learning_rate: 0.2 } }
      table { name: "plain" dim: 8 rows: 100 initializer { stddev: 0.01 } }
      table { name: "fresh" dim: 8 dynamic { admission: ALWAYS } optimizer { learning_rate: 0.4 } }
    }
    model { embedding_dim: 8 hidden: [ 8 ] }
    sparse_optimizer { type: ADAGRAD learning_rate: 0.05 }
    train { global_batch_size: 512 }
  )pb", "test");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Config& config = *parsed;
  auto four = ShardOptionsForJob(config, 0, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_FLOAT_EQ(four->data.sparse_optimizer.learning_rate(), 0.025f);
  ASSERT_EQ(four->data.range_optimizers.size(), 1u);  // "own"; "plain" takes the job's
  EXPECT_NEAR(four->data.range_optimizers[0].optimizer->LearningRate(1), 0.1, 1e-7);
  ASSERT_EQ(four->data.dynamic_tables.size(), 1u);
  EXPECT_NEAR(four->data.dynamic_tables[0].optimizer->LearningRate(1), 0.2, 1e-7);
  // One shard, four workers.
  auto one_shard = ShardOptionsForJob(config, 0, 1, {}, 4);
  ASSERT_TRUE(one_shard.ok()) << one_shard.status();
  EXPECT_FLOAT_EQ(one_shard->data.sparse_optimizer.learning_rate(), 0.025f);
  // Off: the configured rates.
  Config off = config;
  off.mutable_cluster()->set_scale_sparse_lr_by_share(false);
  auto unscaled = ShardOptionsForJob(off, 0, 4);
  ASSERT_TRUE(unscaled.ok()) << unscaled.status();
  EXPECT_FLOAT_EQ(unscaled->data.sparse_optimizer.learning_rate(), 0.05f);
  EXPECT_NEAR(unscaled->data.range_optimizers[0].optimizer->LearningRate(1), 0.2, 1e-7);
  EXPECT_NEAR(unscaled->data.dynamic_tables[0].optimizer->LearningRate(1), 0.4, 1e-7);
}

}  // namespace
}  // namespace pstrain
