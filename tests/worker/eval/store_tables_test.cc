// From a FeatureSpec with tables to the model and the stores: ModelInputsOf's field_dims and
// fm_excluded, and StoreTablesOf's row initializer (the default table's rows exactly
// Model::InitRow's, a named table's from its initializer) and per-table optimizers.
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"
#include "worker/params/local_params.h"

namespace pstrain {
namespace {

FeatureSpec Spec(const std::string& text, const ModelConfig& model) {
  FeatureConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c));
  auto spec = FeatureSpec::Create(c, model);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

const char kTables[] = R"pb(
  preset: NO_PRESET
  field { name: "user" vocab_size: 10 }
  field { name: "item" table: "item" }
  field { name: "hist" table: "item" list {} }
  table { name: "item" rows: 20 initializer { type: ZEROS } optimizer { learning_rate: 0.5 } }
)pb";

TEST(StoreTables, ModelInputsCarryTheDims) {
  ModelConfig m;
  m.set_embedding_dim(8);
  m.set_type(WIDE_DEEP);
  FeatureConfig c;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      std::string(kTables) + "field { name: 'dev' table: 'small' } "
                             "table { name: 'small' rows: 4 dim: 2 fm_join: EXCLUDE }",
      &c));
  auto spec = FeatureSpec::Create(c, m);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelInputs in = ModelInputsOf(*spec);
  EXPECT_EQ(in.field_dims, (std::vector<int>{8, 8, 8, 2}));
  EXPECT_EQ(in.fm_excluded, (std::vector<char>{0, 0, 0, 1}));
  // No named tables: both empty (the model of before tables).
  FeatureConfig plain;
  auto p = FeatureSpec::Create(plain, m);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(ModelInputsOf(*p).field_dims.empty());
  EXPECT_TRUE(ModelInputsOf(*p).fm_excluded.empty());
}

TEST(StoreTables, OneRowInitAndTheTablesOptimizers) {
  ModelConfig mc;
  mc.set_embedding_dim(4);
  mc.set_type(WIDE_DEEP);
  mc.add_hidden(8);
  const FeatureSpec spec = Spec(kTables, mc);
  auto model = Model::Create(mc, ModelInputsOf(spec));
  ASSERT_TRUE(model.ok()) << model.status();
  OptimizerConfig sparse;
  sparse.set_type(SGD);
  sparse.set_learning_rate(0.1f);
  auto tables = StoreTablesOf(spec, **model, sparse, 42);
  ASSERT_TRUE(tables.ok()) << tables.status();
  const int d = (*model)->row_dim();
  std::vector<float> got(d), want(d);
  for (int64_t row : {0, 3, 9}) {  // the default table: Model::InitRow, bit for bit
    tables->row_init(row, got.data());
    (*model)->InitRow(row, 42, want.data());
    EXPECT_EQ(got, want) << row;
  }
  for (int64_t row : {10, 15, 29}) {  // `item`: ZEROS
    tables->row_init(row, got.data());
    for (float x : got) EXPECT_EQ(x, 0.f) << row;
  }
  ASSERT_EQ(tables->optimizers.size(), 1u);
  EXPECT_EQ(tables->optimizers[0].begin, 10);
  EXPECT_EQ(tables->optimizers[0].end, 30);
  EXPECT_DOUBLE_EQ(tables->optimizers[0].optimizer->LearningRate(1), 0.5f);

  // Without tables: the model's InitRow and no optimizers.
  const FeatureSpec plain = Spec("preset: NO_PRESET field { name: 'a' vocab_size: 5 }", mc);
  auto none = StoreTablesOf(plain, **model, sparse, 42);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->optimizers.empty());
  none->row_init(3, got.data());
  (*model)->InitRow(3, 42, want.data());
  EXPECT_EQ(got, want);
}

// Through the trainer's parameters (LocalParams, as `train` and allreduce build them): a row of a
// table with its own learning rate moves by it, a default-table row by the job's, and each
// starts from its own initializer.
TEST(StoreTables, LocalParamsApplyEachTablesOptimizer) {
  Config config;
  config.mutable_model()->set_type(WIDE_DEEP);
  config.mutable_model()->set_embedding_dim(4);
  config.mutable_model()->add_hidden(8);
  config.mutable_sparse_optimizer()->set_type(SGD);
  config.mutable_sparse_optimizer()->set_learning_rate(0.1f);
  config.mutable_dense_optimizer()->set_type(SGD);
  config.mutable_train()->set_seed(5);
  const FeatureSpec spec = Spec(kTables, config.model());
  auto model = Model::Create(config.model(), ModelInputsOf(spec));
  ASSERT_TRUE(model.ok()) << model.status();
  auto tables = StoreTablesOf(spec, **model, config.sparse_optimizer(), config.train().seed());
  ASSERT_TRUE(tables.ok()) << tables.status();
  auto params = LocalParams::Create(**model, spec.total_rows(), config, 1, *std::move(tables));
  ASSERT_TRUE(params.ok()) << params.status();
  const int d = (*model)->row_dim();
  const std::vector<int64_t> ids = {3, 12};  // the default table's row 3, item's row 12
  std::vector<float> before(2 * d), after(2 * d), grads(2 * d, 1.f);
  std::vector<float> dense((*model)->dense_size()), dense_grad((*model)->dense_size(), 0.f);
  ASSERT_TRUE((*params)->Pull(ids, before.data(), dense.data()).ok());
  for (int j = 1; j < d; ++j) EXPECT_EQ(before[d + j], 0.f);  // item's initializer: ZEROS
  std::vector<float> want(d);
  (*model)->InitRow(3, 5, want.data());
  EXPECT_EQ(std::vector<float>(before.begin(), before.begin() + d), want);
  ASSERT_TRUE((*params)->Push(ids, grads.data(), dense_grad.data(), 1).ok());
  ASSERT_TRUE((*params)->Pull(ids, after.data(), nullptr).ok());
  for (int j = 0; j < d; ++j) {
    EXPECT_FLOAT_EQ(after[j], before[j] - 0.1f) << j;
    EXPECT_FLOAT_EQ(after[d + j], before[d + j] - 0.5f) << j;
  }
}

