// The fast writers against plain reference twins. The text writers format rows with word-at-a-
// time and vector kernels, and the TFRecord / RecordIO writers encode the protobuf wire format by
// hand; each must produce exactly the bytes that a straightforward implementation (number by
// number through std::to_chars / absl::StrFormat, or the generated message classes serialized
// deterministically) produces, on random rows and on rows of edge values.
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aialgs/record.pb.h"
#include "common/record_frame.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tensorflow/example.pb.h"
#include "tests/worker/data/formats/format_test_util.h"
#include "worker/data/formats/recordio.h"
#include "worker/data/formats/util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;

// ---- Reference twins. ----

std::string RefNumber(double v) {
  if (v == std::trunc(v) && std::fabs(v) < 9.2e18) return absl::StrCat(static_cast<int64_t>(v));
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

std::string RefLabel(float v) {
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

std::string RefHexKey(uint64_t key) { return absl::StrFormat("%08x", key); }

size_t At(const RawRows& rows, int r, int f) { return static_cast<size_t>(r) * rows.num_fields + f; }

// Criteo TSV (sep '\t') and CSV (sep ',', after the header line).
std::string RefDelimited(const FeatureSpec& spec, const RawRows& rows, char sep) {
  std::string out;
  if (sep == ',') {
    out = spec.label_name();
    for (const auto& f : spec.fields()) absl::StrAppend(&out, ",", f.name);
    out += "\n";
  }
  for (int r = 0; r < rows.size(); ++r) {
    out += RefLabel(rows.labels[r]);
    for (int f = 0; f < spec.num_fields(); ++f) {
      out += sep;
      const size_t i = At(rows, r, f);
      if (!rows.present[i]) continue;
      out += spec.field(f).kind == CATEGORICAL ? RefHexKey(rows.key[i]) : RefNumber(rows.value[i]);
    }
    out += "\n";
  }
  return out;
}

std::string RefLibSvm(const FeatureSpec& spec, const RawRows& rows) {
  std::string out;
  for (int r = 0; r < rows.size(); ++r) {
    out += RefLabel(rows.labels[r]);
    for (int f = 0; f < spec.num_fields(); ++f) {
      const size_t i = At(rows, r, f);
      const uint64_t id = spec.field(f).kind == CATEGORICAL ? rows.key[i] : uint64_t(f);
      absl::StrAppend(&out, " ", id, ":", RefNumber(rows.value[i]));
    }
    out += "\n";
  }
  return out;
}

std::string Deterministic(const google::protobuf::MessageLite& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  return out;
}

tensorflow::Example RefExample(const FeatureSpec& spec, const RawRows& rows, int r) {
  tensorflow::Example ex;
  auto* features = ex.mutable_features()->mutable_feature();
  (*features)[spec.label_name()].mutable_float_list()->add_value(rows.labels[r]);
  for (int f = 0; f < spec.num_fields(); ++f) {
    const size_t i = At(rows, r, f);
    if (!rows.present[i]) continue;
    tensorflow::Feature& feature = (*features)[spec.field(f).name];
    if (spec.field(f).kind == CATEGORICAL) {
      feature.mutable_int64_list()->add_value(static_cast<int64_t>(rows.key[i]));
    } else {
      feature.mutable_float_list()->add_value(static_cast<float>(rows.value[i]));
    }
  }
  return ex;
}

aialgs::data::Record RefRecord(const FeatureSpec& spec, const RawRows& rows, int r) {
  aialgs::data::Record record;
  auto* t = (*record.mutable_features())["values"].mutable_float64_tensor();
  for (int f = 0; f < spec.num_fields(); ++f) {
    const size_t i = At(rows, r, f);
    if (!rows.present[i]) continue;
    t->add_keys(static_cast<uint64_t>(f));
    t->add_values(spec.field(f).kind == CATEGORICAL ? static_cast<double>(rows.key[i])
                                                    : rows.value[i]);
  }
  t->add_shape(static_cast<uint64_t>(spec.num_fields()));
  (*record.mutable_label())["values"].mutable_float32_tensor()->add_values(rows.labels[r]);
  return record;
}

// ---- Inputs. ----

FeatureSpec MakeSpec(const std::vector<std::pair<std::string, FieldKind>>& fields) {
  FeatureConfig config;
  config.set_preset(NO_PRESET);
  for (const auto& [name, kind] : fields) {
    auto* f = config.add_field();
    f->set_name(name);
    f->set_kind(kind);
  }
  auto spec = FeatureSpec::Create(config);
  PSTRAIN_CHECK(spec.ok()) << spec.status();
  return *std::move(spec);
}

// Criteo's 39 fields; 3 fields (fewer than one 8-field group); 11 interleaved fields with
// unsorted names, one longer than 127 bytes (two-byte protobuf lengths), so the last 8-field
// group overlaps the first and groups mix both kinds.
std::vector<FeatureSpec> Specs() {
  std::vector<FeatureSpec> specs = {testing_util::CriteoSpec()};
  specs.push_back(MakeSpec({{"n", NUMERIC}, {"c", CATEGORICAL}, {"m", NUMERIC}}));
  std::vector<std::pair<std::string, FieldKind>> mixed;
  const char* names[] = {"z0", "a1", "m2", "B3", "_4", "10", "9", "labels", "lab", "~", "Z"};
  for (int f = 0; f < 11; ++f) mixed.emplace_back(names[f], f % 3 == 1 ? NUMERIC : CATEGORICAL);
  mixed[5].first = std::string(200, 'x');
  specs.push_back(MakeSpec(mixed));
  return specs;
}

// Rows cycling through edge values: digit-count and fast-path boundaries, -0, non-integral,
// tiny, huge and int64-boundary numbers, and keys of 1 to 16 hex digits.
RawRows EdgeRows(const FeatureSpec& spec, const testing_util::RowShape& shape) {
  const std::vector<double> numbers = {
      0.0, -0.0, 1, -1, 9, 10, -10, 99, 100, 9999999, -9999999, 10000000, -10000000, 99999999,
      -99999999, 100000000, -100000000, 123456789012.0, 99999999.5, -9999999.5, 0.5, -0.25, 3.14,
      1e-300, 4.9e-324, std::numeric_limits<double>::max(), -std::numeric_limits<double>::max(),
      9.2e18, -9.2e18, 9.1e18, -9.1e18, 2251799813685248.5, 1e7 - 1, 2147483648.0,
      -2147483648.0, 4294967296.0};
  const std::vector<uint64_t> keys = {0,           1,           0xf,          0xabcdef,
                                      0xffffffff,  0x100000000, 0x123456789,  0xfedcba9876543210,
                                      ~uint64_t{0}, uint64_t{1} << 63, 0x0fffffffffffff};
  const std::vector<float> labels = {0.0f, 1.0f, -0.0f, 0.5f, 1e-45f, 0.1f, 0.99999994f};
  RawRows rows;
  rows.Clear(spec.num_fields());
  const int n = static_cast<int>(numbers.size() * keys.size());
  for (int r = 0; r < n; ++r) {
    rows.AddRow(labels[r % labels.size()]);
    for (int f = 0; f < spec.num_fields(); ++f) {
      if (shape.missing && (r + 2 * f) % 7 == 0) continue;
      if (spec.field(f).kind == CATEGORICAL) {
        uint64_t key = keys[(r + f) % keys.size()];
        if (shape.key_bits < 64) key &= (uint64_t{1} << shape.key_bits) - 1;
        const double scale = shape.categorical_scale ? numbers[(r + f) % numbers.size()] : 1.0;
        rows.SetCategorical(r, f, key, scale);
      } else {
        double v = numbers[(r * 5 + f) % numbers.size()];
        if (shape.float32_numeric) {
          v = static_cast<double>(static_cast<float>(v));
          if (!std::isfinite(v)) v = 0.25;
        }
        rows.SetNumeric(r, f, v);
        if (shape.numeric_key_is_field) rows.key[At(rows, r, f)] = f;
      }
    }
  }
  return rows;
}

// Random rows (testing_util::RandomRows: missing fields, counts, huge and non-integral numbers,
// keys of any width), then the edge rows.
RawRows TestRows(const FeatureSpec& spec, DataFormat format, uint64_t seed) {
  const testing_util::RowShape shape = testing_util::ShapeFor(format);
  RawRows rows = testing_util::RandomRows(spec, shape, 3000, seed);
  const RawRows edge = EdgeRows(spec, shape);
  for (int r = 0; r < edge.size(); ++r) {
    const int row = rows.AddRow(edge.labels[r]);
    for (int f = 0; f < spec.num_fields(); ++f) {
      rows.present[At(rows, row, f)] = edge.present[At(edge, r, f)];
      rows.key[At(rows, row, f)] = edge.key[At(edge, r, f)];
      rows.value[At(rows, row, f)] = edge.value[At(edge, r, f)];
    }
  }
  return rows;
}

std::string WriteFile(const TempDir& dir, DataFormat format, const FeatureSpec& spec,
                      const RawRows& rows) {
  const std::string path = dir.File("out" + DataFormatExtension(format));
  testing_util::WriteRows(format, spec, path, rows);
  return testing_util::ReadAll(path);
}

// ---- Text formats: byte for byte. ----

TEST(TextWriters, MatchTheReferenceByteForByte) {
  int spec_index = 0;
  for (const FeatureSpec& spec : Specs()) {
    SCOPED_TRACE(absl::StrCat("spec ", spec_index++, " (", spec.num_fields(), " fields)"));
    TempDir dir;
    for (DataFormat format : {CRITEO_TSV, CSV, LIBSVM}) {
      SCOPED_TRACE(DataFormatName(format));
      const RawRows rows = TestRows(spec, format, 11 + format);
      const std::string want = format == LIBSVM  ? RefLibSvm(spec, rows)
                               : format == CSV   ? RefDelimited(spec, rows, ',')
                                                 : RefDelimited(spec, rows, '\t');
      const std::string got = WriteFile(dir, format, spec, rows);
      ASSERT_EQ(got.size(), want.size());
      const size_t diff = std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin();
      ASSERT_EQ(got, want) << "first difference at byte " << diff << ": "
                           << Quote(got.substr(diff > 20 ? diff - 20 : 0, 60));
      // And the readers read back the rows written (the edge rows included).
      std::vector<absl::Status> errors;
      const RawRows back = testing_util::ParseFile(format, spec, dir.File("out" +
                                                   DataFormatExtension(format)), &errors);
      EXPECT_TRUE(errors.empty()) << errors[0];
      EXPECT_TRUE(testing_util::SameRows(back, rows));
    }
  }
}

// The value kernels alone, over every digit count and both sides of each fast-path bound.
TEST(TextWriters, ValueKernelsMatchTheReference) {
  Rng rng(5);
  char buf[64];
  auto number = [&](double v) { return std::string(buf, WriteNumber(v, buf)); };
  auto uint = [&](uint64_t v) { return std::string(buf, WriteUint64(v, buf)); };
  auto hex = [&](uint64_t v) { return std::string(buf, WriteHexKey(v, buf)); };
  for (uint64_t p = 1, d = 0; d <= 19; ++d, p *= 10) {
    for (uint64_t v : {p - 1, p, p + 1, p * 2 - 1, p * 9 + p - 1}) {
      EXPECT_EQ(uint(v), absl::StrCat(v));
      if (v < (uint64_t{1} << 62)) {
        EXPECT_EQ(number(static_cast<double>(v)), RefNumber(static_cast<double>(v)));
        EXPECT_EQ(number(-static_cast<double>(v)), RefNumber(-static_cast<double>(v)));
      }
    }
  }
  for (int i = 0; i < 200000; ++i) {
    const uint64_t bits = rng.Next() >> rng.Uniform(64);
    ASSERT_EQ(uint(bits), absl::StrCat(bits));
    ASSERT_EQ(hex(bits), RefHexKey(bits));
    const double v = testing_util::RandomNumber(rng);
    ASSERT_EQ(number(v), RefNumber(v)) << v;
    const double small = static_cast<double>(static_cast<int64_t>(rng.Uniform(300000000)) -
                                             100000000);
    ASSERT_EQ(number(small), RefNumber(small));
    const float label = static_cast<float>(rng.UniformDouble());
    ASSERT_EQ(std::string(buf, WriteLabel(label, buf)), RefLabel(label));
  }
  for (float label : {0.0f, 1.0f, -0.0f, 1e-45f}) {
    EXPECT_EQ(std::string(buf, WriteLabel(label, buf)), RefLabel(label));
  }
}

// ---- Every writer: rows that would not read back are refused, whichever field (and so
// whichever lane of the 8-field groups) holds the problem. ----

TEST(Writers, RefuseRowsThatWouldNotReadBackInAnyField) {
  const double kNaN = std::numeric_limits<double>::quiet_NaN();
  const double kInf = std::numeric_limits<double>::infinity();
  for (const FeatureSpec& spec : Specs()) {
    for (DataFormat format : {CRITEO_TSV, CSV, LIBSVM, TFRECORD, RECORDIO}) {
      SCOPED_TRACE(absl::StrCat(DataFormatName(format), ", ", spec.num_fields(), " fields"));
      const testing_util::RowShape shape = testing_util::ShapeFor(format);
      const RawRows good = testing_util::RandomRows(spec, shape, 6, 3);
      // Writes the rows with `change` applied to row 4; returns the status.
      auto write = [&](auto change) {
        RawRows rows = good;
        change(&rows);
        auto w = CreateRecordWriter(format, spec, "/dev/null");  // not fsynced
        EXPECT_TRUE(w.ok()) << w.status();
        return (*w)->Write(rows, 0, rows.size());
      };
      auto expect_refused = [&](const absl::Status& s, const std::string& what) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr("row 4 (record 5 of the output)"));
        EXPECT_THAT(std::string(s.message()), HasSubstr(what));
      };
      EXPECT_TRUE(write([](RawRows*) {}).ok());
      for (float label : {2.0f, -0.5f, std::numeric_limits<float>::quiet_NaN()}) {
        expect_refused(write([&](RawRows* rows) { rows->labels[4] = label; }), "is not in [0, 1]");
      }
      for (int f = 0; f < spec.num_fields(); ++f) {
        SCOPED_TRACE(absl::StrCat("field ", f));
        const size_t i = At(good, 4, f);
        const bool categorical = spec.field(f).kind == CATEGORICAL;
        for (double bad : {kNaN, kInf, -kInf}) {
          expect_refused(write([&](RawRows* rows) { rows->SetNumeric(4, f, bad); }),
                         "non-finite value");
        }
        const absl::Status scaled = write([&](RawRows* rows) {
          rows->present[i] = 1;
          rows->value[i] = 2.0;
        });
        if (categorical && format != LIBSVM) {
          expect_refused(scaled, "stores no categorical value");
        } else {
          EXPECT_TRUE(scaled.ok()) << scaled;
        }
        // A missing field's value is not looked at.
        const absl::Status missing = write([&](RawRows* rows) {
          rows->present[i] = 0;
          rows->value[i] = kNaN;
        });
        if (format == LIBSVM) {
          expect_refused(missing, "cannot represent a missing field");
        } else {
          EXPECT_TRUE(missing.ok()) << missing;
        }
      }
    }
  }
}

