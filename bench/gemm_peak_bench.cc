// The oneDNN matmul roof on DeepFM's shapes (bench/gemm_peak.h), as a benchmark:
//   gemm_peak_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Arguments: bf16 (0/1), threads, K (624: the first layer, 400: the others); M = 1024, N = 400.
#include <benchmark/benchmark.h>

#include "bench/bench_main.h"

#include "bench/gemm_peak.h"

namespace pstrain {
namespace {

void BM_GemmPeak(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const int threads = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  double gflops = 0;
  for (auto _ : state) gflops = GemmPeakGflops(bf16, threads, 1024, k, 400);
  if (gflops == 0) state.SkipWithError("oneDNN could not run this matmul");
  state.counters["GFLOP/s"] = gflops;
  state.counters["GFLOP/s/thread"] = gflops / threads;
  // The MLP roof in examples/s: DeepFM k=16, 400-400-400 needs 3.42 MFLOP per example.
  state.counters["roof_ex/s"] = gflops * 1e9 / 3.42e6;
}
BENCHMARK(BM_GemmPeak)
    ->ArgNames({"bf16", "threads", "K"})
    ->ArgsProduct({{0, 1}, {1, 2}, {624, 400}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
