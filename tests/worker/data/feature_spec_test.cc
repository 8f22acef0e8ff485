// FeatureSpec's value transform of DENSE numeric fields.
#include "worker/data/feature_spec.h"

#include <cmath>

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

}  // namespace
}  // namespace pstrain
