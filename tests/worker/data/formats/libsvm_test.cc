#include "worker/data/formats/libsvm.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;

FeatureSpec ThreeFields() {
  FeatureConfig config;
  config.set_preset(NO_PRESET);
  auto* n = config.add_field();
  n->set_name("n");
  n->set_kind(NUMERIC);
  n->set_numeric_mode(DENSE);
  n->set_numeric_transform(NO_TRANSFORM);  // values pass through exactly
  config.add_field()->set_name("c1");
  config.add_field()->set_name("c2");
  auto spec = FeatureSpec::Create(config);
  PSTRAIN_CHECK(spec.ok());
  return *spec;
}

TEST(LibSvm, PairsMapToFieldsInOrder) {
  TempDir dir;
  const FeatureSpec spec = ThreeFields();
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseText(dir, LIBSVM, spec,
                                               "1 0:0.5 17:1 9000000000:0.25\n"
                                               "-1\t1:-2  5:1\t6:1 \r\n"
                                               "+1 0:1 1:1 2:1\n"
                                               "0 0:1 1:1\n"
                                               "0 0:1 1:1 2:1 3:1\n"
                                               "0 0:1 x:1 2:1\n"
                                               "0 0:1 1:abc 2:1\n"
                                               "0 0:1 1 2:1\n"
                                               "2 0:1 1:1 2:1\n",
                                               &errors);
  ASSERT_EQ(rows.size(), 3);
  EXPECT_EQ(rows.labels[0], 1.0f);
  EXPECT_EQ(rows.value[0], 0.5);
  EXPECT_EQ(rows.key[0], 0u);
  EXPECT_EQ(rows.key[1], 17u);
  EXPECT_EQ(rows.value[1], 1.0);
  EXPECT_EQ(rows.key[2], 9000000000u);
  EXPECT_EQ(rows.value[2], 0.25);
  EXPECT_EQ(rows.labels[1], 0.0f);  // -1 is LibSVM's negative label
  EXPECT_EQ(rows.value[3], -2);
  EXPECT_EQ(rows.key[3], 1u);
  EXPECT_EQ(rows.key[5], 6u);
  EXPECT_EQ(rows.labels[2], 1.0f);
  ASSERT_EQ(errors.size(), 6u);
  EXPECT_THAT(std::string(errors[0].message()),
              HasSubstr(":line 4: found 2 id:value pairs, expected 3 (one per field"));
  EXPECT_THAT(std::string(errors[1].message()), HasSubstr(":line 5: found 4 id:value pairs"));
  EXPECT_THAT(std::string(errors[2].message()), HasSubstr(":line 6: pair 2 (c1): bad pair 'x:1'"));
  EXPECT_THAT(std::string(errors[3].message()), HasSubstr(":line 7: pair 2 (c1): bad pair '1:abc'"));
  EXPECT_THAT(std::string(errors[4].message()), HasSubstr(":line 8: pair 2 (c1): bad pair '1'"));
  EXPECT_THAT(std::string(errors[5].message()), HasSubstr(":line 9: bad label '2'"));
}

TEST(LibSvm, WriterNeedsEveryField) {
  TempDir dir;
  const FeatureSpec spec = ThreeFields();
  RawRows rows;
  rows.Clear(3);
  rows.AddRow(1.0f);
  rows.SetNumeric(0, 0, 2.5);
  rows.SetCategorical(0, 1, 42, 0.5);
  rows.SetCategorical(0, 2, 7);
  const std::string path = dir.File("w.libsvm");
  testing_util::WriteRows(LIBSVM, spec, path, rows);
  EXPECT_EQ(testing_util::ReadAll(path), "1 0:2.5 42:0.5 7:1\n");

  rows.AddRow(0.0f);  // row 1: every field missing
  auto w = CreateRecordWriter(LIBSVM, spec, dir.File("w2.libsvm"));
  const absl::Status s = (*w)->Write(rows, 0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("row 1 (record 2 of the output)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("field 'n' is missing"));
}

}  // namespace
}  // namespace pstrain
