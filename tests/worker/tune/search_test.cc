// The search of `pstrain tune` (worker/tune/search.h) with a fake measurement and a fake clock:
// the candidates at several core counts, the budget, the ranking, and that a setting which changes
// the global batch is never recommended unless allowed. Nothing is trained.
#include "worker/tune/search.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_env.h"

namespace pstrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TuneSpace Space(int cores, bool search_inter, int default_inter = 1) {
  return TuneSpace{cores, cores, search_inter, default_inter};
}

TEST(TuneSearchTest, PowersOfTwoEndAtTheCoreCount) {
  EXPECT_THAT(PowersOfTwo(1), ElementsAre(1));
  EXPECT_THAT(PowersOfTwo(4), ElementsAre(1, 2, 4));
  EXPECT_THAT(PowersOfTwo(6), ElementsAre(1, 2, 4, 6));
  EXPECT_THAT(PowersOfTwo(72), ElementsAre(1, 2, 4, 8, 16, 32, 64, 72));
}

TEST(TuneSearchTest, CoarseGridOnFourCoresIsFullestComputeFirst) {
  const CoarseGrid g = CoarseCandidates(Space(4, /*search_inter=*/false, 2), 512);
  std::vector<std::string> names;
  for (const TuneCandidate& c : g.candidates) names.push_back(c.Name());
  // Compute 4, then 2, then 1; more towers first within each.
  EXPECT_THAT(names, ElementsAre("4x1x2@512", "2x2x2@512", "1x4x2@512", "2x1x2@512", "1x2x2@512",
                                 "1x1x2@512"));
  EXPECT_EQ(g.not_allowed, 3);  // 2x4, 4x2, 4x4 oversubscribe the cores
}

TEST(TuneSearchTest, CoarseGridStaysInTheSpaceAtEveryCoreCount) {
  for (int cores : {1, 2, 3, 6, 16, 72}) {
    for (bool search_inter : {false, true}) {
      SCOPED_TRACE(testing::Message() << cores << " cores, search_inter " << search_inter);
      TuneSpace space = Space(cores, search_inter, 1);
      space.intra_cap = std::max(1, cores / 2);
      const CoarseGrid g = CoarseCandidates(space, 256);
      const size_t p = PowersOfTwo(cores).size();
      EXPECT_EQ(g.candidates.size() + g.not_allowed, p * p * (search_inter ? p : 1));
      ASSERT_FALSE(g.candidates.empty());
      std::set<TuneCandidate> unique(g.candidates.begin(), g.candidates.end());
      EXPECT_EQ(unique.size(), g.candidates.size());
      int last_compute = cores;
      for (const TuneCandidate& c : g.candidates) {
        EXPECT_TRUE(space.Allowed(c)) << c.Name();
        EXPECT_LE(c.towers * c.intra, cores) << c.Name();
        EXPECT_LE(c.intra, space.intra_cap) << c.Name();
        EXPECT_EQ(c.step, 256);
        if (!search_inter) EXPECT_EQ(c.inter, 1) << c.Name();
        // Parser threads may overlap the compute by a quarter of the cores (at least one).
        EXPECT_LE(c.inter, std::max(1, cores - c.towers * c.intra + std::max(1, cores / 4)));
        EXPECT_LE(c.towers * c.intra, last_compute) << c.Name();
        last_compute = c.towers * c.intra;
      }
    }
  }
}

TEST(TuneSearchTest, NeighboursAreWithinOneAndAllowed) {
  const TuneSpace space = Space(4, /*search_inter=*/true);
  const TuneCandidate best{2, 2, 1, 128};
  const std::vector<TuneCandidate> n = NeighbourCandidates(space, best);
  EXPECT_NE(std::find(n.begin(), n.end(), best), n.end());
  for (const TuneCandidate& c : n) {
    EXPECT_TRUE(space.Allowed(c)) << c.Name();
    EXPECT_LE(std::abs(c.towers - 2), 1);
    EXPECT_LE(std::abs(c.intra - 2), 1);
    EXPECT_LE(std::abs(c.inter - 1), 1);
    EXPECT_EQ(c.step, 128);
  }
  // 3x2 and 2x3 need 6 cores; inter 0 is no setting.
  for (const TuneCandidate& c : n) EXPECT_LE(c.towers * c.intra, 4);
}

TEST(TuneSearchTest, BatchSizeCandidatesChangeTheGlobalBatchUpToTheMax) {
  const TuneCandidate best{4, 1, 2, 512};
  const std::vector<TuneCandidate> b = BatchSizeCandidates(best, {32, kMaxBatch});
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], (TuneCandidate{4, 1, 2, 128}));
  EXPECT_EQ(b[0].batch(), 32);
  EXPECT_EQ(b[1].step, kMaxBatch);
}

TEST(TuneSearchTest, CandidateSplitsTheStepOverTheTowers) {
  EXPECT_EQ((TuneCandidate{3, 1, 1, 512}).batch(), 171);  // the largest share
  EXPECT_EQ((TuneCandidate{4, 1, 1, 512}).batch(), 128);
  EXPECT_EQ((TuneCandidate{4, 1, 1, 2}).batch(), 1);
}

// A fake measurement: examples/s from a table by name (else from the compute threads), taking
// `seconds` of the fake clock; counts its calls.
struct FakeMeasure {
  FakeEnv* env;
  double seconds = 1;
  std::map<std::string, double> by_name;
  std::vector<std::string> calls;
  absl::StatusOr<double> operator()(const TuneCandidate& c) {
    calls.push_back(c.Name());
    env->Advance(absl::Seconds(seconds));
    auto it = by_name.find(c.Name());
    if (it != by_name.end()) return it->second;
    return 1000.0 * c.towers * c.intra + c.inter;
  }
};

