#include "ps/store/store_memory.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"

namespace pstrain {
namespace {

std::shared_ptr<const Optimizer> MakeOptimizer(OptimizerType type) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(0.1f);
  auto o = Optimizer::Create(c);
  EXPECT_TRUE(o.ok()) << o.status();
  return std::shared_ptr<const Optimizer>(std::move(o).value());
}

// Weights and slots are counted for the rows trained only; the rest of the held memory (index
// pages, the arena chunk's untouched rows, the locks) is in total_bytes only.
TEST(StoreMemory, EmbeddingRowsCountTheirWeightsAndSlots) {
  EmbeddingStore::Options o;
  o.begin = 1000;
  o.end = 1000000;
  o.dim = 5;
  o.optimizer = MakeOptimizer(ADAM);  // 2 x dim + 1 floats of state a row
  auto store = EmbeddingStore::Create(std::move(o));
  ASSERT_TRUE(store.ok()) << store.status();
  const StoreMemory empty = MemoryOf(**store);
  EXPECT_EQ(empty.parameter_bytes, 0);
  EXPECT_EQ(empty.optimizer_bytes, 0);

  const std::vector<int64_t> ids = {1000, 5000, 999999};
  const std::vector<float> grads(ids.size() * 5, 0.5f);
  ASSERT_TRUE((*store)->Apply(ids, grads.data(), 1).ok());
  const StoreMemory m = MemoryOf(**store);
  EXPECT_EQ(m.parameter_bytes, 3 * 5 * 4);
  EXPECT_EQ(m.optimizer_bytes, 3 * 11 * 4);
  EXPECT_GE(m.total_bytes, m.parameter_bytes + m.optimizer_bytes);
  EXPECT_EQ(m.total_bytes, (*store)->stats().bytes);
  // A row trained again takes nothing more.
  ASSERT_TRUE((*store)->Apply(ids, grads.data(), 2).ok());
  EXPECT_EQ(MemoryOf(**store).parameter_bytes, 3 * 5 * 4);
}

TEST(StoreMemory, DenseSliceIsItsFloatsAndItsOptimizerState) {
  for (auto [type, state] : std::vector<std::pair<OptimizerType, int64_t>>{
           {SGD, 0}, {ADAGRAD, 10}, {ADAM, 21}, {FTRL, 20}}) {
    DenseStore::Options o;
    o.begin = 3;
    o.size = 10;
    o.optimizer = MakeOptimizer(type);
    auto store = DenseStore::Create(std::move(o));
    ASSERT_TRUE(store.ok()) << store.status();
    const StoreMemory m = MemoryOf(**store);
    EXPECT_EQ(m.parameter_bytes, 40) << OptimizerType_Name(type);
    EXPECT_EQ(m.optimizer_bytes, state * 4) << OptimizerType_Name(type);
    EXPECT_EQ(m.total_bytes, 40 + state * 4) << OptimizerType_Name(type);
  }
}

TEST(StoreMemory, PartsAddUp) {
  StoreMemory a{1, 2, 4};
  a += StoreMemory{10, 20, 40};
  EXPECT_EQ(a.parameter_bytes, 11);
  EXPECT_EQ(a.optimizer_bytes, 22);
  EXPECT_EQ(a.total_bytes, 44);
}

}  // namespace
}  // namespace pstrain
