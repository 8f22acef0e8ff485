// The dense half of the models with a CROSS_V2 or DOT interaction (DCN-v2, DLRM, BLOCKS): what
// runs between the sparse forward's x0 = concat_f s_f v_f [n, F*k] and the logit, and back.
// (DEEPFM, LR, FM, WIDE_DEEP and BLOCKS without these interactions keep the tower's plain MLP
// path, bit for bit.) See ModelBlocks in proto/pstrain/config.proto for the grammar:
//
//   CROSS_V2, STACKED:   logit += MLP(x_L)                        x_L = CrossNetwork(x0)
//   CROSS_V2, PARALLEL:  logit += MLP(x0) + x_L . cross_out/w     (= the final linear layer over
//                                                                  [x_L, MLP's last hidden layer])
//   CROSS_V2, no MLP:    logit += x_L . cross_out/w + cross_out/b
//   DOT:                 logit += MLP([bottom(d), dots(bottom(d), x_1 .. x_F)])
//                        d = the DENSE numeric fields' values (their scales); without such
//                        fields there is no bottom MLP and the top MLP reads the dots alone.
//
// Thread-safety: none; one DenseBlocks per tower, driven from the tower's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/bottom_mlp.h"
#include "worker/model/cross_network.h"
#include "worker/model/dot_interaction.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"
#include "worker/model/simd.h"

namespace pstrain {

class DenseBlocks {
 public:
  struct Options {
    int num_fields = 0;  // F
    int dim = 0;         // k
    // CROSS_V2 when cross.layers is not empty.
    CrossNetwork::Options cross;
    bool parallel = false;     // Join PARALLEL
    int64_t cross_out_w = -1;  // [D]: PARALLEL, or no MLP
    int64_t cross_out_b = -1;  // [1]: no MLP
    // DOT when dot; the bottom MLP when bottom.layers is not empty (its input: the scales of
    // dense_fields, in that order).
    bool dot = false;
    std::vector<int> dense_fields;
    BottomMlp::Options bottom;
    // The MLP (DOT: the top MLP), when present. Its bf16 flag is the model's precision.
    std::optional<Mlp::Options> mlp;
    int max_batch = 0;
    int threads = 1;
  };

  static absl::StatusOr<std::unique_ptr<DenseBlocks>> Create(const Options& options);
  DenseBlocks(const DenseBlocks&) = delete;
  DenseBlocks& operator=(const DenseBlocks&) = delete;

  // Where SparseForward writes x0 [n, D] (f32) before Forward: D = cross.dim for CROSS_V2 (sum_f
  // d_f with per-field dims), F*k for DOT (whose fields all have dim k).
  float* x0();

  // logits[b] += the blocks' output for b < in.n. Keeps what Backward needs.
  absl::Status Forward(const Tower::Input& in, float* logits);

  // After Forward(in): ADDS d(sum_b g_b logit_b)/d(dense) into dense_grad for the blocks' tensors
  // and returns d(sum_b g_b logit_b)/d x0 [n, D], valid until the next call (the caller may
  // adjust it in place: the blocks do not read it again).
  absl::StatusOr<float*> Backward(const Tower::Input& in, const float* g, float* dense_grad);

 private:
  explicit DenseBlocks(const Options& options) : opt_(options) {}
  // x0's floats per example: the cross network's width (sum_f d_f with per-field dims), or F*k.
  int64_t X0Width() const {
    return !opt_.cross.layers.empty() ? int64_t{opt_.cross.dim}
                                      : int64_t{opt_.num_fields} * opt_.dim;
  }
  // Copies [n, width] f32 rows into the MLP's input buffer (converting under bf16).
  void ToMlpInput(const float* src, int n, int64_t width);
  int64_t top_width() const;

  Options opt_;
  DotShape dot_shape_;
  std::unique_ptr<CrossNetwork> cross_;
  std::unique_ptr<BottomMlp> bottom_;
  std::unique_ptr<Mlp> mlp_;
  AlignedArray<float> x0_;     // DOT: x0
  AlignedArray<float> top_;    // DOT under bf16: the top MLP's input in f32, [n, top_width()]
  AlignedArray<float> dx0_;    // PARALLEL: the sum of both paths' dx0; DOT: dx0
  AlignedArray<float> dout_;   // CROSS_V2 with the linear head: d x_L; DOT: d bottom output
};

}  // namespace pstrain
