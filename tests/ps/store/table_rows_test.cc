// The stores' view of tables (ps/store/table_rows.h): the named tables' initializers, the one
// RowInit over a row space, per-table optimizer overrides in an EmbeddingStore.
#include "ps/store/table_rows.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "ps/store/embedding_store.h"
#include "ps/store/optimizer.h"

namespace pstrain {
namespace {

TableInitializer Init(TableInitializer::Type type, float stddev, float limit = 0) {
  TableInitializer i;
  i.set_type(type);
  i.set_stddev(stddev);
  if (limit > 0) i.set_limit(limit);
  return i;
}

// Each type draws what it says, w = 0, the stride's tail is 0, and a row is a pure function of
// (seed, row).
TEST(TableRows, InitializersDrawTheirDistribution) {
  const int dim = 4, stride = 9;
  std::vector<float> a(stride, -1.f), b(stride, -1.f);
  double sum2 = 0;
  int n = 0;
  for (int64_t row = 0; row < 500; ++row) {
    InitTableRow(Init(TableInitializer::NORMAL, 0.1f), dim, stride, row, 7, a.data());
    InitTableRow(Init(TableInitializer::NORMAL, 0.1f), dim, stride, row, 7, b.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(a[0], 0.f);
    for (int j = 1 + dim; j < stride; ++j) EXPECT_EQ(a[j], 0.f);
    for (int j = 1; j <= dim; ++j) sum2 += a[j] * a[j], ++n;
  }
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.1, 0.01);
  InitTableRow(Init(TableInitializer::NORMAL, 0.1f), dim, stride, 3, 8, b.data());
  InitTableRow(Init(TableInitializer::NORMAL, 0.1f), dim, stride, 3, 7, a.data());
  EXPECT_NE(a, b);  // another seed, other values

  for (int64_t row = 0; row < 300; ++row) {
    InitTableRow(Init(TableInitializer::TRUNCATED_NORMAL, 0.1f), dim, stride, row, 7, a.data());
    for (int j = 1; j <= dim; ++j) EXPECT_LE(std::fabs(a[j]), 0.2f + 1e-6f);
    InitTableRow(Init(TableInitializer::UNIFORM, 0.1f, 0.05f), dim, stride, row, 7, a.data());
    for (int j = 1; j <= dim; ++j) EXPECT_LE(std::fabs(a[j]), 0.05f);
    InitTableRow(Init(TableInitializer::ZEROS, 0.1f), dim, stride, row, 7, a.data());
    for (int j = 0; j < stride; ++j) EXPECT_EQ(a[j], 0.f);
  }
}

// The default table's rows come from the default initializer, a named table's from its own.
TEST(TableRows, OneRowInitOverTheRowSpace) {
  RowInit def = [](int64_t row, float* out) {
    for (int j = 0; j < 5; ++j) out[j] = static_cast<float>(row) + 100.f;
  };
  RowInit init = TablesRowInit({{10, 20, 2, Init(TableInitializer::UNIFORM, 0, 1.f)},
                                {20, 25, 4, Init(TableInitializer::ZEROS, 0)}},
                               def, 5, 3);
  std::vector<float> out(5);
  init(9, out.data());
  EXPECT_EQ(out[0], 109.f);
  init(10, out.data());
  EXPECT_EQ(out[0], 0.f);
  EXPECT_NE(out[1], 0.f);
  EXPECT_EQ(out[3], 0.f);
  EXPECT_EQ(out[4], 0.f);
  init(24, out.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
  init(25, out.data());
  EXPECT_EQ(out[0], 125.f);
  // No named tables: the default initializer itself.
  RowInit same = TablesRowInit({}, def, 5, 3);
  same(3, out.data());
  EXPECT_EQ(out[4], 103.f);
}

TEST(TableRows, OptimizerOverridesKeepTypeAndSchedule) {
  OptimizerConfig base;
  base.set_type(ADAGRAD);
  base.set_learning_rate(0.05f);
  base.mutable_schedule()->set_warmup_steps(10);
  TableOptimizer o;
  o.set_learning_rate(0.5f);
  o.set_initial_accumulator(0.1f);
  const OptimizerConfig c = TableOptimizerConfig(base, o);
  EXPECT_EQ(c.type(), ADAGRAD);
  EXPECT_FLOAT_EQ(c.learning_rate(), 0.5f);
  EXPECT_FLOAT_EQ(c.initial_accumulator(), 0.1f);
  EXPECT_EQ(c.schedule().warmup_steps(), 10);
  EXPECT_FLOAT_EQ(c.beta1(), base.beta1());
}

// A row of a table with its own learning rate moves by it; the other rows by the store's.
TEST(TableRows, RangeOptimizerTakesEffect) {
  OptimizerConfig sgd;
  sgd.set_type(SGD);
  sgd.set_learning_rate(0.1f);
  OptimizerConfig fast = sgd;
  fast.set_learning_rate(0.5f);
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = 100;
  o.dim = 3;
  o.optimizer = std::shared_ptr<const Optimizer>(std::move(*Optimizer::Create(sgd)));
  o.range_optimizers.push_back(
      {50, 80, std::shared_ptr<const Optimizer>(std::move(*Optimizer::Create(fast)))});
  auto store = EmbeddingStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<int64_t> ids = {10, 60, 85};
  const std::vector<float> grads(ids.size() * 3, 1.f);
  ASSERT_TRUE((*store)->Apply(ids, grads.data(), 1).ok());
  std::vector<float> rows(ids.size() * 3);
  ASSERT_TRUE((*store)->Gather(ids, rows.data()).ok());
  EXPECT_FLOAT_EQ(rows[0], -0.1f);
  EXPECT_FLOAT_EQ(rows[3], -0.5f);
  EXPECT_FLOAT_EQ(rows[6], -0.1f);

  // An override of another type would need other slots: refused.
  OptimizerConfig adam = sgd;
  adam.set_type(ADAM);
  o.range_optimizers[0].optimizer =
      std::shared_ptr<const Optimizer>(std::move(*Optimizer::Create(adam)));
  EXPECT_FALSE(EmbeddingStore::Create(o).ok());
}

// Adagrad's initial accumulator per table: InitState is the table's.
TEST(TableRows, RangeOptimizerInitialState) {
  OptimizerConfig a;
  a.set_type(ADAGRAD);
  a.set_learning_rate(1.f);
  a.set_initial_accumulator(1.f);
  OptimizerConfig b = a;
  b.set_initial_accumulator(3.f);
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = 10;
  o.dim = 1;
  o.optimizer = std::shared_ptr<const Optimizer>(std::move(*Optimizer::Create(a)));
  o.range_optimizers.push_back(
      {5, 10, std::shared_ptr<const Optimizer>(std::move(*Optimizer::Create(b)))});
  auto store = EmbeddingStore::Create(o);
  ASSERT_TRUE(store.ok());
  const std::vector<int64_t> ids = {1, 7};
  const std::vector<float> g = {1.f, 1.f};
  ASSERT_TRUE((*store)->Apply(ids, g.data(), 1).ok());
  std::vector<float> rows(2);
  ASSERT_TRUE((*store)->Gather(ids, rows.data()).ok());
  // Adagrad: acc = init + g^2, w -= lr g / sqrt(acc).
  EXPECT_NEAR(rows[0], -1.0 / std::sqrt(2.0), 1e-5);
  EXPECT_NEAR(rows[1], -1.0 / std::sqrt(4.0), 1e-5);
}

}  // namespace
}  // namespace pstrain
