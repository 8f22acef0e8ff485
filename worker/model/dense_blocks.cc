#include "worker/model/dense_blocks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<DenseBlocks>> DenseBlocks::Create(const Options& options) {
  const bool cross = !options.cross.layers.empty();
  if (cross == options.dot || options.num_fields <= 0 || options.dim <= 0 ||
      options.max_batch <= 0 || options.threads <= 0) {
    return absl::InvalidArgumentError(
        "DenseBlocks: expected exactly one of a cross network and a dot interaction, and "
        "positive sizes");
  }
  if (options.dot && !options.mlp.has_value()) {
    return absl::InvalidArgumentError("DenseBlocks: DOT needs its top MLP");
  }
  std::unique_ptr<DenseBlocks> blocks(new DenseBlocks(options));
  const size_t batch = options.max_batch;
  // x0's width: the cross network's (per-field dims make it sum_f d_f), F*k for DOT.
  const int64_t D = cross ? int64_t{options.cross.dim} : int64_t{options.num_fields} * options.dim;
  if (cross) {
    const bool head = options.parallel || !options.mlp.has_value();
    if (head != (options.cross_out_w >= 0) ||
        (!options.mlp.has_value()) != (options.cross_out_b >= 0)) {
      return absl::InvalidArgumentError("DenseBlocks: the cross network's linear head is misplaced");
    }
    ASSIGN_OR_RETURN(blocks->cross_, CrossNetwork::Create(options.cross));
    if (head) blocks->dout_ = AlignedArray<float>(batch * D);
    if (options.parallel) blocks->dx0_ = AlignedArray<float>(batch * D);
  } else {
    blocks->dot_shape_ = {options.num_fields, options.dim, !options.bottom.layers.empty()};
    if (blocks->dot_shape_.front) {
      if (options.bottom.layers.back().out != options.dim ||
          options.bottom.layers.front().in != static_cast<int>(options.dense_fields.size())) {
        return absl::InvalidArgumentError(
            "DenseBlocks: the bottom MLP must map the dense fields to embedding_dim");
      }
      ASSIGN_OR_RETURN(blocks->bottom_, BottomMlp::Create(options.bottom));
      blocks->dout_ = AlignedArray<float>(batch * options.dim);
    }
    blocks->x0_ = AlignedArray<float>(batch * D);
    blocks->dx0_ = AlignedArray<float>(batch * D);
  }
  if (options.mlp.has_value()) {
    ASSIGN_OR_RETURN(blocks->mlp_, Mlp::Create(*options.mlp));
    const int64_t want = cross ? D : blocks->top_width();
    if (blocks->mlp_->input_dim() != want) {
      return absl::InvalidArgumentError(absl::StrCat("DenseBlocks: the MLP reads ",
                                                     blocks->mlp_->input_dim(), " inputs, expected ",
                                                     want));
    }
    if (options.dot && options.mlp->bf16) blocks->top_ = AlignedArray<float>(batch * want);
  }
  return blocks;
}

int64_t DenseBlocks::top_width() const {
  return (dot_shape_.front ? opt_.dim : 0) + dot_shape_.pairs();
}

float* DenseBlocks::x0() { return cross_ != nullptr ? cross_->input() : x0_.data(); }

void DenseBlocks::ToMlpInput(const float* src, int n, int64_t width) {
  const int64_t size = n * width;
  if (float* dst = mlp_->input_f32(); dst != nullptr) {
    ParallelFor(size, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      std::copy(src + begin, src + end, dst + begin);
    });
  } else {
    uint16_t* dst16 = mlp_->input_bf16();
    ParallelFor(size, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      FloatToBf16(src + begin, dst16 + begin, end - begin);
    });
  }
}

