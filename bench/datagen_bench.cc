// Synthetic data generation speed (rows/s) on one thread: features + teacher + labels, alone,
// generated and written by each format's writer, and the writers alone on one pre-generated
// chunk (all to /dev/null, so no disk time is counted).
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"

#include "worker/data/record_io.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

void BM_GenerateChunk(benchmark::State& state) {
  DatagenOptions o;
  o.max_cardinality = static_cast<uint64_t>(state.range(0));
  auto d = SyntheticData::Create(o);
  RawRows rows;
  std::vector<float> probs;
  int64_t chunk = 0;
  for (auto _ : state) {
    d->GenerateChunk(chunk++, o.chunk_rows, &rows, &probs);
    benchmark::DoNotOptimize(rows.key.data());
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(chunk) * o.chunk_rows, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GenerateChunk)->Arg(100000)->Arg(10000000)->Unit(benchmark::kMillisecond);

void BM_GenerateToFormat(benchmark::State& state) {
  const DataFormat format = static_cast<DataFormat>(state.range(0));
  DatagenOptions o;
  o.fill_missing = format == LIBSVM;
  auto d = SyntheticData::Create(o);
  auto spec = FeatureSpec::Create(FeatureConfig());
  auto writer = CreateRecordWriter(format, *spec, "/dev/null");
  if (!d.ok() || !spec.ok() || !writer.ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  RawRows rows;
  std::vector<float> probs;
  int64_t chunk = 0;
  for (auto _ : state) {
    d->GenerateChunk(chunk++, o.chunk_rows, &rows, &probs);
    if (!(*writer)->Write(rows, 0, rows.size()).ok()) state.SkipWithError("write failed");
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(chunk) * o.chunk_rows, benchmark::Counter::kIsRate);
  state.counters["bytes/row"] =
      static_cast<double>((*writer)->bytes_written()) / (static_cast<double>(chunk) * o.chunk_rows);
  state.SetLabel(DataFormatName(format));
}
BENCHMARK(BM_GenerateToFormat)->DenseRange(CRITEO_TSV, RECORDIO)->Unit(benchmark::kMillisecond);

void BM_Write(benchmark::State& state) {
  const DataFormat format = static_cast<DataFormat>(state.range(0));
  DatagenOptions o;
  o.fill_missing = format == LIBSVM;
  auto d = SyntheticData::Create(o);
  auto spec = FeatureSpec::Create(FeatureConfig());
  auto writer = CreateRecordWriter(format, *spec, "/dev/null");
  if (!d.ok() || !spec.ok() || !writer.ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  RawRows rows;
  std::vector<float> probs;
  d->GenerateChunk(0, o.chunk_rows, &rows, &probs);
  int64_t written = 0;
  for (auto _ : state) {
    if (!(*writer)->Write(rows, 0, rows.size()).ok()) state.SkipWithError("write failed");
    written += rows.size();
  }
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(written), benchmark::Counter::kIsRate);
  state.SetLabel(DataFormatName(format));
}
BENCHMARK(BM_Write)->DenseRange(CRITEO_TSV, RECORDIO)->Unit(benchmark::kMillisecond);

void BM_Create(benchmark::State& state) {
  DatagenOptions o;
  for (auto _ : state) benchmark::DoNotOptimize(SyntheticData::Create(o));
}
BENCHMARK(BM_Create)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
