// Plain f32 GEMMs on oneDNN for the dense blocks other than the MLP (cross network, DLRM's
// bottom MLP): C[M, N] (+)= op(A)[M, K] op(B)[K, N], row-major, with either operand read
// transposed through strides (no copy); RunBf16 the same with bf16 operands and an f32 C
// (oneDNN accumulates in f32; it needs AVX512-BF16 or AMX: CheckPrecisionSupported). Primitives
// are created once per shape and kept (a tower sees a handful of batch sizes); the buffers are
// bound per call.
//
// Thread-safety: none; one Matmuls per tower. oneDNN takes its team size from the calling
// thread's OpenMP thread count, which the tower sets.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "worker/model/simd.h"

namespace pstrain {

class Matmuls {
 public:
  struct Shape {
    int64_t m = 0, k = 0, n = 0;
    bool trans_a = false;     // A is stored [K, M] (row-major) and read as its transpose
    bool trans_b = false;     // B is stored [N, K] and read as its transpose
    bool accumulate = false;  // C += op(A) op(B) instead of C = op(A) op(B)
  };

  Matmuls();
  Matmuls(const Matmuls&) = delete;
  Matmuls& operator=(const Matmuls&) = delete;

  // Runs the GEMM (creating its primitive on first use) and waits for it. INTERNAL with
  // oneDNN's message when oneDNN fails.
  absl::Status Run(const Shape& shape, const float* a, const float* b, float* c);
  absl::Status RunBf16(const Shape& shape, const uint16_t* a, const uint16_t* b, float* c);
  // RunBf16 of f32 operands: both rounded to bf16 first (op(A) is M x K, op(B) K x N floats,
  // transposed or not: dense either way, so each converts as one array), over `threads` OpenMP
  // threads, into buffers kept for the next call.
  absl::Status RunRoundedToBf16(const Shape& shape, const float* a, const float* b, float* c,
                                int threads);

 private:
  absl::Status RunTyped(const Shape& shape, bool bf16, const void* a, const void* b, float* c);

  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, bool>;  // ..., bf16
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc a, b, c, scratchpad;
  };

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Key, Entry> cache_;
  AlignedArray<uint8_t> scratchpad_;
  AlignedArray<uint16_t> a16_, b16_;  // RunRoundedToBf16's operands
};

}  // namespace pstrain