// ---- Protobuf formats: the generated classes parse the same messages; the bytes are those of
// the deterministic serialization; the readers read back identical rows. ----

template <class Message>
void ExpectSameMessages(const std::vector<std::string>& got, const std::vector<std::string>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    Message a, b;
    ASSERT_TRUE(a.ParseFromString(got[i])) << "record " << i + 1;
    ASSERT_TRUE(b.ParseFromString(want[i]));
    ASSERT_TRUE(google::protobuf::util::MessageDifferencer::Equals(a, b))
        << "record " << i + 1 << ":\n" << a.DebugString() << "vs\n" << b.DebugString();
    ASSERT_EQ(got[i], want[i]) << "record " << i + 1 << ": same message, different bytes";
  }
}

TEST(ProtobufWriters, MatchTheGeneratedClasses) {
  int spec_index = 0;
  for (const FeatureSpec& spec : Specs()) {
    SCOPED_TRACE(absl::StrCat("spec ", spec_index++, " (", spec.num_fields(), " fields)"));
    TempDir dir;
    for (DataFormat format : {TFRECORD, RECORDIO}) {
      SCOPED_TRACE(DataFormatName(format));
      const RawRows rows = TestRows(spec, format, 21 + format);
      std::string want_file;
      for (int r = 0; r < rows.size(); ++r) {
        if (format == TFRECORD) {
          AppendTFRecordFrame(Deterministic(RefExample(spec, rows, r)), &want_file);
        } else {
          AppendRecordIOFrame(Deterministic(RefRecord(spec, rows, r)), &want_file);
        }
      }
      const std::string got_file = WriteFile(dir, format, spec, rows);
      const std::string want_path = dir.Write("want" + DataFormatExtension(format), want_file);
      auto records = [&](const std::string& path) {
        auto src = testing_util::Open(format, path);
        testing_util::ReadResult read = testing_util::ReadSource(src.get());
        EXPECT_TRUE(read.error.ok() && read.skipped.empty()) << read.error;
        return read.data;
      };
      const std::vector<std::string> got = records(dir.File("out" + DataFormatExtension(format)));
      if (format == TFRECORD) {
        ExpectSameMessages<tensorflow::Example>(got, records(want_path));
      } else {
        ExpectSameMessages<aialgs::data::Record>(got, records(want_path));
      }
      EXPECT_EQ(got_file, want_file);
      std::vector<absl::Status> errors;
      const RawRows back = testing_util::ParseFile(
          format, spec, dir.File("out" + DataFormatExtension(format)), &errors);
      const RawRows want_back = testing_util::ParseFile(format, spec, want_path, &errors);
      EXPECT_TRUE(errors.empty()) << errors[0];
      EXPECT_TRUE(testing_util::SameRows(back, want_back));
      EXPECT_TRUE(testing_util::SameRows(back, rows));
    }
  }
}

TEST(ProtobufWriters, TFRecordRefusesAFieldNamedLikeTheLabel) {
  TempDir dir;
  const FeatureSpec spec = MakeSpec({{"a", NUMERIC}, {"label", CATEGORICAL}});
  auto w = CreateRecordWriter(TFRECORD, spec, dir.File("x.tfrecords"));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("field 'label' has the label's name"));
}

}  // namespace
}  // namespace pstrain
