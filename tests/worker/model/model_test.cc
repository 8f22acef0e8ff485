// The fast tower against its double-precision reference twin (worker/model/reference.h):
// forward for every model type and shape, gradients against central finite differences of the
// reference objective block by block (LR: first order + loss, FM: + FM term, WIDE_DEEP: + MLP,
// DEEPFM: all), bf16 against f32, and one thread against two.
#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"
#include "tests/worker/model/tower_test_util.h"
#include "worker/model/reference.h"

namespace pstrain {
namespace {

ModelConfig Config(ModelType type, int k, std::vector<int> hidden, float l2 = 0.f,
                   Precision precision = F32) {
  ModelConfig config;
  config.set_type(type);
  config.set_embedding_dim(k);
  for (int h : hidden) config.add_hidden(h);
  config.set_embedding_l2(l2);
  config.set_precision(precision);
  return config;
}

// A slice with many duplicate rows (U ~ n F / 3), scales that are mostly 1 but also arbitrary
// (LibSVM values, dense numeric fields), and parameters large enough that every block matters.
TowerSlice MakeSlice(const Model& model, int n, uint64_t seed) {
  TowerSlice s;
  const int F = model.num_fields();
  s.n = n;
  s.rows_used = std::max(1, n * F / 3);
  Rng rng(seed);
  for (int e = 0; e < n * F; ++e) {
    s.slots.push_back(static_cast<int32_t>(rng.Uniform(s.rows_used)));
    s.scales.push_back(rng.Uniform(3) == 0 ? static_cast<float>(4.0 * rng.UniformDouble() - 2.0)
                                           : 1.f);
  }
  for (int b = 0; b < n; ++b) s.labels.push_back(static_cast<float>(rng.Uniform(2)));
  s.rows.resize(static_cast<size_t>(s.rows_used) * model.row_dim());
  for (float& v : s.rows) v = static_cast<float>(0.3 * rng.Normal());
  RandomDense(model, seed, &rng, &s.dense);
  return s;
}


double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(ModelTest, DeepFmLayoutAndFlops) {
  auto model = Model::Create(Config(DEEPFM, 16, {}), 39);
  ASSERT_TRUE(model.ok()) << model.status();
  const Model& m = **model;
  EXPECT_EQ(m.row_dim(), 17);
  const auto& layout = m.dense_layout();
  std::vector<std::string> names;
  for (const auto& t : layout) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "mlp0/w", "mlp0/b", "mlp1/w", "mlp1/b",
                                             "mlp2/w", "mlp2/b", "out/w", "out/b"}));
  EXPECT_EQ(layout[1].shape, (std::vector<int64_t>{624, 400}));
  EXPECT_EQ(layout[1].offset, 1);
  EXPECT_EQ(layout[2].offset, 1 + 624 * 400);
  EXPECT_EQ(layout[7].shape, (std::vector<int64_t>{400, 1}));
  int64_t expected_offset = 0;
  for (const auto& t : layout) {
    EXPECT_EQ(t.offset, expected_offset) << t.name;
    int64_t size = 1;
    for (int64_t d : t.shape) size *= d;
    expected_offset += size;
  }
  EXPECT_EQ(m.dense_size(), expected_offset);
  // 6 (624*400 + 2*400*400 + 400) for the MLP plus the sparse terms: about 3.4 MFLOP.
  EXPECT_NEAR(m.flops_per_example(), 6.0 * (624 * 400 + 2 * 400 * 400 + 400), 6000);
}

TEST(ModelTest, LrAndFmHaveNoMlp) {
  auto lr = Model::Create(Config(LR, 16, {8}), 5);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ((*lr)->row_dim(), 1);
  EXPECT_EQ((*lr)->dense_size(), 1);
  auto fm = Model::Create(Config(FM, 8, {}), 5);
  ASSERT_TRUE(fm.ok());
  EXPECT_EQ((*fm)->row_dim(), 9);
  EXPECT_EQ((*fm)->dense_size(), 1);
  auto wd = Model::Create(Config(WIDE_DEEP, 4, {3}), 2);
  ASSERT_TRUE(wd.ok());
  EXPECT_EQ((*wd)->dense_size(), 1 + 8 * 3 + 3 + 3 + 1);
}

