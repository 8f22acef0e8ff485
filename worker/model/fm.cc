#include "worker/model/fm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/cpu.h"
#include "worker/model/simd.h"

namespace pstrain {
namespace {

// kDim > 0 fixes k at compile time so that the j loops become a few full-width vector ops;
// kDim == 0 reads k from the shape.
template <int kDim>
void SparseForwardImpl(const SparseShape& shape, const Tower::Input& in, float bias, int64_t begin,
                       int64_t end, float* logits, float* sum_v, float* x0_f32, uint16_t* x0_bf16) {
  const int F = shape.num_fields;
  const int k = kDim > 0 ? kDim : shape.dim;
  const int64_t rd = 1 + k;
  const bool fm = shape.fm && k > 0;
  const bool deep = shape.deep && k > 0;
  alignas(64) float sum[kDim > 0 ? kDim : kMaxEmbeddingDim];
  alignas(64) float sq[kDim > 0 ? kDim : kMaxEmbeddingDim];
  alignas(64) float x[kDim > 0 ? kDim : kMaxEmbeddingDim];
  for (int64_t b = begin; b < end; ++b) {
    const int32_t* slots = in.slots + b * F;
    const float* scales = in.scales + b * F;
    float first = 0.f;
    for (int j = 0; j < k; ++j) sum[j] = sq[j] = 0.f;
    for (int f = 0; f < F; ++f) {
      const float s = scales[f];
      const float* r = in.rows + slots[f] * rd;
      first += s * r[0];
      if (!fm && !deep) continue;
      for (int j = 0; j < k; ++j) x[j] = s * r[1 + j];
      if (fm) {
        for (int j = 0; j < k; ++j) {
          sum[j] += x[j];
          sq[j] += x[j] * x[j];
        }
      }
      if (x0_f32 != nullptr) {
        float* out = x0_f32 + (b * F + f) * k;
        for (int j = 0; j < k; ++j) out[j] = x[j];
      } else if (x0_bf16 != nullptr) {
        FloatToBf16(x, x0_bf16 + (b * F + f) * k, k);
      }
    }
    float second = 0.f;
    if (fm) {
      for (int j = 0; j < k; ++j) second += sum[j] * sum[j] - sq[j];
      second *= 0.5f;
      if (sum_v != nullptr) {
        for (int j = 0; j < k; ++j) sum_v[b * k + j] = sum[j];
      }
    }
    logits[b] = bias + first + second;
  }
}

template <int kDim>
void SparseBackwardImpl(const SparseShape& shape, const Tower::Input& in, const float* g,
                        const float* sum_v, const float* dx0, float l2, const int32_t* entries,
                        int64_t num_entries, float* row_grads) {
  const int F = shape.num_fields;
  const int k = kDim > 0 ? kDim : shape.dim;
  const int64_t rd = 1 + k;
  const bool fm = shape.fm && k > 0;
  const bool deep = shape.deep && k > 0;
  alignas(64) float d[kDim > 0 ? kDim : kMaxEmbeddingDim];
  // Entries are increasing, so the example index only moves forward: no division per entry.
  int64_t b = 0, b_end = F;
  for (int64_t i = 0; i < num_entries; ++i) {
    const int64_t e = entries != nullptr ? entries[i] : i;
    while (e >= b_end) {
      ++b;
      b_end += F;
    }
    const float s = in.scales[e];
    const int64_t slot = in.slots[e];
    const float* r = in.rows + slot * rd;
    float* gr = row_grads + slot * rd;
    const float gb = g[b];
    gr[0] += gb * s + l2 * r[0];
    if (k == 0 || (!fm && !deep)) continue;
    for (int j = 0; j < k; ++j) d[j] = 0.f;
    if (fm) {
      const float* sv = sum_v + b * k;
      for (int j = 0; j < k; ++j) d[j] = gb * (sv[j] - s * r[1 + j]);
    }
    if (deep) {
      const float* dx = dx0 + e * k;
      for (int j = 0; j < k; ++j) d[j] += dx[j];
    }
    for (int j = 0; j < k; ++j) gr[1 + j] += s * d[j] + l2 * r[1 + j];
  }
}

// The list path (fm.h): each (b, f) pools its entries [offsets[e] - base, offsets[e+1] - base).
template <int kDim>
void SparseForwardListsImpl(const SparseShape& shape, const Tower::Input& in, float bias,
                            int64_t begin, int64_t end, float* logits, float* sum_v,
                            float* pooled, float* x0_f32, uint16_t* x0_bf16) {
  const int F = shape.num_fields;
  const int k = kDim > 0 ? kDim : shape.dim;
  const int64_t rd = 1 + k;
  const bool fm = shape.fm && k > 0;
  const bool deep = shape.deep && k > 0;
  const int32_t base = in.offsets[0];
  alignas(64) float sum[kDim > 0 ? kDim : kMaxEmbeddingDim];
  alignas(64) float sq[kDim > 0 ? kDim : kMaxEmbeddingDim];
  alignas(64) float x[kDim > 0 ? kDim : kMaxEmbeddingDim];
  for (int64_t b = begin; b < end; ++b) {
    float first = 0.f;
    for (int j = 0; j < k; ++j) sum[j] = sq[j] = 0.f;
    for (int f = 0; f < F; ++f) {
      const int64_t e = b * F + f;
      const int64_t lo = in.offsets[e] - base, hi = in.offsets[e + 1] - base;
      for (int j = 0; j < k; ++j) x[j] = 0.f;
      for (int64_t i = lo; i < hi; ++i) {
        const float s = in.scales[i];
        const float* r = in.rows + in.slots[i] * rd;
        first += s * r[0];
        if (!fm && !deep) continue;
        for (int j = 0; j < k; ++j) x[j] += s * r[1 + j];
      }
      if (!fm && !deep) continue;
      if (fm) {
        for (int j = 0; j < k; ++j) {
          sum[j] += x[j];
          sq[j] += x[j] * x[j];
        }
        if (pooled != nullptr) {
          for (int j = 0; j < k; ++j) pooled[e * k + j] = x[j];
        }
      }
      if (x0_f32 != nullptr) {
        for (int j = 0; j < k; ++j) x0_f32[e * k + j] = x[j];
      } else if (x0_bf16 != nullptr) {
        FloatToBf16(x, x0_bf16 + e * k, k);
      }
    }
    float second = 0.f;
    if (fm) {
      for (int j = 0; j < k; ++j) second += sum[j] * sum[j] - sq[j];
      second *= 0.5f;
      if (sum_v != nullptr) {
        for (int j = 0; j < k; ++j) sum_v[b * k + j] = sum[j];
      }
    }
    logits[b] = bias + first + second;
  }
}

template <int kDim>
void SparseBackwardListsImpl(const SparseShape& shape, const Tower::Input& in, const float* g,
                             const float* sum_v, const float* pooled, const float* dx0, float l2,
                             const int32_t* entries, int64_t num_entries, float* row_grads) {
  const int F = shape.num_fields;
  const int k = kDim > 0 ? kDim : shape.dim;
  const int64_t rd = 1 + k;
  const bool fm = shape.fm && k > 0;
  const bool deep = shape.deep && k > 0;
  const int32_t base = in.offsets[0];
  alignas(64) float d[kDim > 0 ? kDim : kMaxEmbeddingDim];
  // Entries increase, so the (example, field) cell and the example only move forward.
  int64_t e = 0, b = 0, b_end = F;
  for (int64_t n = 0; n < num_entries; ++n) {
    const int64_t i = entries != nullptr ? entries[n] : n;
    while (i >= in.offsets[e + 1] - base) ++e;
    while (e >= b_end) {
      ++b;
      b_end += F;
    }
    const float s = in.scales[i];
    const int64_t slot = in.slots[i];
    const float* r = in.rows + slot * rd;
    float* gr = row_grads + slot * rd;
    const float gb = g[b];
    gr[0] += gb * s + l2 * r[0];
    if (k == 0 || (!fm && !deep)) continue;
    for (int j = 0; j < k; ++j) d[j] = 0.f;
    if (fm) {
      const float* sv = sum_v + b * k;
      const float* x = pooled + e * k;
      for (int j = 0; j < k; ++j) d[j] = gb * (sv[j] - x[j]);
    }
    if (deep) {
      const float* dx = dx0 + e * k;
      for (int j = 0; j < k; ++j) d[j] += dx[j];
    }
    for (int j = 0; j < k; ++j) gr[1 + j] += s * d[j] + l2 * r[1 + j];
  }
}

// The general path for per-field dims (shape.layout, fm.h): plain loops over each field's d_f,
// for one entry per cell (kLists false) or the list path. Not the hot path of a uniform model,
// which keeps the fixed-k kernels; reference.cc is its twin.
template <bool kLists>
void MixedForward(const SparseShape& shape, const Tower::Input& in, float bias, int64_t begin,
                  int64_t end, float* logits, float* sum_v, float* pooled, float* x0_f32,
                  uint16_t* x0_bf16) {
  const FieldLayout& lay = *shape.layout;
  const int F = shape.num_fields;
  const int k = shape.dim;
  const int64_t rd = shape.row_dim(), D = lay.width;
  const bool fm = shape.fm;
  const int32_t base = kLists ? in.offsets[0] : 0;
  alignas(64) float sum[kMaxEmbeddingDim];
  alignas(64) float sq[kMaxEmbeddingDim];
  alignas(64) float x[kMaxEmbeddingDim];
  for (int64_t b = begin; b < end; ++b) {
    float first = 0.f;
    for (int j = 0; j < k; ++j) sum[j] = sq[j] = 0.f;
    for (int f = 0; f < F; ++f) {
      const int64_t e = b * F + f;
      const int64_t lo = kLists ? in.offsets[e] - base : e;
      const int64_t hi = kLists ? in.offsets[e + 1] - base : e + 1;
      const int d = lay.dim[f];
      for (int j = 0; j < d; ++j) x[j] = 0.f;
      for (int64_t i = lo; i < hi; ++i) {
        const float s = in.scales[i];
        const float* r = in.rows + in.slots[i] * rd;
        first += s * r[0];
        for (int j = 0; j < d; ++j) x[j] += s * r[1 + j];
      }
      if (fm && lay.fm[f]) {  // d == k (Model::Create)
        for (int j = 0; j < k; ++j) {
          sum[j] += x[j];
          sq[j] += x[j] * x[j];
        }
        if (pooled != nullptr) std::copy(x, x + k, pooled + e * k);
      }
      if (x0_f32 != nullptr) {
        std::copy(x, x + d, x0_f32 + b * D + lay.offset[f]);
      } else if (x0_bf16 != nullptr) {
        FloatToBf16(x, x0_bf16 + b * D + lay.offset[f], d);
      }
    }
    float second = 0.f;
    if (fm) {
      for (int j = 0; j < k; ++j) second += sum[j] * sum[j] - sq[j];
      second *= 0.5f;
      if (sum_v != nullptr) std::copy(sum, sum + k, sum_v + b * k);
    }
    logits[b] = bias + first + second;
  }
}

template <bool kLists>
void MixedBackward(const SparseShape& shape, const Tower::Input& in, const float* g,
                   const float* sum_v, const float* pooled, const float* dx0, float l2,
                   const int32_t* entries, int64_t num_entries, float* row_grads) {
  const FieldLayout& lay = *shape.layout;
  const int F = shape.num_fields;
  const int k = shape.dim;
  const int64_t rd = shape.row_dim(), D = lay.width;
  const bool fm = shape.fm, deep = shape.deep;
  const int32_t base = kLists ? in.offsets[0] : 0;
  // Entries increase, so the cell e = b*F + f and the example b only move forward.
  int64_t e = 0, b = 0, b_end = F;
  for (int64_t n = 0; n < num_entries; ++n) {
    const int64_t i = entries != nullptr ? entries[n] : n;
    if (kLists) {
      while (i >= in.offsets[e + 1] - base) ++e;
    } else {
      e = i;
    }
    while (e >= b_end) {
      ++b;
      b_end += F;
    }
    const int f = static_cast<int>(e - (b_end - F));
    const int d = lay.dim[f];
    const float s = in.scales[i];
    const int64_t slot = in.slots[i];
    const float* r = in.rows + slot * rd;
    float* gr = row_grads + slot * rd;
    const float gb = g[b];
    gr[0] += gb * s + l2 * r[0];
    const bool in_fm = fm && lay.fm[f];
    const float* sv = in_fm ? sum_v + b * k : nullptr;
    const float* px = in_fm && kLists ? pooled + e * k : nullptr;
    const float* dx = deep ? dx0 + b * D + lay.offset[f] : nullptr;
    for (int j = 0; j < d; ++j) {
      float dj = 0.f;
      if (in_fm) dj = gb * (sv[j] - (kLists ? px[j] : s * r[1 + j]));
      if (deep) dj += dx[j];
      gr[1 + j] += s * dj + l2 * r[1 + j];
    }
  }
}

}  // namespace

// The vector variants (worker/model/fm_vec.inc): AVX2 at the build's baseline; AVX-512, and
// AVX-512 with AVX512-BF16 stores, compiled for their ISA and reached only through KernelIsa().
namespace fm_avx2 {
constexpr int kWidth = 8;
#define PSTRAIN_FM_BF16_HW 0
#include "worker/model/fm_vec.inc"
#undef PSTRAIN_FM_BF16_HW
}  // namespace fm_avx2

#if defined(__clang__)  // clang ignores #pragma GCC target (the fuzz preset builds with clang)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif
namespace fm_avx512 {
constexpr int kWidth = 16;
#define PSTRAIN_FM_BF16_HW 0
#include "worker/model/fm_vec.inc"
#undef PSTRAIN_FM_BF16_HW
}  // namespace fm_avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)  // clang ignores #pragma GCC target (the fuzz preset builds with clang)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#endif
namespace fm_avx512_bf16 {
constexpr int kWidth = 16;
#define PSTRAIN_FM_BF16_HW 1
#include "worker/model/fm_vec.inc"
#undef PSTRAIN_FM_BF16_HW
}  // namespace fm_avx512_bf16
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

void SparseForward(const SparseShape& shape, const Tower::Input& in, float bias, int64_t begin,
                   int64_t end, float* logits, float* sum_v, float* x0_f32, uint16_t* x0_bf16) {
  if (shape.layout != nullptr) {
    return MixedForward<false>(shape, in, bias, begin, end, logits, sum_v, nullptr, x0_f32,
                               x0_bf16);
  }
  if ((shape.fm || shape.deep) && shape.dim > 0) {
    const Isa isa = KernelIsa();
    if (isa >= Isa::kAvx512CoreBf16 &&
        fm_avx512_bf16::ForwardAnyK(shape, in, bias, begin, end, logits, sum_v, x0_f32, x0_bf16)) {
      return;
    }
    if (isa >= Isa::kAvx512Core &&
        fm_avx512::ForwardAnyK(shape, in, bias, begin, end, logits, sum_v, x0_f32, x0_bf16)) {
      return;
    }
    if (fm_avx2::ForwardAnyK(shape, in, bias, begin, end, logits, sum_v, x0_f32, x0_bf16)) return;
  }
  if (shape.dim == 4) {
    return SparseForwardImpl<4>(shape, in, bias, begin, end, logits, sum_v, x0_f32, x0_bf16);
  }
  return SparseForwardImpl<0>(shape, in, bias, begin, end, logits, sum_v, x0_f32, x0_bf16);
}

void SparseBackward(const SparseShape& shape, const Tower::Input& in, const float* g,
                    const float* sum_v, const float* dx0, float l2, const int32_t* entries,
                    int64_t num_entries, float* row_grads) {
  if (shape.layout != nullptr) {
    return MixedBackward<false>(shape, in, g, sum_v, nullptr, dx0, l2, entries, num_entries,
                                row_grads);
  }
  if ((shape.fm || shape.deep) && shape.dim > 0) {
    if (KernelIsa() >= Isa::kAvx512Core &&
        fm_avx512::BackwardAnyK(shape, in, g, sum_v, dx0, l2, entries, num_entries, row_grads)) {
      return;
    }
    if (fm_avx2::BackwardAnyK(shape, in, g, sum_v, dx0, l2, entries, num_entries, row_grads)) {
      return;
    }
  }
  if (shape.dim == 4) {
    return SparseBackwardImpl<4>(shape, in, g, sum_v, dx0, l2, entries, num_entries, row_grads);
  }
  return SparseBackwardImpl<0>(shape, in, g, sum_v, dx0, l2, entries, num_entries, row_grads);
}

void SparseForwardLists(const SparseShape& shape, const Tower::Input& in, float bias,
                        int64_t begin, int64_t end, float* logits, float* sum_v, float* pooled,
                        float* x0_f32, uint16_t* x0_bf16) {
  if (shape.layout != nullptr) {
    return MixedForward<true>(shape, in, bias, begin, end, logits, sum_v, pooled, x0_f32,
                              x0_bf16);
  }
  if ((shape.fm || shape.deep) && shape.dim > 0) {
    const Isa isa = KernelIsa();
    if (isa >= Isa::kAvx512CoreBf16 &&
        fm_avx512_bf16::ForwardListsAnyK(shape, in, bias, begin, end, logits, sum_v, pooled,
                                         x0_f32, x0_bf16)) {
      return;
    }
    if (isa >= Isa::kAvx512Core &&
        fm_avx512::ForwardListsAnyK(shape, in, bias, begin, end, logits, sum_v, pooled, x0_f32,
                                    x0_bf16)) {
      return;
    }
    if (fm_avx2::ForwardListsAnyK(shape, in, bias, begin, end, logits, sum_v, pooled, x0_f32,
                                  x0_bf16)) {
      return;
    }
  }
  return SparseForwardListsImpl<0>(shape, in, bias, begin, end, logits, sum_v, pooled, x0_f32,
                                   x0_bf16);
}

void SparseBackwardLists(const SparseShape& shape, const Tower::Input& in, const float* g,
                         const float* sum_v, const float* pooled, const float* dx0, float l2,
                         const int32_t* entries, int64_t num_entries, float* row_grads) {
  if (shape.layout != nullptr) {
    return MixedBackward<true>(shape, in, g, sum_v, pooled, dx0, l2, entries, num_entries,
                               row_grads);
  }
  if ((shape.fm || shape.deep) && shape.dim > 0) {
    if (KernelIsa() >= Isa::kAvx512Core &&
        fm_avx512::BackwardListsAnyK(shape, in, g, sum_v, pooled, dx0, l2, entries, num_entries,
                                     row_grads)) {
      return;
    }
    if (fm_avx2::BackwardListsAnyK(shape, in, g, sum_v, pooled, dx0, l2, entries, num_entries,
                                   row_grads)) {
      return;
    }
  }
  return SparseBackwardListsImpl<0>(shape, in, g, sum_v, pooled, dx0, l2, entries, num_entries,
                                    row_grads);
}

double SigmoidCrossEntropy(const float* z, const float* y, int64_t begin, int64_t end, float* g) {
  double loss = 0.0;
  for (int64_t b = begin; b < end; ++b) {
    const float zb = z[b];
    const float e = std::exp(-std::fabs(zb));  // in (0, 1]: never overflows
    const float sigmoid = zb >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
    g[b] = sigmoid - y[b];
    loss += std::max(zb, 0.f) - zb * y[b] + std::log1p(e);
  }
  return loss;
}

int64_t SelectOwnedEntries(const int32_t* slots, int64_t num, int owner, int owners, int32_t* out) {
  int64_t m = 0;
  for (int64_t e = 0; e < num; ++e) {
    out[m] = static_cast<int32_t>(e);
    m += OwnerOfSlot(slots[e], owners) == owner;
  }
  return m;
}

}  // namespace pstrain