absl::Status DenseBlocks::Forward(const Tower::Input& in, float* logits) {
  const int n = in.n;
  if (n <= 0) return absl::OkStatus();
  const float* dense = in.dense;
  const int64_t D = X0Width();
  if (cross_ != nullptr) {
    RETURN_IF_ERROR(cross_->Forward(n, dense));
    if (mlp_ != nullptr) {
      ToMlpInput(opt_.parallel ? cross_->input() : cross_->output(), n, D);
      RETURN_IF_ERROR(mlp_->Forward(n, dense, logits));
    }
    if (opt_.cross_out_w >= 0) {
      const float* xl = cross_->output();
      const float* w = dense + opt_.cross_out_w;
      const float bias = opt_.cross_out_b >= 0 ? dense[opt_.cross_out_b] : 0.f;
      ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const float* __restrict x = xl + b * D;
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < D; ++j) sum += x[j] * w[j];
          logits[b] += sum + bias;
        }
      });
    }
    return absl::OkStatus();
  }
  // DOT.
  const int k = opt_.dim;
  if (bottom_ != nullptr) {
    const int F = opt_.num_fields;
    const int64_t nd = static_cast<int64_t>(opt_.dense_fields.size());
    float* a0 = bottom_->input();
    // A DENSE numeric field is never a list: its one entry is at b*F + f, or with list fields in
    // the batch (Tower::Input::offsets) at offsets[b*F + f] - offsets[0].
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t i = 0; i < nd; ++i) {
        const int64_t cell = b * F + opt_.dense_fields[i];
        const int64_t entry = in.offsets != nullptr ? in.offsets[cell] - in.offsets[0] : cell;
        a0[b * nd + i] = in.scales[entry];
      }
    }
    RETURN_IF_ERROR(bottom_->Forward(n, dense));
  }
  const int64_t W = top_width();
  float* top = mlp_->input_f32() != nullptr ? mlp_->input_f32() : top_.data();
  const float* front = bottom_ != nullptr ? bottom_->output() : nullptr;
  if (front != nullptr) {
    for (int64_t b = 0; b < n; ++b) std::copy(front + b * k, front + (b + 1) * k, top + b * W);
  }
  DotForward(dot_shape_, n, front, x0_.data(), top + (front != nullptr ? k : 0), W, opt_.threads);
  if (mlp_->input_bf16() != nullptr) ToMlpInput(top, n, W);
  return mlp_->Forward(n, dense, logits);
}

absl::StatusOr<float*> DenseBlocks::Backward(const Tower::Input& in, const float* g,
                                             float* dense_grad) {
  const int n = in.n;
  const float* dense = in.dense;
  const int64_t D = X0Width();
  if (n <= 0) return dx0_.data() != nullptr ? dx0_.data() : x0();
  if (mlp_ != nullptr) RETURN_IF_ERROR(mlp_->Backward(n, dense, g, dense_grad));
  if (cross_ != nullptr) {
    const float* dxl = opt_.cross_out_w >= 0 ? dout_.data() : mlp_->input_grad();
    if (opt_.cross_out_w >= 0) {
      // The linear head: d x_L = g_b w; dw_j += sum_b g_b x_L[b, j] (columns over the threads,
      // each summed in example order); db += sum_b g_b.
      const float* xl = cross_->output();
      const float* w = dense + opt_.cross_out_w;
      float* dxl_out = dout_.data();
      ParallelFor(n, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          float* __restrict d = dxl_out + b * D;
          const float gb = g[b];
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) d[j] = gb * w[j];
        }
      });
      float* dw = dense_grad + opt_.cross_out_w;
      ParallelFor(D, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
        for (int b = 0; b < n; ++b) {
          const float* __restrict x = xl + b * D;
          const float gb = g[b];
          for (int64_t j = begin; j < end; ++j) dw[j] += gb * x[j];
        }
      });
      if (opt_.cross_out_b >= 0) {
        float gsum = 0.f;
        for (int b = 0; b < n; ++b) gsum += g[b];
        dense_grad[opt_.cross_out_b] += gsum;
      }
    }
    RETURN_IF_ERROR(cross_->Backward(n, dense, dxl, dense_grad));
    if (!opt_.parallel) return cross_->input_grad();
    const float* a = cross_->input_grad();
    const float* c = mlp_->input_grad();
    float* sum = dx0_.data();
    ParallelFor(n * D, opt_.threads, [&](int, int, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum[i] = a[i] + c[i];
    });
    return sum;
  }
  // DOT.
  const int k = opt_.dim;
  const int64_t W = top_width();
  const float* dtop = mlp_->input_grad();
  const float* front = bottom_ != nullptr ? bottom_->output() : nullptr;
  DotBackward(dot_shape_, n, front, x0_.data(), dtop + (front != nullptr ? k : 0), W,
              dout_.data(), dx0_.data(), opt_.threads);
  if (bottom_ != nullptr) {
    float* dfront = dout_.data();
    for (int64_t b = 0; b < n; ++b) {
      for (int j = 0; j < k; ++j) dfront[b * k + j] += dtop[b * W + j];
    }
    RETURN_IF_ERROR(bottom_->Backward(n, dense, dfront, dense_grad));
  }
  return dx0_.data();
}

}  // namespace pstrain
