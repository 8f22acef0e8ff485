#include "worker/model/dot_interaction.h"

#include <algorithm>
#include <vector>

#include "common/parallel.h"

namespace pstrain {
namespace {

// The example's vectors: e_0 = front (when present), then the F fields.
inline const float* Vector(const DotShape& s, const float* front, const float* x0, int64_t b,
                           int i) {
  const int64_t k = s.dim;
  if (s.front) {
    if (i == 0) return front + b * k;
    --i;
  }
  return x0 + (b * s.fields + i) * k;
}

// DotForward's outputs per register block (four AVX2 vectors, two AVX-512 ones).
constexpr int kBlock = 32;

}  // namespace

void DotForward(const DotShape& shape, int n, const float* front, const float* x0, float* dots,
                int64_t out_stride, int threads) {
  const int m = shape.vectors(), k = shape.dim;
  // The transposed vectors' rows are padded by a block so that a block's loads past m read zeros.
  const int64_t ld = m + kBlock;
  ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
    // The example's vectors transposed, et[d * ld + j] = e_j[d]: the dots <e_i, e_j>, j > i, of
    // row i are then k vector FMAs over j, kept in registers a block of kBlock outputs at a time
    // and stored once (no horizontal sums, no reloads of the outputs between the k steps).
    std::vector<float> et(static_cast<size_t>(k) * ld, 0.f);
    for (int64_t b = begin; b < end; ++b) {
      for (int j = 0; j < m; ++j) {
        const float* ej = Vector(shape, front, x0, b, j);
        for (int d = 0; d < k; ++d) et[static_cast<size_t>(d) * ld + j] = ej[d];
      }
      float* out = dots + b * out_stride;
      for (int i = 0; i < m - 1; ++i) {
        const float* ei = Vector(shape, front, x0, b, i);
        const int count = m - 1 - i;  // out[t] is the output of (i, i + 1 + t)
        for (int t0 = 0; t0 < count; t0 += kBlock) {
          // Summed over d in order from 0, as <e_i, e_j> always was.
          alignas(64) float acc[kBlock] = {};
          for (int d = 0; d < k; ++d) {
            const float a = ei[d];
            const float* __restrict col = et.data() + static_cast<size_t>(d) * ld + i + 1 + t0;
#pragma omp simd
            for (int t = 0; t < kBlock; ++t) acc[t] += a * col[t];
          }
          std::copy(acc, acc + std::min(kBlock, count - t0), out + t0);
        }
        out += count;
      }
    }
  });
}

namespace {

// Example b's d e_i = sum_{j != i} d dots[p(i, j)] e_j, summed over j in increasing order (the
// order the pairwise accumulation always had). K: k at compile time, 0 for the runtime k (the
// dimensions other than 16). With K, kRows rows i at once, each d e_i in registers and written
// once: kRows independent FMA chains share each e_j's load (one row's chain alone waits on the
// FMA latency).
constexpr int kRows = 4;

inline int64_t PairIndex(int m, int lo, int hi) {  // p(lo, hi), lo < hi
  return static_cast<int64_t>(lo) * (2 * m - lo - 1) / 2 + (hi - lo - 1);
}

template <int K>
void DotBackwardExample(const DotShape& shape, const float* front, const float* x0, int64_t b,
                        const float* d, float* d_front, float* dx0, std::vector<float>* sym) {
  const int m = shape.vectors(), F = shape.fields;
  const int k = K > 0 ? K : shape.dim;
  auto grad_of = [&](int i) {
    const bool is_front = shape.front && i == 0;
    return is_front ? d_front + b * k : dx0 + (b * F + i - (shape.front ? 1 : 0)) * k;
  };
  if (K == 0) {
    for (int i = 0; i < m; ++i) {
      float* a = grad_of(i);
      std::fill(a, a + k, 0.f);
      for (int j = 0; j < m; ++j) {
        if (j == i) continue;
        const float dp = d[PairIndex(m, std::min(i, j), std::max(i, j))];
        const float* __restrict ej = Vector(shape, front, x0, b, j);
#pragma omp simd
        for (int t = 0; t < k; ++t) a[t] += dp * ej[t];
      }
    }
    return;
  }
  // The symmetric matrix of the pairs' gradients, s[i * m + j] = d dots[p(min, max)], zero on the
  // diagonal and in the rows past m (padding to whole blocks of kRows). Adding 0 * e_i leaves
  // d e_i as it was (for a finite e_i: a non-finite one makes the dots non-finite anyway).
  std::vector<float>& s = *sym;
  const int padded = (m + kRows - 1) / kRows * kRows;
  s.assign(static_cast<size_t>(padded) * m, 0.f);
  for (int i = 0; i < m; ++i) {
    for (int j = i + 1; j < m; ++j) {
      const float dp = *d++;
      s[static_cast<size_t>(i) * m + j] = dp;
      s[static_cast<size_t>(j) * m + i] = dp;
    }
  }
  for (int i0 = 0; i0 < m; i0 += kRows) {
    alignas(64) float acc[kRows][K > 0 ? K : 1] = {};
    const float* srow = s.data() + static_cast<size_t>(i0) * m;
    for (int j = 0; j < m; ++j) {
      const float* __restrict ej = Vector(shape, front, x0, b, j);
      for (int r = 0; r < kRows; ++r) {
        const float dp = srow[static_cast<size_t>(r) * m + j];
#pragma omp simd
        for (int t = 0; t < K; ++t) acc[r][t] += dp * ej[t];
      }
    }
    for (int r = 0; r < kRows && i0 + r < m; ++r) std::copy(acc[r], acc[r] + K, grad_of(i0 + r));
  }
}

}  // namespace

void DotBackward(const DotShape& shape, int n, const float* front, const float* x0,
                 const float* d_dots, int64_t in_stride, float* d_front, float* dx0, int threads) {
  ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
    std::vector<float> sym;
    for (int64_t b = begin; b < end; ++b) {
      const float* d = d_dots + b * in_stride;
      if (shape.dim == 16) {
        DotBackwardExample<16>(shape, front, x0, b, d, d_front, dx0, &sym);
      } else {
        DotBackwardExample<0>(shape, front, x0, b, d, d_front, dx0, &sym);
      }
    }
  });
}

}  // namespace pstrain
