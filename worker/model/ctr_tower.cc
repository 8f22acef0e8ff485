#include "worker/model/ctr_tower.h"

#include <omp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status.h"
#include "worker/model/simd.h"

namespace pstrain {
namespace {

// Per call: the sparse forward (parallel by example), the MLP (oneDNN, then fused row loops), the
// loss (parallel by example), the MLP backward, and the sparse backward. The last runs with one
// worker per thread, each owning the slots that OwnerOfSlot gives it and walking all entries in
// order: duplicate slots never race, and each row's gradient is summed in the same order whatever
// the thread count.
class CtrTower : public Tower {
 public:
  CtrTower(const SparseShape& shape, float l2, int max_batch, int threads, std::unique_ptr<Mlp> mlp,
           std::unique_ptr<DenseBlocks> blocks, std::unique_ptr<TargetAttention> attention)
      : shape_(shape),
        l2_(l2),
        max_batch_(max_batch),
        threads_(threads),
        mlp_(std::move(mlp)),
        blocks_(std::move(blocks)),
        attention_(std::move(attention)),
        z_(max_batch),
        g_(max_batch),
        sum_v_(shape.fm ? static_cast<size_t>(max_batch) * shape.dim : 0),
        entries_(threads > 1 ? static_cast<size_t>(threads) * max_batch * shape.num_fields : 0),
        loss_part_(threads) {}

  absl::Status Forward(const Input& in, float* logits) override {
    RETURN_IF_ERROR(Validate(in, /*training=*/false));
    if (logits == nullptr) return absl::InvalidArgumentError("Tower::Forward: logits is null");
    return RunForward(WithOffsets(in), logits, nullptr);
  }

  absl::StatusOr<double> ForwardBackward(const Input& in_arg, float* row_grads,
                                         float* dense_grad, float* logits) override {
    RETURN_IF_ERROR(Validate(in_arg, /*training=*/true));
    const Input in = WithOffsets(in_arg);
    if (row_grads == nullptr || dense_grad == nullptr) {
      return absl::InvalidArgumentError("Tower::ForwardBackward: null gradient buffer");
    }
    const int n = in.n;
    if (n == 0) return 0.0;
    float* z = logits != nullptr ? logits : z_.data();
    float* sum_v = shape_.fm ? sum_v_.data() : nullptr;
    RETURN_IF_ERROR(RunForward(in, z, sum_v));

    float* g = g_.data();
    std::fill(loss_part_.begin(), loss_part_.end(), 0.0);
    ParallelFor(n, threads_, [&](int ithr, int, int64_t begin, int64_t end) {
      loss_part_[ithr] = SigmoidCrossEntropy(z, in.labels, begin, end, g);
    });
    double loss = 0.0;
    for (double part : loss_part_) loss += part;
    float gsum = 0.f;
    for (int b = 0; b < n; ++b) gsum += g[b];
    dense_grad[0] += gsum;

    float* dx0 = nullptr;  // adjusted in place by the attention
    if (mlp_ != nullptr) {
      RETURN_IF_ERROR(mlp_->Backward(n, in.dense, g, dense_grad));
      dx0 = mlp_->input_grad();
    } else if (blocks_ != nullptr) {
      ASSIGN_OR_RETURN(dx0, blocks_->Backward(in, g, dense_grad));
    }
    if (attention_ != nullptr) {
      RETURN_IF_ERROR(attention_->Backward(in, dx0, g, sum_v, dense_grad));
    }
    const bool lists = in.offsets != nullptr;
    const int64_t num_entries = NumEntries(in);
    auto backward = [&](const int32_t* entries, int64_t count) {
      if (lists) {
        SparseBackwardLists(shape_, in, g, sum_v, pooled_.data(), dx0, l2_, entries, count,
                            row_grads);
      } else {
        SparseBackward(shape_, in, g, sum_v, dx0, l2_, entries, count, row_grads);
      }
    };
    if (threads_ == 1) {
      backward(nullptr, num_entries);
      if (attention_ != nullptr) attention_->AddRowGrads(in, 0, 1, row_grads);
    } else {
      // Each owner's entries (a list batch may hold more entries than max_batch * F).
      if (entries_.size() < static_cast<size_t>(threads_) * num_entries) {
        entries_ = AlignedArray<int32_t>(static_cast<size_t>(threads_) * num_entries);
      }
      ParallelFor(threads_, threads_, [&](int, int, int64_t first, int64_t last) {
        for (int64_t owner = first; owner < last; ++owner) {
          int32_t* mine = entries_.data() + owner * num_entries;
          const int64_t count =
              SelectOwnedEntries(in.slots, num_entries, static_cast<int>(owner), threads_, mine);
          backward(mine, count);
          // The attended entries' d e_i, after the sparse backward's terms: one order per row.
          if (attention_ != nullptr) {
            attention_->AddRowGrads(in, static_cast<int>(owner), threads_, row_grads);
          }
        }
      });
    }
    return loss;
  }

