// FeatureSpec: the value transform of DENSE numeric fields, and golden row ids.
#include "worker/data/feature_spec.h"

#include <cmath>
#include <vector>

#include "common/hash.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

float DenseScale(const FeatureSpec& spec, int f, double x) {
  int64_t row = -1;
  float scale = 0;
  spec.EncodeOne(f, /*present=*/true, 0, x, &row, &scale);
  EXPECT_EQ(row, static_cast<int64_t>(spec.field(f).offset + 1));
  return scale;
}

// Preset fields in DENSE mode take features.numeric_transform (LOG1P by default, negatives
// clamped to 0); an explicit field may override it; a missing value keeps row 0 and scale 1.
TEST(FeatureSpec, DenseNumericTransform) {
  FeatureConfig config;
  config.set_numeric_mode(DENSE);
  auto spec = FeatureSpec::Create(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->field(0).numeric_transform, LOG1P);
  EXPECT_FLOAT_EQ(DenseScale(*spec, 0, 0.0), 0.0f);
  EXPECT_FLOAT_EQ(DenseScale(*spec, 0, 1.0), static_cast<float>(std::log(2.0)));
  EXPECT_FLOAT_EQ(DenseScale(*spec, 0, 100000.0), static_cast<float>(std::log(100001.0)));
  EXPECT_FLOAT_EQ(DenseScale(*spec, 1, -3.0), 0.0f);
  int64_t row = -1;
  float scale = 0;
  spec->EncodeOne(0, /*present=*/false, 0, 0.0, &row, &scale);
  EXPECT_EQ(row, 0);
  EXPECT_EQ(scale, 1.0f);

  config.set_numeric_transform(NO_TRANSFORM);
  FieldSpec* i2 = config.add_field();  // replaces preset field I2, keeps its kind and mode
  i2->set_name("I2");
  i2->set_numeric_transform(LOG1P);
  spec = FeatureSpec::Create(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FLOAT_EQ(DenseScale(*spec, 0, 12345.0), 12345.0f);
  EXPECT_FLOAT_EQ(DenseScale(*spec, 0, -2.5), -2.5f);
  EXPECT_FLOAT_EQ(DenseScale(*spec, 1, 12345.0), static_cast<float>(std::log1p(12345.0)));
}

// Bucketed numeric fields and categorical scales are not transformed.
TEST(FeatureSpec, TransformOnlyTouchesDenseFields) {
  FeatureConfig config;  // LOG_SQUARED_BUCKET numerics, LOG1P transform (unused)
  auto spec = FeatureSpec::Create(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  int64_t row = -1;
  float scale = 0;
  spec->EncodeOne(0, true, 0, 1000.0, &row, &scale);
  EXPECT_EQ(scale, 1.0f);
  spec->EncodeOne(20, true, 77, 0.25, &row, &scale);  // C8, a LibSVM-style value
  EXPECT_EQ(scale, 0.25f);
}

int64_t Row(const FeatureSpec& spec, const std::string& field, bool present, uint64_t key,
            double value) {
  const int f = spec.FieldIndex(field);
  EXPECT_GE(f, 0) << field;
  int64_t row = -1;
  float scale = 0;
  spec.EncodeOne(f, present, key, value, &row, &scale);
  return row;
}

// Golden rows: raw values -> global row ids, fixed here. Checkpoints store rows by id, so a
// change to the hash, the per-field seeds, the field offsets, the bucketing or the multiply-shift
// reduction (row = offset + 1 + (hash * (rows - 1)) >> 64) must fail this test.
TEST(FeatureSpecGolden, CriteoPresetRows) {
  auto spec = FeatureSpec::Create(FeatureConfig());  // CRITEO, default vocabularies and seed
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->total_rows(), 26013312u);  // 13 x 1024 + 26 x 1000000
  EXPECT_EQ(spec->field(12).offset, 12288u);    // I13
  EXPECT_EQ(spec->field(15).offset, 2013312u);  // C3
  // Numeric fields: LOG_SQUARED_BUCKET buckets (0 and 2.5 share bucket 0; -1 is bucket -1).
  EXPECT_EQ(Row(*spec, "I1", true, 0, 0.0), 401);
  EXPECT_EQ(Row(*spec, "I1", true, 0, 1.0), 610);
  EXPECT_EQ(Row(*spec, "I2", true, 0, 2.5), 1307);
  EXPECT_EQ(Row(*spec, "I3", true, 0, 100.0), 2615);    // bucket 21
  EXPECT_EQ(Row(*spec, "I4", true, 0, -1.0), 4044);
  EXPECT_EQ(Row(*spec, "I5", true, 0, 1e6), 5095);      // bucket 190
  // Categorical fields: an integer key (Criteo's hex "68fd1e64"), a string's HashBytes, the
  // extreme keys.
  EXPECT_EQ(Row(*spec, "C1", true, 0x68fd1e64, 1.0), 64149);
  EXPECT_EQ(Row(*spec, "C2", true, HashBytes("hello world"), 1.0), 1902023);
  EXPECT_EQ(Row(*spec, "C26", true, 0, 1.0), 25762118);
  EXPECT_EQ(Row(*spec, "C26", true, ~0ull, 1.0), 25563985);
  // Missing values: the field's row 0.
  EXPECT_EQ(Row(*spec, "C3", false, 0x68fd1e64, 1.0), 2013312);
  EXPECT_EQ(Row(*spec, "I13", false, 0, 5.0), 12288);
  EXPECT_EQ(FeatureSpec::LogSquaredBucket(100.0), 21);
  EXPECT_EQ(FeatureSpec::LogSquaredBucket(2.5), 0);
  EXPECT_EQ(FeatureSpec::LogSquaredBucket(-1.5), -1);
}

// Explicit fields with their own hash_seed; Encode over a RawRows batch gives the same rows.
TEST(FeatureSpecGolden, ExplicitFieldsRows) {
  FeatureConfig config;
  config.set_preset(NO_PRESET);
  config.set_hash_seed(12345);
  FieldSpec* user = config.add_field();
  user->set_name("user");
  user->set_vocab_size(7);
  FieldSpec* price = config.add_field();
  price->set_name("price");
  price->set_kind(NUMERIC);
  price->set_numeric_mode(DENSE);
  FieldSpec* age = config.add_field();
  age->set_name("age");
  age->set_kind(NUMERIC);
  age->set_vocab_size(2);  // one row besides "missing": every value lands on it
  auto spec = FeatureSpec::Create(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->total_rows(), 11u);  // user [0, 7), price [7, 9), age [9, 11)

  RawRows raw;
  raw.Clear(3);
  const uint64_t keys[] = {1, 2, 3, HashBytes("alice"), HashBytes("bob")};
  const double ages[] = {0, 30, 1e9, 4, 5};
  for (int r = 0; r < 5; ++r) {
    raw.AddRow(r % 2);
    raw.SetCategorical(r, 0, keys[r]);
    if (r != 3) raw.SetNumeric(r, 1, 10.0 * r);
    if (r != 4) raw.SetNumeric(r, 2, ages[r]);
  }
  Batch batch;
  spec->Encode(raw, &batch);
  ASSERT_EQ(batch.size, 5);
  EXPECT_EQ(batch.ids, (std::vector<int64_t>{2, 8, 10,  //
                                             5, 8, 10,  //
                                             2, 8, 10,  //
                                             2, 7, 10,  // price missing
                                             6, 8, 9}));  // age missing
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Resolved(): every field explicit, in table order; a spec made from it is the same spec (the
// same rows, seeds and encodings), which is what a checkpoint's model description relies on.
TEST(FeatureSpec, ResolvedMakesTheSameSpec) {
  FeatureConfig c;  // the CRITEO preset, with a DENSE override, an extra field and a hash seed
  c.set_categorical_vocab_size(777);
  c.set_hash_seed(99);
  c.set_label_name("click");
  FieldSpec* i3 = c.add_field();
  i3->set_name("I3");
  i3->set_kind(NUMERIC);
  i3->set_numeric_mode(DENSE);
  i3->set_numeric_transform(NO_TRANSFORM);
  FieldSpec* extra = c.add_field();
  extra->set_name("site");
  extra->set_vocab_size(50);
  auto spec = FeatureSpec::Create(c);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const FeatureConfig resolved = spec->Resolved();
  EXPECT_EQ(resolved.preset(), NO_PRESET);
  EXPECT_EQ(resolved.hash_seed(), 99u);
  EXPECT_EQ(resolved.label_name(), "click");
  ASSERT_EQ(resolved.field_size(), 40);
  EXPECT_EQ(resolved.field(2).name(), "I3");
  EXPECT_EQ(resolved.field(2).vocab_size(), 2u);  // a DENSE field's rows: missing, present
  EXPECT_EQ(resolved.field(13).vocab_size(), 777u);
  EXPECT_EQ(resolved.field(39).name(), "site");
  auto again = FeatureSpec::Create(resolved);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->num_fields(), spec->num_fields());
  EXPECT_EQ(again->total_rows(), spec->total_rows());
  for (int f = 0; f < spec->num_fields(); ++f) {
    const auto& a = spec->field(f);
    const auto& b = again->field(f);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.numeric_mode, b.numeric_mode);
    EXPECT_EQ(a.numeric_transform, b.numeric_transform);
    EXPECT_EQ(a.rows, b.rows);
    EXPECT_EQ(a.offset, b.offset);
    EXPECT_EQ(a.seed, b.seed);
  }
  EXPECT_EQ(again->Resolved().SerializeAsString(), resolved.SerializeAsString());
}

}  // namespace
}  // namespace pstrain
