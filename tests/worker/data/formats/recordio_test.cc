#include "worker/data/formats/recordio.h"

#include <cmath>
#include <cstring>

#include "aialgs/record.pb.h"
#include "common/random.h"
#include "common/record_frame.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/data/formats/format_test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;

std::string Magic() {
  std::string m(4, '\0');
  EncodeFixed32(m.data(), kRecordIOMagic);
  return m;
}

std::string Header(uint32_t cflag, uint32_t len) {
  std::string h = Magic() + std::string(4, '\0');
  EncodeFixed32(h.data() + 4, (cflag << 29) | len);
  return h;
}

std::string Framed(const std::string& payload) {
  std::string out;
  AppendRecordIOFrame(payload, &out);
  return out;
}

TEST(RecordIOFraming, MatchesDmlcLayout) {
  // Whole records: header, data, zero padding to 4 bytes.
  EXPECT_EQ(Framed(""), Header(0, 0));
  EXPECT_EQ(Framed("abcde"), Header(0, 5) + "abcde" + std::string(3, '\0'));
  EXPECT_EQ(Framed("abcd"), Header(0, 4) + "abcd");
  // A magic at an unaligned offset stays in place.
  EXPECT_EQ(Framed("a" + Magic() + "bcd"), Header(0, 8) + "a" + Magic() + "bcd");
  // A magic at an aligned offset splits the record there and is dropped.
  EXPECT_EQ(Framed("ABCD" + Magic() + "EFG"),
            Header(1, 4) + "ABCD" + Header(3, 3) + "EFG" + std::string(1, '\0'));
  EXPECT_EQ(Framed(Magic()), Header(1, 0) + Header(3, 0));
  EXPECT_EQ(Framed(Magic() + "12345678" + Magic() + Magic() + "xy"),
            Header(1, 0) + Header(2, 8) + "12345678" + Header(2, 0) + Header(3, 2) + "xy" +
                std::string(2, '\0'));
}

TEST(RecordIOFraming, SplitRecordsAndPaddingReadBackExactly) {
  TempDir dir;
  Rng rng(3);
  std::vector<std::string> payloads = {"", "a", "ab", "abc", "abcd", "abcde", Magic(),
                                       Magic() + Magic(), "xyzw" + Magic()};
  for (int i = 0; i < 300; ++i) {
    std::string p;
    const int pieces = static_cast<int>(rng.Uniform(6));
    for (int j = 0; j < pieces; ++j) {
      if (rng.Uniform(2)) p += Magic();
      p += std::string(rng.Uniform(9), static_cast<char>('a' + rng.Uniform(26)));
    }
    payloads.push_back(p);
  }
  std::string file;
  size_t split = 0;
  for (const auto& p : payloads) {
    const std::string f = Framed(p);
    split += f.size() != 8 + ((p.size() + 3) & ~size_t{3});
    EXPECT_EQ(f.size() % 4, 0u);
    file += f;
  }
  EXPECT_GT(split, 100u) << "the test must exercise split records";
  const std::string path = dir.Write("x.rec", file);
  for (size_t chunk : {size_t{1}, size_t{6}, kDefaultReadChunk}) {
    auto src = testing_util::Open(RECORDIO, path, chunk);
    const auto r = testing_util::ReadSource(src.get());
    ASSERT_TRUE(r.error.ok()) << r.error;
    EXPECT_EQ(r.data, payloads) << "chunk " << chunk;
    EXPECT_EQ(src->offset(), file.size());
  }
}

TEST(RecordIOFraming, CorruptFramingEndsTheFile) {
  TempDir dir;
  struct Case {
    std::string bytes;
    std::string message;
  };
  const std::string good = Framed("okay");  // 12 bytes
  const std::vector<Case> cases = {
      {good + "JUNKJUNK", "record 2 at offset 12: bad magic 0x4b4e554a at offset 12, expected 0xced7230a"},
      {good + Header(3, 0), "record 2 at offset 12: part 1 at offset 12 has continuation flag 3, "
                            "expected 0 (whole) or 1 (start)"},
      {good + Header(1, 4) + "abcd" + Header(0, 0),
       "record 2 at offset 12: part 2 at offset 24 has continuation flag 0, expected 2 (middle) or 3"},
      {good + Header(1, 4) + "abcd", "record 2 at offset 12: truncated at offset 24: expected an 8-byte "
                                     "part header (the record is split and not finished)"},
      {good + Header(0, 9) + "abcdefghi", "record 2 at offset 12: truncated: the part at offset 12 "
                                          "expects 9 bytes of data (12 with padding), file ends after 9"},
      {good + "\x0a\x23", "record 2 at offset 12: truncated at offset 12: expected an 8-byte part "
                          "header, file ends after 2 bytes"},
  };
  for (const auto& c : cases) {
    auto src = testing_util::Open(RECORDIO, dir.Write("bad.rec", c.bytes), 4);
    const auto r = testing_util::ReadSource(src.get());
    EXPECT_EQ(r.data.size(), 1u);
    EXPECT_EQ(r.error.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.error.message()), HasSubstr("bad.rec: " + c.message));
  }
}

