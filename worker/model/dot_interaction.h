// DLRM's interaction (Naumov et al. 2019; torchrec's InteractionArch): the pairwise dot products
// of an example's m feature vectors of dimension k,
//   dots[p(i, j)] = <e_i, e_j>,  0 <= i < j < m,  p in row-major order of the upper triangle
//   ((0,1), (0,2), .., (0,m-1), (1,2), ..): P = m (m - 1) / 2 outputs,
// where e_0 = front[b] (the bottom MLP's output) when the model has one, and the rest are the
// fields' x_f = s_f v_f from x0 [n, F*k]. Vectorised loops over examples (k is small and the
// pairs many, so a batched GEMM would mostly compute the lower triangle twice), f32: forward
// vectorises over j (the example's vectors transposed, no horizontal sums; 32 outputs of a row
// held in registers over the k steps), backward over k.
// Backward: d e_i = sum_{j != i} d dots[p(i, j)] e_j, summed over j in increasing order; the
// pairs' gradients are first laid out as a symmetric m x m matrix S (zero diagonal), so that
// d E = S E runs four rows i at a time in registers (k = 16; other k one row at a time).
// On the AVX-512 path (KernelIsa() >= avx512_core) and k = 16, dot_interaction.cc's dot_avx512
// kernels: the forward as register blocks of the Gram matrix (4 rows x up to 48 columns, the
// vectors transposed 16 at a time in registers), the backward's S built with register
// transposes and d E = S E 8 rows at a time; same summation orders, so the same floats as the
// AVX2 path (dot_interaction_test), about 3x (forward) and 1.4x (backward) its speed at m = 40.
//
// Thread-safety: the functions are pure apart from their outputs; they split the examples over
// `threads` with ParallelFor.
#pragma once

#include <cstdint>

namespace pstrain {

struct DotShape {
  int fields = 0;      // F: the vectors in x0
  int dim = 0;         // k
  bool front = false;  // a front vector e_0 precedes the fields (m = F + 1)
  int vectors() const { return fields + (front ? 1 : 0); }
  int64_t pairs() const { return int64_t{vectors()} * (vectors() - 1) / 2; }
};

// dots[b * out_stride + p] for b < n. front: [n, k] or null when !shape.front; x0: [n, F*k].
void DotForward(const DotShape& shape, int n, const float* front, const float* x0, float* dots,
                int64_t out_stride, int threads);

// Writes (not adds) d_front [n, k] (when shape.front) and dx0 [n, F*k] from
// d_dots[b * in_stride + p].
void DotBackward(const DotShape& shape, int n, const float* front, const float* x0,
                 const float* d_dots, int64_t in_stride, float* d_front, float* dx0, int threads);

}  // namespace pstrain
