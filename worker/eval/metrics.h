// Evaluation metrics of a binary classifier: exact ROC AUC and logloss.
//
// Labels are 0/1 or soft labels in [0, 1]. A soft label y is treated as a weight: the example
// counts as y of a positive and (1 - y) of a negative. For 0/1 labels this is the usual
// definition; for soft labels the AUC is the weighted Mann-Whitney statistic over all pairs
//   AUC = sum_{i,j} y_i (1 - y_j) ([s_i > s_j] + 1/2 [s_i == s_j])  /  (sum_i y_i)(sum_j (1 - y_j))
// i.e. each example is split into a positive of weight y and a negative of weight 1 - y with the
// same score (the two halves of one soft example tie with each other). Tied scores count 1/2,
// exactly: for 0/1 labels this is the Mann-Whitney U statistic with average ranks, the number
// sklearn's roc_auc_score gives.
//
// When one class has no weight (all labels 0, or all labels 1, or no examples) the AUC is
// undefined and these functions return NaN; callers print it as "nan" rather than inventing 0.5.
//
// A NaN score is an error, not a programmer's mistake: a model whose parameters diverged scores
// NaN, and NaN has no place in an order (sorting it is undefined behaviour) nor a logloss. The
// metrics then return INVALID_ARGUMENT naming how many scores are NaN and the first one, and the
// evaluation that asked fails with that status instead of the process aborting.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pstrain {

// Probabilities are clipped to [kLogLossEpsilon, 1 - kLogLossEpsilon] before taking logs, so a
// confident wrong prediction costs at most -ln(1e-7) ~= 16.1 instead of infinity (as sklearn's
// log_loss and TF's binary_crossentropy clip).
inline constexpr double kLogLossEpsilon = 1e-7;

// Exact AUC of `scores` against `labels` (same length: a programmer's error otherwise). O(n log n)
// time, O(n) extra memory. Any monotone transform of the scores gives the same AUC (probabilities
// or logits both work). NaN when one class is empty (see above); INVALID_ARGUMENT when a score
// is NaN.
absl::StatusOr<double> ComputeAuc(absl::Span<const float> scores, absl::Span<const float> labels);

// Mean sigmoid cross-entropy  -[y ln p + (1 - y) ln(1 - p)]  of probabilities `probs` (clipped,
// see kLogLossEpsilon) against `labels`. NaN for zero examples; INVALID_ARGUMENT when a
// probability is NaN.
absl::StatusOr<double> ComputeLogLoss(absl::Span<const float> probs,
                                      absl::Span<const float> labels);

// The per-example term of ComputeLogLoss, for callers that accumulate it themselves.
double LogLossTerm(double prob, double label);

// The probability of a model output (a logit), as every scorer computes it: the sigmoid in
// double, rounded to float once. The evaluator, `pstrain predict` and `pstrain serve` share it,
// so their probabilities (and AUC, logloss) agree to the bit for the same logits.
inline float ProbabilityOfLogit(float logit) {
  return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logit))));
}

// Collects (probability, label) pairs over many batches and reports AUC, logloss, count and
// positive rate over all of them. Memory: 8 bytes per example (scores kept as float: the AUC is
// exact for the float scores; scores that differ only below float precision count as ties).
//
// Thread-compatible: concurrent const calls are safe, mutation needs external synchronization.
// The usual pattern is one accumulator per thread, merged at the end with Merge(); merging in a
// fixed order gives bit-identical results.
class AucAccumulator {
 public:
  // `prob` must be a probability in [0, 1] for LogLoss() to be meaningful (AUC accepts any
  // score); `label` in [0, 1].
  void Add(float prob, float label) {
    if (std::isnan(prob) && nan_scores_++ == 0) first_nan_ = count();
    scores_.push_back(prob);
    labels_.push_back(label);
    logloss_sum_ += LogLossTerm(prob, label);
    label_sum_ += label;
  }
  void Add(absl::Span<const float> probs, absl::Span<const float> labels);
  // Appends every example of `other`.
  void Merge(const AucAccumulator& other);
  void Clear();
  void Reserve(size_t n) {
    scores_.reserve(n);
    labels_.reserve(n);
  }

  int64_t count() const { return static_cast<int64_t>(scores_.size()); }
  // Exact AUC over everything added (sorts a copy: O(n log n)). NaN if one class is empty;
  // INVALID_ARGUMENT if a score is NaN.
  absl::StatusOr<double> Auc() const;
  // Mean logloss; NaN when empty; INVALID_ARGUMENT if a probability is NaN.
  absl::StatusOr<double> LogLoss() const;
  // Mean label (the positive rate for 0/1 labels); NaN when empty.
  double PositiveRate() const;

 private:
  std::vector<float> scores_;
  std::vector<float> labels_;
  double logloss_sum_ = 0;
  double label_sum_ = 0;
  int64_t nan_scores_ = 0;  // NaN probabilities added, the first at index first_nan_
  int64_t first_nan_ = 0;
};

}  // namespace pstrain
