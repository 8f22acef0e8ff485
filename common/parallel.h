// The one helper for CPU parallel regions (after oneDNN's dnnl_thread.hpp): a tower calls
// ParallelFor with its own team size; regions never nest. Work is split with Balance211.
#pragma once

#include <omp.h>

#include <cstdint>

namespace pstrain {

// Splits n items over nthr workers as evenly as possible (oneDNN's balance211): worker ithr gets
// [*start, *end).
inline void Balance211(int64_t n, int nthr, int ithr, int64_t* start, int64_t* end) {
  const int64_t base = n / nthr, rem = n % nthr;
  *start = ithr * base + (ithr < rem ? ithr : rem);
  *end = *start + base + (ithr < rem ? 1 : 0);
}

// The team size for n items of which fewer than `min_per_thread` a thread cost more in the
// team's start than they save: at most `threads`, at least 1.
inline int ThreadsWorthIt(int64_t n, int threads, int64_t min_per_thread) {
  const int64_t useful = n / min_per_thread > 1 ? n / min_per_thread : 1;
  return static_cast<int>(threads < useful ? threads : useful);
}

// Runs fn(ithr, nthr, begin, end) over [0, n) on up to `threads` OpenMP threads. With threads <= 1,
// or when already inside a parallel region, runs inline on the caller (never nests).
template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn&& fn) {
  if (n <= 0) return;
  if (threads <= 1 || n == 1 || omp_in_parallel()) {
    fn(0, 1, int64_t{0}, n);
    return;
  }
  const int nthr = static_cast<int>(threads < n ? threads : n);
#pragma omp parallel num_threads(nthr)
  {
    const int ithr = omp_get_thread_num();
    const int team = omp_get_num_threads();
    int64_t b, e;
    Balance211(n, team, ithr, &b, &e);
    if (b < e) fn(ithr, team, b, e);
  }
}

}  // namespace pstrain