TEST(ModelTest, RejectsBadConfigs) {
  EXPECT_FALSE(Model::Create(Config(DEEPFM, 0, {}), 39).ok());
  EXPECT_FALSE(Model::Create(Config(DEEPFM, 16, {400, -1}), 39).ok());
  EXPECT_FALSE(Model::Create(Config(FM, 16, {}), 0).ok());
  EXPECT_FALSE(Model::Create(Config(FM, 4096, {}), 3).ok());
  // A first layer within every per-field bound but too large as a whole (39 x 1024 inputs x
  // 65536): refused before the layout is allocated, naming the layer.
  auto huge = Model::Create(Config(DEEPFM, 1024, {65536}), 39);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("layer 0: 39936 x 65536"), absl::string_view::npos)
      << huge.status();
  auto model = Model::Create(Config(DEEPFM, 4, {4}), 3);
  ASSERT_TRUE(model.ok());
  EXPECT_FALSE((*model)->CreateTower(0, 1).ok());
  EXPECT_FALSE((*model)->CreateTower(8, 0).ok());
}

TEST(ModelTest, InitRowIsAPureFunctionOfIdAndSeed) {
  ModelConfig config = Config(DEEPFM, 16, {});
  config.set_embedding_init_stddev(0.01f);
  auto model = Model::Create(config, 39);
  ASSERT_TRUE(model.ok());
  std::vector<float> a(17), b(17), c(17), d(17);
  (*model)->InitRow(123456789, 7, a.data());
  (*model)->InitRow(123456789, 7, b.data());
  (*model)->InitRow(123456790, 7, c.data());
  (*model)->InitRow(123456789, 8, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_EQ(a[0], 0.f);
  // v ~ N(0, 0.01): check the moments over many rows.
  double sum = 0, sq = 0;
  const int rows = 4000;
  for (int r = 0; r < rows; ++r) {
    (*model)->InitRow(r, 1, a.data());
    EXPECT_EQ(a[0], 0.f);
    for (int j = 1; j < 17; ++j) {
      sum += a[j];
      sq += double{a[j]} * a[j];
    }
  }
  const double count = rows * 16.0;
  EXPECT_NEAR(sum / count, 0.0, 3e-4);
  EXPECT_NEAR(std::sqrt(sq / count), 0.01, 3e-4);
}

TEST(ModelTest, InitDenseIsGlorotUniformWithZeroBiases) {
  auto model = Model::Create(Config(DEEPFM, 16, {}), 39);
  ASSERT_TRUE(model.ok());
  const Model& m = **model;
  std::vector<float> a(m.dense_size()), b(m.dense_size()), c(m.dense_size());
  m.InitDense(3, a.data());
  m.InitDense(3, b.data());
  m.InitDense(4, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const DenseTensor& t : m.dense_layout()) {
    int64_t size = 1;
    for (int64_t d : t.shape) size *= d;
    if (t.shape.size() == 1) {
      for (int64_t i = 0; i < size; ++i) EXPECT_EQ(a[t.offset + i], 0.f) << t.name;
      continue;
    }
    const double limit = std::sqrt(6.0 / (t.shape[0] + t.shape[1]));
    double sq = 0;
    for (int64_t i = 0; i < size; ++i) {
      ASSERT_LE(std::fabs(a[t.offset + i]), limit) << t.name;
      sq += double{a[t.offset + i]} * a[t.offset + i];
    }
    // U(-l, l) has variance l^2 / 3.
    EXPECT_NEAR(sq / size, limit * limit / 3, 0.1 * limit * limit / 3 + 20 * limit * limit / size)
        << t.name;
  }
}

// ---- Forward against the reference -----------------------------------------------------------

using ForwardParam = std::tuple<ModelType, int /*k*/, int /*n*/, Precision>;

class ForwardTest : public ::testing::TestWithParam<ForwardParam> {};

TEST_P(ForwardTest, MatchesReference) {
  const auto [type, k, n, precision] = GetParam();
  if (precision == BF16) PSTRAIN_SKIP_UNLESS_BF16();
  const int F = 7;
  const ModelConfig config = Config(type, k, {16, 9}, 0.f, precision);
  auto model = Model::Create(config, F);
  ASSERT_TRUE(model.ok()) << model.status();
  const TowerSlice s = MakeSlice(**model, n, 11 + n + k);
  auto tower = (*model)->CreateTower(n, 1);
  ASSERT_TRUE(tower.ok()) << tower.status();
  std::vector<float> logits(n);
  ASSERT_TRUE((*tower)->Forward(s.input(), logits.data()).ok());

  const std::vector<double> rows(s.rows.begin(), s.rows.end());
  const std::vector<double> dense(s.dense.begin(), s.dense.end());
  const std::vector<double> ref = ReferenceLogits(config, **model, s.ref(rows, dense));
  // bf16 rounds the MLP's inputs and weights to 8 bits of mantissa.
  const double tol = precision == BF16 ? 3e-2 : 2e-5;
  double max_abs = 0;
  for (int b = 0; b < n; ++b) {
    ASSERT_NEAR(logits[b], ref[b], tol * (1 + std::fabs(ref[b]))) << "example " << b;
    max_abs = std::max(max_abs, std::fabs(ref[b]));
  }
  if (n >= 7) {
    EXPECT_GT(max_abs, 0.1);  // the logits are not trivially zero
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ForwardTest,
                         ::testing::Combine(::testing::Values(DEEPFM, LR, FM, WIDE_DEEP),
                                            ::testing::Values(3, 4, 16, 32),
                                            ::testing::Values(1, 7, 1024), ::testing::Values(F32)),
                         [](const auto& info) {
                           return absl::StrCat(ModelType_Name(std::get<0>(info.param)), "_k",
                                               std::get<1>(info.param), "_n",
                                               std::get<2>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Bf16, ForwardTest,
                         ::testing::Combine(::testing::Values(DEEPFM, WIDE_DEEP),
                                            ::testing::Values(4, 16), ::testing::Values(7, 1024),
                                            ::testing::Values(BF16)),
                         [](const auto& info) {
                           return absl::StrCat(ModelType_Name(std::get<0>(info.param)), "_k",
                                               std::get<1>(info.param), "_n",
                                               std::get<2>(info.param));
                         });

// ---- Gradients against finite differences of the reference ----------------------------------

using GradParam = std::tuple<ModelType, int /*k*/, float /*l2*/, int /*threads*/>;

class GradientTest : public ::testing::TestWithParam<GradParam> {};

TEST_P(GradientTest, MatchesCentralDifferences) {
  const auto [type, k, l2, threads] = GetParam();
  const int F = 5, n = 7;
  const ModelConfig config = Config(type, k, {8, 6}, l2);
  auto model = Model::Create(config, F);
  ASSERT_TRUE(model.ok()) << model.status();
  const TowerSlice s = MakeSlice(**model, n, 5 + k);
  const TowerGrads g = RunTower(**model, s, threads, /*fill=*/0.25f);

  std::vector<double> rows(s.rows.begin(), s.rows.end());
  std::vector<double> dense(s.dense.begin(), s.dense.end());
  const ReferenceInput in = s.ref(rows, dense);
  EXPECT_NEAR(g.loss, ReferenceLoss(config, **model, in), 1e-5 * n);

  const auto objective = [&] { return ReferenceObjective(config, **model, in); };
  ExpectCentralDifferences(objective, &rows, g.rows, "row_grads");
  ExpectCentralDifferences(objective, &dense, g.dense, "dense_grad");
}

INSTANTIATE_TEST_SUITE_P(Blocks, GradientTest,
                         ::testing::Combine(::testing::Values(LR, FM, WIDE_DEEP, DEEPFM),
                                            ::testing::Values(4, 16), ::testing::Values(0.f, 0.5f),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return absl::StrCat(ModelType_Name(std::get<0>(info.param)), "_k",
                                               std::get<1>(info.param),
                                               std::get<2>(info.param) > 0 ? "_l2" : "", "_t",
                                               std::get<3>(info.param));
                         });

// ---- Precision and threads -------------------------------------------------------------------

TEST(TowerTest, Bf16IsCloseToF32) {
  PSTRAIN_SKIP_UNLESS_BF16();
  const int F = 39, n = 512;
  auto f32 = Model::Create(Config(DEEPFM, 16, {64, 32}), F);
  auto bf16 = Model::Create(Config(DEEPFM, 16, {64, 32}, 0.f, BF16), F);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  const TowerSlice s = MakeSlice(**f32, n, 99);
  const TowerGrads a = RunTower(**f32, s, 1);
  const TowerGrads b = RunTower(**bf16, s, 1);
  EXPECT_LT(RelDiff(b.logits, a.logits), 2e-2);
  EXPECT_LT(RelDiff(b.rows, a.rows), 3e-2);
  // The first layer's dW sums 512 products of bf16 x0 and bf16 dz that mostly cancel; mlp_test
  // shows the bf16 MLP matches a bf16-rounding reference to 2e-3, so this is bf16's own error.
  EXPECT_LT(RelDiff(b.dense, a.dense), 1e-1);
  EXPECT_NEAR(b.loss, a.loss, 1e-2 * a.loss);
  EXPECT_NE(a.dense, b.dense);  // bf16 really ran in bf16
}

// Where the path has no bf16 (this CPU, or the kernels lowered below avx512_core_bf16), a bf16
// model is refused with the missing feature and the fix, not oneDNN's "could not create a
// primitive descriptor".
TEST(TowerTest, Bf16IsRefusedWithTheFixWhereThePathHasNone) {
  ScopedKernelIsa lowered(Isa::kAvx2);
  ASSERT_TRUE(lowered.status().ok()) << lowered.status();
  auto bf16 = Model::Create(Config(DEEPFM, 16, {64, 32}, 0.f, BF16), 39);
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bf16.status().message()),
              ::testing::AllOf(::testing::HasSubstr("AVX512-BF16"),
                               ::testing::HasSubstr("model.precision=F32")));
  EXPECT_TRUE(Model::Create(Config(DEEPFM, 16, {64, 32}), 39).ok());  // f32 is fine
}

class ThreadsTest : public ::testing::TestWithParam<std::tuple<ModelType, Precision>> {};

TEST_P(ThreadsTest, OneAndTwoThreadsAgree) {
  const auto [type, precision] = GetParam();
  if (precision == BF16) PSTRAIN_SKIP_UNLESS_BF16();
  const int F = 39, n = 333;
  auto model = Model::Create(Config(type, 16, {48, 40}, 0.1f, precision), F);
  ASSERT_TRUE(model.ok());
  const TowerSlice s = MakeSlice(**model, n, 5);
  const TowerGrads one = RunTower(**model, s, 1);
  const TowerGrads two = RunTower(**model, s, 2);
  const double tol = precision == BF16 ? 1e-2 : 1e-5;
  EXPECT_LT(RelDiff(two.logits, one.logits), tol);
  EXPECT_LT(RelDiff(two.rows, one.rows), tol);
  EXPECT_LT(RelDiff(two.dense, one.dense), tol);
  EXPECT_NEAR(two.loss, one.loss, 1e-6 * one.loss);
}

INSTANTIATE_TEST_SUITE_P(Types, ThreadsTest,
                         ::testing::Combine(::testing::Values(DEEPFM, LR, FM, WIDE_DEEP),
                                            ::testing::Values(F32, BF16)),
                         [](const auto& info) {
                           return absl::StrCat(ModelType_Name(std::get<0>(info.param)), "_",
                                               Precision_Name(std::get<1>(info.param)));
                         });

TEST(TowerTest, ChangingBatchSizesReusesNothingStale) {
  auto model = Model::Create(Config(DEEPFM, 8, {24, 16}), 6);
  ASSERT_TRUE(model.ok());
  auto tower = (*model)->CreateTower(64, 2);
  ASSERT_TRUE(tower.ok());
  // Every size in turn, then the first again: each must match a fresh tower.
  for (int n : {64, 5, 63, 1, 64}) {
    const TowerSlice s = MakeSlice(**model, n, n);
    std::vector<float> rows(s.rows.size()), dense(s.dense.size()), logits(n);
    auto loss = (*tower)->ForwardBackward(s.input(), rows.data(), dense.data(), logits.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    const TowerGrads fresh = RunTower(**model, s, 2);
    EXPECT_LT(RelDiff(logits, fresh.logits), 1e-6) << n;
    EXPECT_LT(RelDiff(rows, fresh.rows), 1e-6) << n;
    EXPECT_LT(RelDiff(dense, fresh.dense), 1e-6) << n;
  }
}

TEST(TowerTest, ForwardMatchesForwardBackwardLogitsAndNullLogitsIsFine) {
  auto model = Model::Create(Config(DEEPFM, 16, {32}), 10);
  ASSERT_TRUE(model.ok());
  const TowerSlice s = MakeSlice(**model, 100, 1);
  auto tower = (*model)->CreateTower(100, 1);
  ASSERT_TRUE(tower.ok());
  std::vector<float> logits(100);
  ASSERT_TRUE((*tower)->Forward(s.input(), logits.data()).ok());
  const TowerGrads g = RunTower(**model, s, 1);
  EXPECT_EQ(logits, g.logits);
  std::vector<float> rows(s.rows.size()), dense(s.dense.size());
  auto loss = (*tower)->ForwardBackward(s.input(), rows.data(), dense.data(), nullptr);
  ASSERT_TRUE(loss.ok());
  EXPECT_DOUBLE_EQ(*loss, g.loss);
  EXPECT_EQ(rows, g.rows);
  EXPECT_EQ(dense, g.dense);
}

TEST(TowerTest, RejectsBadInput) {
  auto model = Model::Create(Config(DEEPFM, 4, {4}), 3);
  ASSERT_TRUE(model.ok());
  auto tower = (*model)->CreateTower(8, 1);
  ASSERT_TRUE(tower.ok());
  TowerSlice s = MakeSlice(**model, 9, 1);
  std::vector<float> rows(s.rows.size()), dense(s.dense.size()), logits(9);
  Tower::Input in = s.input();
  EXPECT_EQ((*tower)->Forward(in, logits.data()).code(), absl::StatusCode::kInvalidArgument);
  in.n = 4;
  in.labels = nullptr;
  EXPECT_TRUE((*tower)->Forward(in, logits.data()).ok());
  EXPECT_EQ((*tower)->ForwardBackward(in, rows.data(), dense.data(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  in.n = 0;
  auto empty = (*tower)->ForwardBackward(in, rows.data(), dense.data(), nullptr);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, 0.0);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// ResolveModelConfig: what Model::Create uses, written out (checkpoints record it); a model
// created from it has the same shape as one created from the config.
TEST(ResolveModelConfig, WritesTheValuesCreateUses) {
  ModelConfig deep;  // DEEPFM, hidden left empty
  deep.set_embedding_dim(4);
  const ModelConfig r = ResolveModelConfig(deep);
  EXPECT_EQ(std::vector<int>(r.hidden().begin(), r.hidden().end()),
            (std::vector<int>{400, 400, 400}));
  EXPECT_TRUE(r.has_precision() && r.has_embedding_init_stddev() && r.has_embedding_l2());
  EXPECT_FLOAT_EQ(r.embedding_init_stddev(), 0.01f);
  auto a = Model::Create(deep, 3);
  auto b = Model::Create(r, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->dense_size(), (*b)->dense_size());
  ModelConfig lr;
  lr.set_type(LR);
  lr.add_hidden(7);
  const ModelConfig rl = ResolveModelConfig(lr);
  EXPECT_EQ(rl.embedding_dim(), 0);  // LR rows are [w]
  EXPECT_EQ(rl.hidden_size(), 0);    // and it has no MLP
  auto c = Model::Create(rl, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->row_dim(), 1);
  ModelConfig fm;
  fm.set_type(FM);
  fm.add_hidden(7);
  EXPECT_EQ(ResolveModelConfig(fm).hidden_size(), 0);
}

}  // namespace
}  // namespace pstrain

// ---- The block grammar: DCN_V2, DLRM and BLOCKS ------------------------------------------------

namespace pstrain {
namespace {

struct BlockCase {
  std::string name;
  ModelConfig config;
  std::vector<int> dense_fields;
};

ModelConfig BlockConfig(ModelType type, int k, std::vector<int> hidden) {
  return Config(type, k, std::move(hidden));
}

std::vector<BlockCase> BlockCases(int k) {
  std::vector<BlockCase> cases;
  cases.push_back({"DcnV2Stacked", BlockConfig(DCN_V2, k, {8, 6}), {}});
  {
    BlockCase c{"DcnV2ParallelLowRank", BlockConfig(DCN_V2, k, {8}), {}};
    c.config.mutable_blocks()->set_join(ModelBlocks::PARALLEL);
    c.config.mutable_blocks()->set_cross_rank(3);
    c.config.mutable_blocks()->set_cross_layers(2);
    cases.push_back(c);
  }
  {
    // DCN-Mix: 3 low-rank experts per cross layer (the tanh layers, the softmax gate).
    BlockCase c{"DcnMixStacked", BlockConfig(DCN_V2, k, {8}), {}};
    c.config.mutable_blocks()->set_cross_rank(3);
    c.config.mutable_blocks()->set_cross_experts(3);
    c.config.mutable_blocks()->set_cross_layers(2);
    cases.push_back(c);
  }
  {
    BlockCase c{"CrossOnly", BlockConfig(BLOCKS, k, {}), {}};
    c.config.mutable_blocks()->set_interaction(ModelBlocks::CROSS_V2);
    c.config.mutable_blocks()->set_mlp(false);
    c.config.mutable_blocks()->set_cross_layers(2);
    cases.push_back(c);
  }
  {
    BlockCase c{"Dlrm", BlockConfig(DLRM, k, {8, 6}), {0, 2}};
    c.config.mutable_blocks()->add_bottom_hidden(5);
    cases.push_back(c);
  }
  cases.push_back({"DlrmNoDenseFields", BlockConfig(DLRM, k, {8}), {}});
  return cases;
}

std::unique_ptr<Model> CreateBlockModel(const BlockCase& c, int F) {
  ModelInputs inputs;
  inputs.num_fields = F;
  inputs.dense_fields = c.dense_fields;
  auto model = Model::Create(c.config, inputs);
  EXPECT_TRUE(model.ok()) << c.name << ": " << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(BlockModelTest, ForwardMatchesReference) {
  const int F = 5;
  for (int k : {4, 16}) {
    for (const BlockCase& c : BlockCases(k)) {
      for (int n : {1, 7, 100}) {
        std::unique_ptr<Model> model = CreateBlockModel(c, F);
        ASSERT_NE(model, nullptr);
        const TowerSlice s = MakeSlice(*model, n, 3 + n + k);
        for (int threads : {1, 2}) {
          auto tower = model->CreateTower(n, threads);
          ASSERT_TRUE(tower.ok()) << tower.status();
          std::vector<float> logits(n);
          ASSERT_TRUE((*tower)->Forward(s.input(), logits.data()).ok());
          const std::vector<double> rows(s.rows.begin(), s.rows.end());
          const std::vector<double> dense(s.dense.begin(), s.dense.end());
          const std::vector<double> ref =
              ReferenceLogits(c.config, *model, s.ref(rows, dense));
          double max_abs = 0;
          for (int b = 0; b < n; ++b) {
            ASSERT_NEAR(logits[b], ref[b], 1e-5 * (1 + std::fabs(ref[b])))
                << c.name << " k " << k << " n " << n << " threads " << threads << " example "
                << b;
            max_abs = std::max(max_abs, std::fabs(ref[b]));
          }
          if (n >= 7) {
            EXPECT_GT(max_abs, 0.1) << c.name;
          }
        }
      }
    }
  }
}

// Small shapes (F k = 12): the check evaluates the double reference twice per parameter, and the
// suite also runs under QEMU (Emulated.Zen3), where larger ones take minutes.
TEST(BlockModelTest, GradientsMatchCentralDifferences) {
  const int F = 4, n = 6;
  for (int k : {3}) {
    for (const BlockCase& c : BlockCases(k)) {
      for (float l2 : {0.5f}) {
        ModelConfig config = c.config;
        config.set_embedding_l2(l2);
        BlockCase with_l2 = c;
        with_l2.config = config;
        std::unique_ptr<Model> model = CreateBlockModel(with_l2, F);
        ASSERT_NE(model, nullptr);
        const TowerSlice s = MakeSlice(*model, n, 5 + k);
        const TowerGrads g = RunTower(*model, s, /*threads=*/2, /*fill=*/0.25f);
        std::vector<double> rows(s.rows.begin(), s.rows.end());
        std::vector<double> dense(s.dense.begin(), s.dense.end());
        const ReferenceInput in = s.ref(rows, dense);
        EXPECT_NEAR(g.loss, ReferenceLoss(config, *model, in), 1e-5 * n) << c.name;
        const auto objective = [&] { return ReferenceObjective(config, *model, in); };
        const std::string what = absl::StrCat(c.name, " k ", k, " ");
        ExpectCentralDifferences(objective, &rows, g.rows, what + "row_grads");
        ExpectCentralDifferences(objective, &dense, g.dense, what + "dense_grad");
        // Every tensor of the grammar's layout gets a gradient somewhere (none is disconnected).
        for (const DenseTensor& t : model->dense_layout()) {
          int64_t size = 1;
          for (int64_t d : t.shape) size *= d;
          double norm = 0;
          for (int64_t i = 0; i < size; ++i) norm += std::fabs(g.dense[t.offset + i]);
          EXPECT_GT(norm, 0) << c.name << ": " << t.name << " has no gradient";
        }
      }
    }
  }
}

TEST(BlockModelTest, OneAndTwoThreadsAgreeAndBatchSizesChange) {
  const int F = 13;
  for (const BlockCase& c : BlockCases(8)) {
    std::unique_ptr<Model> model = CreateBlockModel(c, F);
    ASSERT_NE(model, nullptr);
    auto tower = model->CreateTower(100, 2);
    ASSERT_TRUE(tower.ok());
    for (int n : {100, 17, 100}) {
      const TowerSlice s = MakeSlice(*model, n, n);
      const TowerGrads one = RunTower(*model, s, 1);
      std::vector<float> rows(s.rows.size()), dense(s.dense.size()), logits(n);
      auto loss = (*tower)->ForwardBackward(s.input(), rows.data(), dense.data(), logits.data());
      ASSERT_TRUE(loss.ok()) << loss.status();
      EXPECT_LT(RelDiff(logits, one.logits), 1e-5) << c.name;
      EXPECT_LT(RelDiff(rows, one.rows), 1e-5) << c.name;
      EXPECT_LT(RelDiff(dense, one.dense), 1e-5) << c.name;
      EXPECT_NEAR(*loss, one.loss, 1e-5 * one.loss) << c.name;
    }
  }
}

TEST(BlockModelTest, Bf16IsCloseToF32) {
  PSTRAIN_SKIP_UNLESS_BF16();
  const int F = 13, n = 256;
  for (const BlockCase& c : BlockCases(16)) {
    BlockCase b16 = c;
    b16.config.set_precision(BF16);
    std::unique_ptr<Model> f32 = CreateBlockModel(c, F);
    std::unique_ptr<Model> bf16 = CreateBlockModel(b16, F);
    ASSERT_TRUE(f32 != nullptr && bf16 != nullptr);
    const TowerSlice s = MakeSlice(*f32, n, 99);
    const TowerGrads a = RunTower(*f32, s, 1);
    const TowerGrads b = RunTower(*bf16, s, 1);
    EXPECT_LT(RelDiff(b.logits, a.logits), 3e-2) << c.name;
    EXPECT_LT(RelDiff(b.rows, a.rows), 5e-2) << c.name;
    EXPECT_NEAR(b.loss, a.loss, 1e-2 * a.loss) << c.name;
    if (c.config.blocks().mlp() || !c.config.blocks().has_mlp()) {
      EXPECT_NE(a.dense, b.dense) << c.name;  // the MLP really ran in bf16
    }
  }
}

TEST(BlockModelTest, LayoutOfThePresets) {
  ModelConfig dcn = BlockConfig(DCN_V2, 4, {8});
  auto m = Model::Create(dcn, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> names;
  for (const auto& t : (*m)->dense_layout()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "cross0/w", "cross0/b", "cross1/w",
                                             "cross1/b", "cross2/w", "cross2/b", "mlp0/w",
                                             "mlp0/b", "out/w", "out/b"}));
  EXPECT_EQ((*m)->dense_layout()[1].shape, (std::vector<int64_t>{12, 12}));
  EXPECT_EQ((*m)->dense_size(), 1 + 3 * (144 + 12) + 12 * 8 + 8 + 8 + 1);

  ModelConfig dlrm = BlockConfig(DLRM, 4, {8});
  ModelInputs inputs;
  inputs.num_fields = 5;
  inputs.dense_fields = {1, 3};
  auto d = Model::Create(dlrm, inputs);
  ASSERT_TRUE(d.ok()) << d.status();
  names.clear();
  for (const auto& t : (*d)->dense_layout()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "bottom0/w", "bottom0/b", "bottom1/w",
                                             "bottom1/b", "bottom2/w", "bottom2/b", "mlp0/w",
                                             "mlp0/b", "out/w", "out/b"}));
  // Bottom 2 -> 256 -> 64 -> 4; the top MLP reads 4 + 6 * 5 / 2 = 19 inputs.
  EXPECT_EQ((*d)->dense_layout()[5].shape, (std::vector<int64_t>{64, 4}));
  EXPECT_EQ((*d)->dense_layout()[7].shape, (std::vector<int64_t>{19, 8}));
  EXPECT_EQ((*d)->dense_fields(), (std::vector<int>{1, 3}));
}

// num_fields fields, of which dense_fields are DENSE numeric.
ModelInputs FieldsOf(int num_fields, std::vector<int> dense_fields = {}) {
  ModelInputs inputs;
  inputs.num_fields = num_fields;
  inputs.dense_fields = std::move(dense_fields);
  return inputs;
}

TEST(BlockModelTest, RejectsBadBlocks) {
  auto expect_bad = [](const ModelConfig& config, const std::string& needle,
                       ModelInputs inputs = FieldsOf(4)) {
    auto m = Model::Create(config, inputs);
    ASSERT_FALSE(m.ok()) << needle;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr(needle));
  };
  ModelConfig deepfm = Config(DEEPFM, 4, {8});
  deepfm.mutable_blocks()->set_cross_layers(2);
  expect_bad(deepfm, "fixed preset");
  ModelConfig dcn = Config(DCN_V2, 4, {8});
  dcn.mutable_blocks()->set_interaction(ModelBlocks::DOT);
  expect_bad(dcn, "contradicts model.type DCN_V2");
  dcn = Config(DCN_V2, 4, {8});
  dcn.mutable_blocks()->set_cross_layers(0);
  expect_bad(dcn, "cross_layers is 0");
  dcn.mutable_blocks()->set_cross_layers(2);
  dcn.mutable_blocks()->set_cross_rank(17);  // F*k = 16
  expect_bad(dcn, "cross_rank is 17");
  dcn.mutable_blocks()->set_cross_rank(0);
  dcn.mutable_blocks()->set_cross_experts(2);  // the experts are low rank
  expect_bad(dcn, "cross_experts is 2");
  dcn.mutable_blocks()->set_cross_rank(2);
  dcn.mutable_blocks()->set_cross_experts(65);
  expect_bad(dcn, "cross_experts is 65");
  ModelConfig dlrm = Config(DLRM, 4, {8});
  dlrm.mutable_blocks()->set_mlp(false);
  expect_bad(dlrm, "DOT needs the top MLP");
  dlrm = Config(DLRM, 4, {8});
  dlrm.mutable_blocks()->add_bottom_hidden(-3);
  expect_bad(dlrm, "bottom_hidden[0] is -3", FieldsOf(4, {1}));
  expect_bad(Config(DLRM, 4, {8}), "dense field 7", FieldsOf(4, {7}));
  expect_bad(Config(DLRM, 4, {8}), "dense field 1", FieldsOf(4, {2, 1}));
  ModelConfig lr_like = Config(BLOCKS, 4, {8});
  lr_like.mutable_blocks()->set_mlp(false);
  expect_bad(lr_like, "use model.type LR");
  // Full-rank cross layers over a wide x0 are bounded before anything is allocated.
  ModelConfig huge = Config(DCN_V2, 1024, {8});
  auto h = Model::Create(huge, 39);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("cross0/w"));
}

// BLOCKS spelling out DeepFM's blocks is DeepFM: the same layout and bit-identical results.
TEST(BlockModelTest, BlocksWithTheFmTermIsDeepFm) {
  ModelConfig blocks = Config(BLOCKS, 8, {16, 8});
  blocks.mutable_blocks()->set_interaction(ModelBlocks::FM_TERM);
  auto a = Model::Create(Config(DEEPFM, 8, {16, 8}), 6);
  auto b = Model::Create(blocks, 6);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  ASSERT_EQ((*a)->dense_size(), (*b)->dense_size());
  const TowerSlice s = MakeSlice(**a, 50, 4);
  const TowerGrads ga = RunTower(**a, s, 2);
  const TowerGrads gb = RunTower(**b, s, 2);
  EXPECT_EQ(ga.logits, gb.logits);
  EXPECT_EQ(ga.rows, gb.rows);
  EXPECT_EQ(ga.dense, gb.dense);
}

TEST(BlockModelTest, ResolveFillsThePresetsBlocks) {
  ModelConfig dcn;
  dcn.set_type(DCN_V2);
  const ModelConfig r = ResolveModelConfig(dcn);
  EXPECT_EQ(r.blocks().interaction(), ModelBlocks::CROSS_V2);
  EXPECT_EQ(r.blocks().cross_layers(), 3);
  EXPECT_TRUE(r.blocks().has_cross_rank() && r.blocks().has_join() && r.blocks().mlp());
  EXPECT_EQ(r.hidden_size(), 3);
  EXPECT_EQ(r.blocks().bottom_hidden_size(), 0);
  ModelConfig dlrm;
  dlrm.set_type(DLRM);
  const ModelConfig rd = ResolveModelConfig(dlrm);
  EXPECT_EQ(rd.blocks().interaction(), ModelBlocks::DOT);
  EXPECT_EQ(std::vector<int>(rd.blocks().bottom_hidden().begin(),
                             rd.blocks().bottom_hidden().end()),
            (std::vector<int>{256, 64}));
  EXPECT_FALSE(rd.blocks().has_cross_layers());
  // The old presets resolve exactly as before: no blocks.
  for (ModelType type : {DEEPFM, LR, FM, WIDE_DEEP}) {
    ModelConfig c;
    c.set_type(type);
    EXPECT_FALSE(ResolveModelConfig(c).has_blocks()) << ModelType_Name(type);
  }
  // Resolving is idempotent, so a checkpoint's recorded model creates the same model.
  EXPECT_EQ(ResolveModelConfig(r).SerializeAsString(), r.SerializeAsString());
  EXPECT_EQ(ResolveModelConfig(rd).SerializeAsString(), rd.SerializeAsString());
}

}  // namespace
}  // namespace pstrain