class RecordIOParse : public ::testing::Test {
 protected:
  RawRows Parse(const std::vector<aialgs::data::Record>& records) {
    std::string bytes;
    for (const auto& r : records) AppendRecordIOFrame(r.SerializeAsString(), &bytes);
    errors_.clear();
    return testing_util::ParseFile(RECORDIO, spec_, dir_.Write("p.rec", bytes), &errors_);
  }
  static aialgs::data::Record WithLabel(float label) {
    aialgs::data::Record r;
    (*r.mutable_label())["values"].mutable_float32_tensor()->add_values(label);
    return r;
  }
  static aialgs::data::Value& Values(aialgs::data::Record* r) {
    return (*r->mutable_features())["values"];
  }
  size_t At(int r, const char* name) const {
    return static_cast<size_t>(r) * 39 + spec_.FieldIndex(name);
  }

  const FeatureSpec spec_ = testing_util::CriteoSpec();
  TempDir dir_;
  std::vector<absl::Status> errors_;
};

TEST_F(RecordIOParse, DenseSparseAndNamedForms) {
  // Dense Float32Tensor, as sagemaker's write_numpy_to_dense_tensor writes; NaN = missing.
  aialgs::data::Record dense = WithLabel(1);
  auto* d = Values(&dense).mutable_float32_tensor();
  for (int f = 0; f < 39; ++f) d->add_values(f == 5 ? NAN : f * 2.0f);
  // Sparse Float64Tensor: keys are field indices.
  aialgs::data::Record sparse = WithLabel(0);
  auto* s = Values(&sparse).mutable_float64_tensor();
  s->add_keys(38);
  s->add_values(123456789012.0);
  s->add_keys(0);
  s->add_values(-0.25);
  s->add_shape(39);
  // Int32Tensor dense, label as Float64Tensor.
  aialgs::data::Record ints;
  (*ints.mutable_label())["values"].mutable_float64_tensor()->add_values(0.5);
  auto* t = Values(&ints).mutable_int32_tensor();
  for (int f = 0; f < 39; ++f) t->add_values(f);
  // Keyed by field names.
  aialgs::data::Record named = WithLabel(1);
  (*named.mutable_features())["C2"].mutable_float64_tensor()->add_values(77);
  (*named.mutable_features())["I4"].mutable_int32_tensor()->add_values(-3);
  (*named.mutable_features())["C3"].mutable_float32_tensor();  // empty: missing
  (*named.mutable_features())["other"].mutable_float32_tensor()->add_values(1);
  const RawRows rows = Parse({dense, sparse, ints, named});
  ASSERT_TRUE(errors_.empty()) << errors_[0];
  ASSERT_EQ(rows.size(), 4);
  EXPECT_EQ(rows.labels[0], 1.0f);
  EXPECT_EQ(rows.value[At(0, "I1")], 0);
  EXPECT_FALSE(rows.present[At(0, "I6")]);
  EXPECT_EQ(rows.value[At(0, "I7")], 12);
  EXPECT_EQ(rows.key[At(0, "C1")], 26u);
  EXPECT_EQ(rows.value[At(0, "C1")], 1.0);
  EXPECT_EQ(rows.key[At(0, "C26")], 76u);
  EXPECT_EQ(std::count(rows.present.begin(), rows.present.begin() + 39, 1), 38);
  EXPECT_EQ(rows.value[At(1, "I1")], -0.25);
  EXPECT_EQ(rows.key[At(1, "C26")], 123456789012u);
  EXPECT_EQ(std::count(rows.present.begin() + 39, rows.present.begin() + 78, 1), 2);
  EXPECT_EQ(rows.labels[2], 0.5f);
  EXPECT_EQ(rows.key[At(2, "C26")], 38u);
  EXPECT_EQ(rows.key[At(3, "C2")], 77u);
  EXPECT_EQ(rows.value[At(3, "I4")], -3);
  EXPECT_EQ(std::count(rows.present.begin() + 117, rows.present.end(), 1), 2);
}