// Compact widths: with named tables LocalParams keeps a store per table at its width 1 + dim
// (the `small` table of dim 2 beside dim 4: 3 floats, not the stride's 5), while Pull and Push
// stay stride-wide: a narrow row reads zeros after its width, and a gradient's tail is dropped.
TEST(StoreTables, LocalParamsKeepEachTableAtItsWidth) {
  Config config;
  config.mutable_model()->set_type(WIDE_DEEP);
  config.mutable_model()->set_embedding_dim(4);
  config.mutable_model()->add_hidden(8);
  config.mutable_sparse_optimizer()->set_type(ADAGRAD);
  config.mutable_sparse_optimizer()->set_learning_rate(0.1f);
  config.mutable_sparse_optimizer()->set_initial_accumulator(0.1f);
  config.mutable_dense_optimizer()->set_type(SGD);
  config.mutable_train()->set_seed(5);
  const FeatureSpec spec =
      Spec(std::string(kTables) + "field { name: 'dev' table: 'small' } "
                                  "table { name: 'small' rows: 4 dim: 2 fm_join: EXCLUDE }",
           config.model());
  auto model = Model::Create(config.model(), ModelInputsOf(spec));
  ASSERT_TRUE(model.ok()) << model.status();
  const int d = (*model)->row_dim();
  ASSERT_EQ(d, 5);
  auto tables = StoreTablesOf(spec, **model, config.sparse_optimizer(), config.train().seed());
  ASSERT_TRUE(tables.ok()) << tables.status();
  StoreTables wide_tables = *tables;
  wide_tables.widths.clear();
  auto params = LocalParams::Create(**model, spec.total_rows(), config, 1, *std::move(tables));
  ASSERT_TRUE(params.ok()) << params.status();
  auto wide = LocalParams::Create(**model, spec.total_rows(), config, 1, std::move(wide_tables));
  ASSERT_TRUE(wide.ok()) << wide.status();
  const std::vector<EmbeddingStore*>& stores = (*params)->embeddings();
  ASSERT_EQ(stores.size(), 3u);  // default, item, small
  EXPECT_EQ(stores[0]->dim(), 5);
  EXPECT_EQ(stores[1]->dim(), 5);
  EXPECT_EQ(stores[2]->dim(), 3);
  EXPECT_EQ(stores[2]->end(), spec.total_rows());

  // The last row is small's; the first the default table's. Both parameter sets agree at the
  // stride, before and after an update whose gradient tail is not 0.
  const int64_t small_row = spec.total_rows() - 1;
  const std::vector<int64_t> ids = {small_row, 3};
  std::vector<float> got(2 * d), want(2 * d), grads(2 * d, 1.f);
  std::vector<float> dense_grad((*model)->dense_size(), 0.f);
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE((*params)->Pull(ids, got.data(), nullptr).ok());
    ASSERT_TRUE((*wide)->Pull(ids, want.data(), nullptr).ok());
    for (int j = 3; j < d; ++j) EXPECT_EQ(got[j], 0.f) << j;
    for (int j = 0; j < 3; ++j) EXPECT_EQ(got[j], want[j]) << j;
    for (int j = d; j < 2 * d; ++j) EXPECT_EQ(got[j], want[j]) << j;
    if (round == 0) EXPECT_NE(got[1], 0.f);  // small's initializer drew it
    ASSERT_TRUE((*params)->Push(ids, grads.data(), dense_grad.data(), 1 + round).ok());
    ASSERT_TRUE((*wide)->Push(ids, grads.data(), dense_grad.data(), 1 + round).ok());
  }
  EXPECT_LT(stores[2]->stats().chunk_bytes, (*wide)->embeddings()[0]->stats().chunk_bytes);
  // An id outside every table is refused, nothing applied.
  const std::vector<int64_t> bad = {3, spec.total_rows()};
  EXPECT_FALSE((*params)->Push(bad, grads.data(), dense_grad.data(), 3).ok());
  EXPECT_EQ(stores[0]->Snapshot().rows(), 1);
}

}  // namespace
}  // namespace pstrain
