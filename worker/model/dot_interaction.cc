#include "worker/model/dot_interaction.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/cpu.h"
#include "common/parallel.h"
#include "worker/model/simd.h"

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

inline int64_t PairIndex(int m, int lo, int hi) {  // p(lo, hi), lo < hi
  return static_cast<int64_t>(lo) * (2 * m - lo - 1) / 2 + (hi - lo - 1);
}

// DotForward's outputs per register block (four AVX2 vectors, two AVX-512 ones).
constexpr int kBlock = 32;

}  // namespace

// The AVX-512 kernels for k = 16 (one vector a zmm register), reached only through KernelIsa().
// Why: the AVX2 loops above are latency-bound at DLRM's sizes (m = 27: a row's 2-26 outputs
// take a 32-wide block of 4 FMA chains, one chain per ymm, over the 16 steps d), and the
// transpose before them is 432 scalar stores an example. Here:
//   forward:  the example's m vectors transposed 16 at a time in registers, et[d][j]; then the
//             Gram rows G[i][j] = sum_d e_i[d] et[d][j] of 4 rows i x up to 3 blocks of 16
//             columns j at once (12 independent FMA chains), of which the lanes j > i, j < m are
//             stored (compressed to the output's packed row); summed over d in order from 0, as
//             before, so the dots are the same floats.
//   backward: d E = S E as before, 8 rows i at once (8 chains of one zmm each, sharing each
//             e_j's load), summed over j in increasing order as before.
#if defined(__clang__)  // clang ignores #pragma GCC target (the fuzz preset builds with clang)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 warns of the intrinsics' own undefined pass-through operands (`__Y`) in the unpacks.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace dot_avx512 {

constexpr int kRowsF = 4;   // forward: rows i a register block
constexpr int kMaxCols = 3;  // forward: blocks of 16 columns j a register block
constexpr int kRowsB = 8;   // backward: rows i a register block

// The 64-bit halves of a and b interleaved (lo: the even ones, hi: the odd ones).
inline __m512 Lo64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
inline __m512 Hi64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// r[t][d] -> r[d][t] for a 16 x 16 block of floats.
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int p = 0; p < 8; ++p) {
    t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int q = 0; q < 4; ++q) {
    r[4 * q + 0] = Lo64(t[4 * q + 0], t[4 * q + 2]);
    r[4 * q + 1] = Hi64(t[4 * q + 0], t[4 * q + 2]);
    r[4 * q + 2] = Lo64(t[4 * q + 1], t[4 * q + 3]);
    r[4 * q + 3] = Hi64(t[4 * q + 1], t[4 * q + 3]);
  }
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      t[8 * h + c] = _mm512_shuffle_f32x4(r[8 * h + c], r[8 * h + 4 + c], 0x88);
      t[8 * h + 4 + c] = _mm512_shuffle_f32x4(r[8 * h + c], r[8 * h + 4 + c], 0xdd);
    }
  }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
}

