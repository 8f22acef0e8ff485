// Helpers shared by the tests in tests/worker/data/formats/: temp files, reading a whole source,
// random RawRows that a given format can represent, and row comparison.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/shared_data.h"
#include "worker/data/feature_spec.h"
#include "worker/data/formats/registry.h"
#include "worker/data/record_io.h"

namespace pstrain {
namespace testing_util {

// A fresh directory under $TMPDIR (or /tmp), removed with its files at destruction.
class TempDir {
 public:
  TempDir() {
    const char* tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/pstrain_formats_XXXXXX";
    PSTRAIN_CHECK(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  std::string Write(const std::string& name, const std::string& contents) const {
    const std::string p = File(name);
    std::ofstream(p, std::ios::binary) << contents;
    return p;
  }

 private:
  std::string path_;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline FeatureSpec CriteoSpec() {
  FeatureConfig config;  // preset CRITEO: I1..I13 numeric, C1..C26 categorical, label "label"
  auto spec = FeatureSpec::Create(config);
  PSTRAIN_CHECK(spec.ok()) << spec.status();
  return *std::move(spec);
}

// Everything one pass over a source produced.
struct ReadResult {
  std::vector<std::string> data;        // record bodies, copied
  std::vector<uint64_t> numbers;        // RecordRef::number of each
  std::vector<absl::Status> skipped;    // DATA_LOSS errors
  absl::Status error;                   // the error that ended the pass, if any
};

inline ReadResult ReadSource(RecordSource* src, size_t max_records = ~size_t{0}) {
  ReadResult r;
  while (r.data.size() < max_records) {
    RecordRef rec;
    bool eof = false;
    absl::Status s = src->Next(&rec, &eof);
    if (absl::IsDataLoss(s)) {
      r.skipped.push_back(s);
      continue;
    }
    if (!s.ok()) {
      r.error = s;
      break;
    }
    if (eof) break;
    EXPECT_EQ(rec.file, &src->path());
    r.data.emplace_back(rec.data);
    r.numbers.push_back(rec.number);
  }
  return r;
}

inline std::unique_ptr<RecordSource> Open(DataFormat format, const std::string& path,
                                          size_t chunk = kDefaultReadChunk) {
  auto src = OpenRecordSource(format, path, RecordSourceOptions{chunk});
  PSTRAIN_CHECK(src.ok()) << src.status();
  return *std::move(src);
}

// Parses every record of `path` into rows; parse errors go to *errors.
inline RawRows ParseFile(DataFormat format, const FeatureSpec& spec, const std::string& path,
                         std::vector<absl::Status>* errors, size_t chunk = kDefaultReadChunk,
                         absl::Status* source_error = nullptr) {
  auto src = Open(format, path, chunk);
  auto parser = CreateRecordParser(format, spec, src->header());
  PSTRAIN_CHECK(parser.ok()) << parser.status();
  RawRows rows;
  rows.Clear(spec.num_fields());
  while (true) {
    RecordRef rec;
    bool eof = false;
    absl::Status s = src->Next(&rec, &eof);
    if (absl::IsDataLoss(s)) {
      errors->push_back(s);
      continue;
    }
    if (!s.ok()) {
      if (source_error) *source_error = s;
      break;
    }
    if (eof) break;
    (*parser)->Parse({&rec, 1}, &rows, errors);
  }
  return rows;
}

// Parses each line of `text` (a TSV / CSV / LibSVM body) with `format`; returns the rows and
// leaves the errors in *errors. The file is written to `dir`.
inline RawRows ParseText(const TempDir& dir, DataFormat format, const FeatureSpec& spec,
                         const std::string& text, std::vector<absl::Status>* errors) {
  return ParseFile(format, spec, dir.Write("input" + DataFormatExtension(format), text), errors);
}

// What random rows must look like to be representable in a format.
struct RowShape {
  bool missing = true;              // fields may be missing
  bool categorical_scale = false;   // categorical values other than 1
  bool numeric_key_is_field = false;  // LibSVM writes the field index as a numeric field's id
  bool float32_numeric = false;     // TFRecord stores numeric values as float32
  int key_bits = 64;                // categorical keys below 2^key_bits
};

inline RowShape ShapeFor(DataFormat format) {
  RowShape s;
  if (format == LIBSVM) {
    s.missing = false;
    s.categorical_scale = true;
    s.numeric_key_is_field = true;
  }
  if (format == TFRECORD) s.float32_numeric = true;
  if (format == RECORDIO) s.key_bits = 53;
  return s;
}

inline double RandomNumber(Rng& rng) {
  switch (rng.Uniform(5)) {
    case 0: return static_cast<double>(static_cast<int64_t>(rng.Uniform(2000)) - 3);  // counts
    case 1: return static_cast<double>(static_cast<int64_t>(rng.Next()) >> rng.Uniform(63));
    case 2: return rng.Normal() * std::pow(10.0, static_cast<double>(rng.Uniform(40)) - 20);
    case 3: return rng.UniformDouble();
    default: return -rng.UniformDouble() * 1e6;
  }
}

inline RawRows RandomRows(const FeatureSpec& spec, const RowShape& shape, int n, uint64_t seed) {
  Rng rng(seed);
  RawRows rows;
  rows.Clear(spec.num_fields());
  for (int r = 0; r < n; ++r) {
    const float label = rng.Uniform(4) == 0 ? static_cast<float>(rng.UniformDouble())
                                            : static_cast<float>(rng.Uniform(2));
    rows.AddRow(label);
    for (int f = 0; f < spec.num_fields(); ++f) {
      if (shape.missing && rng.Uniform(5) == 0) continue;
      if (spec.field(f).kind == CATEGORICAL) {
        uint64_t key = rng.Next() >> rng.Uniform(64);
        if (shape.key_bits < 64) key &= (uint64_t{1} << shape.key_bits) - 1;
        rows.SetCategorical(r, f, key, shape.categorical_scale ? RandomNumber(rng) : 1.0);
      } else {
        double v = RandomNumber(rng);
        if (shape.float32_numeric) v = static_cast<double>(static_cast<float>(v));
        rows.SetNumeric(r, f, v);
        if (shape.numeric_key_is_field) rows.key[static_cast<size_t>(r) * spec.num_fields() + f] = f;
      }
    }
  }
  return rows;
}

// Compares two RawRows field by field and says where they differ first.
inline ::testing::AssertionResult SameRows(const RawRows& a, const RawRows& b) {
  if (a.num_fields != b.num_fields || a.size() != b.size()) {
    return ::testing::AssertionFailure() << "shape " << a.size() << "x" << a.num_fields << " vs "
                                         << b.size() << "x" << b.num_fields;
  }
  for (int r = 0; r < a.size(); ++r) {
    if (a.labels[r] != b.labels[r]) {
      return ::testing::AssertionFailure() << "row " << r << " label " << a.labels[r] << " vs "
                                           << b.labels[r];
    }
    for (int f = 0; f < a.num_fields; ++f) {
      const size_t i = static_cast<size_t>(r) * a.num_fields + f;
      if (a.present[i] != b.present[i] || a.key[i] != b.key[i] || a.value[i] != b.value[i]) {
        return ::testing::AssertionFailure()
               << "row " << r << " field " << f << ": present " << int(a.present[i]) << "/"
               << int(b.present[i]) << " key " << a.key[i] << "/" << b.key[i] << " value "
               << absl::StrCat(a.value[i]) << "/" << absl::StrCat(b.value[i]);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

inline void WriteRows(DataFormat format, const FeatureSpec& spec, const std::string& path,
                      const RawRows& rows) {
  auto w = CreateRecordWriter(format, spec, path);
  ASSERT_TRUE(w.ok()) << w.status();
  // Two calls, to cover appending across Write calls.
  ASSERT_TRUE((*w)->Write(rows, 0, rows.size() / 3).ok());
  ASSERT_TRUE((*w)->Write(rows, rows.size() / 3, rows.size()).ok());
  ASSERT_TRUE((*w)->Close().ok());
}

}  // namespace testing_util
}  // namespace pstrain