 private:
  absl::Status Validate(const Input& in, bool training) const {
    if (in.n < 0 || in.n > max_batch_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Tower: slice of ", in.n, " examples, expected 0..", max_batch_));
    }
    if (in.n > 0 && (in.slots == nullptr || in.scales == nullptr || in.rows == nullptr ||
                     in.dense == nullptr || (training && in.labels == nullptr))) {
      return absl::InvalidArgumentError("Tower: null slots, scales, rows, dense or labels");
    }
    if (in.offsets != nullptr && in.n > 0) {
      const int64_t cells = static_cast<int64_t>(in.n) * shape_.num_fields;
      if (in.offsets[cells] - in.offsets[0] < cells) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Tower: offsets give ", in.offsets[cells] - in.offsets[0], " entries for ", cells,
            " (example, field) cells, expected at least one each"));
      }
    }
    return absl::OkStatus();
  }

  // Target attention with the FM term takes the list path (its pooled vectors): a batch without
  // offsets gets one entry per cell.
  Input WithOffsets(const Input& in) {
    if (attention_ == nullptr || !shape_.fm || in.offsets != nullptr || in.n == 0) return in;
    const int64_t cells = static_cast<int64_t>(in.n) * shape_.num_fields;
    if (static_cast<int64_t>(iota_.size()) < cells + 1) {
      iota_ = AlignedArray<int32_t>(static_cast<size_t>(max_batch_) * shape_.num_fields + 1);
      for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = static_cast<int32_t>(i);
    }
    Input out = in;
    out.offsets = iota_.data();
    return out;
  }

  int64_t NumEntries(const Input& in) const {
    const int64_t cells = static_cast<int64_t>(in.n) * shape_.num_fields;
    return in.offsets != nullptr ? in.offsets[cells] - in.offsets[0] : cells;
  }

  // logits = the model's output; sum_v (when not null) keeps the FM sums for backward.
  absl::Status RunForward(const Input& in, float* logits, float* sum_v) {
    // Target attention with the FM term replaces pooled vectors in the FM sums (list path).
    if (attention_ != nullptr && shape_.fm && sum_v == nullptr) sum_v = sum_v_.data();
    // oneDNN's OpenMP runtime and ParallelFor take the team size from this thread's ICV; towers
    // run on threads the trainer creates, so set it on every call (cheap).
    omp_set_num_threads(threads_);
    float* x0_f32 = mlp_ != nullptr ? mlp_->input_f32() : nullptr;
    uint16_t* x0_bf16 = mlp_ != nullptr ? mlp_->input_bf16() : nullptr;
    if (blocks_ != nullptr) x0_f32 = blocks_->x0();
    if (in.offsets != nullptr) {
      // The pooled vectors, for the FM term's backward (allocated by the first list batch).
      float* pooled = nullptr;
      if (sum_v != nullptr) {
        if (pooled_.size() == 0) {
          pooled_ = AlignedArray<float>(static_cast<size_t>(max_batch_) * shape_.num_fields *
                                        shape_.dim);
        }
        pooled = pooled_.data();
      }
      ParallelFor(in.n, threads_, [&](int, int, int64_t begin, int64_t end) {
        SparseForwardLists(shape_, in, in.dense[0], begin, end, logits, sum_v, pooled, x0_f32,
                           x0_bf16);
      });
    } else {
      ParallelFor(in.n, threads_, [&](int, int, int64_t begin, int64_t end) {
        SparseForward(shape_, in, in.dense[0], begin, end, logits, sum_v, x0_f32, x0_bf16);
      });
    }
    if (attention_ != nullptr) {
      RETURN_IF_ERROR(attention_->Forward(in, x0_f32, x0_bf16, logits, sum_v, pooled_.data()));
    }
    if (mlp_ != nullptr) RETURN_IF_ERROR(mlp_->Forward(in.n, in.dense, logits));
    if (blocks_ != nullptr) RETURN_IF_ERROR(blocks_->Forward(in, logits));
    return absl::OkStatus();
  }

  const SparseShape shape_;
  const float l2_;
  const int max_batch_;
  const int threads_;
  std::unique_ptr<Mlp> mlp_;             // the MLP on x0: DEEPFM, WIDE_DEEP (and such BLOCKS)
  std::unique_ptr<DenseBlocks> blocks_;  // instead: CROSS_V2 or DOT models
  std::unique_ptr<TargetAttention> attention_;  // list fields pooled by target attention (DIN)
  AlignedArray<float> z_, g_, sum_v_;
  AlignedArray<int32_t> entries_;  // [threads][entries of the slice]: each owner's entries
  AlignedArray<float> pooled_;     // [max_batch * F * k]: the list path's pooled x_f (fm)
  AlignedArray<int32_t> iota_;     // 0, 1, 2, ...: offsets of one entry per cell (WithOffsets)
  std::vector<double> loss_part_;
};

}  // namespace

std::unique_ptr<Tower> NewCtrTower(const SparseShape& shape, float l2, int max_batch, int threads,
                                   std::unique_ptr<Mlp> mlp, std::unique_ptr<DenseBlocks> blocks,
                                   std::unique_ptr<TargetAttention> attention) {
  return std::make_unique<CtrTower>(shape, l2, max_batch, threads, std::move(mlp),
                                    std::move(blocks), std::move(attention));
}

}  // namespace pstrain