// The dots of rows i0 .. i0 + kRowsF - 1 against the columns c0 .. c0 + 16 NC - 1 of et
// [16][ld], stored into the example's packed outputs `out` where j > i and j < m.
template <int NC>
inline void GramBlock(const float* const e[kRowsF], const float* et, int ld, int c0, int i0,
                      int m, float* out) {
  __m512 acc[kRowsF][NC];
  for (int r = 0; r < kRowsF; ++r) {
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int d = 0; d < 16; ++d) {
    __m512 col[NC];
    for (int c = 0; c < NC; ++c) col[c] = _mm512_load_ps(et + d * ld + c0 + 16 * c);
    for (int r = 0; r < kRowsF; ++r) {
      const __m512 a = _mm512_set1_ps(e[r][d]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(a, col[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRowsF; ++r) {
    const int i = i0 + r;
    if (i >= m - 1) break;
    float* row = out + PairIndex(m, i, i + 1);  // row[t] is the output of (i, i + 1 + t)
    for (int c = 0; c < NC; ++c) {
      const int base = c0 + 16 * c;
      const int lo = std::max(base, i + 1), hi = std::min(base + 16, m);
      if (lo >= hi) continue;
      const uint32_t lanes = ((1u << (hi - base)) - 1) & ~((1u << (lo - base)) - 1);
      const __m512 packed = _mm512_maskz_compress_ps(static_cast<__mmask16>(lanes), acc[r][c]);
      _mm512_mask_storeu_ps(row + (lo - i - 1), static_cast<__mmask16>((1u << (hi - lo)) - 1),
                            packed);
    }
  }
}

// et: 64-byte aligned scratch of 16 x ld floats, ld = m rounded up to 16.
void ForwardExample(const DotShape& s, const float* front, const float* x0, int64_t b,
                    float* out, float* et) {
  const int m = s.vectors(), ld = (m + 15) / 16 * 16;
  for (int j0 = 0; j0 < ld; j0 += 16) {
    __m512 r[16];
    for (int t = 0; t < 16; ++t) {
      r[t] = j0 + t < m ? _mm512_loadu_ps(Vector(s, front, x0, b, j0 + t)) : _mm512_setzero_ps();
    }
    Transpose16(r);
    for (int d = 0; d < 16; ++d) _mm512_store_ps(et + d * ld + j0, r[d]);
  }
  for (int i0 = 0; i0 < m - 1; i0 += kRowsF) {
    const float* e[kRowsF];
    // Rows past m - 2 have no outputs; they read a valid row and are not stored.
    for (int r = 0; r < kRowsF; ++r) e[r] = Vector(s, front, x0, b, std::min(i0 + r, m - 1));
    for (int c0 = (i0 + 1) / 16 * 16; c0 < ld; c0 += 16 * kMaxCols) {
      switch (std::min(kMaxCols, (ld - c0) / 16)) {
        case 3: GramBlock<3>(e, et, ld, c0, i0, m, out); break;
        case 2: GramBlock<2>(e, et, ld, c0, i0, m, out); break;
        default: GramBlock<1>(e, et, ld, c0, i0, m, out); break;
      }
    }
  }
}

// r[t][c] -> r[c][t] for an 8 x 8 block of floats.
inline void Transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xee);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// The diagonal 8 x 8 block (rows and columns i0 .. i0 + 7) of the symmetric matrix of the
// pairs' gradients, s[i][j] = d[p(min, max)], zero on the diagonal and past m: the upper
// triangle U's rows expanded from d's contiguous rows, then U + U^T through a register
// transpose (each entry one of d's floats plus an exact 0).
inline void DiagonalBlock(int m, int i0, const float* d, float blk[kRowsB][kRowsB]) {
  __m256 u[kRowsB], v[kRowsB];
  for (int r = 0; r < kRowsB; ++r) {
    const int i = i0 + r, hi = std::min(i0 + kRowsB, m);  // columns i + 1 .. hi - 1
    const uint32_t lanes = i + 1 < hi ? ((1u << (hi - i0)) - 1) & ~((1u << (r + 1)) - 1) : 0;
    const float* drow = lanes != 0 ? d + PairIndex(m, i, i + 1) : d;
    u[r] = v[r] = _mm256_maskz_expandloadu_ps(static_cast<__mmask8>(lanes), drow);
  }
  Transpose8(v);
  for (int r = 0; r < kRowsB; ++r) _mm256_store_ps(blk[r], _mm256_add_ps(u[r], v[r]));
}

// d E = S E, S the symmetric matrix of the pairs' gradients (s[i][j] = d[p(min(i, j), max(i,
// j))], zero on the diagonal), 8 rows i at once, each row's sum over j in increasing order. S is
// not built: its coefficients are broadcast from d's packed rows where they lie, in three runs
// of j for the block of rows i0 .. i0 + 7:
//   j < i0:       s[i0 + r][j] = d[p(j, i0) + r], 8 consecutive floats of d's row j;
//   i0 <= j < i0 + 8: the diagonal 8 x 8 block (DiagonalBlock);
//   j >= i0 + 8:  s[i0 + r][j] = d[p(i0 + r, j)], each row's own run of d.
// (Building S first, SymmetricPairs, wrote and reread ld x ld floats and transposed its blocks:
// half of the backward's samples in DLRM's step profile at m = 27, docs/PERFORMANCE.md.) The
// FMAs and their order are the ones the built S had, so the floats are too. d: the example's
// packed pairs' gradients; dz: 64-byte aligned scratch of pairs + 16 floats, its tail zero: d
// copied there so that the first run's reads for the rows past m (not stored) stay inside it.
void BackwardExample(const DotShape& shape, const float* front, const float* x0, int64_t b,
                     const float* d, float* dz, float* d_front, float* dx0) {
  const int m = shape.vectors(), F = shape.fields;
  std::memcpy(dz, d, sizeof(float) * shape.pairs());
  alignas(32) float blk[kRowsB][kRowsB];
  for (int i0 = 0; i0 < m; i0 += kRowsB) {
    __m512 acc[kRowsB];
    for (int r = 0; r < kRowsB; ++r) acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < i0; ++j) {
      const __m512 ej = _mm512_loadu_ps(Vector(shape, front, x0, b, j));
      const float* c = dz + PairIndex(m, j, i0);
      for (int r = 0; r < kRowsB; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(c[r]), ej, acc[r]);
      }
    }
    DiagonalBlock(m, i0, dz, blk);
    const int mid = std::min(i0 + kRowsB, m);
    for (int j = i0; j < mid; ++j) {
      const __m512 ej = _mm512_loadu_ps(Vector(shape, front, x0, b, j));
      for (int r = 0; r < kRowsB; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(blk[r][j - i0]), ej, acc[r]);
      }
    }
    if (mid < m) {  // then every row of the block is below m - 1
      const float* q[kRowsB];  // q[r][j] = d[p(i0 + r, j)]
      for (int r = 0; r < kRowsB; ++r) {
        const int i = i0 + r;
        q[r] = dz + PairIndex(m, i, i + 1) - (i + 1);
      }
      for (int j = mid; j < m; ++j) {
        const __m512 ej = _mm512_loadu_ps(Vector(shape, front, x0, b, j));
        for (int r = 0; r < kRowsB; ++r) {
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][j]), ej, acc[r]);
        }
      }
    }
    for (int r = 0; r < kRowsB && i0 + r < m; ++r) {
      const int i = i0 + r;
      float* g = shape.front && i == 0 ? d_front + b * 16
                                       : dx0 + (b * F + i - (shape.front ? 1 : 0)) * 16;
      _mm512_storeu_ps(g, acc[r]);
    }
  }
}

}  // namespace dot_avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

void DotForward(const DotShape& shape, int n, const float* front, const float* x0, float* dots,
                int64_t out_stride, int threads) {
  const int m = shape.vectors(), k = shape.dim;
  if (k == 16 && KernelIsa() >= Isa::kAvx512Core) {
    ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
      AlignedArray<float> et(16 * static_cast<size_t>((m + 15) / 16 * 16));
      for (int64_t b = begin; b < end; ++b) {
        dot_avx512::ForwardExample(shape, front, x0, b, dots + b * out_stride, et.data());
      }
    });
    return;
  }
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
  if (shape.dim == 16 && KernelIsa() >= Isa::kAvx512Core) {
    ParallelFor(n, threads, [&](int, int, int64_t begin, int64_t end) {
      AlignedArray<float> s(static_cast<size_t>(shape.pairs()) + 16);
      s.Zero();  // the tail past the pairs stays zero
      for (int64_t b = begin; b < end; ++b) {
        dot_avx512::BackwardExample(shape, front, x0, b, d_dots + b * in_stride, s.data(),
                                    d_front, dx0);
      }
    });
    return;
  }
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
