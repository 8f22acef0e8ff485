// The list path of the tower (Tower::Input::offsets, fm.h SparseForwardLists /
// SparseBackwardLists) against its double twin (reference.h with offsets): forward for every
// model type on every kernel path, the FM identity against the explicit pairwise sum of the
// pooled vectors, gradients against central finite differences, the owner-partitioned backward's
// determinism over thread counts, offsets that start inside a batch, and one-id lists against the
// single-valued path.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"
#include "worker/model/model.h"
#include "tests/worker/model/tower_test_util.h"
#include "worker/model/reference.h"

namespace pstrain {
namespace {

ModelConfig Config(ModelType type, int k, float l2 = 0.f) {
  ModelConfig config;
  config.set_type(type);
  config.set_embedding_dim(k);
  config.add_hidden(16);
  config.add_hidden(9);
  config.set_embedding_l2(l2);
  return config;
}

// A slice whose (example, field) cells hold 1..max_len entries (duplicates included) with
// arbitrary scales, as the combiners leave them.
TowerSlice MakeListSlice(const Model& model, int n, int max_len, uint64_t seed) {
  TowerSlice s;
  const int F = model.num_fields();
  s.n = n;
  s.rows_used = std::max(2, n * F);
  Rng rng(seed);
  s.offsets.push_back(0);
  for (int e = 0; e < n * F; ++e) {
    const int len = 1 + static_cast<int>(rng.Uniform(max_len));
    for (int i = 0; i < len; ++i) {
      s.slots.push_back(static_cast<int32_t>(rng.Uniform(s.rows_used)));
      s.scales.push_back(static_cast<float>(2.0 * rng.UniformDouble() - 0.5));
    }
    s.offsets.push_back(static_cast<int32_t>(s.slots.size()));
  }
  for (int b = 0; b < n; ++b) s.labels.push_back(static_cast<float>(rng.Uniform(2)));
  s.rows.resize(static_cast<size_t>(s.rows_used) * model.row_dim());
  for (float& v : s.rows) v = static_cast<float>(0.3 * rng.Normal());
  RandomDense(model, seed, &rng, &s.dense);
  return s;
}


// ---- Forward against the reference, on every kernel path ------------------------------------

using ForwardParam = std::tuple<Isa, ModelType, int /*k*/, int /*n*/>;
class ListForwardTest : public ::testing::TestWithParam<ForwardParam> {};

TEST_P(ListForwardTest, MatchesReference) {
  const auto [isa, type, k, n] = GetParam();
  PSTRAIN_SCOPED_KERNEL_ISA(isa);
  const int F = 6;
  const ModelConfig config = Config(type, k);
  auto model = Model::Create(config, F);
  ASSERT_TRUE(model.ok()) << model.status();
  const TowerSlice s = MakeListSlice(**model, n, 12, 3 + n + k);
  auto tower = (*model)->CreateTower(n, 1);
  ASSERT_TRUE(tower.ok());
  std::vector<float> logits(n);
  ASSERT_TRUE((*tower)->Forward(s.input(), logits.data()).ok());
  const std::vector<double> rows(s.rows.begin(), s.rows.end());
  const std::vector<double> dense(s.dense.begin(), s.dense.end());
  const std::vector<double> ref = ReferenceLogits(config, **model, s.ref(rows, dense));
  double max_abs = 0;
  for (int b = 0; b < n; ++b) {
    ASSERT_NEAR(logits[b], ref[b], 1e-5 * (1 + std::fabs(ref[b]))) << "example " << b;
    max_abs = std::max(max_abs, std::fabs(ref[b]));
  }
  EXPECT_GT(max_abs, 0.1);

  // ForwardBackward's logits are Forward's.
  const TowerGrads g = RunTower(**model, s, 1);
  for (int b = 0; b < n; ++b) ASSERT_EQ(g.logits[b], logits[b]) << b;
}

INSTANTIATE_TEST_SUITE_P(
    Paths, ListForwardTest,
    ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512Core),
                       ::testing::Values(DEEPFM, LR, FM, WIDE_DEEP),
                       ::testing::Values(3, 8, 16, 32), ::testing::Values(1, 9, 300)),
    [](const auto& info) {
      return absl::StrCat(IsaName(std::get<0>(info.param)), "_",
                          ModelType_Name(std::get<1>(info.param)), "_k", std::get<2>(info.param),
                          "_n", std::get<3>(info.param));
    });

