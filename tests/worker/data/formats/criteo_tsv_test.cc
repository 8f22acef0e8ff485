#include "worker/data/formats/criteo_tsv.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::ParseText;
using testing_util::TempDir;

class CriteoTsv : public ::testing::Test {
 protected:
  // Field value accessors for row r.
  bool present(int r, const std::string& name) const { return rows_.present[At(r, name)]; }
  uint64_t key(int r, const std::string& name) const { return rows_.key[At(r, name)]; }
  double value(int r, const std::string& name) const { return rows_.value[At(r, name)]; }
  size_t At(int r, const std::string& name) const {
    const int f = spec_.FieldIndex(name);
    PSTRAIN_CHECK(f >= 0) << name;
    return static_cast<size_t>(r) * spec_.num_fields() + f;
  }
  void Parse(const std::string& text) {
    errors_.clear();
    rows_ = ParseText(dir_, CRITEO_TSV, spec_, text, &errors_);
  }
  // A full 40-column line with the given label, I values 1..13 and C values 0xa1..0xba.
  static std::string Line(const std::string& label = "1") {
    std::string s = label;
    for (int i = 1; i <= 13; ++i) absl::StrAppend(&s, "\t", i);
    for (int i = 0; i < 26; ++i) absl::StrAppend(&s, "\t", absl::Hex(0xa1 + i));
    return s;
  }

  const FeatureSpec spec_ = testing_util::CriteoSpec();
  TempDir dir_;
  RawRows rows_;
  std::vector<absl::Status> errors_;
};

TEST_F(CriteoTsv, KaggleHead10k) {
  ASSERT_SHARED_DATA(path, "criteo/kaggle_train_head10k.tsv");
  rows_ = testing_util::ParseFile(CRITEO_TSV, spec_, path, &errors_);
  ASSERT_TRUE(errors_.empty()) << errors_[0];
  ASSERT_EQ(rows_.size(), 10000);
  // Independent counts, computed once with awk over the same file:
  //   awk -F'\t' '$1==1' kaggle_train_head10k.tsv | wc -l                      -> 2182
  //   awk -F'\t' '{for(i=2;i<=40;i++) if($i=="") m++; s+=$2; if($3<0) n++;
  //               if($36=="") c++; s6+=$6} END {print m, s, n, c, s6}'      -> 56821 18652 975 8182 162384005
  int positives = 0, missing = 0, negative_i2 = 0, missing_c22 = 0;
  double sum_i1 = 0, sum_i5 = 0;
  for (int r = 0; r < rows_.size(); ++r) {
    positives += rows_.labels[r] == 1.0f;
    for (int f = 0; f < 39; ++f) missing += !rows_.present[static_cast<size_t>(r) * 39 + f];
    sum_i1 += value(r, "I1");
    sum_i5 += value(r, "I5");
    negative_i2 += value(r, "I2") < 0;
    missing_c22 += !present(r, "C22");
  }
  EXPECT_EQ(positives, 2182);  // 21.82% positives
  EXPECT_EQ(missing, 56821);
  EXPECT_EQ(sum_i1, 18652);
  EXPECT_EQ(sum_i5, 162384005);
  EXPECT_EQ(negative_i2, 975);
  EXPECT_EQ(missing_c22, 8182);

  // head -1: 0 1 1 5 0 1382 4 15 2 181 1 2 <empty> 2 68fd1e64 80e26c9b ... 07b5194c <empty>
  //          3a171ecb c5c50484 e8b83407 9727dd16
  EXPECT_EQ(rows_.labels[0], 0.0f);
  EXPECT_EQ(value(0, "I1"), 1);
  EXPECT_EQ(value(0, "I3"), 5);
  EXPECT_EQ(value(0, "I5"), 1382);
  EXPECT_EQ(value(0, "I9"), 181);
  EXPECT_FALSE(present(0, "I12"));
  EXPECT_EQ(value(0, "I13"), 2);
  EXPECT_EQ(key(0, "C1"), 0x68fd1e64u);
  EXPECT_EQ(value(0, "C1"), 1.0);
  EXPECT_EQ(key(0, "C21"), 0x07b5194cu);
  EXPECT_FALSE(present(0, "C22"));
  EXPECT_EQ(key(0, "C26"), 0x9727dd16u);
  // Last line: 1 <empty> 13 6 4 8693 ... c97d7481
  EXPECT_EQ(rows_.labels[9999], 1.0f);
  EXPECT_FALSE(present(9999, "I1"));
  EXPECT_EQ(value(9999, "I5"), 8693);
  EXPECT_EQ(key(9999, "C26"), 0xc97d7481u);
}

