// The machine's GEMM roof, measured with the same oneDNN matmul the towers use (row-major f32 or
// bf16, an operand optionally read transposed as backward passes read it), so that end-to-end
// throughput can be quoted as a fraction of what the model's GEMMs could reach on this CPU: for
// DeepFM's MLP shapes (DeepFmMlpRoofGflops), or for any list of shapes (GemmsRoofGflops; the
// model's own list is bench/model_gemms.h's).
//
// Header-only: used by bench/gemm_peak_bench.cc and by end-to-end benchmark apps.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace pstrain {

// One GEMM C[M,N] = op(A)[M,K] op(B)[K,N], row-major, an operand read transposed through its
// layout (trans_a: A stored [K, M]; trans_b: B stored [N, K]) as a backward pass reads it.
struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
  bool trans_a = false, trans_b = false;
  bool bf16 = false;
  double flops() const { return 2.0 * m * k * n; }
};

// GFLOP/s (2 M N K per product) of `shape` on `threads` OpenMP threads: the median over `runs`
// timed runs of about 30 ms each, after a warm-up. Sets the calling thread's OpenMP thread count
// to `threads` (oneDNN's OpenMP runtime takes it from there). Returns 0 if oneDNN cannot create or
// run the primitive (e.g. bf16 on a CPU without AVX512-BF16 or AMX).
inline double GemmShapeGflops(const GemmShape& shape, int threads, int runs = 5) {
  using dnnl::memory;
  using Clock = std::chrono::steady_clock;
  omp_set_num_threads(threads);
  const int64_t m = shape.m, k = shape.k, n = shape.n;
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    const memory::data_type dt = shape.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    using tag = memory::format_tag;
    const memory::desc a_md({m, k}, dt, shape.trans_a ? tag::ba : tag::ab);
    const memory::desc b_md({k, n}, dt, shape.trans_b ? tag::ba : tag::ab);
    const memory::desc c_md({m, n}, dt, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    const dnnl::matmul matmul(pd);
    memory a(a_md, engine), b(b_md, engine), c(c_md, engine);
    // Small finite values (0x3c3c.. is about 0.0115 in f32 and in bf16): no denormals, no NaNs.
    std::memset(a.get_data_handle(), 0x3c, a_md.get_size());
    std::memset(b.get_data_handle(), 0x3c, b_md.get_size());
    const std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    auto run = [&](int iters) {
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) matmul.execute(stream, args);
      stream.wait();
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    // Warm up (page faults, AMX tile state, frequency), then size each run to about 30 ms.
    double t = run(3) / 3;
    const int iters = std::max(1, static_cast<int>(0.03 / std::max(t, 1e-9)));
    std::vector<double> gflops;
    for (int r = 0; r < std::max(runs, 1); ++r) {
      t = run(iters) / iters;
      gflops.push_back(shape.flops() / t * 1e-9);
    }
    std::nth_element(gflops.begin(), gflops.begin() + gflops.size() / 2, gflops.end());
    return gflops[gflops.size() / 2];
  } catch (const dnnl::error&) {
    return 0.0;
  }
}

// GemmShapeGflops of the plain C[M,N] = A[M,K] B[K,N]. DeepFM's shapes are M = 1024 examples,
// K = 624 (39 fields x 16) or 400, N = 400.
inline double GemmPeakGflops(bool bf16, int threads, int m = 1024, int k = 624, int n = 400,
                             int runs = 5) {
  GemmShape shape;
  shape.m = m;
  shape.k = k;
  shape.n = n;
  shape.bf16 = bf16;
  return GemmShapeGflops(shape, threads, runs);
}

// The summed GFLOP/s of `streams` single-threaded GEMMs of `shape` running at the same time on
// their own threads: the roof of `streams` towers of one thread each, which contend for the cores
// (two vCPUs may share a physical core), the caches and memory bandwidth as the towers do.
inline double ConcurrentGemmShapeGflops(const GemmShape& shape, int streams, int runs = 5) {
  std::vector<double> each(streams, 0.0);
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] { each[s] = GemmShapeGflops(shape, 1, runs); });
  }
  for (std::thread& t : threads) t.join();
  double sum = 0;
  for (double g : each) sum += g;
  return sum;
}

inline double ConcurrentGemmPeakGflops(bool bf16, int streams, int m = 1024, int k = 624,
                                       int n = 400, int runs = 5) {
  GemmShape shape;
  shape.m = m;
  shape.k = k;
  shape.n = n;
  shape.bf16 = bf16;
  return ConcurrentGemmShapeGflops(shape, streams, runs);
}

// The roof of a list of GEMMs (each run `count` times a step): their FLOPs over the time they
// would take if each ran at its own measured rate, i.e. the FLOP-weighted harmonic mean of the
// rates. `rate` measures one shape in GFLOP/s. 0 if any shape cannot run.
template <typename Rate>
double GemmsRoofGflops(const std::vector<std::pair<GemmShape, int>>& gemms, Rate rate) {
  double flops = 0, seconds = 0;
  for (const auto& [shape, count] : gemms) {
    const double g = rate(shape);
    if (g <= 0) return 0.0;
    flops += count * shape.flops();
    seconds += count * shape.flops() / g;
  }
  return seconds > 0 ? flops / seconds : 0.0;
}

// The MLP roof of DeepFM k=16, F=39, 400-400-400 in GFLOP/s: GemmPeakGflops at K = 624 and
// K = 400 combined by their share of the MLP's FLOPs (one 624x400 layer, two 400x400 ones), i.e.
// the rate at which the tower's GEMMs would run if every one ran at peak. Divide the tower's
// GFLOP/s (Model::flops_per_example() x examples/s) by it for "fraction of roof".
inline double DeepFmMlpRoofGflops(bool bf16, int threads, int runs = 5) {
  const double first = GemmPeakGflops(bf16, threads, 1024, 624, 400, runs);
  const double rest = GemmPeakGflops(bf16, threads, 1024, 400, 400, runs);
  if (first <= 0 || rest <= 0) return 0.0;
  const double a = 624.0 * 400, b = 2 * 400.0 * 400;
  return (a + b) / (a / first + b / rest);
}

}  // namespace pstrain
