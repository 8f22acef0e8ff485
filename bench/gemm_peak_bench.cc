// The oneDNN matmul roof on DeepFM's shapes (bench/gemm_peak.h), as a benchmark:
//   gemm_peak_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Arguments: bf16 (0/1), threads, K (624: the first layer, 400: the others); M = 1024, N = 400.
// BM_DinAttentionGemms: DIN's attention GEMMs in one chunk and in one piece (below).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <utility>
#include <vector>

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

// DIN's attention GEMMs (configs/din.textproto: k = 16, one 36-wide layer; the per-entry ones,
// bench/model_gemms.h): forward (M, 2k, 36), backward-weights (2k, M, 36) and backward-data
// (M, 36, 2k), one thread, their FLOP-weighted roof at M rows. M = 1024 is the chunk
// TargetAttention runs them in (Options::chunk_rows); 26,112 is a 1,024-example tower batch of
// histories ~25.5 long in one piece, the shape the step bench's roof counts
// (train_throughput_app): the two rates say whether the chunks cost the GEMMs anything.
void BM_DinAttentionGemms(benchmark::State& state) {
  const int64_t m = state.range(0), k2 = 32, n = 36;
  const std::vector<std::pair<GemmShape, int>> gemms = {
      {GemmShape{m, k2, n, false, false, false}, 1},
      {GemmShape{k2, m, n, true, false, false}, 1},
      {GemmShape{m, n, k2, false, true, false}, 1}};
  double gflops = 0;
  for (auto _ : state) {
    gflops = GemmsRoofGflops(gemms, [](const GemmShape& g) { return GemmShapeGflops(g, 1); });
  }
  if (gflops == 0) state.SkipWithError("oneDNN could not run these matmuls");
  state.counters["GFLOP/s"] = gflops;
}
BENCHMARK(BM_DinAttentionGemms)
    ->ArgNames({"M"})
    ->Arg(1024)
    ->Arg(26112)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace pstrain

PSTRAIN_BENCHMARK_MAIN()
