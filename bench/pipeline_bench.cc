// Throughput of the input pipeline itself (framing, sharding, shuffling, batching, the thread
// hand-offs, the position bookkeeping) over the tests' fake line format, whose parse cost is
// close to nothing. The real formats' parse cost is measured by the formats' own bench.
//
//   BM_Sequential: one thread frames, parses and encodes the same records with no pipeline: the
//                  work the pipeline spreads over its threads, done the plain way. Compare
//                  records/s of BM_Pipeline with it.
//   BM_Pipeline/<reader_threads>/<shuffle_buffer>: Next() in a loop, one batch per iteration.
//
// Run: build/release/bench/pipeline_bench --benchmark_out=pipeline_bench.json
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"
#include <stdlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "tests/worker/data/fake_line_format.h"
#include "worker/data/pipeline.h"

namespace pstrain {
namespace {

constexpr int kFiles = 16;
constexpr int kRecordsPerFile = 65536;
constexpr int kBatch = 1024;

// The data set, written once per process into a temporary directory removed at exit.
const std::string& DataDir() {
  static const std::string* dir = [] {
    char tmpl[] = "/tmp/pstrain_pipeline_bench_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    auto* d = new std::string(tmpl);
    for (int f = 0; f < kFiles; ++f) {
      std::vector<int> values;
      for (int i = 0; i < kRecordsPerFile; ++i) values.push_back(f * kRecordsPerFile + i);
      if (!WriteFileAtomic(absl::StrCat(*d, "/part-", f), testing_fake::Lines(values)).ok()) {
        std::abort();
      }
    }
    std::atexit([] {
      if (std::system(("rm -rf " + *dir).c_str()) != 0) std::abort();
    });
    return d;
  }();
  return *dir;
}

void BM_Sequential(benchmark::State& state) {
  const FeatureSpec spec = testing_fake::FakeLineSpec();
  testing_fake::LineParser parser;
  std::vector<std::string> held(kBatch);
  std::vector<RecordRef> refs(kBatch);
  RawRows raw;
  std::vector<absl::Status> errors;
  Batch batch;
  std::unique_ptr<RecordSource> src;
  int file = 0;
  int64_t records = 0;
  for (auto _ : state) {
    raw.Clear(spec.num_fields());
    int n = 0;
    while (n < kBatch) {
      if (!src) {
        src = *testing_fake::LineSource::Open(CRITEO_TSV,
                                              absl::StrCat(DataDir(), "/part-", file++ % kFiles));
      }
      bool eof = false;
      if (!src->Next(&refs[n], &eof).ok()) std::abort();
      if (eof) {
        src.reset();
        continue;
      }
      held[n].assign(refs[n].data.data(), refs[n].data.size());  // the pipeline copies too
      refs[n].data = held[n];
      ++n;
    }
    parser.Parse(refs, &raw, &errors);
    batch.Clear(spec.num_fields());
    spec.Encode(raw, &batch);
    records += batch.size;
    benchmark::DoNotOptimize(batch.values.data());
  }
  state.SetItemsProcessed(records);
  state.counters["batches/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Sequential)->MinWarmUpTime(0.5)->UseRealTime();

void BM_Pipeline(benchmark::State& state) {
  PipelineOptions o;
  o.channels.emplace_back();
  o.channels[0].set_name("train");
  o.channels[0].add_path(DataDir());
  o.batch_size = kBatch;
  o.epochs = 0;
  o.reader_threads = static_cast<int>(state.range(0));
  o.shuffle_buffer = static_cast<int>(state.range(1));
  o.prefetch_batches = 4;
  o.formats = testing_fake::Formats();
  auto p = Pipeline::Create(o, testing_fake::FakeLineSpec());
  if (!p.ok()) {
    state.SkipWithError(std::string(p.status().message()).c_str());
    return;
  }
  Batch batch;
  int64_t epoch = 0, records = 0;
  for (auto _ : state) {
    auto more = (*p)->Next(&batch, &epoch);
    if (!more.ok() || !*more) {
      state.SkipWithError("pipeline ended");
      break;
    }
    records += batch.size;
  }
  state.SetItemsProcessed(records);
  state.counters["batches/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Pipeline)
    ->ArgNames({"reader_threads", "shuffle_buffer"})
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({1, 10000})
    ->Args({2, 10000})
    ->MinWarmUpTime(0.5)
    ->UseRealTime();

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
