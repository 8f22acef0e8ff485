#include "worker/train/early_stopping.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

EvalResult Eval(int64_t step, double auc, double logloss) {
  EvalResult r;
  r.step = step;
  r.auc = auc;
  r.logloss = logloss;
  return r;
}

// AUC: higher is better; an improvement must beat the best by more than min_delta; patience
// counts the evaluations since the last improvement (Keras' EarlyStopping).
TEST(EarlyStopper, AucPatienceAndMinDelta) {
  EarlyStopping config;
  config.set_patience_evals(2);
  config.set_min_delta(0.01);
  EarlyStopper es(config, EarlyStoppingState());
  EXPECT_EQ(es.metric_name(), "AUC");
  auto o = es.Observe(Eval(10, 0.60, 0.7));  // the first always improves
  EXPECT_TRUE(o.improved);
  EXPECT_FALSE(o.stop);
  o = es.Observe(Eval(20, 0.65, 0.6));
  EXPECT_TRUE(o.improved);
  o = es.Observe(Eval(30, 0.655, 0.5));  // +0.005 <= min_delta: no improvement
  EXPECT_FALSE(o.improved);
  EXPECT_FALSE(o.stop);
  EXPECT_EQ(es.state().evals_since_best(), 1);
  o = es.Observe(Eval(40, 0.64, 0.5));
  EXPECT_FALSE(o.improved);
  EXPECT_TRUE(o.stop);
  EXPECT_DOUBLE_EQ(es.state().best(), 0.65);
  EXPECT_EQ(es.state().best_step(), 20);
  EXPECT_EQ(es.state().evals(), 4);
}

// LOGLOSS: lower is better. Patience 0 never stops; the best is still tracked.
TEST(EarlyStopper, LoglossLowerIsBetterAndPatienceZeroNeverStops) {
  EarlyStopping config;
  config.set_metric(EarlyStopping::LOGLOSS);
  EarlyStopper es(config, EarlyStoppingState());
  EXPECT_EQ(es.metric_name(), "LOGLOSS");
  EXPECT_TRUE(es.Observe(Eval(1, 0.5, 0.50)).improved);
  EXPECT_FALSE(es.Observe(Eval(2, 0.9, 0.51)).improved);  // AUC is not the metric
  EXPECT_TRUE(es.Observe(Eval(3, 0.1, 0.40)).improved);
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(es.Observe(Eval(4 + i, 0.5, 0.6)).stop);
  EXPECT_DOUBLE_EQ(es.state().best(), 0.40);
  EXPECT_EQ(es.state().best_step(), 3);
}

// A restored state goes on counting: one more evaluation without improvement stops.
TEST(EarlyStopper, RestoredStateGoesOnCounting) {
  EarlyStopping config;
  config.set_patience_evals(3);
  EarlyStoppingState saved;
  saved.set_evals(5);
  saved.set_best(0.7);
  saved.set_best_step(30);
  saved.set_evals_since_best(2);
  EarlyStopper es(config, saved);
  auto o = es.Observe(Eval(60, 0.7, 0.5));  // equal is not better
  EXPECT_FALSE(o.improved);
  EXPECT_TRUE(o.stop);
  EXPECT_EQ(es.state().evals(), 6);
}

}  // namespace
}  // namespace pstrain
