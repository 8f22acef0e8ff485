#include "worker/model/cross_network.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status.h"

namespace pstrain {
namespace {

// db[j] += sum_b d[b, j] over n rows of width D: columns split over the threads, each summed in
// example order (the same result for any thread count).
void AddColumnSums(const float* d, int n, int64_t D, int threads, float* db) {
  ParallelFor(D, threads, [&](int, int, int64_t begin, int64_t end) {
    for (int b = 0; b < n; ++b) {
      const float* __restrict row = d + b * D;
      float* __restrict out = db;
#pragma omp simd
      for (int64_t j = begin; j < end; ++j) out[j] += row[j];
    }
  });
}

// x[j] = tanh(x[j]) for j < n, in registers: Eigen's vectorised rational approximation (within
// 3e-7 relative of the double tanh over [-12, 12] and at 1e-30; NaN stays NaN, +-inf gives
// +-1). Why: libm's scalar tanhf (through expm1f) was 11% of DCN-Mix's step samples, more
// than its elementwise passes and the embeddings' prefetch together.
void VectorTanh(float* x, int64_t n) {
  Eigen::Map<Eigen::ArrayXf> a(x, n);
  a = a.tanh();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CrossNetwork>> CrossNetwork::Create(const Options& options) {
  if (options.dim <= 0 || options.rank < 0 || options.layers.empty() || options.max_batch <= 0 ||
      options.threads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossNetwork: dim ", options.dim, ", rank ", options.rank, ", ", options.layers.size(),
        " layers, max_batch ", options.max_batch, ": expected positive sizes"));
  }
  if (options.experts < 0 || options.experts > 64 ||
      (options.experts >= 2 && options.rank == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CrossNetwork: ", options.experts, " experts of rank ", options.rank,
        ": expected 0 or 1 (no mixture), or 2..64 experts of a rank > 0"));
  }
  std::unique_ptr<CrossNetwork> net(new CrossNetwork(options));
  const size_t K = options.experts >= 2 ? options.experts : 1;
  const size_t nr = static_cast<size_t>(options.max_batch) * options.rank * K;
  const size_t nd = static_cast<size_t>(options.max_batch) * options.dim;
  const size_t L = options.layers.size();
  for (size_t l = 0; l <= L; ++l) net->x_.emplace_back(nd);
  for (size_t l = 0; l < L; ++l) {
    net->y_.emplace_back(nd);
    if (options.rank > 0) net->t_.emplace_back(nr);
    if (K > 1) {
      net->a2_.emplace_back(nr);
      net->q_.emplace_back(nr);
      net->p_.emplace_back(static_cast<size_t>(options.max_batch) * K);
    }
  }
  if (K > 1) {
    net->da_ = AlignedArray<float>(nr);
    net->ds_ = AlignedArray<float>(static_cast<size_t>(options.max_batch) * K);
  }
  net->g_ = AlignedArray<float>(nd);
  net->dy_ = AlignedArray<float>(nd);
  net->dx0_ = AlignedArray<float>(nd);
  if (options.rank > 0) net->dt_ = AlignedArray<float>(nr);
  return net;
}

absl::Status CrossNetwork::Gemm(const Matmuls::Shape& s, const float* a, const float* b, float* c) {
  return opt_.bf16 ? gemm_.RunRoundedToBf16(s, a, b, c, opt_.threads) : gemm_.Run(s, a, b, c);
}

absl::Status CrossNetwork::Forward(int n, const float* dense) {
  if (n < 0 || n > opt_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("CrossNetwork: batch of ", n, ", expected 0..", opt_.max_batch));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t D = opt_.dim, r = opt_.rank;
  const float* x0 = x_[0].data();
  for (size_t l = 0; l < opt_.layers.size(); ++l) {
    const Layer& layer = opt_.layers[l];
    const float* x = x_[l].data();
    float* y = y_[l].data();
    if (opt_.experts >= 2) {
      RETURN_IF_ERROR(MixForward(n, l, dense, y));
    } else if (r == 0) {
      RETURN_IF_ERROR(Gemm({n, D, D}, x, dense + layer.w, y));
    } else {
      RETURN_IF_ERROR(Gemm({n, D, r}, x, dense + layer.w, t_[l].data()));
      RETURN_IF_ERROR(Gemm({n, r, D}, t_[l].data(), dense + layer.u, y));
    }
    float* next = x_[l + 1].data();
    const float* bias = dense + layer.b;
    ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const float* __restrict x0b = x0 + b * D;
        const float* __restrict xb = x + b * D;
        const float* __restrict bb = bias;
        float* __restrict yb = y + b * D;
        float* __restrict out = next + b * D;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) {
          const float yj = yb[j] + bb[j];
          yb[j] = yj;
          out[j] = x0b[j] * yj + xb[j];
        }
      }
    });
  }
  return absl::OkStatus();
}

