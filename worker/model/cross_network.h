// DCN-v2's cross network (Wang et al. 2021) over x0 [n, D], D = F*k, in f32:
//   x_{l+1} = x0 * y_l + x_l,  y_l = x_l W_l + b_l            (full rank; * is elementwise)
//   y_l = (x_l V_l) U_l + b_l                                (low rank r: V_l [D, r], U_l [r, D])
// for l < L; the output is x_L [n, D].
//
// Parameters live in the caller's flat dense vector (Model::dense_layout()): "cross<l>/w" [D, D]
// row-major (full), or "cross<l>/v" [D, r] and "cross<l>/u" [r, D] (low rank), and "cross<l>/b"
// [D]. The GEMMs run on oneDNN (Matmuls); the elementwise parts are row loops over examples.
// Backward, from G = dL/dx_{l+1}:  dy = G * x0,  db += sum_b dy,  dW += x_l^T dy (or
// dU += t^T dy, dt = dy U^T, dV += x_l^T dt with t = x_l V),  dx_l = G + dy W^T (or dt V^T),
// dx0 += G * y_l; and x0 is also x_0, so dx0 += dx_0 at the end.
//
// DCN-Mix (Options::experts = K >= 2, rank r > 0): the mixture of low-rank experts of the paper's
// section 4.2, with the nonlinearity g = tanh and the gate as DeepCTR's TF CrossNetMix has them
// (tfrs.layers.dcn.Cross has no mixture; TorchRec's LowRankMixtureCrossNet defaults g to ReLU):
//   y_l = sum_i p_i(x_l) tanh(tanh(x_l V_i) C_i) U_i + b_l,   p(x_l) = softmax_i(x_l . gate_i)
// in row form (the paper's U g(C g(V^T x)) transposed), V_i [D, r], C_i [r, r], U_i [r, D],
// gate [D, K] (one bias-free linear score per expert), b_l [D] one per layer as in the paper;
// then x_{l+1} = x0 * y_l + x_l as above (sum_i p_i = 1, so x0 * b_l is added once).
// Layer::w / c / u are the offsets of V_0 / C_0 / U_0, the experts' tensors consecutive
// ("cross<l>/v<i>", "cross<l>/c<i>", "cross<l>/u<i>"), and Layer::gate of "cross<l>/gate".
// Each expert's products are their own GEMMs (3K forward, 6K backward per layer, plus the gate's).
//
// Precision: Options::bf16 (model.precision BF16) runs every GEMM with bf16 operands (rounded from
// the f32 activations, weights and gradients just before each GEMM) and f32 accumulation and
// outputs; the elementwise parts, x_l, y_l and every gradient stay f32. Otherwise f32.
//
// Thread-safety: none; one CrossNetwork per tower, driven from the tower's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/matmul.h"
#include "worker/model/simd.h"

namespace pstrain {

class CrossNetwork {
 public:
  struct Layer {
    int64_t w = 0;  // full rank: offset of W_l [D, D]; low rank: offset of V_l [D, r]
    int64_t u = 0;  // low rank: offset of U_l [r, D]
    int64_t b = 0;  // offset of b_l [D]
    int64_t c = 0;     // experts >= 2: offset of C_0 [r, r] (C_i at c + i r r)
    int64_t gate = 0;  // experts >= 2: offset of the gate [D, K]
  };
  struct Options {
    int dim = 0;   // D
    int rank = 0;  // 0 = full rank
    int experts = 0;  // 0 or 1: one low-rank (or full) W_l; K >= 2: DCN-Mix (needs rank > 0)
    std::vector<Layer> layers;
    int max_batch = 0;
    int threads = 1;
    bool bf16 = false;  // the GEMMs' operands in bf16 (needs AVX512-BF16 or AMX)
  };

  static absl::StatusOr<std::unique_ptr<CrossNetwork>> Create(const Options& options);
  CrossNetwork(const CrossNetwork&) = delete;
  CrossNetwork& operator=(const CrossNetwork&) = delete;

  // Where the caller writes x0 [n, D] before Forward.
  float* input() { return x_[0].data(); }
  // x_L [n, D], valid after Forward.
  const float* output() const { return x_.back().data(); }
  // d(loss)/d x0 [n, D], valid after Backward.
  const float* input_grad() const { return dx0_.data(); }
  // The same buffer, for a caller that adjusts it in place: the network does not read it again.
  float* input_grad() { return dx0_.data(); }

  // Computes x_1 .. x_L for n <= max_batch examples from input().
  absl::Status Forward(int n, const float* dense);
  // After Forward(n, dense): ADDS d loss/d(its tensors) into dense_grad and writes input_grad(),
  // given output_grad [n, D] = d loss / d x_L.
  absl::Status Backward(int n, const float* dense, const float* output_grad, float* dense_grad);

 private:
  explicit CrossNetwork(const Options& options) : opt_(options) {}
  // gemm_.Run, or with opt_.bf16 gemm_.RunRoundedToBf16.
  absl::Status Gemm(const Matmuls::Shape& shape, const float* a, const float* b, float* c);
  // DCN-Mix's y_l (incl. b_l is added by the caller) for layer l, and its backward from dy,
  // which adds into dense_grad and g (= d loss / d x_l).
  absl::Status MixForward(int n, size_t l, const float* dense, float* y);
  absl::Status MixBackward(int n, size_t l, const float* dense, const float* dy, float* g,
                           float* dense_grad);

  Options opt_;
  Matmuls gemm_;
  std::vector<AlignedArray<float>> x_;  // x_0 .. x_L, each [max_batch, D]
  std::vector<AlignedArray<float>> y_;  // y_l incl. b_l, [max_batch, D]
  std::vector<AlignedArray<float>> t_;  // low rank: x_l V_l, [max_batch, r]; DCN-Mix:
                                        // tanh(x_l V_i), [K][n, r] (expert-major)
  // DCN-Mix: a2 = tanh(t C_i) and q = p_i a2 ([K][n, r]); p the gate's softmax [n, K].
  std::vector<AlignedArray<float>> a2_, q_, p_;
  AlignedArray<float> g_, dy_, dt_, dx0_;
  AlignedArray<float> da_, ds_;  // DCN-Mix backward scratch: [K][n, r] and [n, K]
};

}  // namespace pstrain