TEST_F(CriteoTsv, MissingAndStrippedTrailingFields) {
  std::string full = Line();
  // 38 columns: C25 and C26 stripped; 37: C24..C26 stripped; 2: label and I1 only.
  const std::string c38 = full.substr(0, full.rfind('\t', full.rfind('\t') - 1));
  const std::string c37 = c38.substr(0, c38.rfind('\t'));
  Parse(absl::StrCat(c38, "\n", c37, "\n1\t7\n0\t\t-2\t\t3.5\n"));
  ASSERT_TRUE(errors_.empty()) << errors_[0];
  ASSERT_EQ(rows_.size(), 4);
  EXPECT_TRUE(present(0, "C24"));
  EXPECT_EQ(key(0, "C24"), 0xa1u + 23);
  EXPECT_FALSE(present(0, "C25"));
  EXPECT_FALSE(present(0, "C26"));
  EXPECT_FALSE(present(1, "C24"));
  EXPECT_EQ(key(1, "C23"), 0xa1u + 22);
  EXPECT_EQ(value(2, "I1"), 7);
  EXPECT_FALSE(present(2, "I2"));
  EXPECT_FALSE(present(3, "I1"));
  EXPECT_EQ(value(3, "I2"), -2);
  EXPECT_FALSE(present(3, "I3"));
  EXPECT_EQ(value(3, "I4"), 3.5);
}

TEST_F(CriteoTsv, ValueSyntax) {
  Parse("0.25\t-1\t1e3\t260.0\t123456789012345678901\t\t\t\t\t\t\t\t\t\tABCDEF01\t0\t"
        "ffffffffffffffff\n");
  ASSERT_TRUE(errors_.empty()) << errors_[0];
  EXPECT_EQ(rows_.labels[0], 0.25f);
  EXPECT_EQ(value(0, "I1"), -1);
  EXPECT_EQ(value(0, "I2"), 1000);
  EXPECT_EQ(value(0, "I3"), 260);
  EXPECT_EQ(value(0, "I4"), 123456789012345678901.0);
  EXPECT_EQ(key(0, "C1"), 0xabcdef01u);
  EXPECT_EQ(key(0, "C2"), 0u);
  EXPECT_TRUE(present(0, "C2"));
  EXPECT_EQ(key(0, "C3"), ~uint64_t{0});
}

TEST_F(CriteoTsv, BadRecordsNameLineColumnAndExpectation) {
  std::string bad_hex = Line();
  bad_hex.replace(bad_hex.find("\tb0"), 3, "\txyz");  // C16
  std::string long_hex = Line();
  long_hex.replace(long_hex.find("\tb0"), 3, "\t0123456789abcdef0");
  std::string bad_num = Line();
  bad_num.replace(bad_num.find("\t7\t"), 3, "\t7x\t");
  Parse(absl::StrCat(Line(), "\n", bad_hex, "\n", Line() + "\t\n", Line("2"), "\n",
                     Line("-1"), "\n", Line("abc"), "\n", long_hex, "\n", bad_num, "\n",
                     Line("0"), "\n"));
  ASSERT_EQ(rows_.size(), 2);  // lines 1 and 9
  EXPECT_EQ(rows_.labels[1], 0.0f);
  ASSERT_EQ(errors_.size(), 7u);
  for (const auto& e : errors_) EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(errors_[0].message()),
              HasSubstr(":line 2: column 30 (C16): bad hex 'xyz': expected 1..16 hex digits"));
  EXPECT_THAT(std::string(errors_[0].message()), HasSubstr("input.tsv"));
  EXPECT_THAT(std::string(errors_[1].message()),
              HasSubstr(":line 3: too many columns: found 41, expected at most 40"));
  EXPECT_THAT(std::string(errors_[2].message()), HasSubstr(":line 4: column 1: bad label '2'"));
  EXPECT_THAT(std::string(errors_[3].message()), HasSubstr(":line 5: column 1: bad label '-1'"));
  EXPECT_THAT(std::string(errors_[4].message()), HasSubstr(":line 6: column 1: bad label 'abc'"));
  EXPECT_THAT(std::string(errors_[5].message()), HasSubstr(":line 7: column 30 (C16): bad hex"));
  EXPECT_THAT(std::string(errors_[6].message()),
              HasSubstr(":line 8: column 8 (I7): bad number '7x'"));
}

