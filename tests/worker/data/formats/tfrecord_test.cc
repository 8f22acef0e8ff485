#include "worker/data/formats/tfrecord.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/hash.h"
#include "common/random.h"
#include "common/record_frame.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorflow/example.pb.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;

const FeatureSpec& Spec() {
  static const FeatureSpec* spec = new FeatureSpec(testing_util::CriteoSpec());
  return *spec;
}

TEST(TFRecord, DeepCtrSampleFiles) {
  for (const auto& [name, count, positives] :
       {std::tuple<const char*, int, int>{"criteo/criteo_sample.tr.tfrecords", 160, 37},
        {"criteo/criteo_sample.te.tfrecords", 40, 12}}) {
    ASSERT_SHARED_DATA(path, name);
    std::vector<absl::Status> errors;
    absl::Status source_error;
    const RawRows rows = testing_util::ParseFile(TFRECORD, Spec(), path, &errors,
                                                 kDefaultReadChunk, &source_error);
    ASSERT_TRUE(source_error.ok()) << source_error;
    ASSERT_TRUE(errors.empty()) << errors[0];
    ASSERT_EQ(rows.size(), count) << name;
    EXPECT_EQ(std::count(rows.present.begin(), rows.present.end(), 1), count * 39) << name;
    EXPECT_EQ(std::count(rows.labels.begin(), rows.labels.end(), 1.0f), positives) << name;
  }
}

// The TFRecords are DeepCTR's preprocessing of criteo_sample.txt, shuffled and split 160/40
// (train_test_split): C columns label-encoded (LabelEncoder over the 200 rows, missing as "-1"),
// I columns min-max scaled after filling missing with 0. The rows are NOT in CSV order (checked
// once: the first labels differ), so this test rebuilds the preprocessing from the CSV text and
// matches every TFRecord row to exactly one CSV row with the same label.
TEST(TFRecord, AgreesWithTheCsvItWasMadeFrom) {
  ASSERT_SHARED_DATA(csv_path, "criteo/criteo_sample.txt");
  ASSERT_SHARED_DATA(tr_path, "criteo/criteo_sample.tr.tfrecords");
  ASSERT_SHARED_DATA(te_path, "criteo/criteo_sample.te.tfrecords");
  const std::string text = testing_util::ReadAll(csv_path);
  std::vector<std::vector<std::string>> csv;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    csv.push_back(absl::StrSplit(line, ','));
  }
  const std::vector<std::string> header = csv[0];
  csv.erase(csv.begin());
  ASSERT_EQ(csv.size(), 200u);
  // Per column: encoded C ids and scaled I values, by CSV row.
  std::map<std::string, std::vector<double>> enc;
  for (size_t c = 1; c < header.size(); ++c) {
    std::vector<double>& out = enc[header[c]];
    if (header[c][0] == 'C') {
      std::map<std::string, int> ids;
      for (const auto& row : csv) ids[row[c].empty() ? "-1" : row[c]] = 0;
      int next = 0;
      for (auto& [value, id] : ids) id = next++;  // sorted, as LabelEncoder does
      for (const auto& row : csv) out.push_back(ids[row[c].empty() ? "-1" : row[c]]);
    } else {
      for (const auto& row : csv) out.push_back(row[c].empty() ? 0.0 : std::stod(row[c]));
      const auto [lo, hi] = std::minmax_element(out.begin(), out.end());
      const double min = *lo, range = *hi - *lo;
      for (double& v : out) v = (v - min) / range;
    }
  }
  std::map<std::vector<uint64_t>, int> csv_by_ids;
  for (int r = 0; r < 200; ++r) {
    std::vector<uint64_t> ids;
    for (int i = 1; i <= 26; ++i) ids.push_back(static_cast<uint64_t>(enc[absl::StrCat("C", i)][r]));
    ASSERT_TRUE(csv_by_ids.emplace(ids, r).second) << "C ids identify CSV rows uniquely";
  }
  std::vector<int> matched(200, 0);
  int first_mismatch_in_order = -1;
  for (const std::string& name : {tr_path, te_path}) {
    const bool train = absl::StrContains(name, ".tr.");
    std::vector<absl::Status> errors;
    const RawRows rows = testing_util::ParseFile(TFRECORD, Spec(), name, &errors);
    ASSERT_TRUE(errors.empty());
    for (int r = 0; r < rows.size(); ++r) {
      const size_t base = static_cast<size_t>(r) * 39;
      std::vector<uint64_t> ids;
      for (int i = 1; i <= 26; ++i) ids.push_back(rows.key[base + Spec().FieldIndex(absl::StrCat("C", i))]);
      const auto it = csv_by_ids.find(ids);
      ASSERT_NE(it, csv_by_ids.end()) << name << " record " << r + 1;
      const int c = it->second;
      ++matched[c];
      EXPECT_EQ(rows.labels[r], std::stof(csv[c][0])) << name << " record " << r + 1;
      for (int i = 1; i <= 13; ++i) {
        const std::string field = absl::StrCat("I", i);
        EXPECT_NEAR(rows.value[base + Spec().FieldIndex(field)], enc[field][c], 1e-6)
            << name << " record " << r + 1 << " " << field;
      }
      if (train && first_mismatch_in_order < 0 &&
          rows.labels[r] != std::stof(csv[r][0])) {
        first_mismatch_in_order = r;
      }
    }
  }
  EXPECT_EQ(std::count(matched.begin(), matched.end(), 1), 200);
  EXPECT_GE(first_mismatch_in_order, 0) << "the files are in CSV order after all";
}