absl::Status CrossNetwork::Backward(int n, const float* dense, const float* output_grad,
                                    float* dense_grad) {
  if (n < 0 || n > opt_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("CrossNetwork: batch of ", n, ", expected 0..", opt_.max_batch));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t D = opt_.dim, r = opt_.rank;
  const float* x0 = x_[0].data();
  float* g = g_.data();
  float* dy = dy_.data();
  float* dx0 = dx0_.data();
  std::copy(output_grad, output_grad + n * D, g);
  std::fill(dx0, dx0 + n * D, 0.f);
  for (int l = static_cast<int>(opt_.layers.size()) - 1; l >= 0; --l) {
    const Layer& layer = opt_.layers[l];
    const float* y = y_[l].data();
    float* db = dense_grad + layer.b;
    if (opt_.threads == 1) {
      // One pass: db's column sums in example order, as AddColumnSums adds them.
      for (int64_t b = 0; b < n; ++b) {
        const float* __restrict gb = g + b * D;
        const float* __restrict x0b = x0 + b * D;
        const float* __restrict yb = y + b * D;
        float* __restrict dyb = dy + b * D;
        float* __restrict dx0b = dx0 + b * D;
        float* __restrict dbb = db;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) {
          const float d = gb[j] * x0b[j];
          dyb[j] = d;
          dbb[j] += d;
          dx0b[j] += gb[j] * yb[j];
        }
      }
    } else {
      ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const float* __restrict gb = g + b * D;
          const float* __restrict x0b = x0 + b * D;
          const float* __restrict yb = y + b * D;
          float* __restrict dyb = dy + b * D;
          float* __restrict dx0b = dx0 + b * D;
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) {
            dyb[j] = gb[j] * x0b[j];
            dx0b[j] += gb[j] * yb[j];
          }
        }
      });
      AddColumnSums(dy, n, D, opt_.threads, db);
    }
    const float* x = x_[l].data();
    if (opt_.experts >= 2) {
      RETURN_IF_ERROR(MixBackward(n, l, dense, dy, g, dense_grad));
    } else if (r == 0) {
      // dW += x_l^T dy; g = g + dy W^T (the skip connection's share is already in g).
      RETURN_IF_ERROR(Gemm({D, n, D, /*trans_a=*/true, false, /*accumulate=*/true}, x, dy,
                                dense_grad + layer.w));
      RETURN_IF_ERROR(Gemm({n, D, D, false, /*trans_b=*/true, /*accumulate=*/true}, dy,
                                dense + layer.w, g));
    } else {
      float* dt = dt_.data();
      RETURN_IF_ERROR(Gemm({r, n, D, true, false, true}, t_[l].data(), dy,
                                dense_grad + layer.u));
      RETURN_IF_ERROR(Gemm({n, D, r, false, true, false}, dy, dense + layer.u, dt));
      RETURN_IF_ERROR(Gemm({D, n, r, true, false, true}, x, dt, dense_grad + layer.w));
      RETURN_IF_ERROR(Gemm({n, r, D, false, true, true}, dt, dense + layer.w, g));
    }
  }
  ParallelFor(n * D, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dx0[i] += g[i];
  });
  return absl::OkStatus();
}

