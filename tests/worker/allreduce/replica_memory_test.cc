#include "worker/allreduce/replica_memory.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// Two categorical fields of 1001 rows (1000 hashed + missing), Adagrad on the rows (1 slot a
// float), SGD on the dense vector.
Config TwoFields() {
  Config c;
  FeatureConfig* f = c.mutable_features();
  f->set_preset(NO_PRESET);
  for (const char* name : {"A", "B"}) {
    FieldSpec* field = f->add_field();
    field->set_name(name);
    field->set_kind(CATEGORICAL);
    field->set_vocab_size(1001);
  }
  c.mutable_sparse_optimizer()->set_type(ADAGRAD);
  c.mutable_dense_optimizer()->set_type(SGD);
  return c;
}

class ReplicaMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pstrain_replica_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string dir_;
};

TEST_F(ReplicaMemoryTest, WithoutTheDataEveryRowOfTheTable) {
  const Config c = TwoFields();
  auto spec = FeatureSpec::Create(c.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->total_rows(), 2002u);
  auto e = EstimateReplica(c, *spec, /*row_dim=*/5, /*dense_size=*/100, std::nullopt);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_DOUBLE_EQ(e->rows, 2002);
  // Rows x (5 weights + 5 Adagrad slots + the generation stamp) x 4, the index (4 bytes a
  // table row), the dense floats.
  EXPECT_EQ(e->bytes, 2002 * 11 * 4 + 2002 * 4 + 100 * 4);
  EXPECT_THAT(e->basis, HasSubstr("every row of the table"));
}

TEST_F(ReplicaMemoryTest, TheDataDistinctValuesFillTheHashedRows) {
  const Config c = TwoFields();
  auto spec = FeatureSpec::Create(c.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  DataCardinality data;
  data.rows = 1000000;
  data.distinct = {{"A", 1000}, {"C", 5}};  // B unknown: capped by nothing but its table
  data.source = "teacher.json";
  auto e = EstimateReplica(c, *spec, 5, 100, data);
  ASSERT_TRUE(e.ok()) << e.status();
  // A: 1000 values into 1000 buckets fill 1 - 1/e of them, plus the missing row; B: all 1001.
  const double a = 1000 * (1 - std::exp(-1.0)) + 1;
  EXPECT_NEAR(e->rows, a + 1001, 1e-6);
  EXPECT_THAT(e->basis, HasSubstr("2 of 2 fields"));  // B's count is capped by the data's rows

  // A handful of examples touch at most that many rows per field.
  data.rows = 10;
  e = EstimateReplica(c, *spec, 5, 100, data);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_LT(e->rows, 2 * 11 + 1e-6);
}

// A dynamic table (features.table.dynamic): its rows are the data's distinct values or its cap,
// whichever is smaller, at a store slot and a map entry each, plus its admission sketch; with
// neither, unknown (counted 0) and said so.
TEST_F(ReplicaMemoryTest, ADynamicTableCountsItsCapOrTheDataAndItsSketch) {
  Config c = TwoFields();
  c.mutable_features()->mutable_field()->RemoveLast();  // A (1001 rows) only
  FieldSpec* u = c.mutable_features()->add_field();
  u->set_name("U");
  u->set_kind(CATEGORICAL);
  u->set_table("user");
  TableConfig* t = c.mutable_features()->add_table();
  t->set_name("user");
  t->set_dim(4);
  t->mutable_dynamic()->set_admission(DynamicTableConfig::COUNT);
  t->mutable_dynamic()->set_admit_count(2);
  t->mutable_dynamic()->set_sketch_width(2048);
  t->mutable_dynamic()->set_sketch_depth(2);
  auto spec = FeatureSpec::Create(c.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->total_rows(), 1001u);
  // The fixed part as above; a dynamic row: (1 + 4 weights, 5 Adagrad slots, 5 words) x 4 and a
  // map entry of 17 bytes at 7/8 (20); the sketch 2048 x 2 x 4.
  const int64_t fixed = 1001 * 11 * 4 + 1001 * 4 + 100 * 4;
  const int64_t row = 15 * 4 + 20, sketch = 2048 * 2 * 4;
  auto e = EstimateReplica(c, *spec, 5, 100, std::nullopt);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->bytes, fixed + sketch);
  EXPECT_THAT(e->basis, HasSubstr("dynamic table 'user': rows unknown"));

  t->mutable_dynamic()->set_max_rows_per_shard(500);
  spec = FeatureSpec::Create(c.features());
  ASSERT_TRUE(spec.ok()) << spec.status();
  e = EstimateReplica(c, *spec, 5, 100, std::nullopt);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->bytes, fixed + sketch + 500 * row);
  EXPECT_DOUBLE_EQ(e->rows, 1001 + 500);
  EXPECT_THAT(e->basis, HasSubstr("dynamic table 'user': 500 rows"));

  DataCardinality data;
  data.distinct = {{"U", 300}};
  data.source = "teacher.json";
  e = EstimateReplica(c, *spec, 5, 100, data);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->rows, 1001 + 300, 1e-6);
}

TEST_F(ReplicaMemoryTest, ReadsDatagensTeacherJsonBesideTheData) {
  std::ofstream(dir_ + "/teacher.json")
      << R"({"generator":"pstrain datagen v1","rows":20000,"cardinalities":{"C1":1460,"C2":583}})";
  auto d = ReadDataCardinality({dir_ + "/part-00000.tsv", dir_ + "/part-00001.tsv"});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->has_value());
  EXPECT_EQ((*d)->rows, 20000);
  EXPECT_EQ((*d)->distinct.at("C1"), 1460u);
  EXPECT_EQ((*d)->distinct.at("C2"), 583u);
  EXPECT_EQ((*d)->source, dir_ + "/teacher.json");
}

TEST_F(ReplicaMemoryTest, NoTeacherJsonIsNoCardinality) {
  auto d = ReadDataCardinality({dir_ + "/part-00000.tsv"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->has_value());
}

TEST_F(ReplicaMemoryTest, AMalformedTeacherJsonIsRefusedWithItsPath) {
  for (const char* text : {"not json", R"({"rows":"many","cardinalities":{}})",
                           R"({"rows":5,"cardinalities":{"C1":-3}})", R"({"rows":5})"}) {
    std::ofstream(dir_ + "/teacher.json") << text;
    auto d = ReadDataCardinality({dir_ + "/part-00000.tsv"});
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(dir_ + "/teacher.json")) << text;
  }
}

}  // namespace
}  // namespace pstrain
