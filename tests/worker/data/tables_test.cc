// FeatureSpec's tables (FeatureConfig.table): the row space, shared rows across fields naming one
// table, the dims and the refusals, Resolved()'s round trip.
#include <string>

#include "common/config.h"
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

// Two default-table fields, a history list and a candidate sharing `item` (dim 8), and a
// bucketed numeric field in `small` (dim 4, EXCLUDE).
const char kTables[] = R"pb(
  preset: NO_PRESET
  field { name: "user" vocab_size: 10 }
  field { name: "hist" table: "item" list { combiner: MEAN max_length: 4 } }
  field { name: "ad" vocab_size: 7 }
  field { name: "cand" table: "item" }
  field { name: "age" kind: NUMERIC table: "small" }
  table { name: "item" dim: 8 rows: 100 }
  table { name: "small" dim: 4 rows: 5 fm_join: EXCLUDE initializer { type: UNIFORM limit: 0.5 }
          optimizer { learning_rate: 0.5 } partitions: 3 }
)pb";

ModelConfig Model(int k) {
  ModelConfig m;
  m.set_embedding_dim(k);
  m.set_embedding_init_stddev(0.02f);
  return m;
}

TEST(Tables, ResolveOffsetsDimsAndSharedRows) {
  auto spec = FeatureSpec::Create(Parse(kTables), Model(8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->num_tables(), 3);
  const auto& d = spec->tables()[0];
  EXPECT_TRUE(d.is_default);
  EXPECT_EQ(d.offset, 0u);
  EXPECT_EQ(d.rows, 17u);  // user 10 + ad 7: the layout of before tables
  EXPECT_EQ(d.dim, 8);
  const auto& item = spec->tables()[1];
  EXPECT_EQ(item.name, "item");
  EXPECT_EQ(item.offset, 17u);
  EXPECT_EQ(item.rows, 100u);
  EXPECT_EQ(item.dim, 8);
  EXPECT_FLOAT_EQ(item.initializer.stddev(), 0.02f);  // the model's
  const auto& small = spec->tables()[2];
  EXPECT_EQ(small.offset, 117u);
  EXPECT_EQ(small.dim, 4);
  EXPECT_EQ(small.partitions, 3);
  EXPECT_FLOAT_EQ(small.optimizer.learning_rate(), 0.5f);
  EXPECT_EQ(spec->total_rows(), 122u);
  EXPECT_EQ(spec->max_dim(), 8);
  EXPECT_TRUE(spec->has_named_tables());

  EXPECT_EQ(spec->field(0).offset, 0u);
  EXPECT_EQ(spec->field(2).offset, 10u);
  const int hist = spec->FieldIndex("hist");
  const int cand = spec->FieldIndex("cand");
  const int age = spec->FieldIndex("age");
  EXPECT_EQ(spec->field(hist).table, 1);
  EXPECT_EQ(spec->field(cand).table, 1);
  EXPECT_EQ(spec->field(age).table, 2);
  EXPECT_EQ(spec->field(age).dim, 4);
  EXPECT_TRUE(spec->field(age).fm_excluded);
  EXPECT_FALSE(spec->field(cand).fm_excluded);
  // One key, one row of `item` from either field; the missing row is the table's row 0.
  int64_t r1 = -1, r2 = -2, m = -3;
  float s = 0;
  spec->EncodeOne(cand, true, 12345, 1.0, &r1, &s);
  RawRows raw;
  (void)raw;
  for (uint64_t key : {1ull, 99ull, 12345ull}) {
    spec->EncodeOne(cand, true, key, 1.0, &r1, &s);
    spec->EncodeOne(hist, true, key, 1.0, &r2, &s);
    EXPECT_EQ(r1, r2) << key;
    EXPECT_GE(r1, 18);
    EXPECT_LT(r1, 117);
    EXPECT_EQ(spec->TableOfRow(r1), 1);
  }
  spec->EncodeOne(cand, false, 0, 0.0, &m, &s);
  EXPECT_EQ(m, 17);
  spec->EncodeOne(age, true, 0, 1000.0, &r1, &s);
  EXPECT_GE(r1, 118);
  EXPECT_LT(r1, 122);
  EXPECT_EQ(spec->TableOfRow(0), 0);
  EXPECT_EQ(spec->TableOfRow(16), 0);
  EXPECT_EQ(spec->TableOfRow(17), 1);
  EXPECT_EQ(spec->TableOfRow(121), 2);
  EXPECT_EQ(spec->TableOfRow(122), -1);
  EXPECT_EQ(spec->TableOfRow(-1), -1);
  EXPECT_EQ(spec->TableIndex("small"), 2);
  EXPECT_EQ(spec->TableIndex(""), 0);
}

// A field's row for a key depends on the table's name and the hash seed, not on the table's
// position: warm start matches tables by name.
TEST(Tables, SeedFollowsTheNameNotThePosition) {
  FeatureConfig a = Parse(kTables);
  FeatureConfig b = a;
  b.mutable_table()->SwapElements(0, 1);
  auto sa = FeatureSpec::Create(a, Model(8));
  auto sb = FeatureSpec::Create(b, Model(8));
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->tables()[1].seed, sb->tables()[2].seed);
  EXPECT_NE(sa->tables()[1].seed, sa->tables()[2].seed);
}