absl::Status CrossNetwork::MixForward(int n, size_t l, const float* dense, float* y) {
  const int64_t D = opt_.dim, r = opt_.rank, K = opt_.experts, nr = int64_t{n} * r;
  const Layer& layer = opt_.layers[l];
  const float* x = x_[l].data();
  float* a1 = t_[l].data();
  float* a2 = a2_[l].data();
  float* q = q_[l].data();
  float* p = p_[l].data();
  // The gate's scores, then their softmax over the experts in place (max subtracted).
  RETURN_IF_ERROR(Gemm({n, D, K}, x, dense + layer.gate, p));
  ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* pb = p + b * K;
      const float top = *std::max_element(pb, pb + K);
      float sum = 0.f;
      for (int64_t i = 0; i < K; ++i) sum += pb[i] = std::exp(pb[i] - top);
      for (int64_t i = 0; i < K; ++i) pb[i] /= sum;
    }
  });
  for (int64_t i = 0; i < K; ++i) {
    RETURN_IF_ERROR(Gemm({n, D, r}, x, dense + layer.w + i * D * r, a1 + i * nr));
  }
  ParallelFor(K * nr, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
    VectorTanh(a1 + begin, end - begin);
  });
  for (int64_t i = 0; i < K; ++i) {
    RETURN_IF_ERROR(Gemm({n, r, r}, a1 + i * nr, dense + layer.c + i * r * r, a2 + i * nr));
  }
  // a2 = tanh(.), q_i = p_i a2_i: each expert's row weighted by its gate.
  ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t b = begin; b < end; ++b) {
        const float pbi = p[b * K + i];
        float* a2b = a2 + i * nr + b * r;
        float* qb = q + i * nr + b * r;
        VectorTanh(a2b, r);
        for (int64_t j = 0; j < r; ++j) qb[j] = pbi * a2b[j];
      }
    }
  });
  for (int64_t i = 0; i < K; ++i) {
    RETURN_IF_ERROR(Gemm({n, r, D, false, false, /*accumulate=*/i > 0}, q + i * nr,
                         dense + layer.u + i * r * D, y));
  }
  return absl::OkStatus();
}

absl::Status CrossNetwork::MixBackward(int n, size_t l, const float* dense, const float* dy,
                                       float* g, float* dense_grad) {
  const int64_t D = opt_.dim, r = opt_.rank, K = opt_.experts, nr = int64_t{n} * r;
  const Layer& layer = opt_.layers[l];
  const float* x = x_[l].data();
  const float* a1 = t_[l].data();
  const float* a2 = a2_[l].data();
  const float* q = q_[l].data();
  const float* p = p_[l].data();
  float* dq = dt_.data();
  float* da = da_.data();
  float* ds = ds_.data();
  for (int64_t i = 0; i < K; ++i) {
    RETURN_IF_ERROR(Gemm({r, n, D, true, false, true}, q + i * nr, dy,
                         dense_grad + layer.u + i * r * D));
    RETURN_IF_ERROR(Gemm({n, D, r, false, true, false}, dy, dense + layer.u + i * r * D,
                         dq + i * nr));
  }
  // dp_i = dq_i . a2_i; ds = p * (dp - p . dp) (the softmax's backward); dq_i becomes
  // d(t C_i) = dq_i p_i (1 - a2_i^2).
  ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* pb = p + b * K;
      float* dsb = ds + b * K;
      float mean = 0.f;
      for (int64_t i = 0; i < K; ++i) {
        const float* a2b = a2 + i * nr + b * r;
        float* dqb = dq + i * nr + b * r;
        float dp = 0.f;
        for (int64_t j = 0; j < r; ++j) {
          dp += dqb[j] * a2b[j];
          dqb[j] *= pb[i] * (1.f - a2b[j] * a2b[j]);
        }
        dsb[i] = dp;
        mean += pb[i] * dp;
      }
      for (int64_t i = 0; i < K; ++i) dsb[i] = pb[i] * (dsb[i] - mean);
    }
  });
  for (int64_t i = 0; i < K; ++i) {
    RETURN_IF_ERROR(Gemm({r, n, r, true, false, true}, a1 + i * nr, dq + i * nr,
                         dense_grad + layer.c + i * r * r));
    RETURN_IF_ERROR(Gemm({n, r, r, false, true, false}, dq + i * nr,
                         dense + layer.c + i * r * r, da + i * nr));
  }
  ParallelFor(K * nr, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) da[j] *= 1.f - a1[j] * a1[j];
  });
  for (int64_t i = 0; i < K; ++i) {
    RETURN_IF_ERROR(Gemm({D, n, r, true, false, true}, x, da + i * nr,
                         dense_grad + layer.w + i * D * r));
    RETURN_IF_ERROR(Gemm({n, r, D, false, true, true}, da + i * nr,
                         dense + layer.w + i * D * r, g));
  }
  RETURN_IF_ERROR(Gemm({D, n, K, true, false, true}, x, ds, dense_grad + layer.gate));
  return Gemm({n, K, D, false, true, true}, ds, dense + layer.gate, g);
}

}  // namespace pstrain
