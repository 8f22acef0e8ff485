#include "worker/eval/metrics.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// The value of a metric that must succeed (-1 and a failure otherwise).
double Value(const absl::StatusOr<double>& r) {
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : -1;
}
double Auc(absl::Span<const float> s, absl::Span<const float> y) {
  return Value(ComputeAuc(s, y));
}
double LogLoss(absl::Span<const float> p, absl::Span<const float> y) {
  return Value(ComputeLogLoss(p, y));
}

// The definition, pair by pair: O(n^2).
double BruteForceAuc(const std::vector<float>& s, const std::vector<float>& y) {
  double wins = 0, pos = 0, neg = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    pos += y[i];
    neg += 1 - y[i];
    for (size_t j = 0; j < s.size(); ++j) {
      const double w = static_cast<double>(y[i]) * (1 - y[j]);
      if (s[i] > s[j]) wins += w;
      if (s[i] == s[j]) wins += 0.5 * w;
    }
  }
  return wins / (pos * neg);
}

TEST(AucTest, HandComputedCases) {
  // sklearn's roc_auc_score docstring example.
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.8f, 0.9f}, {1, 1, 0, 0}), 0.0);
  // Positives {0.5, 0.9}, negatives {0.5, 0.2}: pairs 1/2 + 1 + 1 + 1 = 3.5 of 4.
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f, 0.2f, 0.9f}, {1, 0, 0, 1}), 0.875);
  // Every score tied: each pair counts 1/2.
  EXPECT_DOUBLE_EQ(Auc({0.3f, 0.3f, 0.3f, 0.3f, 0.3f}, {1, 0, 0, 1, 0}), 0.5);
  // Order of the input does not matter; scores may be logits.
  EXPECT_DOUBLE_EQ(Auc({5.f, -2.f, 0.f, 1.f}, {1, 0, 1, 0}), 0.75);
}

TEST(AucTest, OneClassIsNaN) {
  EXPECT_TRUE(std::isnan(Auc({0.1f, 0.7f, 0.3f}, {1, 1, 1})));
  EXPECT_TRUE(std::isnan(Auc({0.1f, 0.7f, 0.3f}, {0, 0, 0})));
  EXPECT_TRUE(std::isnan(Auc({}, {})));
  AucAccumulator acc;
  EXPECT_TRUE(std::isnan(Value(acc.Auc())));
  EXPECT_TRUE(std::isnan(Value(acc.LogLoss())));
  EXPECT_TRUE(std::isnan(acc.PositiveRate()));
  acc.Add(0.9f, 1);
  EXPECT_TRUE(std::isnan(Value(acc.Auc())));
}

// A diverged model scores NaN: every metric says so with INVALID_ARGUMENT, naming how many scores
// are NaN and the first one, instead of aborting the process (NaN cannot be sorted).
TEST(AucTest, NanScoresAreAnErrorNotAnAbort) {
  using ::testing::HasSubstr;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> s = {0.2f, nan, 0.7f, -nan}, y = {0, 1, 1, 0};
  for (const absl::StatusOr<double>& r : {ComputeAuc(s, y), ComputeLogLoss(s, y)}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("2 of 4 scores are NaN (the first is example 1)"));
    EXPECT_THAT(r.status().message(), HasSubstr("diverged"));
  }
  // The accumulator counts them as they come, one at a time, by the batch and merged.
  AucAccumulator one, batch, merged;
  one.Add(0.4f, 1);
  one.Add(0.1f, 0);
  for (size_t i = 0; i < s.size(); ++i) one.Add(s[i], y[i]);
  batch.Add({0.4f, 0.1f}, {1, 0});
  batch.Add(s, y);
  merged.Add({0.4f, 0.1f}, {1, 0});
  merged.Merge(batch);  // the NaNs at 3 and 5 of batch come after merged's 2 examples
  for (const auto& [acc, want] : {std::pair<const AucAccumulator*, const char*>{
                                      &one, "2 of 6 scores are NaN (the first is example 3)"},
                                  {&batch, "2 of 6 scores are NaN (the first is example 3)"},
                                  {&merged, "2 of 8 scores are NaN (the first is example 5)"}}) {
    for (const absl::StatusOr<double>& r : {acc->Auc(), acc->LogLoss()}) {
      ASSERT_FALSE(r.ok()) << want;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(r.status().message(), HasSubstr(want));
    }
  }
  // Clear forgets them; infinite scores are ordered and fine.
  merged.Clear();
  const float inf = std::numeric_limits<float>::infinity();
  merged.Add({-inf, 0.5f, inf}, {0, 0, 1});
  EXPECT_DOUBLE_EQ(Value(merged.Auc()), 1.0);
}