TuneSearchOptions Options(FakeEnv* env, int cores, double budget_s) {
  TuneSearchOptions o;
  o.space = Space(cores, /*search_inter=*/false);
  o.global_batch = 512;
  o.budget_s = budget_s;
  o.env = env;
  return o;
}

TEST(TuneSearchTest, WithinTheBudgetEverySettingIsMeasuredOnce) {
  FakeEnv env;
  FakeMeasure m{&env};
  std::vector<std::string> progress;
  TuneSearchOptions o = Options(&env, 4, 1000);
  o.on_measured = [&](const MeasuredSetting& s) { progress.push_back(s.c.Name()); };
  absl::StatusOr<TuneResult> r = SearchSettings(o, std::ref(m));
  ASSERT_TRUE(r.ok()) << r.status();
  // The 6 coarse settings, then the one neighbour of the best (4x1) not measured yet: 3x1.
  EXPECT_EQ(r->measured.size(), 7u);
  EXPECT_EQ(m.calls.back(), "3x1x1@512");
  EXPECT_EQ(m.calls, progress);
  EXPECT_EQ(std::set<std::string>(m.calls.begin(), m.calls.end()).size(), m.calls.size());
  EXPECT_TRUE(r->not_tried.empty());
  EXPECT_EQ(r->not_allowed, 3);
  EXPECT_DOUBLE_EQ(r->seconds, 7);
  EXPECT_EQ(r->recommended.c.Name(), "4x1x1@512");
  EXPECT_FALSE(r->batch_changes());
}

TEST(TuneSearchTest, TheBudgetStopsBeforeACandidateThatWouldNotFit) {
  FakeEnv env;
  FakeMeasure m{&env, /*seconds=*/3};
  absl::StatusOr<TuneResult> r = SearchSettings(Options(&env, 4, 10), std::ref(m));
  ASSERT_TRUE(r.ok()) << r.status();
  // 3 s, 6 s, 9 s spent; a fourth would end at 12 s > 10 s. The best's neighbour 3x1 is not
  // tried either.
  EXPECT_THAT(m.calls, ElementsAre("4x1x1@512", "2x2x1@512", "1x4x1@512"));
  std::vector<std::string> not_tried;
  for (const TuneCandidate& c : r->not_tried) not_tried.push_back(c.Name());
  EXPECT_THAT(not_tried, ElementsAre("2x1x1@512", "1x2x1@512", "1x1x1@512", "3x1x1@512"));
  EXPECT_DOUBLE_EQ(r->seconds, 9);
}

TEST(TuneSearchTest, TheFirstCandidateIsMeasuredWhateverTheBudget) {
  FakeEnv env;
  FakeMeasure m{&env, /*seconds=*/100};
  absl::StatusOr<TuneResult> r = SearchSettings(Options(&env, 2, 1), std::ref(m));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(r->recommended.c.Name(), "2x1x1@512");
  EXPECT_EQ(r->not_tried.size(), 2u);  // 1x2, 1x1
}

TEST(TuneSearchTest, TheNeighboursOfTheBestAreMeasured) {
  FakeEnv env;
  FakeMeasure m{&env};
  TuneSearchOptions o = Options(&env, 6, 1000);
  // 4x1 is the fastest of the powers-of-two grid; its neighbour 5x1 is faster still.
  m.by_name = {{"4x1x1@512", 5000}, {"5x1x1@512", 6000}, {"6x1x1@512", 10}, {"1x6x1@512", 10},
               {"3x2x1@512", 10}};
  absl::StatusOr<TuneResult> r = SearchSettings(o, std::ref(m));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->recommended.c.Name(), "5x1x1@512");
  EXPECT_NE(std::find(m.calls.begin(), m.calls.end(), "3x1x1@512"), m.calls.end());
}

TEST(TuneSearchTest, AFasterChangedGlobalBatchIsNotRecommendedUnlessAllowed) {
  for (bool allow : {false, true}) {
    SCOPED_TRACE(allow);
    FakeEnv env;
    FakeMeasure m{&env};
    TuneSearchOptions o = Options(&env, 4, 1000);
    o.batch_sizes = {1024};
    o.allow_batch_change = allow;
    m.by_name = {{"4x1x1@4096", 99999}};
    absl::StatusOr<TuneResult> r = SearchSettings(o, std::ref(m));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(m.calls.back(), "4x1x1@4096");  // the batch sizes come last, at the best threads
    EXPECT_TRUE(r->batch_changes());
    EXPECT_EQ(r->fastest.c.step, 4096);
    EXPECT_EQ(r->best_fixed.c.Name(), "4x1x1@512");
    EXPECT_EQ(r->recommended.c.step, allow ? 4096 : 512);
  }
}

TEST(TuneSearchTest, AMeasurementErrorNamesTheCandidate) {
  FakeEnv env;
  int calls = 0;
  absl::StatusOr<TuneResult> r =
      SearchSettings(Options(&env, 2, 1000), [&](const TuneCandidate&) -> absl::StatusOr<double> {
        if (++calls == 2) return absl::FailedPreconditionError("the training data is empty");
        return 1.0;
      });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "1x2x1@512: the training data is empty");
}

}  // namespace
}  // namespace pstrain
