#include "worker/model/simd.h"

#include "common/cpu.h"

namespace pstrain {
namespace {

#if defined(__clang__)  // clang ignores #pragma GCC target (the fuzz preset builds with clang)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#endif
void FloatToBf16Avx512Bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(v));
  }
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i>(v));
  }
  for (; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

}  // namespace

void FloatToBf16(const float* src, uint16_t* dst, int64_t n) {
  if (KernelIsa() >= Isa::kAvx512CoreBf16) return FloatToBf16Avx512Bf16(src, dst, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

}  // namespace pstrain
