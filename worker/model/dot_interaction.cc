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

inline float DotK(const float* __restrict a, const float* __restrict c, int k) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < k; ++j) sum += a[j] * c[j];
  return sum;
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
    for (int64_t b = begin; b < end; ++b) {
      float* out = dots + b * out_stride;
      for (int i = 0; i < m; ++i) {
        const float* ei = Vector(shape, front, x0, b, i);
        for (int j = i + 1; j < m; ++j) *out++ = DotK(ei, Vector(shape, front, x0, b, j), k);
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
