// DLRM's bottom MLP: ReLU layers a_l = ReLU(a_{l-1} W_l + b_l) over the values of the DENSE
// numeric fields, a_0 = [n, fields], the last layer of width embedding_dim (its output joins the
// embeddings in the dot interaction). W_l "bottom<l>/w" [in, out] row-major and b_l "bottom<l>/b"
// [out] live in the caller's dense vector. GEMMs on oneDNN (Matmuls); bias, ReLU and their
// backward are row loops. Nothing flows back into the input: it is data.
// Precision: Options::bf16 (model.precision BF16) runs every GEMM with bf16 operands (rounded
// from the f32 activations, weights and gradients just before it; f32 accumulation and outputs),
// as the cross network does; the bias, ReLU and everything kept between steps stay f32.
//
// Thread-safety: none; one BottomMlp per tower.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/matmul.h"
#include "worker/model/mlp.h"
#include "worker/model/simd.h"

namespace pstrain {

class BottomMlp {
 public:
  struct Options {
    std::vector<Mlp::Layer> layers;  // at least one; layers[l].in == layers[l-1].out
    int max_batch = 0;
    int threads = 1;
    bool bf16 = false;  // the GEMMs' operands in bf16 (needs AVX512-BF16 or AMX)
  };

  static absl::StatusOr<std::unique_ptr<BottomMlp>> Create(const Options& options);
  BottomMlp(const BottomMlp&) = delete;
  BottomMlp& operator=(const BottomMlp&) = delete;

  // Where the caller writes a_0 [n, layers[0].in] before Forward.
  float* input() { return a_[0].data(); }
  // The last layer's activation [n, out], valid after Forward.
  const float* output() const { return a_.back().data(); }
  int output_dim() const { return opt_.layers.back().out; }

  absl::Status Forward(int n, const float* dense);
  // After Forward(n, dense): ADDS d loss / d(its tensors) into dense_grad given
  // output_grad [n, out] = d loss / d output.
  absl::Status Backward(int n, const float* dense, const float* output_grad, float* dense_grad);

 private:
  explicit BottomMlp(const Options& options) : opt_(options) {}

  // gemm_.Run, or with opt_.bf16 gemm_.RunRoundedToBf16.
  absl::Status Gemm(const Matmuls::Shape& s, const float* a, const float* b, float* c);

  Options opt_;
  Matmuls gemm_;
  std::vector<AlignedArray<float>> a_;  // a_0 .. a_L
  AlignedArray<float> dz_[2];           // ping-pong: d loss / d pre-activation
};

}  // namespace pstrain
