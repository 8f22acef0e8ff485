// Scorer: the one inference step of pstrain predict and pstrain serve. For n encoded examples
// (Batch layout: ids[n x F], values[n x F]) it deduplicates the row ids, gathers the rows from a
// ServingModel (trained values, else the initial value), runs the model's Tower::Forward and
// turns the logits into probabilities (ProbabilityOfLogit). The same code, on the same batches,
// as the trainer's evaluator (worker/eval/evaluator.cc), so the scores are the evaluator's to the
// bit when the batches are cut alike. The model's forward pass gives the same logits whatever the
// thread count; on some oneDNN paths (avx2) the batch size changes the last bits of a few logits
// (measured: up to 2e-6), which is why predict cuts its batches as the evaluator does.
//
// Memory: scratch for max_batch examples (the tower's, the unique ids and their rows).
// Thread-safety: not thread-safe; one Scorer per thread. The model is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "serving/serving_model.h"
#include "worker/model/model.h"
#include "worker/params/dedup.h"

namespace pstrain {

class Scorer {
 public:
  // A scorer of up to max_batch examples per call, whose forward pass runs `threads` OpenMP
  // threads. INVALID_ARGUMENT for a max_batch or threads < 1.
  static absl::StatusOr<std::unique_ptr<Scorer>> Create(std::shared_ptr<const ServingModel> model,
                                                        int max_batch, int threads);

  const std::shared_ptr<const ServingModel>& model() const { return model_; }
  int max_batch() const { return max_batch_; }

  // Scores n <= max_batch examples: ids and values hold n x num_fields entries (row ids already
  // offset into the table, as FeatureSpec::Encode writes them). Writes logits[n] and probs[n]
  // (either may be null). INVALID_ARGUMENT for n out of range or a row id outside the table.
  // offsets: Batch::offsets for a batch with list fields (ids / values then hold its entries),
  // else null.
  absl::Status Score(int n, const int64_t* ids, const float* values, float* logits, float* probs,
                     const int32_t* offsets = nullptr);

 private:
  Scorer(std::shared_ptr<const ServingModel> model, int max_batch, std::unique_ptr<Tower> tower)
      : model_(std::move(model)), max_batch_(max_batch), tower_(std::move(tower)) {}

  std::shared_ptr<const ServingModel> model_;
  const int max_batch_;
  std::unique_ptr<Tower> tower_;
  Deduper dedup_;
  std::vector<int64_t> unique_;
  std::vector<int32_t> slots_;
  std::vector<float> rows_, logits_;
};

}  // namespace pstrain