TEST_F(CriteoTsv, CrLfBlankLinesAndNoFinalNewline) {
  Parse(absl::StrCat(Line("1"), "\r\n\r\n\n", Line("0"), "\r\n", Line("1")));
  ASSERT_TRUE(errors_.empty()) << errors_[0];
  ASSERT_EQ(rows_.size(), 3);
  EXPECT_EQ(key(0, "C26"), 0xa1u + 25);  // no '\r' left on the last column
  EXPECT_EQ(key(2, "C26"), 0xa1u + 25);
  EXPECT_EQ(rows_.labels[2], 1.0f);
  // The same with reads of 1..4 bytes, so "\r" and "\n" land in different reads.
  for (size_t chunk = 1; chunk <= 4; ++chunk) {
    std::vector<absl::Status> errors;
    const RawRows small = testing_util::ParseFile(CRITEO_TSV, spec_, dir_.File("input.tsv"),
                                                  &errors, chunk);
    EXPECT_TRUE(errors.empty());
    EXPECT_TRUE(testing_util::SameRows(rows_, small)) << "chunk " << chunk;
  }
  // Blank lines are skipped but keep the file's line numbers.
  auto src = testing_util::Open(CRITEO_TSV, dir_.File("input.tsv"));
  const auto read = testing_util::ReadSource(src.get());
  EXPECT_EQ(read.numbers, (std::vector<uint64_t>{1, 4, 5}));
  EXPECT_EQ(src->records(), 5u);
}

TEST_F(CriteoTsv, GeneralSpecIsPositional) {
  FeatureConfig config;
  config.set_preset(NO_PRESET);
  auto* a = config.add_field();
  a->set_name("a");
  a->set_kind(NUMERIC);
  config.add_field()->set_name("b");
  auto spec = FeatureSpec::Create(config);
  ASSERT_TRUE(spec.ok());
  std::vector<absl::Status> errors;
  const RawRows rows = ParseText(dir_, CRITEO_TSV, *spec, "1\t5\tff\n0\t6\n1\t1\t2\t3\n", &errors);
  ASSERT_EQ(rows.size(), 2);
  EXPECT_EQ(rows.value[0], 5);
  EXPECT_EQ(rows.key[1], 0xffu);
  EXPECT_FALSE(rows.present[3]);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(std::string(errors[0].message()), HasSubstr("found 4, expected at most 3"));
}

TEST_F(CriteoTsv, WriterFormat) {
  RawRows rows;
  rows.Clear(spec_.num_fields());
  rows.AddRow(1.0f);
  rows.SetNumeric(0, spec_.FieldIndex("I1"), 3);
  rows.SetNumeric(0, spec_.FieldIndex("I2"), -0.5);
  rows.SetCategorical(0, spec_.FieldIndex("C1"), 0x1f);
  rows.SetCategorical(0, spec_.FieldIndex("C26"), 0x123456789abcdefull);
  const std::string path = dir_.File("w.tsv");
  testing_util::WriteRows(CRITEO_TSV, spec_, path, rows);
  EXPECT_EQ(testing_util::ReadAll(path),
            "1\t3\t-0.5" + std::string(11, '\t') + "\t0000001f" + std::string(25, '\t') +
                "123456789abcdef\n");
  rows.SetCategorical(0, spec_.FieldIndex("C2"), 5, 0.5);
  auto w = CreateRecordWriter(CRITEO_TSV, spec_, dir_.File("w2.tsv"));
  const absl::Status s = (*w)->Write(rows, 0, 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr("row 0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'C2' has value 0.5"));
}

}  // namespace
}  // namespace pstrain
