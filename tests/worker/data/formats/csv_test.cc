#include "worker/data/formats/csv.h"

#include "common/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;

FeatureSpec SmallSpec() {
  FeatureConfig config;
  config.set_preset(NO_PRESET);
  auto* n = config.add_field();
  n->set_name("num");
  n->set_kind(NUMERIC);
  config.add_field()->set_name("cat");
  auto spec = FeatureSpec::Create(config);
  PSTRAIN_CHECK(spec.ok());
  return *spec;
}

TEST(Csv, DeepCtrSample) {
  const FeatureSpec spec = testing_util::CriteoSpec();
  ASSERT_SHARED_DATA(path, "criteo/criteo_sample.txt");
  auto src = testing_util::Open(CSV, path);
  EXPECT_THAT(std::string(src->header()), testing::StartsWith("label,I1,I2,"));
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseFile(CSV, spec, path, &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  ASSERT_EQ(rows.size(), 200);
  // awk -F, 'NR>1 && $1==1' criteo_sample.txt | wc -l -> 49
  // awk -F, 'NR>1{for(i=2;i<=40;i++) if($i=="") m++; s+=$4} END {print m, s}' -> 1101 7062
  int positives = 0, missing = 0;
  double sum_i3 = 0;
  for (int r = 0; r < rows.size(); ++r) {
    positives += rows.labels[r] == 1.0f;
    for (int f = 0; f < 39; ++f) missing += !rows.present[static_cast<size_t>(r) * 39 + f];
    sum_i3 += rows.value[static_cast<size_t>(r) * 39 + spec.FieldIndex("I3")];
  }
  EXPECT_EQ(positives, 49);
  EXPECT_EQ(missing, 1101);
  EXPECT_EQ(sum_i3, 7062);
  // Line 2: 0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,08d6d899,...,c0d61a5c,,
  auto at = [&](const char* name) { return static_cast<size_t>(spec.FieldIndex(name)); };
  EXPECT_FALSE(rows.present[at("I1")]);
  EXPECT_EQ(rows.value[at("I2")], 3);
  EXPECT_EQ(rows.value[at("I3")], 260);
  EXPECT_EQ(rows.value[at("I5")], 17668);
  EXPECT_EQ(rows.value[at("I12")], 0);
  EXPECT_TRUE(rows.present[at("I12")]);
  EXPECT_EQ(rows.key[at("C1")], 0x05db9164u);
  EXPECT_EQ(rows.key[at("C24")], 0xc0d61a5cu);
  EXPECT_FALSE(rows.present[at("C26")]);
}

TEST(Csv, HeaderMapsColumnsByName) {
  TempDir dir;
  const FeatureSpec spec = SmallSpec();
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseText(
      dir, CSV, spec,
      "\xEF\xBB\xBF" "extra,cat,label,num\r\n"
      "x,a1b2,1,2.5\r\n"
      "y,hello world,0,\r\n"
      "z,,0.5,-3\r\n"
      "w,00ff,1\n"
      "v,1,1,1,1\n"
      "u,1,yes,1\n"
      "t,1,1,1e999\n",
      &errors);
  ASSERT_EQ(rows.size(), 3);
  EXPECT_EQ(rows.labels[0], 1.0f);
  EXPECT_EQ(rows.value[0], 2.5);
  EXPECT_EQ(rows.key[1], 0xa1b2u);
  EXPECT_EQ(rows.key[3], HashBytes("hello world"));  // not hex: hashed
  EXPECT_FALSE(rows.present[2]);
  EXPECT_FALSE(rows.present[5]);
  EXPECT_EQ(rows.value[4], -3);
  EXPECT_EQ(rows.labels[2], 0.5f);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_THAT(std::string(errors[0].message()), HasSubstr(":line 5: found 3 columns, expected 4"));
  EXPECT_THAT(std::string(errors[1].message()), HasSubstr(":line 6: found 5 columns, expected 4"));
  EXPECT_THAT(std::string(errors[2].message()),
              HasSubstr(":line 7: column 3 (label): bad label 'yes'"));
  EXPECT_THAT(std::string(errors[3].message()),
              HasSubstr(":line 8: column 4 (num): bad number '1e999'"));
}

TEST(Csv, HeaderErrorsNameTheField) {
  const FeatureSpec spec = SmallSpec();
  auto p = CreateRecordParser(CSV, spec, "label,cat");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no column for field 'num'"));
  p = CreateRecordParser(CSV, spec, "num,cat");
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no label column 'label'"));
  p = CreateRecordParser(CSV, spec, "label,num,cat,num");
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("'num' appears twice"));
  EXPECT_TRUE(CreateRecordParser(CSV, spec, "num , label,cat,other").ok());
}