TEST(Tables, NoTablesIsTheOneTableLayout) {
  FeatureConfig c;  // the Criteo preset
  auto spec = FeatureSpec::Create(c, Model(16));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_named_tables());
  ASSERT_EQ(spec->num_tables(), 1);
  EXPECT_TRUE(spec->tables()[0].is_default);
  EXPECT_EQ(spec->tables()[0].rows, spec->total_rows());
  EXPECT_EQ(spec->max_dim(), 16);
  FeatureConfig resolved = spec->Resolved();
  EXPECT_EQ(resolved.table_size(), 0);
  auto plain = FeatureSpec::Create(c);
  ASSERT_TRUE(plain.ok());
  for (int f = 0; f < spec->num_fields(); ++f) {
    EXPECT_EQ(spec->field(f).offset, plain->field(f).offset);
    EXPECT_EQ(spec->field(f).seed, plain->field(f).seed);
    EXPECT_EQ(spec->field(f).table, 0);
  }
}

TEST(Tables, ResolvedRoundTrips) {
  auto spec = FeatureSpec::Create(Parse(kTables), Model(8));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const FeatureConfig r = spec->Resolved();
  ASSERT_EQ(r.table_size(), 2);
  EXPECT_EQ(r.table(0).dim(), 8);
  EXPECT_FLOAT_EQ(r.table(0).initializer().stddev(), 0.02f);
  EXPECT_EQ(r.field(1).table(), "item");
  EXPECT_FALSE(r.field(1).has_vocab_size());
  // The recorded spec gives the same layout back; the named tables' dims are explicit in it (the
  // default table's is the model's).
  auto plain = FeatureSpec::Create(r);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->tables()[1].dim, 8);
  EXPECT_EQ(plain->tables()[2].dim, 4);
  auto again = FeatureSpec::Create(r, Model(8));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(again->Resolved(), r));
  ASSERT_EQ(again->num_tables(), 3);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(again->tables()[t].offset, spec->tables()[t].offset);
    EXPECT_EQ(again->tables()[t].seed, spec->tables()[t].seed);
    EXPECT_EQ(again->tables()[t].dim, spec->tables()[t].dim);
  }
  for (int f = 0; f < spec->num_fields(); ++f) {
    EXPECT_EQ(again->field(f).offset, spec->field(f).offset);
    EXPECT_EQ(again->field(f).seed, spec->field(f).seed);
  }
}

// A preset field moved into a table drops its preset vocabulary; every field in tables leaves
// no default table.
TEST(Tables, PresetFieldIntoATable) {
  FeatureConfig c = Parse(R"pb(
    field { name: "C3" table: "t" }
    table { name: "t" rows: 50 }
  )pb");
  auto spec = FeatureSpec::Create(c, Model(16));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const int f = spec->FieldIndex("C3");
  EXPECT_EQ(spec->field(f).rows, 50u);
  EXPECT_EQ(spec->field(f).dim, 16);
  EXPECT_EQ(spec->num_tables(), 2);

  FeatureConfig only = Parse(R"pb(
    preset: NO_PRESET
    field { name: "a" table: "t" }
    field { name: "b" share_rows_with: "a" list {} }
    table { name: "t" rows: 50 dim: 4 fm_join: EXCLUDE }
  )pb");
  spec = FeatureSpec::Create(only, Model(16));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->num_tables(), 1);
  EXPECT_FALSE(spec->tables()[0].is_default);
  EXPECT_EQ(spec->field(1).table, 0);  // the sharing field is in its target's table
  EXPECT_EQ(spec->field(1).offset, spec->field(0).offset);
  EXPECT_EQ(spec->field(1).dim, 4);
  EXPECT_EQ(spec->max_dim(), 16);
}

