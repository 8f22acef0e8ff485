// Small building blocks of the model kernels: 64-byte aligned scratch arrays and f32 <-> bf16
// conversion (round to nearest even, as oneDNN and AVX512-BF16 do). The 8x8 transpose uses SSE2
// only, which every x86-64 CPU has.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/logging.h"

namespace pstrain {

// A fixed-size, 64-byte aligned, uninitialized array (cache-line aligned for the AVX-512 loops
// and oneDNN's buffers). Movable, not copyable.
template <typename T>
class AlignedArray {
 public:
  AlignedArray() = default;
  explicit AlignedArray(size_t n) : size_(n) {
    if (n == 0) return;
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    data_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    PSTRAIN_CHECK(data_ != nullptr) << "out of memory allocating " << bytes << " bytes";
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }
  void Zero() {
    if (size_) std::memset(data_.get(), 0, size_ * sizeof(T));
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

// bf16 as its raw 16 bits: the high half of an IEEE float.
inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaNs stay (quiet) NaNs.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// dst[i] = bf16(src[i]) for i < n: vcvtneps2bf16 where the kernel path has AVX512-BF16
// (worker/model/simd.cc), the scalar rounding above otherwise; both give the same bits.
void FloatToBf16(const float* src, uint16_t* dst, int64_t n);

// dst[c * ld + r] = src[r * cols + c] for 16-bit elements (bf16): writes the transpose of a
// row-major [rows, cols] matrix into columns [0, rows) of a [cols, ld] one, in 8x8 blocks of SSE
// unpacks (scalar loops for the edges).
inline void Transpose16(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst,
                        int64_t ld) {
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  // Columns outer: the 8 destination rows of a block are then written front to back. Rows outer
  // would write one 16-byte piece to each of `cols` destination rows, which with a power-of-two
  // ld all fall into the same two L1 sets.
  for (int64_t c = 0; c < cols8; c += 8) {
    for (int64_t r = 0; r < rows8; r += 8) {
      __m128i x[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) {
        x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (r + i) * cols + c));
      }
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm_unpacklo_epi16(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(x[2 * i], x[2 * i + 1]);
      }
      for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1)
        u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);
      }
      for (int i = 0; i < 4; ++i) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c + 2 * i) * ld + r),
                         _mm_unpacklo_epi64(u[i], u[4 + i]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c + 2 * i + 1) * ld + r),
                         _mm_unpackhi_epi64(u[i], u[4 + i]));
      }
    }
    for (int64_t r = rows8; r < rows; ++r) {
      for (int64_t i = c; i < c + 8; ++i) dst[i * ld + r] = src[r * cols + i];
    }
  }
  for (int64_t c = cols8; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) dst[c * ld + r] = src[r * cols + c];
  }
}

}  // namespace pstrain