TEST_F(RecordIOParse, BadRecordsSayWhatWasExpected) {
  auto sparse = [](uint64_t key, double v) {
    aialgs::data::Record r = WithLabel(0);
    auto* t = Values(&r).mutable_float64_tensor();
    t->add_keys(key);
    t->add_values(v);
    return r;
  };
  aialgs::data::Record short_dense = WithLabel(0);
  Values(&short_dense).mutable_float32_tensor()->add_values(1);
  aialgs::data::Record dup = sparse(3, 1);
  Values(&dup).mutable_float64_tensor()->add_keys(3);
  Values(&dup).mutable_float64_tensor()->add_values(2);
  aialgs::data::Record shape = sparse(3, 1);
  Values(&shape).mutable_float64_tensor()->add_shape(40);
  aialgs::data::Record no_label;
  aialgs::data::Record bytes = WithLabel(0);
  Values(&bytes).mutable_bytes()->add_value("x");
  aialgs::data::Record label2 = WithLabel(0);
  (*label2.mutable_label())["values"].mutable_float32_tensor()->add_values(1);
  Parse({sparse(20, -1), sparse(20, 1.5), sparse(39, 1), short_dense, dup, shape, no_label, bytes,
         label2, sparse(20, 7)});
  ASSERT_EQ(errors_.size(), 9u);
  const char* expected[] = {
      ": record 1: categorical field 'C8' has value -1, expected a non-negative integer key",
      ": record 2: categorical field 'C8' has value 1.5",
      ": record 3: features[\"values\"] key 39 is not a field index (expected < 39)",
      ": record 4: features[\"values\"] is dense with 1 values, expected 39 (one per field)",
      ": record 5: features[\"values\"] key 3 appears twice",
      ": record 6: features[\"values\"] has shape [40], expected [39]",
      ": record 7: no label: expected label[\"values\"] or label[\"label\"]",
      ": record 8: features[\"values\"]: expected a Float32Tensor, Float64Tensor or Int32Tensor",
      ": record 9: label: expected one value in [0, 1], found 2 values",
  };
  for (int i = 0; i < 9; ++i) EXPECT_THAT(std::string(errors_[i].message()), HasSubstr(expected[i]));
}

TEST(RecordIOWriter, SplitsPayloadsHoldingTheMagic) {
  TempDir dir;
  const FeatureSpec spec = testing_util::CriteoSpec();
  // A double whose 8 bytes are the magic twice: the packed values array then holds the magic
  // at every 4 bytes, so some occurrence is 4-aligned in the payload.
  double magic_double;
  const std::string mm = Magic() + Magic();
  std::memcpy(&magic_double, mm.data(), 8);
  ASSERT_TRUE(std::isfinite(magic_double));
  RawRows rows;
  rows.Clear(39);
  for (int n = 1; n <= 13; ++n) {  // several lengths, so the array lands at several alignments
    const int r = rows.AddRow(1.0f);
    for (int f = 0; f < n; ++f) rows.SetNumeric(r, f, magic_double);
    rows.SetCategorical(r, 20, 12345);
  }
  const std::string path = dir.File("m.rec");
  testing_util::WriteRows(RECORDIO, spec, path, rows);
  // Scan the frames: some record must have been split (a part with flag 1).
  const std::string file = testing_util::ReadAll(path);
  int starts = 0;
  for (size_t pos = 0; pos + 8 <= file.size();) {
    ASSERT_EQ(DecodeFixed32(file.data() + pos), kRecordIOMagic);
    const uint32_t lrec = DecodeFixed32(file.data() + pos + 4);
    starts += (lrec >> 29) == 1;
    pos += 8 + (((lrec & kRecordIOMaxPart) + 3) & ~3u);
  }
  EXPECT_GT(starts, 0);
  std::vector<absl::Status> errors;
  const RawRows back = testing_util::ParseFile(RECORDIO, spec, path, &errors, 3);
  ASSERT_TRUE(errors.empty()) << errors[0];
  EXPECT_TRUE(testing_util::SameRows(rows, back));
}

TEST(RecordIOWriter, RefusesKeysADoubleCannotHold) {
  TempDir dir;
  const FeatureSpec spec = testing_util::CriteoSpec();
  RawRows rows;
  rows.Clear(39);
  rows.AddRow(0.0f);
  rows.SetCategorical(0, 13, (uint64_t{1} << 53) - 1);  // the largest exact key: fine
  rows.AddRow(0.0f);
  rows.SetCategorical(1, 14, uint64_t{1} << 53);
  auto w = CreateRecordWriter(RECORDIO, spec, dir.File("k.rec"));
  const absl::Status s = (*w)->Write(rows, 0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k.rec: row 1 (record 2 of the output): "
                                                  "categorical field 'C2' key 9007199254740992"));
  ASSERT_TRUE((*w)->Close().ok());
  std::vector<absl::Status> errors;
  const RawRows back = testing_util::ParseFile(RECORDIO, spec, dir.File("k.rec"), &errors);
  ASSERT_EQ(back.size(), 1);
  EXPECT_EQ(back.key[13], (uint64_t{1} << 53) - 1);
}

}  // namespace
}  // namespace pstrain
