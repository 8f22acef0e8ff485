// The deep part of DeepFM / Wide&Deep on oneDNN: hidden layers a_l = ReLU(a_{l-1} W_l + b_l),
// then a 1-unit linear output, forward and backward, in f32 or bf16.
//
// Parameters live in the caller's flat dense vector (see Model::dense_layout()):
//   W_l: [in_l, out_l] row-major (oneDNN matmul "ab" weights), b_l: [out_l], out/w: [in_L], out/b.
// [in, out] row-major is what matmul reads without a reorder: forward uses W as is, backward-data
// reads W^T and backward-weights reads a^T through strides (the brgemm kernels take both), so f32
// steps never reorder the master weights. bf16 steps convert W to bf16 once per Forward.
//
// Compute: one matmul primitive per (layer, pass) with bias and ReLU fused in the forward one and
// a sum post-op in backward-weights, so dW accumulates straight into dense_grad (measured: no
// slower than writing a scratch dW, which would then need a 0.07-0.11 ms add pass). Primitives are
// created on first use per batch size n (runtime-dim matmul would fall back to gemm:jit, which is
// no faster in f32 and 2-3x slower than AMX in bf16 on oneDNN 2.6) and kept in a small LRU.
// The ReLU masks, bias gradients and the 1-unit output layer are fused row loops (ParallelFor).
// bf16: activations, x0 and dz are bf16; dW, dx, biases and everything returned stay f32.
// f32: the forward reads each W_l from a 64-byte aligned copy when its place in the dense vector
// is not aligned (the layout packs the tensors, so W_l usually is not): oneDNN's brgemm runs the
// forward 8-30% slower on misaligned weights (one thread, 1024 x {400, 796} x 400, 2026-11-28),
// the copy costs one pass over W_l, and the GEMM's floats are the same (docs/PERFORMANCE.md).
// Backward-weights reads its input transposed. In f32 the strided read costs nothing measurable;
// in bf16 (AMX) it makes dW about 1.5x slower than a plain [K, n] input, so bf16 transposes the
// input first (8x8-block transpose, ~0.15 ms for 1024 x 624).
//
// Thread-safety: none; one Mlp per tower. Each call runs oneDNN and ParallelFor with the calling
// thread's OpenMP thread count, which the tower sets to `threads` before calling.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "worker/model/simd.h"

namespace pstrain {

class Mlp {
 public:
  struct Layer {
    int in = 0;
    int out = 0;
    int64_t w = 0;  // offset of W_l ([in, out]) in the dense vector
    int64_t b = 0;  // offset of b_l ([out])
  };
  struct Options {
    std::vector<Layer> hidden;  // at least one layer; hidden[l].in == hidden[l-1].out
    int64_t out_w = 0;          // offset of out/w ([hidden.back().out])
    int64_t out_b = 0;          // offset of out/b ([1])
    bool bf16 = false;
    int max_batch = 0;
    int threads = 1;
  };

  static absl::StatusOr<std::unique_ptr<Mlp>> Create(const Options& options);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  int input_dim() const { return opt_.hidden.front().in; }
  // Where the caller writes the input x0 [n, input_dim()] before Forward: the f32 buffer in f32
  // mode, the bf16 one in bf16 mode (the other is null).
  float* input_f32() { return opt_.bf16 ? nullptr : x0_f32_.data(); }
  uint16_t* input_bf16() { return opt_.bf16 ? x0_bf16_.data() : nullptr; }
  // d(sum_b g_b logit_b)/d x0 [n, input_dim()], f32, valid after Backward.
  const float* input_grad() const { return dx0_.data(); }
  // The same buffer, for a caller that adjusts it in place (target attention): the MLP does not
  // read it again.
  float* input_grad() { return dx0_.data(); }

  // logits[b] += out(x0[b]) for b < n (n <= max_batch). Keeps the activations for Backward.
  absl::Status Forward(int n, const float* dense, float* logits);

  // After Forward(n, dense): ADDS d(sum_b g_b logit_b)/d(dense) into dense_grad (the MLP's
  // tensors only) and writes input_grad(). g[n] = d loss_b / d logit_b.
  absl::Status Backward(int n, const float* dense, const float* g, float* dense_grad);

  // The oneDNN implementation names of layer 0's forward, backward-data and backward-weights
  // primitives for batch size n (e.g. "brg:avx512_core_amx_bf16"), for logs and benchmarks.
  absl::StatusOr<std::string> ImplInfo(int n);

 private:
  struct Plan;
  explicit Mlp(const Options& options);
  absl::StatusOr<Plan*> GetPlan(int n);
  absl::StatusOr<std::unique_ptr<Plan>> CreatePlan(int n);
  void* act(int l);  // activation of hidden layer l, [max_batch, out_l], f32 or bf16
  template <typename T>
  void OutputBackward(int n, const float* dense, const float* g, float* dense_grad);
  template <typename T>
  void ReluBackward(int n, int l, float* dense_grad);

  Options opt_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::list<std::unique_ptr<Plan>> plans_;  // most recently used first
  AlignedArray<float> x0_f32_, dx0_;
  AlignedArray<uint16_t> x0_bf16_;
  std::vector<AlignedArray<float>> act_f32_;
  std::vector<AlignedArray<uint16_t>> act_bf16_, w_bf16_;
  std::vector<AlignedArray<float>> w_f32_;  // f32: W_l's aligned copy, per Forward (see top)
  AlignedArray<float> dz_f32_[2];  // f32: dz ping-pong; bf16: [0] is the f32 dx/dz scratch
  AlignedArray<uint16_t> dz_bf16_;
  AlignedArray<uint16_t> src_t_bf16_;  // bf16: the current layer's input, transposed, for dW
  int64_t width_ = 0;                  // the widest hidden layer
  AlignedArray<float> partial_;        // per-thread column sums, [threads][2 * width_]
  AlignedArray<uint8_t> scratchpad_;
  bool warned_slow_ = false;
};

}  // namespace pstrain