TEST(AucTest, SoftLabelIsASplitExample) {
  // A label of 0.5 is half a positive and half a negative with the same score.
  const std::vector<float> s = {0.2f, 0.6f, 0.6f, 0.9f}, y = {0, 0.5f, 0.25f, 1};
  EXPECT_NEAR(Auc(s, y), BruteForceAuc(s, y), 1e-12);
  // Splitting by hand: pos {0.6: 0.75, 0.9: 1}, neg {0.2: 1, 0.6: 1.25}.
  // wins = 0.75 * (1 + 0.5 * 1.25) + 1 * (1 + 1.25) = 1.21875 + 2.25; total = 1.75 * 2.25.
  EXPECT_NEAR(Auc(s, y), (1.21875 + 2.25) / (1.75 * 2.25), 1e-12);
}

class AucRandomTest : public ::testing::TestWithParam<int> {};

TEST_P(AucRandomTest, MatchesBruteForce) {
  const int levels = GetParam();  // 0: continuous scores; else scores quantized to `levels`.
  Rng rng(1234 + levels);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 1 + static_cast<int>(rng.Uniform(600));
    std::vector<float> s(n), y(n), soft(n);
    for (int i = 0; i < n; ++i) {
      double x = rng.UniformDouble();
      if (levels > 0) x = std::floor(x * levels) / levels;
      y[i] = rng.UniformDouble() < 0.3 + 0.4 * x ? 1.f : 0.f;  // informative but noisy
      soft[i] = static_cast<float>(rng.Uniform(5)) / 4;
      s[i] = static_cast<float>(x);
    }
    const double ref = BruteForceAuc(s, y);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(Auc(s, y)));
    } else {
      EXPECT_NEAR(Auc(s, y), ref, 1e-12) << "n=" << n;
    }
    const double soft_ref = BruteForceAuc(s, soft);
    if (!std::isnan(soft_ref)) {
      EXPECT_NEAR(Auc(s, soft), soft_ref, 1e-12) << "n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, AucRandomTest, ::testing::Values(0, 2, 3, 10, 50));

TEST(LogLossTest, HandComputedAndClipped) {
  EXPECT_NEAR(LogLoss({0.5f}, {1}), std::log(2.0), 1e-12);
  EXPECT_NEAR(LogLoss({0.8f, 0.1f}, {1, 0}), -(std::log(0.8) + std::log(0.9)) / 2, 1e-7);
  // Clipping: a certain wrong answer costs -ln(1e-7), not infinity.
  EXPECT_NEAR(LogLoss({0.f}, {1}), -std::log(1e-7), 1e-9);
  EXPECT_NEAR(LogLoss({1.f}, {0}), -std::log(1e-7), 1e-6);
  EXPECT_NEAR(LogLoss({1.f}, {1}), -std::log1p(-1e-7), 1e-12);
  // Soft label: the cross-entropy against y.
  EXPECT_NEAR(LogLossTerm(0.25, 0.5), -(0.5 * std::log(0.25) + 0.5 * std::log(0.75)), 1e-12);
  EXPECT_TRUE(std::isnan(LogLoss({}, {})));
}

TEST(AucAccumulatorTest, MergeEqualsOneAccumulator) {
  Rng rng(7);
  AucAccumulator all, parts[3];
  std::vector<float> s, y;
  for (int i = 0; i < 3000; ++i) {
    const float p = static_cast<float>(rng.Uniform(100)) / 100;
    const float l = rng.UniformDouble() < p ? 1.f : 0.f;
    s.push_back(p);
    y.push_back(l);
    all.Add(p, l);
    parts[i % 3].Add(p, l);
  }
  AucAccumulator merged;
  for (const auto& p : parts) merged.Merge(p);
  EXPECT_EQ(merged.count(), 3000);
  EXPECT_DOUBLE_EQ(Value(merged.Auc()), Value(all.Auc()));
  EXPECT_NEAR(Value(merged.LogLoss()), Value(all.LogLoss()), 1e-12);
  EXPECT_NEAR(Value(all.Auc()), Auc(s, y), 0);
  EXPECT_NEAR(Value(all.LogLoss()), LogLoss(s, y), 1e-12);
  double pos = 0;
  for (float l : y) pos += l;
  EXPECT_DOUBLE_EQ(all.PositiveRate(), pos / 3000);
  // Calibrated scores carry signal: well above chance.
  EXPECT_GT(Value(all.Auc()), 0.75);
  AucAccumulator batch;
  batch.Add(s, y);
  EXPECT_DOUBLE_EQ(Value(batch.Auc()), Value(all.Auc()));
  EXPECT_NEAR(Value(batch.LogLoss()), Value(all.LogLoss()), 1e-12);
  batch.Clear();
  EXPECT_EQ(batch.count(), 0);
}

}  // namespace
}  // namespace pstrain