// The FM identity 0.5 sum_j [(sum_f x_fj)^2 - sum_f x_fj^2] = sum_{f<g} <x_f, x_g> holds for the
// pooled vectors: the tower's FM logits against the explicit pairwise sum in double.
TEST(ListModelTest, FmIdentityMatchesThePairwiseSumOfPooledVectors) {
  const int F = 5, k = 16, n = 40;
  auto model = Model::Create(Config(FM, k), F);
  ASSERT_TRUE(model.ok());
  const TowerSlice s = MakeListSlice(**model, n, 10, 77);
  auto tower = (*model)->CreateTower(n, 1);
  ASSERT_TRUE(tower.ok());
  std::vector<float> logits(n);
  ASSERT_TRUE((*tower)->Forward(s.input(), logits.data()).ok());
  const int rd = 1 + k;
  for (int b = 0; b < n; ++b) {
    std::vector<std::vector<double>> x(F, std::vector<double>(k, 0.0));
    double z = s.dense[0];
    for (int f = 0; f < F; ++f) {
      for (int i = s.offsets[b * F + f]; i < s.offsets[b * F + f + 1]; ++i) {
        const float* row = s.rows.data() + static_cast<int64_t>(s.slots[i]) * rd;
        z += double{s.scales[i]} * row[0];
        for (int j = 0; j < k; ++j) x[f][j] += double{s.scales[i]} * row[1 + j];
      }
    }
    double pairs = 0;
    for (int f = 0; f < F; ++f) {
      for (int g = f + 1; g < F; ++g) {
        for (int j = 0; j < k; ++j) pairs += x[f][j] * x[g][j];
      }
    }
    EXPECT_GT(std::fabs(pairs), 1e-3) << b;
    ASSERT_NEAR(logits[b], z + pairs, 1e-5 * (1 + std::fabs(z + pairs))) << "example " << b;
  }
}

// ---- Gradients against finite differences of the reference ----------------------------------

using GradParam = std::tuple<Isa, ModelType, int /*k*/, float /*l2*/, int /*threads*/>;
class ListGradientTest : public ::testing::TestWithParam<GradParam> {};

TEST_P(ListGradientTest, MatchesCentralDifferences) {
  const auto [isa, type, k, l2, threads] = GetParam();
  PSTRAIN_SCOPED_KERNEL_ISA(isa);
  const int F = 4, n = 6;
  const ModelConfig config = Config(type, k, l2);
  auto model = Model::Create(config, F);
  ASSERT_TRUE(model.ok()) << model.status();
  const TowerSlice s = MakeListSlice(**model, n, 5, 9 + k);
  const TowerGrads g = RunTower(**model, s, threads);
  std::vector<double> rows(s.rows.begin(), s.rows.end());
  std::vector<double> dense(s.dense.begin(), s.dense.end());
  const ReferenceInput in = s.ref(rows, dense);
  EXPECT_NEAR(g.loss, ReferenceLoss(config, **model, in), 1e-5 * n);
  const auto objective = [&] { return ReferenceObjective(config, **model, in); };
  ExpectCentralDifferences(objective, &rows, g.rows, "row_grads");
  ExpectCentralDifferences(objective, &dense, g.dense, "dense_grad");
}

INSTANTIATE_TEST_SUITE_P(
    Blocks, ListGradientTest,
    ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512Core),
                       ::testing::Values(LR, FM, WIDE_DEEP, DEEPFM), ::testing::Values(3, 16),
                       ::testing::Values(0.f, 0.5f), ::testing::Values(1, 3)),
    [](const auto& info) {
      return absl::StrCat(IsaName(std::get<0>(info.param)), "_",
                          ModelType_Name(std::get<1>(info.param)), "_k", std::get<2>(info.param),
                          std::get<3>(info.param) > 0 ? "_l2" : "", "_t", std::get<4>(info.param));
    });

// ---- Determinism, slices, and the single-valued path -----------------------------------------

// The owner-partitioned backward sums each row's entries in entry order whatever the thread
// count: the FM model's row gradients are the same to the bit for 1, 2 and 3 threads.
TEST(ListModelTest, RowGradientsAreBitIdenticalOverThreadCounts) {
  const int F = 7, n = 200;
  auto model = Model::Create(Config(FM, 16, 0.1f), F);
  ASSERT_TRUE(model.ok());
  TowerSlice s = MakeListSlice(**model, n, 8, 21);
  s.rows_used = 50;  // many duplicates across cells and examples
  for (int32_t& slot : s.slots) slot %= s.rows_used;
  const TowerGrads one = RunTower(**model, s, 1);
  for (int threads : {2, 3}) {
    const TowerGrads t = RunTower(**model, s, threads);
    EXPECT_EQ(t.rows, one.rows) << threads << " threads";
    EXPECT_EQ(t.logits, one.logits) << threads << " threads";
  }
}

