#include "ps/store/optimizer.h"

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "ps/store/optimizer_ref.h"

namespace pstrain {
namespace {

OptimizerConfig Config(OptimizerType type, float lr) {
  OptimizerConfig c;
  c.set_type(type);
  c.set_learning_rate(lr);
  return c;
}

std::unique_ptr<Optimizer> Make(const OptimizerConfig& c) {
  auto o = Optimizer::Create(c);
  EXPECT_TRUE(o.ok()) << o.status();
  return std::move(o).value();
}

// The configurations every fast kernel is compared against its reference twin under.
struct NamedConfig {
  std::string name;
  OptimizerConfig config;
};

std::vector<NamedConfig> MakeConfigs() {
  std::vector<NamedConfig> out;
  out.push_back({"Sgd", Config(SGD, 0.1f)});
  out.push_back({"Adagrad", Config(ADAGRAD, 0.05f)});
  OptimizerConfig adam = Config(ADAM, 0.01f);
  out.push_back({"Adam", adam});
  adam.set_beta1(0.0f);
  adam.set_beta2(0.9f);
  adam.set_epsilon(1e-6f);
  out.push_back({"AdamBeta1Zero", adam});
  OptimizerConfig ftrl = Config(FTRL, 0.1f);
  ftrl.set_l1(0.01f);
  ftrl.set_l2(0.1f);
  out.push_back({"FtrlSqrt", ftrl});
  ftrl.set_lr_power(-0.7f);  // the pow path
  out.push_back({"FtrlPow", ftrl});
  ftrl.set_lr_power(0.0f);  // constant learning rate: accum^0 = 1
  ftrl.set_l1(0.0f);
  out.push_back({"FtrlPowZero", ftrl});
  return out;
}

const std::vector<NamedConfig>& Configs() {
  static const std::vector<NamedConfig> configs = MakeConfigs();
  return configs;
}

// Gradients in [-1, 1] with about one element in eight exactly zero, as in sparse rows.
std::vector<float> RandomGrad(Rng* rng, int64_t n) {
  std::vector<float> g(n);
  for (auto& x : g)
    x = rng->Uniform(8) == 0 ? 0.0f : static_cast<float>(rng->UniformDouble() * 2 - 1);
  return g;
}

void ExpectClose(const std::vector<float>& fast, const std::vector<float>& ref,
                 const std::string& what) {
  ASSERT_EQ(fast.size(), ref.size());
  for (size_t i = 0; i < fast.size(); ++i) {
    ASSERT_NEAR(fast[i], ref[i], 2e-5 * std::max(1.0f, std::fabs(ref[i])))
        << what << " element " << i;
  }
}

class FastVsRef : public testing::TestWithParam<std::tuple<int, int>> {
 protected:
  const OptimizerConfig& config() const { return Configs()[std::get<0>(GetParam())].config; }
  int dim() const { return std::get<1>(GetParam()); }
};

TEST_P(FastVsRef, InitStateMatchesReference) {
  auto opt = Make(config());
  ASSERT_EQ(opt->StateFloats(dim()), ref::StateFloats(config(), dim()));
  std::vector<float> fast(opt->StateFloats(dim()), -7.0f), ref(fast.size(), -7.0f);
  opt->InitState(fast.data(), dim());
  ref::InitState(config(), ref.data(), dim());
  EXPECT_EQ(fast, ref);
}

// Twelve updates of one row: fast and reference trajectories (each from its own previous state)
// agree to float rounding after every step, weights and every state slot.
TEST_P(FastVsRef, ApplyRowMatchesReferenceOverSteps) {
  auto opt = Make(config());
  const int n = dim();
  Rng rng(1000 + n);
  std::vector<float> w_fast(n), w_ref(n);
  for (int i = 0; i < n; ++i) w_fast[i] = w_ref[i] = static_cast<float>(rng.Normal() * 0.1);
  std::vector<float> s_fast(opt->StateFloats(n)), s_ref(s_fast.size());
  opt->InitState(s_fast.data(), n);
  ref::InitState(config(), s_ref.data(), n);
  for (int step = 1; step <= 12; ++step) {
    const std::vector<float> g = RandomGrad(&rng, n);
    opt->ApplyRow(w_fast.data(), s_fast.data(), g.data(), n, opt->LearningRate(1));
    ref::ApplyRow(config(), w_ref.data(), s_ref.data(), g.data(), n, 1);
    ExpectClose(w_fast, w_ref, "weights after step " + std::to_string(step));
    ExpectClose(s_fast, s_ref, "state after step " + std::to_string(step));
  }
}

// The batched sparse form is exactly a loop of ApplyRow.
TEST_P(FastVsRef, ApplyRowsEqualsApplyRowLoop) {
  auto opt = Make(config());
  const int n = dim(), rows = 5;
  const int64_t sf = opt->StateFloats(n);
  Rng rng(7);
  std::vector<float> w(rows * n), s(rows * sf);
  for (auto& x : w) x = static_cast<float>(rng.Normal());
  for (int r = 0; r < rows; ++r) opt->InitState(&s[r * sf], n);
  std::vector<float> w2 = w, s2 = s;
  const std::vector<float> g = RandomGrad(&rng, rows * n);
  std::vector<float*> wp, sp;
  for (int r = 0; r < rows; ++r) {
    wp.push_back(&w[r * n]);
    sp.push_back(s.data() + r * sf);
  }
  opt->ApplyRows(rows, wp.data(), sp.data(), g.data(), n, opt->LearningRate(1));
  for (int r = 0; r < rows; ++r) {
    opt->ApplyRow(&w2[r * n], s2.data() + r * sf, &g[r * n], n, opt->LearningRate(1));
  }
  EXPECT_EQ(w, w2);
  EXPECT_EQ(s, s2);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, FastVsRef,
                         testing::Combine(testing::Range(0, static_cast<int>(Configs().size())),
                                          testing::Values(1, 7, 16, 17, 64)),
                         [](const testing::TestParamInfo<FastVsRef::ParamType>& info) {
                           return Configs()[std::get<0>(info.param)].name + "_dim" +
                                  std::to_string(std::get<1>(info.param));
                         });

// A dense vector long enough to be split over threads in chunks: threaded equals one thread
// bit for bit, and both match the reference.
class DenseFastVsRef : public testing::TestWithParam<int> {};

TEST_P(DenseFastVsRef, ThreadedApplyDenseMatchesReference) {
  const OptimizerConfig& config = Configs()[GetParam()].config;
  auto opt = Make(config);
  const int64_t n = 50001;
  Rng rng(3);
  std::vector<float> w(n);
  for (auto& x : w) x = static_cast<float>(rng.Normal() * 0.1);
  std::vector<float> s(opt->StateFloats(n));
  opt->InitState(s.data(), n);
  std::vector<float> w1 = w, s1 = s, wr = w, sr = s;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = RandomGrad(&rng, n);
    opt->ApplyDense(w.data(), s.data(), g.data(), n, 2, opt->LearningRate(1));
    opt->ApplyDense(w1.data(), s1.data(), g.data(), n, 1, opt->LearningRate(1));
    ref::ApplyRow(config, wr.data(), sr.data(), g.data(), n, 1);
  }
  EXPECT_EQ(w, w1);
  EXPECT_EQ(s, s1);
  ExpectClose(w, wr, "dense weights");
  ExpectClose(s, sr, "dense state");
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, DenseFastVsRef,
                         testing::Range(0, static_cast<int>(Configs().size())),
                         [](const testing::TestParamInfo<int>& info) {
                           return Configs()[info.param].name;
                         });

// ---------------------------------------------------------------------------------------------
// Two steps of each optimizer, computed by hand.
// ---------------------------------------------------------------------------------------------

struct OneWeight {
  explicit OneWeight(const OptimizerConfig& c) : opt(Make(c)), state(opt->StateFloats(1)) {
    opt->InitState(state.data(), 1);
  }
  void Step(float g) { opt->ApplyRow(&w, state.data(), &g, 1, opt->LearningRate(1)); }
  std::unique_ptr<Optimizer> opt;
  std::vector<float> state;
  float w = 1.0f;
};

TEST(OptimizerByHand, Sgd) {
  OneWeight x(Config(SGD, 0.1f));
  x.Step(0.5f);  // w = 1 - 0.1 * 0.5 = 0.95
  EXPECT_NEAR(x.w, 0.95f, 1e-7);
  x.Step(-1.0f);  // w = 0.95 + 0.1 * 1 = 1.05
  EXPECT_NEAR(x.w, 1.05f, 1e-7);
}

TEST(OptimizerByHand, Adagrad) {
  OptimizerConfig c = Config(ADAGRAD, 0.1f);
  c.set_initial_accumulator(0.1f);
  OneWeight x(c);
  EXPECT_FLOAT_EQ(x.state[0], 0.1f);
  x.Step(0.3f);  // accum = 0.1 + 0.09 = 0.19; w = 1 - 0.1 * 0.3 / sqrt(0.19) = 1 - 0.0688247
  EXPECT_NEAR(x.state[0], 0.19f, 1e-7);
  EXPECT_NEAR(x.w, 0.9311753f, 1e-6);
  x.Step(-0.4f);  // accum = 0.19 + 0.16 = 0.35; w = 0.9311753 + 0.04 / sqrt(0.35) = + 0.0676123
  EXPECT_NEAR(x.state[0], 0.35f, 1e-7);
  EXPECT_NEAR(x.w, 0.9987876f, 1e-6);
}

TEST(OptimizerByHand, Adam) {
  OptimizerConfig c = Config(ADAM, 0.01f);  // beta1 0.9, beta2 0.999, epsilon 1e-8
  OneWeight x(c);
  x.Step(0.5f);
  // t = 1: alpha = 0.01 * sqrt(1 - 0.999) / (1 - 0.9) = 0.00316228
  //        m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025; sqrt(v) = 0.0158114
  //        w = 1 - 0.00316228 * 0.05 / 0.0158114 = 1 - 0.0100000 = 0.99
  // (1 - beta2 is 0.00099998713 in float, hence the relative tolerance of the v checks.)
  EXPECT_NEAR(x.state[0], 0.05f, 1e-7);
  EXPECT_NEAR(x.state[1], 0.00025f, 0.00025f * 2e-5);
  EXPECT_EQ(x.state[2], 1.0f);
  EXPECT_NEAR(x.w, 0.99f, 1e-6);
  x.Step(-0.25f);
  // t = 2: alpha = 0.01 * sqrt(1 - 0.999^2) / (1 - 0.9^2) = 0.01 * 0.0447102 / 0.19 = 0.00235317
  //        m = 0.9 * 0.05 + 0.1 * -0.25 = 0.02; v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225
  //        w = 0.99 - 0.00235317 * 0.02 / sqrt(0.00031225) = 0.99 - 0.00266337 = 0.9873366
  EXPECT_NEAR(x.state[0], 0.02f, 1e-7);
  EXPECT_NEAR(x.state[1], 0.00031225f, 0.00031225f * 2e-5);
  EXPECT_EQ(x.state[2], 2.0f);
  EXPECT_NEAR(x.w, 0.9873366f, 1e-6);
}

TEST(OptimizerByHand, Ftrl) {
  OptimizerConfig c = Config(FTRL, 0.1f);  // lr_power -0.5
  c.set_initial_accumulator(0.1f);
  c.set_l1(0.01f);
  c.set_l2(0.1f);
  OneWeight x(c);
  x.w = 0.0f;  // TF's FTRL variables usually start at zero
  x.Step(0.5f);
  // accum_new = 0.1 + 0.25 = 0.35; linear = 0 + 0.5 - (sqrt(0.35) - sqrt(0.1)) / 0.1 * 0 = 0.5
  // quadratic = sqrt(0.35) / 0.1 + 2 * 0.1 = 5.9160798 + 0.2 = 6.1160798
  // w = (0.01 * sign(0.5) - 0.5) / 6.1160798 = -0.0801167
  EXPECT_NEAR(x.state[0], 0.35f, 1e-7);
  EXPECT_NEAR(x.state[1], 0.5f, 1e-7);
  EXPECT_NEAR(x.w, -0.0801167f, 1e-6);
  x.Step(-0.2f);
  // accum_new = 0.35 + 0.04 = 0.39
  // linear = 0.5 - 0.2 - (0.6244998 - 0.5916080) / 0.1 * -0.0801167 = 0.3 + 0.0263518 = 0.3263518
  // quadratic = 6.244998 + 0.2 = 6.444998; w = (0.01 - 0.3263518) / 6.444998 = -0.0490849
  EXPECT_NEAR(x.state[0], 0.39f, 1e-7);
  EXPECT_NEAR(x.state[1], 0.3263518f, 1e-6);
  EXPECT_NEAR(x.w, -0.0490849f, 1e-6);
}

TEST(OptimizerByHand, FtrlL1ClipsSmallLinearToZero) {
  OptimizerConfig c = Config(FTRL, 0.1f);
  c.set_initial_accumulator(0.1f);
  c.set_l1(1.0f);
  OneWeight x(c);
  x.w = 0.0f;
  x.Step(0.5f);  // linear = 0.5 - (...) * 0 = 0.5; |linear| <= l1 = 1: w = 0 exactly
  EXPECT_EQ(x.w, 0.0f);
  EXPECT_NEAR(x.state[1], 0.5f, 1e-7);
  x.Step(0.6f);  // linear = 0.5 + 0.6 = 1.1 > l1: w = (1 - 1.1) / (sqrt(0.71) / 0.1) = -0.0118678
  EXPECT_NEAR(x.state[1], 1.1f, 1e-6);
  EXPECT_NEAR(x.w, -0.0118678f, 1e-6);
}

// Lazy Adam: each row keeps its own step count, so a row first updated late in training gets
// the bias correction of step 1, exactly as a fresh row would.
TEST(LazyAdam, PerRowStepCounts) {
  auto opt = Make(Config(ADAM, 0.01f));
  const int n = 4;
  const std::vector<float> g = {0.5f, -0.25f, 1e-3f, 0.0f};
  std::vector<float> old_w(n, 1.0f), old_s(opt->StateFloats(n));
  opt->InitState(old_s.data(), n);
  for (int i = 0; i < 5; ++i) {
    opt->ApplyRow(old_w.data(), old_s.data(), g.data(), n, opt->LearningRate(1));
  }
  EXPECT_EQ(old_s[2 * n], 5.0f);

  std::vector<float> late_w(n, 1.0f), late_s(opt->StateFloats(n));
  opt->InitState(late_s.data(), n);
  opt->ApplyRow(late_w.data(), late_s.data(), g.data(), n, opt->LearningRate(1));
  EXPECT_EQ(late_s[2 * n], 1.0f);
  // Step 1 of Adam moves every element with a nonzero gradient by lr * sign(g) (up to epsilon).
  EXPECT_NEAR(late_w[0], 1.0f - 0.01f, 1e-6);
  EXPECT_NEAR(late_w[1], 1.0f + 0.01f, 1e-6);
  EXPECT_NEAR(late_w[2], 1.0f - 0.01f, 1e-5);
  EXPECT_EQ(late_w[3], 1.0f);
  // With a global step of 6 instead, the first update of the late row would be
  // alpha_6 * m / sqrt(v) with m, v uncorrected: much smaller than lr. Check it differs.
  const double alpha6 = 0.01 * std::sqrt(1 - std::pow(0.999, 6)) / (1 - std::pow(0.9, 6));
  const double global_step_update = alpha6 * (0.1 * 0.5) / std::sqrt(0.001 * 0.25);
  EXPECT_GT(std::fabs((1.0f - late_w[0]) - global_step_update), 1e-3);
}

// Adam's beta powers come from tables below t = 65536 and from exp above: both match the
// reference across the boundary, for a row with a long history.
TEST(LazyAdam, StepCountsAcrossTheTableBoundaryMatchReference) {
  OptimizerConfig c = Config(ADAM, 0.01f);
  c.set_beta2(0.99999f);  // keeps beta2^t far from 0 at t ~ 65536
  auto opt = Make(c);
  const int n = 17;
  Rng rng(4);
  std::vector<float> w(n, 0.5f), s(opt->StateFloats(n)), wr = w, sr;
  opt->InitState(s.data(), n);
  for (int i = 0; i < n; ++i) s[n + i] = 1e-4f;  // some v history
  s[2 * n] = 65533.0f;
  sr = s;
  for (int step = 0; step < 6; ++step) {
    const std::vector<float> g = RandomGrad(&rng, n);
    opt->ApplyRow(w.data(), s.data(), g.data(), n, opt->LearningRate(1));
    ref::ApplyRow(c, wr.data(), sr.data(), g.data(), n, 1);
    ExpectClose(w, wr, "weights at t " + std::to_string(s[2 * n]));
  }
  EXPECT_EQ(s[2 * n], 65539.0f);
}

TEST(OptimizerCreate, RejectsBadConfigsNamingTheField) {
  struct Bad {
    OptimizerConfig config;
    std::string field;
  };
  std::vector<Bad> bad;
  bad.push_back({Config(SGD, 0.0f), "learning_rate"});
  bad.push_back({Config(SGD, std::nanf("")), "learning_rate"});
  OptimizerConfig c = Config(ADAGRAD, 0.1f);
  c.set_initial_accumulator(0.0f);
  bad.push_back({c, "initial_accumulator"});
  c = Config(ADAM, 0.1f);
  c.set_beta1(1.0f);
  bad.push_back({c, "beta1"});
  c = Config(ADAM, 0.1f);
  c.set_beta2(-0.1f);
  bad.push_back({c, "beta2"});
  c = Config(ADAM, 0.1f);
  c.set_epsilon(0.0f);
  bad.push_back({c, "epsilon"});
  c = Config(FTRL, 0.1f);
  c.set_lr_power(0.5f);
  bad.push_back({c, "lr_power"});
  c = Config(FTRL, 0.1f);
  c.set_l1(-1.0f);
  bad.push_back({c, "l1"});
  c = Config(FTRL, 0.1f);
  c.set_l2(-1.0f);
  bad.push_back({c, "l2"});
  for (const Bad& b : bad) {
    auto o = Optimizer::Create(b.config);
    ASSERT_FALSE(o.ok()) << b.field;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(b.field), absl::string_view::npos) << o.status();
  }
  EXPECT_TRUE(Optimizer::Create(OptimizerConfig()).ok());  // the schema defaults are valid
}

TEST(OptimizerCreate, StateLayout) {
  EXPECT_EQ(Make(Config(SGD, 1))->StateFloats(17), 0);
  EXPECT_EQ(Make(Config(ADAGRAD, 1))->StateFloats(17), 17);
  EXPECT_EQ(Make(Config(ADAM, 1))->StateFloats(17), 35);
  EXPECT_EQ(Make(Config(FTRL, 1))->StateFloats(17), 34);
}

}  // namespace
}  // namespace pstrain
