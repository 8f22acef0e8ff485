// datagen's ids that come and go over days (DatagenOptions::id_churn, docs/DATAGEN.md "Ids that
// come and go").
#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "worker/eval/metrics.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

constexpr int kF = SyntheticData::kNumFields;
constexpr int kN = SyntheticData::kNumNumeric;
constexpr int kC = SyntheticData::kNumCategorical;

DatagenOptions Churn(int day, double churn = 0.2) {
  DatagenOptions o;
  o.max_cardinality = 1000;
  o.id_churn = churn;
  o.day = day;
  o.teacher_seed = 3;
  o.calibration_rows = 4096;
  return o;
}

SyntheticData Make(const DatagenOptions& o) {
  auto d = SyntheticData::Create(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return std::move(d).value();
}

struct Rows {
  RawRows rows;
  std::vector<float> probs;
};

Rows Generate(const SyntheticData& d, int64_t n) {
  Rows all;
  all.rows.Clear(kF);
  const absl::Status s = d.Generate(n, 1, [&](const RawRows& r, absl::Span<const float> p) {
    all.rows.labels.insert(all.rows.labels.end(), r.labels.begin(), r.labels.end());
    all.rows.present.insert(all.rows.present.end(), r.present.begin(), r.present.end());
    all.rows.key.insert(all.rows.key.end(), r.key.begin(), r.key.end());
    all.rows.value.insert(all.rows.value.end(), r.value.begin(), r.value.end());
    all.probs.insert(all.probs.end(), p.begin(), p.end());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return all;
}

// The ids of field c on `day`: the keys its ranks hold.
std::set<uint64_t> IdsOn(const SyntheticData& d, int c, int day) {
  std::set<uint64_t> ids;
  for (uint64_t r = 1; r <= d.cardinalities()[c]; ++r) ids.insert(d.KeyOnDay(c, r, day));
  return ids;
}

TEST(DatagenChurnTest, AStatedFractionOfIdsIsNewEachDay) {
  const SyntheticData d = Make(Churn(6));
  for (int day = 0; day < 6; ++day) {
    int64_t ranks = 0, changed = 0;
    for (int c = 0; c < kC; ++c) {
      for (uint64_t r = 1; r <= d.cardinalities()[c]; ++r) {
        ++ranks;
        changed += d.KeyOnDay(c, r, day + 1) != d.KeyOnDay(c, r, day);
      }
    }
    // ~24k ranks: the binomial's sd is 0.0026.
    EXPECT_NEAR(static_cast<double>(changed) / ranks, 0.2, 0.015) << "day " << day + 1;
  }
  // Day 0 is the plain id set.
  for (uint64_t r = 1; r <= 50; ++r) EXPECT_EQ(d.KeyOnDay(4, r, 0), d.RankToKey(4, r));
}

// The rows of day 4: no id retired by then appears, and about id_churn of the draws are ids that
// day 3 did not have.
TEST(DatagenChurnTest, RetiredIdsNeverReappearAndDrawsFollowTheNewIds) {
  const SyntheticData d = Make(Churn(4));
  const Rows day4 = Generate(d, 20000);
  int64_t draws = 0, new_draws = 0;
  for (int c = 0; c < kC; ++c) {
    const std::set<uint64_t> now = IdsOn(d, c, 4), yesterday = IdsOn(d, c, 3);
    std::set<uint64_t> retired;
    for (int day = 0; day < 4; ++day) {
      for (uint64_t id : IdsOn(d, c, day)) {
        if (!now.count(id)) retired.insert(id);
      }
    }
    if (d.cardinalities()[c] >= 100) {
      ASSERT_FALSE(retired.empty()) << "C" << c + 1;
    }
    for (size_t r = 0; r < day4.probs.size(); ++r) {
      const size_t at = r * kF + kN + c;
      if (!day4.rows.present[at]) continue;
      const uint64_t key = day4.rows.key[at];
      ASSERT_TRUE(now.count(key)) << "C" << c + 1 << " row " << r << ": " << key;
      ASSERT_FALSE(retired.count(key)) << "C" << c + 1 << " row " << r << ": retired " << key;
      ++draws;
      new_draws += yesterday.count(key) == 0;
    }
  }
  // The coin does not depend on popularity: the draws' share of new ids is id_churn too (the
  // draws are correlated through popular ranks, hence the wider margin).
  EXPECT_NEAR(static_cast<double>(new_draws) / draws, 0.2, 0.05);
}

TEST(DatagenChurnTest, SameSeedSameDataAndTheTeacherFollows) {
  const SyntheticData a = Make(Churn(5)), b = Make(Churn(5));
  const Rows ra = Generate(a, 8192), rb = Generate(b, 8192);
  EXPECT_EQ(ra.rows.key, rb.rows.key);
  EXPECT_EQ(ra.rows.labels, rb.rows.labels);
  EXPECT_EQ(ra.probs, rb.probs);
  // A test set of the same day (another data seed) has the same ids.
  DatagenOptions test = Churn(5);
  test.seed = 2;
  const SyntheticData t = Make(test);
  for (uint64_t r = 1; r <= 100; ++r) EXPECT_EQ(t.KeyOnDay(2, r, 5), a.KeyOnDay(2, r, 5));
  // The teacher labels the new ids (their parameters are hashes of their keys): the day's Bayes
  // AUC is known and near the plain teacher's.
  const double auc = ComputeAuc(ra.probs, ra.rows.labels).value();
  EXPECT_GT(auc, 0.74);
  EXPECT_LT(auc, 0.86);
  for (int r = 0; r < 100; ++r) {
    EXPECT_NEAR(1 / (1 + std::exp(-a.TeacherLogit(ra.rows, r))), ra.probs[r], 1e-5);
  }
  // Churn on day 0 is the plain data, bit for bit.
  DatagenOptions plain = Churn(0, 0);
  const Rows p = Generate(Make(plain), 4096), c0 = Generate(Make(Churn(0)), 4096);
  EXPECT_EQ(p.rows.key, c0.rows.key);
  EXPECT_EQ(p.probs, c0.probs);
  // And a later day differs.
  EXPECT_NE(std::vector<uint64_t>(ra.rows.key.begin(), ra.rows.key.begin() + 4096 * kF),
            std::vector<uint64_t>(p.rows.key.begin(), p.rows.key.end()));
}

TEST(DatagenChurnTest, RefusesRatesAndDaysItCannotKeyDistinctly) {
  DatagenOptions o = Churn(1, 1.0);
  auto d = SyntheticData::Create(o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("id_churn"), std::string::npos) << d.status();
  o = Churn(1, -0.1);
  EXPECT_EQ(SyntheticData::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Churn(2);
  o.high_cardinality_fields = {2};
  o.high_cardinality = uint64_t{1} << 31;  // 3 generations of 2^31 ids do not fit 32 bits
  d = SyntheticData::Create(o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("C3"), std::string::npos) << d.status();
}

}  // namespace
}  // namespace pstrain