// Builds a framed Example with the given features.
std::string Frame(const tensorflow::Example& ex) {
  std::string out;
  AppendTFRecordFrame(ex.SerializeAsString(), &out);
  return out;
}

tensorflow::Example ExampleWith(float label) {
  tensorflow::Example ex;
  (*ex.mutable_features()->mutable_feature())["label"].mutable_float_list()->add_value(label);
  return ex;
}

TEST(TFRecord, FeatureMapping) {
  TempDir dir;
  auto f = [](tensorflow::Example* ex, const char* k) -> tensorflow::Feature& {
    return (*ex->mutable_features()->mutable_feature())[k];
  };
  tensorflow::Example a = ExampleWith(1);
  f(&a, "C1").mutable_int64_list()->add_value(-1);
  f(&a, "C2").mutable_bytes_list()->add_value("00ab");
  f(&a, "C3").mutable_bytes_list()->add_value("not hex");
  f(&a, "C4").mutable_int64_list();  // empty: missing
  f(&a, "I1").mutable_int64_list()->add_value(42);
  f(&a, "I2").mutable_float_list()->add_value(0.5f);
  f(&a, "unused").mutable_float_list()->add_value(3);
  tensorflow::Example b = ExampleWith(0);
  (*b.mutable_features()->mutable_feature())["label"].Clear();
  f(&b, "label").mutable_int64_list()->add_value(1);
  tensorflow::Example no_label;
  f(&no_label, "C1").mutable_int64_list()->add_value(1);
  tensorflow::Example multi = ExampleWith(0);
  f(&multi, "C1").mutable_int64_list()->add_value(1);
  f(&multi, "C1").mutable_int64_list()->add_value(2);
  tensorflow::Example wrong_kind = ExampleWith(0);
  f(&wrong_kind, "C1").mutable_float_list()->add_value(1);
  tensorflow::Example bad_label = ExampleWith(3);
  std::string bytes = Frame(a) + Frame(b) + Frame(no_label) + Frame(multi) + Frame(wrong_kind) +
                      Frame(bad_label);
  AppendTFRecordFrame("\xff\xff garbage", &bytes);
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseFile(TFRECORD, Spec(), dir.Write("x.tfrecords", bytes),
                                               &errors);
  ASSERT_EQ(rows.size(), 2);
  auto at = [&](int r, const char* name) { return static_cast<size_t>(r) * 39 + Spec().FieldIndex(name); };
  EXPECT_EQ(rows.labels[0], 1.0f);
  EXPECT_EQ(rows.key[at(0, "C1")], ~uint64_t{0});
  EXPECT_EQ(rows.key[at(0, "C2")], 0xabu);
  EXPECT_EQ(rows.key[at(0, "C3")], HashBytes("not hex"));
  EXPECT_FALSE(rows.present[at(0, "C4")]);
  EXPECT_EQ(rows.value[at(0, "I1")], 42);
  EXPECT_EQ(rows.value[at(0, "I2")], 0.5);
  EXPECT_FALSE(rows.present[at(0, "I3")]);
  EXPECT_EQ(rows.labels[1], 1.0f);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_THAT(std::string(errors[0].message()), HasSubstr(": record 3: no label feature 'label'"));
  EXPECT_THAT(std::string(errors[1].message()),
              HasSubstr(": record 4: feature 'C1' has 2 values, expected 1"));
  EXPECT_THAT(std::string(errors[2].message()),
              HasSubstr("categorical feature 'C1' is a float_list, expected int64_list or bytes_list"));
  EXPECT_THAT(std::string(errors[3].message()), HasSubstr(": record 6: label feature 'label'"));
  EXPECT_EQ(errors[4].code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(errors[4].message()), HasSubstr(": record 7: 10 bytes are not a valid"));
}

