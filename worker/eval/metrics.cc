#include "worker/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace pstrain {
namespace {

absl::Status NanScores(int64_t nan, int64_t first, int64_t n) {
  return absl::InvalidArgumentError(absl::StrCat(
      nan, " of ", n, " scores are NaN (the first is example ", first,
      "): the model's outputs are not numbers, its parameters have probably diverged"));
}

// The same error for the first NaN of `scores`, if any.
absl::Status CheckScores(absl::Span<const float> scores) {
  int64_t nan = 0, first = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i]) && nan++ == 0) first = static_cast<int64_t>(i);
  }
  if (nan == 0) return absl::OkStatus();
  return NanScores(nan, first, static_cast<int64_t>(scores.size()));
}

}  // namespace

absl::StatusOr<double> ComputeAuc(absl::Span<const float> scores, absl::Span<const float> labels) {
  PSTRAIN_CHECK(scores.size() == labels.size()) << scores.size() << " vs " << labels.size();
  RETURN_IF_ERROR(CheckScores(scores));
  // Sorting (score, label) pairs by value is several times faster than sorting an index.
  std::vector<std::pair<float, float>> pairs(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) pairs[i] = {scores[i], labels[i]};
  std::sort(pairs.begin(), pairs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // Walk tie groups from the lowest score up: each group's positive weight beats all negative
  // weight below it and ties with the group's own negative weight.
  double neg_below = 0, pos_total = 0, wins = 0;
  for (size_t i = 0; i < pairs.size();) {
    size_t j = i;
    double pos = 0, neg = 0;
    for (; j < pairs.size() && pairs[j].first == pairs[i].first; ++j) {
      pos += pairs[j].second;
      neg += 1.0 - pairs[j].second;
    }
    wins += pos * (neg_below + 0.5 * neg);
    neg_below += neg;
    pos_total += pos;
    i = j;
  }
  if (pos_total <= 0 || neg_below <= 0) return std::numeric_limits<double>::quiet_NaN();
  return wins / (pos_total * neg_below);
}

double LogLossTerm(double prob, double label) {
  const double p = std::min(std::max(prob, kLogLossEpsilon), 1.0 - kLogLossEpsilon);
  return -(label * std::log(p) + (1.0 - label) * std::log1p(-p));
}

absl::StatusOr<double> ComputeLogLoss(absl::Span<const float> probs,
                                      absl::Span<const float> labels) {
  PSTRAIN_CHECK(probs.size() == labels.size()) << probs.size() << " vs " << labels.size();
  RETURN_IF_ERROR(CheckScores(probs));
  if (probs.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (size_t i = 0; i < probs.size(); ++i) sum += LogLossTerm(probs[i], labels[i]);
  return sum / static_cast<double>(probs.size());
}

void AucAccumulator::Add(absl::Span<const float> probs, absl::Span<const float> labels) {
  PSTRAIN_CHECK(probs.size() == labels.size()) << probs.size() << " vs " << labels.size();
  for (size_t i = 0; i < probs.size(); ++i) {
    if (std::isnan(probs[i]) && nan_scores_++ == 0) first_nan_ = count() + static_cast<int64_t>(i);
  }
  scores_.insert(scores_.end(), probs.begin(), probs.end());
  labels_.insert(labels_.end(), labels.begin(), labels.end());
  for (size_t i = 0; i < probs.size(); ++i) {
    logloss_sum_ += LogLossTerm(probs[i], labels[i]);
    label_sum_ += labels[i];
  }
}

void AucAccumulator::Merge(const AucAccumulator& other) {
  if (other.nan_scores_ > 0 && nan_scores_ == 0) first_nan_ = count() + other.first_nan_;
  nan_scores_ += other.nan_scores_;
  scores_.insert(scores_.end(), other.scores_.begin(), other.scores_.end());
  labels_.insert(labels_.end(), other.labels_.begin(), other.labels_.end());
  logloss_sum_ += other.logloss_sum_;
  label_sum_ += other.label_sum_;
}

void AucAccumulator::Clear() {
  scores_.clear();
  labels_.clear();
  logloss_sum_ = 0;
  label_sum_ = 0;
  nan_scores_ = 0;
  first_nan_ = 0;
}

absl::StatusOr<double> AucAccumulator::Auc() const {
  if (nan_scores_ > 0) return NanScores(nan_scores_, first_nan_, count());
  return ComputeAuc(scores_, labels_);
}

absl::StatusOr<double> AucAccumulator::LogLoss() const {
  if (nan_scores_ > 0) return NanScores(nan_scores_, first_nan_, count());
  if (scores_.empty()) return std::numeric_limits<double>::quiet_NaN();
  return logloss_sum_ / static_cast<double>(scores_.size());
}

double AucAccumulator::PositiveRate() const {
  if (scores_.empty()) return std::numeric_limits<double>::quiet_NaN();
  return label_sum_ / static_cast<double>(scores_.size());
}

}  // namespace pstrain
