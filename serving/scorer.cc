#include "serving/scorer.h"

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "worker/eval/metrics.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<Scorer>> Scorer::Create(std::shared_ptr<const ServingModel> model,
                                                       int max_batch, int threads) {
  if (model == nullptr) return absl::InvalidArgumentError("Scorer: no model");
  if (max_batch < 1 || threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Scorer: max_batch ", max_batch, " and threads ",
                                                   threads, " must be >= 1"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tower> tower, model->model().CreateTower(max_batch, threads));
  return std::unique_ptr<Scorer>(new Scorer(std::move(model), max_batch, std::move(tower)));
}

absl::Status Scorer::Score(int n, const int64_t* ids, const float* values, float* logits,
                           float* probs, const int32_t* offsets) {
  if (n < 0 || n > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Scorer: ", n, " examples, expected 0..", max_batch_));
  }
  if (n == 0) return absl::OkStatus();
  const int F = model_->spec().num_fields();
  const size_t entries = offsets != nullptr ? static_cast<size_t>(offsets[n * F] - offsets[0])
                                             : static_cast<size_t>(n) * F;
  dedup_.Run(absl::MakeConstSpan(ids, entries), &unique_, &slots_);
  rows_.resize(unique_.size() * model_->row_dim());
  RETURN_IF_ERROR(model_->Gather(unique_, rows_.data()));
  float* out = logits;
  if (out == nullptr) {
    logits_.resize(n);
    out = logits_.data();
  }
  Tower::Input in;
  in.n = n;
  in.slots = slots_.data();
  in.scales = values;
  in.offsets = offsets;
  in.rows = rows_.data();
  in.dense = model_->dense().data();
  RETURN_IF_ERROR(tower_->Forward(in, out));
  if (probs != nullptr) {
    for (int i = 0; i < n; ++i) probs[i] = ProbabilityOfLogit(out[i]);
  }
  return absl::OkStatus();
}

}  // namespace pstrain