// The parser walks the Example -> Features -> map entry envelope itself; this checks it against
// the reference: protobuf's generated parse of the whole Example, mapped field by field. Random
// Examples with unknown features, empty lists and unknown Example fields; half of the records are
// two Examples concatenated, which protobuf merges (a repeated key: the later entry wins).
TEST(TFRecord, EnvelopeWalkMatchesGeneratedParse) {
  TempDir dir;
  Rng rng(17);
  auto random_example = [&]() {
    tensorflow::Example ex;
    auto& fm = *ex.mutable_features()->mutable_feature();
    if (rng.Uniform(2)) {
      fm["label"].mutable_float_list()->add_value(static_cast<float>(rng.UniformDouble()));
    } else {
      fm["label"].mutable_int64_list()->add_value(static_cast<int64_t>(rng.Uniform(2)));
    }
    for (int f = 0; f < 39; ++f) {
      if (rng.Uniform(4) == 0) continue;  // absent
      tensorflow::Feature& feat = fm[Spec().field(f).name];
      const bool empty = rng.Uniform(10) == 0;
      if (Spec().field(f).kind == CATEGORICAL) {
        if (rng.Uniform(3) == 0) {
          auto* b = feat.mutable_bytes_list();
          if (!empty) b->add_value(rng.Uniform(2) ? absl::StrCat(absl::Hex(rng.Next())) : absl::StrCat("s", rng.Next()));
        } else {
          auto* l = feat.mutable_int64_list();
          if (!empty) l->add_value(static_cast<int64_t>(rng.Next()));
        }
      } else if (rng.Uniform(2)) {
        auto* l = feat.mutable_float_list();
        if (!empty) l->add_value(static_cast<float>(rng.Normal() * 100));
      } else {
        auto* l = feat.mutable_int64_list();
        if (!empty) l->add_value(static_cast<int64_t>(rng.Uniform(1000)) - 10);
      }
    }
    fm["unused_feature"].mutable_bytes_list()->add_value("ignored");
    return ex;
  };
  std::string file;
  std::vector<tensorflow::Example> reference;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = random_example().SerializeAsString();
    if (i % 2) bytes += random_example().SerializeAsString();
    bytes += std::string("\x10\x05\x1a\x02xx", 6);  // unknown fields 2 (varint) and 3 (bytes)
    tensorflow::Example ex;
    ASSERT_TRUE(ex.ParseFromString(bytes));
    reference.push_back(ex);
    AppendTFRecordFrame(bytes, &file);
  }
  std::vector<absl::Status> errors;
  const RawRows rows = testing_util::ParseFile(TFRECORD, Spec(), dir.Write("r.tfrecords", file), &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  RawRows expected;
  expected.Clear(39);
  for (int r = 0; r < static_cast<int>(reference.size()); ++r) {
    const auto& fm = reference[r].features().feature();
    const tensorflow::Feature& label = fm.at("label");
    expected.AddRow(label.has_float_list() ? label.float_list().value(0)
                                           : static_cast<float>(label.int64_list().value(0)));
    for (int f = 0; f < 39; ++f) {
      const auto it = fm.find(Spec().field(f).name);
      if (it == fm.end()) continue;
      const tensorflow::Feature& feat = it->second;
      if (feat.int64_list().value_size() == 1) {
        const int64_t v = feat.int64_list().value(0);
        if (Spec().field(f).kind == CATEGORICAL) {
          expected.SetCategorical(r, f, static_cast<uint64_t>(v));
        } else {
          expected.SetNumeric(r, f, static_cast<double>(v));
        }
      } else if (feat.float_list().value_size() == 1) {
        expected.SetNumeric(r, f, feat.float_list().value(0));
      } else if (feat.bytes_list().value_size() == 1) {
        const std::string& b = feat.bytes_list().value(0);
        uint64_t k = HashBytes(b);
        if (b.size() <= 16 && b.find_first_not_of("0123456789abcdef") == std::string::npos) {
          k = std::stoull(b, nullptr, 16);
        }
        expected.SetCategorical(r, f, k);
      }
    }
  }
  EXPECT_TRUE(testing_util::SameRows(expected, rows));
}

class TFRecordCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      tensorflow::Example ex = ExampleWith(i % 2);
      (*ex.mutable_features()->mutable_feature())["I1"].mutable_float_list()->add_value(i);
      starts_.push_back(bytes_.size());
      bytes_ += Frame(ex);
    }
  }
  testing_util::ReadResult Read(const std::string& bytes) {
    auto src = testing_util::Open(TFRECORD, dir_.Write("c.tfrecords", bytes), 16);
    return testing_util::ReadSource(src.get());
  }

  TempDir dir_;
  std::string bytes_;
  std::vector<size_t> starts_;
};

TEST_F(TFRecordCorruption, DataCrcMismatchSkipsOneRecord) {
  std::string bad = bytes_;
  bad[starts_[1] + kTFRecordHeaderSize + 3] ^= 0x20;
  const auto r = Read(bad);
  EXPECT_TRUE(r.error.ok()) << r.error;
  EXPECT_EQ(r.numbers, (std::vector<uint64_t>{1, 3}));
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_THAT(std::string(r.skipped[0].message()),
              HasSubstr(absl::StrCat("c.tfrecords: record 2 at offset ", starts_[1],
                                     ": data CRC mismatch")));
}

TEST_F(TFRecordCorruption, FooterCrcMismatchIsDataLossToo) {
  std::string bad = bytes_;
  bad[starts_[2] - 1] ^= 1;  // the last byte of record 2's data CRC
  const auto r = Read(bad);
  EXPECT_TRUE(r.error.ok());
  EXPECT_EQ(r.numbers, (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(r.skipped.size(), 1u);
}

TEST_F(TFRecordCorruption, HeaderCrcMismatchEndsTheFile) {
  std::string bad = bytes_;
  bad[starts_[1] + 1] ^= 1;  // the length field
  auto src = testing_util::Open(TFRECORD, dir_.Write("c.tfrecords", bad));
  const auto r = testing_util::ReadSource(src.get());
  EXPECT_EQ(r.data.size(), 1u);
  EXPECT_EQ(r.error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.error.message()),
              HasSubstr(absl::StrCat(": record 2 at offset ", starts_[1], ": corrupt record header")));
  RecordRef rec;
  bool eof;
  EXPECT_EQ(src->Next(&rec, &eof), r.error) << "the error is sticky";
}

TEST_F(TFRecordCorruption, TruncatedRecordNamesWhatIsMissing) {
  const size_t len2 = starts_[2] - starts_[1] - kTFRecordHeaderSize - kTFRecordFooterSize;
  for (size_t chunk : {size_t{16}, kDefaultReadChunk}) {
    auto src = testing_util::Open(TFRECORD, dir_.Write("t.tfrecords", bytes_.substr(0, starts_[1] + 12 + 20)), chunk);
    const auto r = testing_util::ReadSource(src.get());
    EXPECT_EQ(r.data.size(), 1u);
    EXPECT_THAT(std::string(r.error.message()),
                HasSubstr(absl::StrCat("t.tfrecords: record 2 at offset ", starts_[1],
                                       ": truncated: expected ", len2,
                                       " bytes of data and a 4-byte CRC, file ends after 20")));
  }
  const auto r = Read(bytes_.substr(0, starts_[2] + 5));
  EXPECT_EQ(r.data.size(), 2u);
  EXPECT_THAT(std::string(r.error.message()),
              HasSubstr("record 3 at offset " + std::to_string(starts_[2]) +
                        ": truncated: expected a 12-byte record header, file ends after 5 bytes"));
}

TEST(TFRecordWriter, RoundsNumericToFloat32AsTensorFlowDoes) {
  TempDir dir;
  RawRows rows;
  rows.Clear(39);
  rows.AddRow(1.0f);
  rows.SetNumeric(0, 0, 0.1);  // not a float
  rows.SetCategorical(0, 13, ~uint64_t{0} - 5);
  testing_util::WriteRows(TFRECORD, Spec(), dir.File("w.tfrecords"), rows);
  std::vector<absl::Status> errors;
  const RawRows back = testing_util::ParseFile(TFRECORD, Spec(), dir.File("w.tfrecords"), &errors);
  ASSERT_EQ(back.size(), 1);
  EXPECT_EQ(back.value[0], static_cast<double>(0.1f));
  EXPECT_EQ(back.key[13], ~uint64_t{0} - 5);
  rows.SetNumeric(0, 1, 1e300);
  auto w = CreateRecordWriter(TFRECORD, Spec(), dir.File("w2.tfrecords"));
  EXPECT_THAT(std::string((*w)->Write(rows, 0, 1).message()), HasSubstr("overflows float32"));
}

}  // namespace
}  // namespace pstrain
