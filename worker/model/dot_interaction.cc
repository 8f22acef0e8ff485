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

inline void Axpy(float alpha, const float* __restrict x, float* __restrict y, int k) {
#pragma omp simd
  for (int j = 0; j < k; ++j) y[j] += alpha * x[j];
}

}  // namespace

void DotForward(const DotShape& shape, int n, const float* front, const float* x0, float* dots,
                int64_t out_stride, int threads) {
  const int m = shape.vectors(), k = shape.dim;
  ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
    // The example's vectors transposed, et[d * m + j] = e_j[d]: row i's dots <e_i, e_j>, j > i,
    // are then k vector FMAs over j into the (contiguous) outputs, with no horizontal sums.
    std::vector<float> et(static_cast<size_t>(k) * m);
    for (int64_t b = begin; b < end; ++b) {
      for (int j = 0; j < m; ++j) {
        const float* ej = Vector(shape, front, x0, b, j);
        for (int d = 0; d < k; ++d) et[static_cast<size_t>(d) * m + j] = ej[d];
      }
      float* out = dots + b * out_stride;
      for (int i = 0; i < m - 1; ++i) {
        const float* ei = Vector(shape, front, x0, b, i);
        const int count = m - 1 - i;  // row[t] is the output of (i, i + 1 + t)
        float* __restrict row = out;
        std::fill(row, row + count, 0.f);
        for (int d = 0; d < k; ++d) {
          const float a = ei[d];
          const float* __restrict col = et.data() + static_cast<size_t>(d) * m + i + 1;
#pragma omp simd
          for (int t = 0; t < count; ++t) row[t] += a * col[t];
        }
        out += count;
      }
    }
  });
}

void DotBackward(const DotShape& shape, int n, const float* front, const float* x0,
                 const float* d_dots, int64_t in_stride, float* d_front, float* dx0, int threads) {
  const int m = shape.vectors(), k = shape.dim, F = shape.fields;
  ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
    std::vector<float*> grads(m);
    for (int64_t b = begin; b < end; ++b) {
      for (int i = 0; i < m; ++i) {
        const bool is_front = shape.front && i == 0;
        grads[i] = is_front ? d_front + b * k : dx0 + (b * F + i - (shape.front ? 1 : 0)) * k;
        std::fill(grads[i], grads[i] + k, 0.f);
      }
      const float* d = d_dots + b * in_stride;
      for (int i = 0; i < m; ++i) {
        const float* ei = Vector(shape, front, x0, b, i);
        for (int j = i + 1; j < m; ++j) {
          const float dp = *d++;
          Axpy(dp, Vector(shape, front, x0, b, j), grads[i], k);
          Axpy(dp, ei, grads[j], k);
        }
      }
    }
  });
}

}  // namespace pstrain
