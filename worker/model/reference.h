// The plain double-precision twin of the CTR tower (FBGEMM's RefImplementations habit): the
// model of worker/model/model.h written as directly as possible, with no blocking, threads or oneDNN.
// Tests compare the fast tower's forward with it, and its gradients with central finite
// differences of ReferenceObjective.
#pragma once

#include <cstdint>
#include <vector>

#include "pstrain/config.pb.h"
#include "worker/model/cross_network.h"
#include "worker/model/dot_interaction.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"

namespace pstrain {

// Like Tower::Input, with the parameters in double so that finite differences are exact enough.
struct ReferenceInput {
  int n = 0;
  const int32_t* slots = nullptr;  // [n*F]
  const float* scales = nullptr;   // [n*F]
  const float* labels = nullptr;   // [n]
  const double* rows = nullptr;    // [U * model.row_dim()]
  const double* dense = nullptr;   // [model.dense_size()]
  // As Tower::Input::offsets: null, or [n*F+1] with the entries of (b, f) at
  // [offsets[b*F+f] - offsets[0], offsets[b*F+f+1] - offsets[0]) of slots / scales, pooled.
  const int32_t* offsets = nullptr;
};

// The n logits. `model` supplies the shapes (fields, k, per-field dims and FM exclusions, dense
// layout, dense fields); `config`
// the type and blocks (every ModelType, DCN_V2, DLRM and BLOCKS included).
std::vector<double> ReferenceLogits(const ModelConfig& config, const Model& model,
                                    const ReferenceInput& in);

// sum_b sigmoid cross-entropy(logit_b, label_b): what Tower::ForwardBackward returns.
double ReferenceLoss(const ModelConfig& config, const Model& model, const ReferenceInput& in);

// ReferenceLoss + (embedding_l2 / 2) * sum over entries (b, f) (every list entry) of
// |row_{slots[b*F+f]}|^2 (the whole row [w, v], its first 1 + d_f floats with per-field dims): the
// objective whose gradient Tower::ForwardBackward adds.
double ReferenceObjective(const ModelConfig& config, const Model& model, const ReferenceInput& in);

// The MLP kernel's twin (worker/model/mlp.h), forward and backward in double. With
// bf16_rounding it rounds to bf16 exactly where the bf16 Mlp stores bf16 (x0, the weights, the
// hidden activations, and dz before each matmul), so the two must agree to float accuracy.
struct ReferenceMlpResult {
  std::vector<double> logits;      // [n]: the MLP's output (including out/b)
  std::vector<double> dense_grad;  // [dense size]: d(sum_b g_b logit_b)/d dense (MLP tensors)
  std::vector<double> input_grad;  // [n, in]: d(sum_b g_b logit_b)/d x0
};
ReferenceMlpResult ReferenceMlp(const Mlp::Options& options, int n, const float* x0,
                                const float* dense, int64_t dense_size, const float* g,
                                bool bf16_rounding);

// The cross network's twin (worker/model/cross_network.h) in double: x_L from x0 [n, D], and
// with output_grad [n, D] = d loss / d x_L the gradients of its tensors and of x0.
struct ReferenceCrossResult {
  std::vector<double> output;      // [n, D]
  std::vector<double> dense_grad;  // [dense size]
  std::vector<double> input_grad;  // [n, D]
};
ReferenceCrossResult ReferenceCross(const CrossNetwork::Options& options, int n, const float* x0,
                                    const float* dense, int64_t dense_size,
                                    const float* output_grad);

// The dot interaction's twin (worker/model/dot_interaction.h) in double: dots [n, P], and with
// d_dots [n, P] the gradients of front [n, k] (when shape.front) and x0 [n, F*k].
struct ReferenceDotResult {
  std::vector<double> dots, front_grad, input_grad;
};
ReferenceDotResult ReferenceDot(const DotShape& shape, int n, const float* front, const float* x0,
                                const float* d_dots);

}  // namespace pstrain
