// Learning-rate schedules (ps/store/lr_schedule.h): golden factors of every shape, and the
// optimizer kernels against their reference twins along a schedule.
#include "ps/store/lr_schedule.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "ps/store/optimizer.h"
#include "ps/store/optimizer_ref.h"

namespace pstrain {
namespace {

LearningRateSchedule Schedule(int64_t warmup, LearningRateSchedule::Decay decay,
                              int64_t decay_steps = 0, double rate = 0.5, double min = 0) {
  LearningRateSchedule s;
  s.set_warmup_steps(warmup);
  s.set_decay(decay);
  s.set_decay_steps(decay_steps);
  s.set_decay_rate(rate);
  s.set_min_factor(min);
  return s;
}

TEST(LearningRateFactor, ConstantIsOne) {
  const LearningRateSchedule s;
  EXPECT_TRUE(IsConstantSchedule(s));
  for (int64_t step : {0, 1, 7, 1000000}) EXPECT_EQ(LearningRateFactor(s, step), 1.0);
}

TEST(LearningRateFactor, LinearWarmup) {
  const LearningRateSchedule s = Schedule(10, LearningRateSchedule::CONSTANT);
  EXPECT_FALSE(IsConstantSchedule(s));
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 0), 0.1);  // counts as step 1
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 5), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 11), 1.0);
}

TEST(LearningRateFactor, StepDecayAfterWarmup) {
  const LearningRateSchedule s = Schedule(10, LearningRateSchedule::STEP, 100, 0.5);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 109), 1.0);   // t = 99
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 110), 0.5);   // t = 100
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 260), 0.25);  // t = 250
}

TEST(LearningRateFactor, ExponentialDecay) {
  const LearningRateSchedule s = Schedule(0, LearningRateSchedule::EXPONENTIAL, 100, 0.25);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 50), 0.5);  // 0.25^(50/100)
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 200), 0.0625);
}

TEST(LearningRateFactor, CosineDecayToItsFloor) {
  const LearningRateSchedule s = Schedule(0, LearningRateSchedule::COSINE, 100, 0.5, 0.1);
  EXPECT_NEAR(LearningRateFactor(s, 1), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.01)), 1e-15);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 50), 0.55);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 100), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateFactor(s, 5000), 0.1);
}

// Every optimizer's fast kernel follows the schedule as its reference twin does, step by step.
TEST(LearningRateSchedule, KernelsMatchTheirReferenceTwinsAlongASchedule) {
  for (OptimizerType type : {SGD, ADAGRAD, ADAM, FTRL}) {
    OptimizerConfig c;
    c.set_type(type);
    c.set_learning_rate(0.1f);
    *c.mutable_schedule() = Schedule(5, LearningRateSchedule::COSINE, 20, 0.5, 0.2);
    auto opt = Optimizer::Create(c);
    ASSERT_TRUE(opt.ok()) << opt.status();
    const int n = 17;
    std::vector<float> w(n, 0.5f), wr(n, 0.5f), g(n);
    std::vector<float> s((*opt)->StateFloats(n)), sr(ref::StateFloats(c, n));
    (*opt)->InitState(s.data(), n);
    ref::InitState(c, sr.data(), n);
    for (int64_t step = 1; step <= 30; ++step) {
      for (int i = 0; i < n; ++i) g[i] = std::sin(0.3 * i + step) * 0.1f;
      (*opt)->ApplyRow(w.data(), s.data(), g.data(), n, (*opt)->LearningRate(step));
      ref::ApplyRow(c, wr.data(), sr.data(), g.data(), n, step);
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(w[i], wr[i], 1e-4 * (1 + std::fabs(wr[i]))) << OptimizerType_Name(type) << i;
    }
    // And the schedule mattered: a constant rate ends elsewhere.
    OptimizerConfig flat = c;
    flat.clear_schedule();
    std::vector<float> wf(n, 0.5f), sf(ref::StateFloats(flat, n));
    ref::InitState(flat, sf.data(), n);
    for (int64_t step = 1; step <= 30; ++step) {
      for (int i = 0; i < n; ++i) g[i] = std::sin(0.3 * i + step) * 0.1f;
      ref::ApplyRow(flat, wf.data(), sf.data(), g.data(), n, step);
    }
    EXPECT_GT(std::fabs(wf[3] - wr[3]), 1e-4) << OptimizerType_Name(type);
  }
}

}  // namespace
}  // namespace pstrain