// A slice of a batch points into the batch's offsets (offsets[0] > 0): it gives the logits and
// gradients of the same examples given as a batch of their own.
TEST(ListModelTest, OffsetsMayStartInsideABatch) {
  const int F = 5, n = 30, from = 11, count = 13;
  auto model = Model::Create(Config(DEEPFM, 8), F);
  ASSERT_TRUE(model.ok());
  const TowerSlice s = MakeListSlice(**model, n, 6, 5);
  TowerSlice own = s;
  own.n = count;
  const int32_t first = s.offsets[from * F], last = s.offsets[(from + count) * F];
  own.slots.assign(s.slots.begin() + first, s.slots.begin() + last);
  own.scales.assign(s.scales.begin() + first, s.scales.begin() + last);
  own.labels.assign(s.labels.begin() + from, s.labels.begin() + from + count);
  own.offsets.clear();
  for (int e = from * F; e <= (from + count) * F; ++e) own.offsets.push_back(s.offsets[e] - first);
  const TowerGrads want = RunTower(**model, own, 2);

  auto tower = (*model)->CreateTower(count, 2);
  ASSERT_TRUE(tower.ok());
  Tower::Input in = s.input();
  in.n = count;
  in.slots = s.slots.data() + first;
  in.scales = s.scales.data() + first;
  in.labels = s.labels.data() + from;
  in.offsets = s.offsets.data() + from * F;
  TowerGrads got;
  got.logits.assign(count, 0.f);
  got.rows.assign(s.rows.size(), 0.f);
  got.dense.assign(s.dense.size(), 0.f);
  ASSERT_TRUE((*tower)->ForwardBackward(in, got.rows.data(), got.dense.data(), got.logits.data()).ok());
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.dense, want.dense);
}

// Lists of exactly one id are the single-valued path (up to the order of float additions).
TEST(ListModelTest, OneIdListsMatchTheSingleValuedPath) {
  const int F = 6, n = 50;
  auto model = Model::Create(Config(DEEPFM, 16, 0.2f), F);
  ASSERT_TRUE(model.ok());
  const TowerSlice s = MakeListSlice(**model, n, 1, 8);
  ASSERT_EQ(s.slots.size(), static_cast<size_t>(n * F));
  const TowerGrads lists = RunTower(**model, s, 2);
  TowerSlice single = s;
  single.offsets.clear();
  auto tower = (*model)->CreateTower(n, 2);
  ASSERT_TRUE(tower.ok());
  Tower::Input in = single.input();
  in.offsets = nullptr;
  TowerGrads g;
  g.logits.assign(n, 0.f);
  g.rows.assign(s.rows.size(), 0.f);
  g.dense.assign(s.dense.size(), 0.f);
  ASSERT_TRUE((*tower)->ForwardBackward(in, g.rows.data(), g.dense.data(), g.logits.data()).ok());
  for (int b = 0; b < n; ++b) ASSERT_NEAR(lists.logits[b], g.logits[b], 1e-5 * (1 + std::fabs(g.logits[b])));
  for (size_t i = 0; i < g.rows.size(); ++i) ASSERT_NEAR(lists.rows[i], g.rows[i], 1e-5 + 1e-5 * std::fabs(g.rows[i])) << i;
}

// bf16 MLP precision: the list kernels store the pooled x0 as bf16 (AVX512-BF16 where the path
// has it); close to f32 as the single-valued path is (model_test's Bf16IsCloseToF32).
TEST(ListModelTest, Bf16IsCloseToF32) {
  PSTRAIN_SKIP_UNLESS_BF16();
  const int F = 12, n = 256;
  ModelConfig f32 = Config(DEEPFM, 16), bf16 = Config(DEEPFM, 16);
  bf16.set_precision(BF16);
  auto a = Model::Create(f32, F);
  auto b = Model::Create(bf16, F);
  ASSERT_TRUE(a.ok() && b.ok());
  const TowerSlice s = MakeListSlice(**a, n, 6, 31);
  const TowerGrads ga = RunTower(**a, s, 2);
  const TowerGrads gb = RunTower(**b, s, 2);
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num += (ga.logits[i] - gb.logits[i]) * (ga.logits[i] - gb.logits[i]);
    den += ga.logits[i] * ga.logits[i];
  }
  EXPECT_LT(std::sqrt(num / den), 2e-2);
  EXPECT_NEAR(gb.loss, ga.loss, 1e-2 * ga.loss);
  EXPECT_NE(ga.dense, gb.dense);  // bf16 really ran in bf16
}

TEST(ListModelTest, RefusesOffsetsWithAnEmptyCell) {
  auto model = Model::Create(Config(FM, 4), 2);
  ASSERT_TRUE(model.ok());
  TowerSlice s = MakeListSlice(**model, 3, 1, 1);
  // 6 cells, but the offsets say 5 entries in all.
  s.offsets = {0, 1, 2, 3, 3, 4, 5};
  auto tower = (*model)->CreateTower(3, 1);
  ASSERT_TRUE(tower.ok());
  std::vector<float> logits(3);
  const absl::Status st = (*tower)->Forward(s.input(), logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("at least one each"), std::string::npos) << st;
}

}  // namespace
}  // namespace pstrain
