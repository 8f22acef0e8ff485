// Reader throughput per data format, in rows/s on one core: framing (RecordSource over a file in
// the page cache) + parsing into RawRows + FeatureSpec::Encode into a Batch, i.e. the full path
// a reader thread runs. Records are copied into a batch buffer first, as the pipeline must
// ("batch first, then parse"). Data: Criteo-shaped rows (13 numeric fields with ~20% missing,
// 26 hashed categorical fields with ~5% missing, 25% positives), written once to $TMPDIR by the
// format's own RecordWriter.
//
//   build/release/bench/parse_bench --benchmark_min_time=1
//
// Breakdowns for TSV: BM_Framing (source only) and BM_ParseOnly (parser only, in memory).
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "benchmark/benchmark.h"
#include "common/logging.h"
#include "common/random.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"
#include "worker/data/formats/registry.h"
#include "worker/data/record_io.h"

namespace pstrain {
namespace {

constexpr int kRows = 100000;
constexpr int kBatch = 1024;

const FeatureSpec& Spec() {
  static const FeatureSpec* spec = [] {
    auto s = FeatureSpec::Create(FeatureConfig());
    PSTRAIN_CHECK(s.ok()) << s.status();
    return new FeatureSpec(*std::move(s));
  }();
  return *spec;
}

// Criteo-like rows. LibSVM cannot represent missing fields, so `all_present` fills every one.
RawRows CriteoLikeRows(bool all_present) {
  Rng rng(42);
  RawRows rows;
  rows.Clear(Spec().num_fields());
  for (int r = 0; r < kRows; ++r) {
    rows.AddRow(rng.Uniform(4) == 0 ? 1.0f : 0.0f);
    for (int f = 0; f < 13; ++f) {
      if (!all_present && rng.Uniform(5) == 0) continue;
      // Counts with a heavy tail, like Criteo's I columns (a few negatives).
      const int64_t v = static_cast<int64_t>(rng.Uniform(1u << rng.Uniform(16))) - 2;
      rows.SetNumeric(r, f, static_cast<double>(v));
    }
    for (int f = 13; f < 39; ++f) {
      if (!all_present && rng.Uniform(20) == 0) continue;
      // 32-bit hashed categories drawn from a skewed vocabulary.
      rows.SetCategorical(r, f, SplitMix64(rng.Uniform(1u << rng.Uniform(20)) + f) & 0xffffffffu);
    }
  }
  return rows;
}

class DataFiles {
 public:
  DataFiles() {
    const char* tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/pstrain_parse_bench_XXXXXX";
    PSTRAIN_CHECK(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
  }
  ~DataFiles() {
    for (const auto& [format, path] : paths_) ::unlink(path.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& Get(DataFormat format) {
    auto it = paths_.find(format);
    if (it != paths_.end()) return it->second;
    const std::string path = dir_ + "/data" + DataFormatExtension(format);
    const RawRows rows = CriteoLikeRows(format == LIBSVM);
    auto w = CreateRecordWriter(format, Spec(), path);
    PSTRAIN_CHECK(w.ok()) << w.status();
    PSTRAIN_CHECK((*w)->Write(rows, 0, rows.size()).ok());
    PSTRAIN_CHECK((*w)->Close().ok());
    return paths_[format] = path;
  }

 private:
  std::string dir_;
  std::map<DataFormat, std::string> paths_;
};

DataFiles& Files() {
  static DataFiles files;  // destroyed at exit, removing the files
  return files;
}

// A batch of copied records: one buffer, offsets into it.
struct RecordBatch {
  std::string bytes;
  std::vector<size_t> ends;
  std::vector<uint64_t> numbers;
  std::vector<RecordRef> refs;
  void Clear() {
    bytes.clear();
    ends.clear();
    numbers.clear();
  }
  void Add(const RecordRef& r) {
    bytes.append(r.data.data(), r.data.size());
    ends.push_back(bytes.size());
    numbers.push_back(r.number);
  }
  absl::Span<const RecordRef> Refs(const std::string* file) {
    refs.resize(ends.size());
    size_t begin = 0;
    for (size_t i = 0; i < ends.size(); ++i) {
      refs[i].data = absl::string_view(bytes.data() + begin, ends[i] - begin);
      refs[i].file = file;
      refs[i].number = numbers[i];
      begin = ends[i];
    }
    return refs;
  }
};

void BM_Read(benchmark::State& state, DataFormat format) {
  const std::string& path = Files().Get(format);
  RecordBatch batch;
  RawRows raw;
  Batch encoded;
  std::vector<absl::Status> errors;
  int64_t rows = 0, bytes = 0;
  for (auto _ : state) {
    auto src = OpenRecordSource(format, path);
    PSTRAIN_CHECK(src.ok()) << src.status();
    auto parser = CreateRecordParser(format, Spec(), (*src)->header());
    PSTRAIN_CHECK(parser.ok()) << parser.status();
    bool eof = false;
    while (!eof) {
      batch.Clear();
      while (batch.ends.size() < kBatch) {
        RecordRef rec;
        PSTRAIN_CHECK((*src)->Next(&rec, &eof).ok());
        if (eof) break;
        batch.Add(rec);
      }
      raw.Clear(Spec().num_fields());
      (*parser)->Parse(batch.Refs(&path), &raw, &errors);
      PSTRAIN_CHECK(errors.empty()) << errors[0];
      encoded.Clear(Spec().num_fields());
      Spec().Encode(raw, &encoded);
      rows += encoded.size;
    }
    bytes += static_cast<int64_t>((*src)->offset());
  }
  PSTRAIN_CHECK(rows == static_cast<int64_t>(state.iterations()) * kRows);
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(bytes);
}
BENCHMARK_CAPTURE(BM_Read, criteo_tsv, CRITEO_TSV)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Read, csv, CSV)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Read, libsvm, LIBSVM)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Read, tfrecord, TFRECORD)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Read, recordio, RECORDIO)->Unit(benchmark::kMillisecond);

// TSV breakdown: framing alone.
void BM_Framing(benchmark::State& state) {
  const std::string& path = Files().Get(CRITEO_TSV);
  int64_t rows = 0;
  for (auto _ : state) {
    auto src = OpenRecordSource(CRITEO_TSV, path);
    PSTRAIN_CHECK(src.ok());
    RecordRef rec;
    bool eof = false;
    while ((*src)->Next(&rec, &eof).ok() && !eof) ++rows;
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Framing)->Unit(benchmark::kMillisecond);

// TSV breakdown: parsing (no encode) of in-memory lines.
void BM_ParseOnly(benchmark::State& state) {
  const std::string& path = Files().Get(CRITEO_TSV);
  RecordBatch all;
  auto src = OpenRecordSource(CRITEO_TSV, path);
  PSTRAIN_CHECK(src.ok());
  RecordRef rec;
  bool eof = false;
  while ((*src)->Next(&rec, &eof).ok() && !eof) all.Add(rec);
  const absl::Span<const RecordRef> refs = all.Refs(&path);
  auto parser = CreateRecordParser(CRITEO_TSV, Spec(), "");
  PSTRAIN_CHECK(parser.ok());
  RawRows raw;
  std::vector<absl::Status> errors;
  int64_t rows = 0;
  for (auto _ : state) {
    for (size_t b = 0; b < refs.size(); b += kBatch) {
      raw.Clear(Spec().num_fields());
      (*parser)->Parse(refs.subspan(b, kBatch), &raw, &errors);
      rows += raw.size();
    }
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ParseOnly)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
