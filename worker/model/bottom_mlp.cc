#include "worker/model/bottom_mlp.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<BottomMlp>> BottomMlp::Create(const Options& options) {
  if (options.layers.empty() || options.max_batch <= 0 || options.threads <= 0) {
    return absl::InvalidArgumentError("BottomMlp needs a layer, max_batch > 0 and threads > 0");
  }
  int width = 0;
  for (size_t l = 0; l < options.layers.size(); ++l) {
    const Mlp::Layer& layer = options.layers[l];
    if (layer.in <= 0 || layer.out <= 0 || (l > 0 && layer.in != options.layers[l - 1].out)) {
      return absl::InvalidArgumentError(absl::StrCat("BottomMlp layer ", l, " has bad sizes"));
    }
    width = std::max(width, layer.out);
  }
  std::unique_ptr<BottomMlp> mlp(new BottomMlp(options));
  const size_t batch = options.max_batch;
  mlp->a_.emplace_back(batch * options.layers[0].in);
  for (const Mlp::Layer& layer : options.layers) mlp->a_.emplace_back(batch * layer.out);
  mlp->dz_[0] = AlignedArray<float>(batch * width);
  mlp->dz_[1] = AlignedArray<float>(batch * width);
  return mlp;
}

absl::Status BottomMlp::Gemm(const Matmuls::Shape& s, const float* a, const float* b, float* c) {
  return opt_.bf16 ? gemm_.RunRoundedToBf16(s, a, b, c, opt_.threads) : gemm_.Run(s, a, b, c);
}

absl::Status BottomMlp::Forward(int n, const float* dense) {
  if (n < 0 || n > opt_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("BottomMlp: batch of ", n, ", expected 0..", opt_.max_batch));
  }
  if (n == 0) return absl::OkStatus();
  for (size_t l = 0; l < opt_.layers.size(); ++l) {
    const Mlp::Layer& layer = opt_.layers[l];
    float* a = a_[l + 1].data();
    RETURN_IF_ERROR(Gemm({n, layer.in, layer.out}, a_[l].data(), dense + layer.w, a));
    const float* bias = dense + layer.b;
    const int64_t N = layer.out;
    ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        float* __restrict row = a + b * N;
        const float* __restrict bb = bias;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) row[j] = std::max(row[j] + bb[j], 0.f);
      }
    });
  }
  return absl::OkStatus();
}

absl::Status BottomMlp::Backward(int n, const float* dense, const float* output_grad,
                                 float* dense_grad) {
  if (n < 0 || n > opt_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("BottomMlp: batch of ", n, ", expected 0..", opt_.max_batch));
  }
  if (n == 0) return absl::OkStatus();
  // dz_[cur] holds d loss / d a_{l+1}, masked in place into d loss / d pre-activation.
  int cur = 0;
  std::copy(output_grad, output_grad + int64_t{n} * opt_.layers.back().out, dz_[cur].data());
  for (int l = static_cast<int>(opt_.layers.size()) - 1; l >= 0; --l) {
    const Mlp::Layer& layer = opt_.layers[l];
    const int64_t N = layer.out;
    const float* a = a_[l + 1].data();
    float* dz = dz_[cur].data();
    ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const float* __restrict ab = a + b * N;
        float* __restrict row = dz + b * N;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) row[j] = ab[j] > 0.f ? row[j] : 0.f;
      }
    });
    // Bias gradient: columns over the threads, each summed in example order.
    float* gb = dense_grad + layer.b;
    ParallelFor(N, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      for (int b = 0; b < n; ++b) {
        for (int64_t j = begin; j < end; ++j) gb[j] += dz[b * N + j];
      }
    });
    RETURN_IF_ERROR(Gemm({layer.in, n, N, /*trans_a=*/true, false, /*accumulate=*/true},
                         a_[l].data(), dz, dense_grad + layer.w));
    if (l == 0) break;
    RETURN_IF_ERROR(Gemm({n, N, layer.in, false, /*trans_b=*/true, false}, dz,
                         dense + layer.w, dz_[1 - cur].data()));
    cur = 1 - cur;
  }
  return absl::OkStatus();
}

}  // namespace pstrain