TEST(Csv, WriterHeaderAndRows) {
  TempDir dir;
  const FeatureSpec spec = SmallSpec();
  RawRows rows;
  rows.Clear(2);
  rows.AddRow(0.5f);
  rows.SetNumeric(0, 0, 1e-7);
  rows.AddRow(1.0f);
  rows.SetCategorical(1, 1, 0xabc);
  testing_util::WriteRows(CSV, spec, dir.File("w.csv"), rows);
  EXPECT_EQ(testing_util::ReadAll(dir.File("w.csv")), "label,num,cat\n0.5,1e-07,\n1,,00000abc\n");
}

// A header is bounded in bytes by max_record_bytes, but every column cost the parser far more
// than its byte (a 16M-column header took `train` to 1.66 GB): the column count is checked first,
// with an error naming the file, the line and the limit, by the source and by the parser.
TEST(Csv, AHeaderOfTooManyColumnsIsRefusedNamingTheFileLineAndLimit) {
  TempDir dir;
  const FeatureSpec spec = SmallSpec();
  const std::string huge = "label,num,cat" + std::string(4 << 20, ',');  // 4M empty columns
  const std::string path = dir.Write("wide.csv", huge + "\n1,2,ab\n");
  absl::StatusOr<std::unique_ptr<RecordSource>> src =
      OpenRecordSource(CSV, path, RecordSourceOptions{});
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(src.status().message()),
              HasSubstr(absl::StrCat(path, ": line 1 (the CSV header, ", huge.size(),
                                     " bytes) has more than 65536 columns")));
  // The parser refuses it by itself too (a header that reaches it another way).
  auto p = CreateRecordParser(CSV, spec, huge);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("CSV header (line 1, 4194317 bytes): more than 65536 columns"));
  // At the limit it reads; one column more does not.
  const std::string widest = "label,num,cat" + std::string(kMaxCsvColumns - 3, ',');
  EXPECT_EQ(CountCsvColumns(widest), kMaxCsvColumns);
  EXPECT_TRUE(CreateRecordParser(CSV, spec, widest).ok());
  EXPECT_FALSE(CreateRecordParser(CSV, spec, widest + ",").ok());
  EXPECT_TRUE(OpenRecordSource(CSV, dir.Write("widest.csv", widest + "\n"), RecordSourceOptions{})
                  .ok());
}

// Columns are counted outside quotes, no further than the limit; a data line of a million quoted
// fields is refused after one more field than the header's, not split whole.
TEST(Csv, ColumnsAreCountedWithoutAllocating) {
  EXPECT_EQ(CountCsvColumns(R"(a,"b,c","say ""hi""",,"")"), 5);
  EXPECT_EQ(CountCsvColumns(""), 1);
  EXPECT_EQ(CountCsvColumns(std::string(100, ','), 10), 11);
  TempDir dir;
  std::string wide;
  for (int i = 0; i < 1000000; ++i) wide += "\"1\",";
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseText(
      dir, CSV, SmallSpec(), "label,num,cat\n" + wide + "\"1\"\n1,2,ab\n", &errors);
  EXPECT_EQ(rows.size(), 1);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(std::string(errors[0].message()),
              HasSubstr(":line 2: found more than 3 columns, expected 3 as in the header"));
}

}  // namespace
}  // namespace pstrain