void ExpectRefused(const std::string& text, const ModelConfig& model, const std::string& needle) {
  auto spec = FeatureSpec::Create(Parse(text), model);
  ASSERT_FALSE(spec.ok()) << text;
  EXPECT_NE(std::string(spec.status().message()).find(needle), std::string::npos)
      << spec.status();
}

TEST(Tables, Refusals) {
  const ModelConfig m = Model(8);
  const std::string base = "preset: NO_PRESET field { name: 'a' table: 't' } ";
  ExpectRefused(base + "table { name: 't' rows: 9 } table { name: 't' rows: 3 }", m,
                "features.table[1].name: 't' is also the name of features.table[0]");
  ExpectRefused(base + "table { name: 'u' rows: 9 }", m, "table 't' is not a features.table");
  ExpectRefused(base + "table { name: 't' rows: 9 dim: 2000 }", m, "features.table[0] ('t').dim");
  ExpectRefused(base + "table { name: 't' rows: 9 dim: -1 }", m, "features.table[0] ('t').dim");
  ExpectRefused(base + "table { name: 't' rows: 1 }", m, "features.table[0] ('t').rows");
  ExpectRefused(base + "table { name: 't' }", m, "('t').rows: must be set");
  ExpectRefused(base + "table { name: 't-x' rows: 9 }", m, "features.table[0].name: 't-x'");
  ExpectRefused(base + "table { rows: 9 }", m, "features.table[0].name: must be set");
  ExpectRefused(base + "table { name: 't' rows: 9 initializer { stddev: -1 } }", m,
                "('t').initializer.stddev");
  ExpectRefused(base + "table { name: 't' rows: 9 optimizer { learning_rate: 0 } }", m,
                "('t').optimizer.learning_rate");
  ExpectRefused(base + "table { name: 't' rows: 9 partitions: -2 }", m, "('t').partitions");
  ExpectRefused(base + "table { name: 't' rows: 9 } table { name: 'v' rows: 9 }", m,
                "features.table[1] ('v'): no field names it");
  ExpectRefused("preset: NO_PRESET field { name: 'a' table: 't' vocab_size: 5 } "
                "table { name: 't' rows: 9 }", m, "remove vocab_size");
  ExpectRefused("preset: NO_PRESET field { name: 'b' } "
                "field { name: 'a' table: 't' share_rows_with: 'b' } table { name: 't' rows: 9 }",
                m, "either table or share_rows_with");
  ExpectRefused("preset: NO_PRESET field { name: 'a' kind: NUMERIC numeric_mode: DENSE table: 't' }"
                " table { name: 't' rows: 9 }", m, "DENSE numeric field");
  // The FM term crosses one dimension: REFUSE (the default) names the table and the way out.
  ExpectRefused(base + "table { name: 't' rows: 9 dim: 4 }", m,
                "features.table[0] ('t').dim: 4 differs from model.embedding_dim 8");
  ExpectRefused(base + "table { name: 't' rows: 9 dim: 4 }", m, "fm_join: EXCLUDE");
  ModelConfig dlrm = m;
  dlrm.set_type(DLRM);
  ExpectRefused(base + "table { name: 't' rows: 9 dim: 4 fm_join: EXCLUDE }", dlrm, "DOT");
  // Without an FM term the dimension is free; the one-argument Create checks no model.
  ModelConfig wd = m;
  wd.set_type(WIDE_DEEP);
  EXPECT_TRUE(FeatureSpec::Create(Parse(base + "table { name: 't' rows: 9 dim: 4 }"), wd).ok());
  EXPECT_TRUE(FeatureSpec::Create(Parse(base + "table { name: 't' rows: 9 dim: 4 }")).ok());
  // Target attention needs one dimension on both sides.
  ModelConfig din = m;
  din.set_type(DIN);
  ExpectRefused("preset: NO_PRESET field { name: 'c' } field { name: 'h' table: 't' "
                "list { attention_target: 'c' } } table { name: 't' rows: 9 dim: 4 }",
                din, "the target's dimension 8 differs from this field's 4");
}

// ValidateConfig checks each table on its own, naming its path.
TEST(Tables, ValidateConfigNamesTheTablePath) {
  Config c;
  *c.mutable_features() = Parse(kTables);
  ApplyConfigDefaults(&c);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.mutable_features()->mutable_table(1)->set_dim(1025);
  const absl::Status s = ValidateConfig(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("features.table[1] ('small').dim"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace pstrain
