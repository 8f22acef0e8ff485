// Dynamic tables in the config and the FeatureSpec (TableConfig.dynamic, issue 28): the
// validation with field paths, the encoding to tagged negative ids (common/dynamic_rows.h), the
// accessor, Resolved()'s round trip, and the refusal of the modes that cannot carry them yet.
#include <string>

#include "common/config.h"
#include "common/dynamic_rows.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "worker/data/feature_spec.h"

namespace pstrain {
namespace {

FeatureConfig Parse(const std::string& text) {
  FeatureConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

ModelConfig Model(int k) {
  ModelConfig m;
  m.set_embedding_dim(k);
  m.set_embedding_init_stddev(0.02f);
  return m;
}

// A default-table field, a fixed table, and two dynamic tables: `user` (a single-valued field and
// a list sharing it) and `bucket` (a bucketed numeric field), between and after the fixed one.
const char kDynamic[] = R"pb(
  preset: NO_PRESET
  field { name: "ad" vocab_size: 7 }
  field { name: "user" table: "user" }
  field { name: "friends" table: "user" list { combiner: SUM max_length: 3 } }
  field { name: "item" table: "item" }
  field { name: "age" kind: NUMERIC table: "bucket" }
  table { name: "user" dynamic { admission: COUNT admit_count: 2 ttl_passes: 3 } }
  table { name: "item" rows: 50 }
  table { name: "bucket" dim: 4 fm_join: EXCLUDE dynamic { max_rows_per_shard: 10 } }
)pb";

TEST(DynamicTables, SpecListsThemAndKeepsTheFixedLayout) {
  auto spec = FeatureSpec::Create(Parse(kDynamic), Model(8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->num_tables(), 4);  // default, user, item, bucket
  ASSERT_EQ(spec->num_dynamic_tables(), 2);
  EXPECT_TRUE(spec->has_dynamic_tables());
  const FeatureSpec::Table& user = spec->dynamic_table(0);
  EXPECT_EQ(user.name, "user");
  EXPECT_EQ(user.dynamic_index, 0);
  EXPECT_EQ(user.dim, 8);
  EXPECT_EQ(user.rows, 0u);
  EXPECT_EQ(user.dynamic.admission(), DynamicTableConfig::COUNT);
  EXPECT_EQ(user.dynamic.admit_count(), 2u);
  EXPECT_EQ(user.dynamic.ttl_passes(), 3);
  EXPECT_EQ(spec->dynamic_table_index(0), 1);
  const FeatureSpec::Table& bucket = spec->dynamic_table(1);
  EXPECT_EQ(bucket.name, "bucket");
  EXPECT_EQ(bucket.dynamic_index, 1);
  EXPECT_EQ(bucket.dim, 4);
  EXPECT_EQ(spec->dynamic_table_index(1), 3);
  EXPECT_FALSE(spec->tables()[2].is_dynamic());
  // The fixed tables take the rows; the dynamic ones none.
  EXPECT_EQ(spec->tables()[0].rows, 7u);
  EXPECT_EQ(spec->tables()[2].offset, 7u);
  EXPECT_EQ(spec->total_rows(), 57u);
  EXPECT_EQ(spec->TableOfRow(6), 0);
  EXPECT_EQ(spec->TableOfRow(7), 2);
  EXPECT_EQ(spec->TableOfRow(56), 2);
  EXPECT_EQ(spec->TableOfRow(57), -1);
  EXPECT_EQ(spec->field(spec->FieldIndex("user")).dynamic, 0);
  EXPECT_EQ(spec->field(spec->FieldIndex("friends")).dynamic, 0);
  EXPECT_EQ(spec->field(spec->FieldIndex("age")).dynamic, 1);
  EXPECT_EQ(spec->field(spec->FieldIndex("item")).dynamic, -1);
  EXPECT_EQ(spec->field(spec->FieldIndex("ad")).dynamic, -1);
}

TEST(DynamicTables, EncodesTaggedHashes) {
  auto spec = FeatureSpec::Create(Parse(kDynamic), Model(8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const int user = spec->FieldIndex("user");
  const int age = spec->FieldIndex("age");
  const int item = spec->FieldIndex("item");
  const uint64_t seed = spec->dynamic_table(0).seed;
  int64_t row = 0;
  float scale = 0;
  for (uint64_t key : {1ull, 42ull, 1ull << 60}) {
    spec->EncodeOne(user, true, key, 0.5, &row, &scale);
    EXPECT_EQ(row, DynamicRow(0, HashKey(key, seed))) << key;
    EXPECT_TRUE(IsDynamicRow(row));
    EXPECT_EQ(DynamicTableOf(row), 0);
    EXPECT_FLOAT_EQ(scale, 0.5f);
    EXPECT_EQ(spec->TableOfRow(row), -1);
  }
  spec->EncodeOne(user, false, 0, 0, &row, &scale);
  EXPECT_EQ(row, DynamicMissingRow(0));
  EXPECT_FLOAT_EQ(scale, 1.0f);
  spec->EncodeOne(age, true, 0, 1000.0, &row, &scale);
  EXPECT_EQ(row, DynamicRow(1, HashKey(uint64_t(FeatureSpec::LogSquaredBucket(1000.0)),
                                       spec->dynamic_table(1).seed)));
  EXPECT_FLOAT_EQ(scale, 1.0f);
  spec->EncodeOne(age, false, 0, 0, &row, &scale);
  EXPECT_EQ(row, DynamicMissingRow(1));
  // A fixed table's field is unchanged: a non-negative row in its range.
  spec->EncodeOne(item, true, 42, 1.0, &row, &scale);
  EXPECT_GE(row, 8);
  EXPECT_LT(row, 57);

  // The list field shares `user`'s keys; an empty list is the missing row.
  RawRows raw;
  raw.Clear(spec->num_fields());
  raw.list_begin.push_back(0);
  raw.list_size.push_back(2);
  raw.list_key = {42, 7};
  raw.list_weight = {1.0, 2.0};
  raw.list_begin.push_back(2);
  raw.list_size.push_back(0);
  std::vector<int64_t> ids;
  std::vector<float> values;
  const int friends = spec->FieldIndex("friends");
  spec->EncodeList(friends, raw, 0, &ids, &values);
  ASSERT_EQ(ids.size(), 2u);
  spec->EncodeOne(user, true, 42, 1.0, &row, &scale);
  EXPECT_EQ(ids[0], row);
  EXPECT_EQ(ids[1], DynamicRow(0, HashKey(7, seed)));
  EXPECT_FLOAT_EQ(values[1], 2.0f);  // SUM
  ids.clear();
  values.clear();
  spec->EncodeList(friends, raw, 1, &ids, &values);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0], DynamicMissingRow(0));
}

// Checkpoints record Resolved(): the dynamic table and its options survive, rows stay unset.
TEST(DynamicTables, ResolvedRoundTrips) {
  auto spec = FeatureSpec::Create(Parse(kDynamic), Model(8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const FeatureConfig resolved = spec->Resolved();
  ASSERT_EQ(resolved.table_size(), 3);
  EXPECT_TRUE(resolved.table(0).has_dynamic());
  EXPECT_FALSE(resolved.table(0).has_rows());
  EXPECT_EQ(resolved.table(0).dynamic().admit_count(), 2u);
  EXPECT_FALSE(resolved.table(1).has_dynamic());
  EXPECT_EQ(resolved.table(1).rows(), 50u);
  EXPECT_EQ(resolved.table(2).dynamic().max_rows_per_shard(), 10);
  Config config;
  *config.mutable_features() = resolved;
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
  auto again = FeatureSpec::Create(resolved, Model(8));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(again->Resolved(), resolved));
  int64_t a = 0, b = 0;
  float s = 0;
  again->EncodeOne(1, true, 99, 1.0, &a, &s);
  spec->EncodeOne(1, true, 99, 1.0, &b, &s);
  EXPECT_EQ(a, b);
}

// Every refusal names the field path and what was expected.
TEST(DynamicTables, ValidationNamesTheField) {
  struct Case {
    const char* table;
    const char* expect;
  };
  const Case cases[] = {
      {"name: 'user' rows: 100 dynamic {}", "features.table[0] ('user').rows: a dynamic table"},
      {"name: 'user' partitions: 2 dynamic {}", "features.table[0] ('user').partitions"},
      {"name: 'user' dynamic { admit_count: 0 }",
       "features.table[0] ('user').dynamic.admit_count: must be >= 1"},
      {"name: 'user' dynamic { sketch_width: 0 }", "('user').dynamic.sketch_width"},
      {"name: 'user' dynamic { sketch_depth: 17 }", "('user').dynamic.sketch_depth"},
      {"name: 'user' dynamic { admit_probability: 0 }", "('user').dynamic.admit_probability"},
      {"name: 'user' dynamic { admit_probability: 1.5 }", "('user').dynamic.admit_probability"},
      {"name: 'user' dynamic { admit_probability: nan }", "('user').dynamic.admit_probability"},
      {"name: 'user' dynamic { ttl_steps: -1 }", "('user').dynamic.ttl_steps"},
      {"name: 'user' dynamic { ttl_passes: -1 }", "('user').dynamic.ttl_passes"},
      {"name: 'user' dynamic { max_rows_per_shard: -1 }", "('user').dynamic.max_rows_per_shard"},
      {"name: 'user' dynamic { max_bytes_per_shard: -5 }",
       "('user').dynamic.max_bytes_per_shard"},
      {"name: 'user'", "features.table[0] ('user').rows: must be set"},
  };
  for (const Case& c : cases) {
    FeatureConfig f = Parse(absl::StrCat("preset: NO_PRESET field { name: 'u' table: 'user' } "
                                         "table { ", c.table, " }"));
    Config config;
    *config.mutable_features() = f;
    const absl::Status v = ValidateConfig(config);
    EXPECT_FALSE(v.ok()) << c.table;
    EXPECT_NE(std::string(v.message()).find(c.expect), std::string::npos) << v;
    const auto spec = FeatureSpec::Create(f, Model(8));
    EXPECT_FALSE(spec.ok()) << c.table;
    EXPECT_NE(std::string(spec.status().message()).find(c.expect), std::string::npos)
        << spec.status();
  }
}

TEST(DynamicTables, AtMostMaxDynamicTables) {
  std::string text = "preset: NO_PRESET ";
  for (int t = 0; t <= kMaxDynamicTables; ++t) {
    absl::StrAppend(&text, "field { name: 'f", t, "' table: 't", t, "' } table { name: 't", t,
                    "' dynamic {} } ");
  }
  const FeatureConfig f = Parse(text);
  Config config;
  *config.mutable_features() = f;
  const absl::Status v = ValidateConfig(config);
  EXPECT_NE(std::string(v.message()).find("features.table[256].dynamic: more than 256"),
            std::string::npos)
      << v;
  const auto spec = FeatureSpec::Create(f, Model(8));
  EXPECT_NE(std::string(spec.status().message()).find("features.table[256]"), std::string::npos)
      << spec.status();
  // 256 of them are fine.
  FeatureConfig ok = f;
  ok.mutable_field()->RemoveLast();
  ok.mutable_table()->RemoveLast();
  const auto fine = FeatureSpec::Create(ok, Model(8));
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->num_dynamic_tables(), kMaxDynamicTables);
}

}  // namespace
}  // namespace pstrain
