// DynamicStoreOptionsOf (worker/eval/model_inputs.h): a dynamic table's config becomes the
// options of its DynamicEmbeddingStore, with the contract's row initializer (the table's
// initializer over 1 + dim floats, called with the negative row id), and the fixed tables' store
// inputs (TableSplitsOf, StoreTablesOf) leave dynamic tables out.
#include <string>
#include <vector>

#include "common/dynamic_rows.h"
#include "gtest/gtest.h"
#include "google/protobuf/text_format.h"
#include "ps/store/table_rows.h"
#include "worker/eval/model_inputs.h"

namespace pstrain {
namespace {

const char kConfig[] = R"pb(
  preset: NO_PRESET
  field { name: "ad" vocab_size: 7 }
  field { name: "user" table: "user" }
  field { name: "item" table: "item" }
  table { name: "user" dim: 4 fm_join: EXCLUDE initializer { type: UNIFORM limit: 0.5 }
          optimizer { learning_rate: 0.25 }
          dynamic { admission: PROBABILITY admit_probability: 0.5 ttl_steps: 9 ttl_passes: 2
                    max_rows_per_shard: 100 max_bytes_per_shard: 4096 capacity_policy: LFU } }
  table { name: "item" rows: 50 }
)pb";

FeatureSpec Spec() {
  FeatureConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kConfig, &c));
  ModelConfig m;
  m.set_embedding_dim(8);
  m.set_embedding_init_stddev(0.02f);
  auto spec = FeatureSpec::Create(c, m);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(DynamicStoreOptions, FromTheTableConfig) {
  const FeatureSpec spec = Spec();
  OptimizerConfig sparse;
  sparse.set_type(ADAGRAD);
  sparse.set_learning_rate(0.01f);
  auto o = DynamicStoreOptionsOf(spec.dynamic_table(0), sparse, /*seed=*/7);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->dim, 5);  // 1 + dim
  EXPECT_EQ(o->admission, DynamicEmbeddingStore::Admission::kProbability);
  EXPECT_DOUBLE_EQ(o->admit_probability, 0.5);
  EXPECT_EQ(o->ttl_steps, 9);
  EXPECT_EQ(o->ttl_passes, 2);
  EXPECT_EQ(o->max_rows, 100);
  EXPECT_EQ(o->max_bytes, 4096);
  EXPECT_EQ(o->capacity_policy, DynamicEmbeddingStore::CapacityPolicy::kLfu);
  ASSERT_NE(o->optimizer, nullptr);
  EXPECT_EQ(o->optimizer->StateFloats(5), 5);  // Adagrad: one accumulator a float

  // The row initializer: InitTableRow of the table's initializer with the negative id.
  const uint64_t key = 123456789;
  std::vector<float> got(5, -1.0f), want(5, -2.0f);
  o->row_init(static_cast<int64_t>(key), got.data());
  InitTableRow(spec.dynamic_table(0).initializer, 4, 5, DynamicRow(0, key), 7, want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 0.0f);  // w starts at 0
  bool any = false;
  for (int j = 1; j < 5; ++j) {
    EXPECT_LE(std::abs(got[j]), 0.5f);
    any = any || got[j] != 0.0f;
  }
  EXPECT_TRUE(any);
  // Another key, other values; the same key and seed, the same values.
  std::vector<float> other(5);
  o->row_init(static_cast<int64_t>(key + 1), other.data());
  EXPECT_NE(other, got);

  // The options make a working store.
  auto store = DynamicEmbeddingStore::Create(*o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->dim(), 5);

  // A fixed table is not dynamic.
  EXPECT_FALSE(DynamicStoreOptionsOf(spec.tables()[2], sparse, 7).ok());
}

TEST(DynamicStoreOptions, FixedTableInputsLeaveDynamicTablesOut) {
  const FeatureSpec spec = Spec();
  ClusterConfig cluster;
  const auto splits = TableSplitsOf(spec, cluster, 2);
  ASSERT_EQ(splits.size(), 2u);  // default and item; not user
  EXPECT_EQ(splits[0].rows, 7);
  EXPECT_EQ(splits[1].rows, 50);
}

}  // namespace
}  // namespace pstrain
