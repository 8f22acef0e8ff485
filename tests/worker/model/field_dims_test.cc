// Per-field embedding dims (ModelInputs::field_dims, fm_excluded; fm.h FieldLayout): every model
// type's tower against its double twin (reference.h) on mixed dims {16, 4, 8, 16}, single ids and
// lists, f32 and bf16, on every kernel path; gradients against central finite differences (the
// stride's tail never read, never written); uniform dims bit-identical to no dims at all; the
// stride, InitRow, and Create's refusals naming the field and the rule.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/isa_test_util.h"
#include "worker/model/model.h"
#include "tests/worker/model/tower_test_util.h"
#include "worker/model/reference.h"

namespace pstrain {
namespace {

constexpr int kDim = 16;
const std::vector<int> kDims = {16, 4, 8, 16};
// The stride's tail of a row [1 + d_f, row_dim): a value the kernels must never read.
constexpr float kTail = 1e3f;

ModelConfig Config(ModelType type, Precision precision = F32, float l2 = 0.f) {
  ModelConfig config;
  config.set_type(type);
  config.set_embedding_dim(kDim);
  config.add_hidden(16);
  config.add_hidden(9);
  config.set_embedding_l2(l2);
  config.set_precision(precision);
  if (type == DCN_V2) {
    // Low rank keeps the finite differences cheap (a full D x D layer is 44^2 more parameters).
    config.mutable_blocks()->set_cross_layers(2);
    config.mutable_blocks()->set_cross_rank(3);
  }
  if (type == BLOCKS) {
    // DeepFM's blocks under the grammar: the FM term next to the MLP.
    config.mutable_blocks()->set_interaction(ModelBlocks::FM_TERM);
    config.mutable_blocks()->set_mlp(true);
  }
  return config;
}

bool HasFm(ModelType type) { return type == DEEPFM || type == FM || type == BLOCKS; }

// Mixed dims: the fields of another dim than k are out of the FM term (fm_join: EXCLUDE). DLRM's
// dot products need one dim: its fields all have k. DIN: the history (field 3, a list) attends
// against field 1, both of dim 4.
ModelInputs Inputs(ModelType type) {
  ModelInputs inputs;
  inputs.num_fields = static_cast<int>(kDims.size());
  inputs.field_dims = kDims;
  if (type == DLRM) inputs.field_dims.assign(kDims.size(), kDim);
  if (type == DIN) {
    inputs.field_dims = {16, 4, 8, 4};
    inputs.attention.push_back({3, 1, {12}});
  }
  inputs.fm_excluded.assign(kDims.size(), 0);
  for (size_t f = 0; f < kDims.size(); ++f) inputs.fm_excluded[f] = inputs.field_dims[f] != kDim;
  return inputs;
}

// A slice over rows that each field owns (as a table's rows are its fields'): field f's cells
// take rows [f * per_field, (f + 1) * per_field), with kTail in each row's stride tail. Lists hold
// 1..max_len entries; the fields in `single` hold one (an attention target).
TowerSlice MakeSlice(const Model& model, int n, int max_len, uint64_t seed) {
  TowerSlice s;
  const int F = model.num_fields(), rd = model.row_dim();
  std::vector<bool> single(F, false);
  for (const ModelInputs::Attention& a : model.attention()) single[a.target] = true;
  const int per_field = std::max(3, n);
  s.n = n;
  s.rows_used = F * per_field;
  Rng rng(seed);
  if (max_len > 0) s.offsets.push_back(0);
  for (int e = 0; e < n * F; ++e) {
    const int f = e % F;
    const int len = max_len > 0 && !single[f] ? 1 + static_cast<int>(rng.Uniform(max_len)) : 1;
    for (int i = 0; i < len; ++i) {
      s.slots.push_back(static_cast<int32_t>(f * per_field + rng.Uniform(per_field)));
      s.scales.push_back(static_cast<float>(1.5 * rng.UniformDouble() - 0.25));
    }
    if (max_len > 0) s.offsets.push_back(static_cast<int32_t>(s.slots.size()));
  }
  for (int b = 0; b < n; ++b) s.labels.push_back(static_cast<float>(rng.Uniform(2)));
  s.rows.resize(static_cast<size_t>(F) * per_field * rd);
  for (int64_t u = 0; u < int64_t{F} * per_field; ++u) {
    const int width = 1 + model.field_dims()[u / per_field];
    for (int j = 0; j < rd; ++j) {
      s.rows[u * rd + j] = j < width ? static_cast<float>(0.3 * rng.Normal()) : kTail;
    }
  }
  RandomDense(model, seed, &rng, &s.dense);
  return s;
}


std::string TypeName(ModelType type) { return ModelType_Name(type); }

// ---- Forward against the reference -----------------------------------------------------------

using ForwardParam = std::tuple<Isa, ModelType, bool /*lists*/, Precision>;
class FieldDimsForwardTest : public ::testing::TestWithParam<ForwardParam> {};

TEST_P(FieldDimsForwardTest, MatchesReference) {
  const auto [isa, type, lists, precision] = GetParam();
  // bf16 first, on the process's path: oneDNN's is fixed per process (a forced avx2 copy).
  if (precision == BF16) PSTRAIN_SKIP_UNLESS_BF16();
  PSTRAIN_SCOPED_KERNEL_ISA(isa);
  if (type == DIN && !lists) GTEST_SKIP() << "DIN's history is a list field";
  const ModelConfig config = Config(type, precision);
  auto model = Model::Create(config, Inputs(type));
  ASSERT_TRUE(model.ok()) << model.status();
  const int max_dim = *std::max_element(kDims.begin(), kDims.end());
  EXPECT_EQ((*model)->row_dim(), 1 + std::max(kDim, max_dim));
  const int n = 37;
  const TowerSlice s = MakeSlice(**model, n, lists ? 6 : 0, 11 + n);
  auto tower = (*model)->CreateTower(n, 2);
  ASSERT_TRUE(tower.ok()) << tower.status();
  std::vector<float> logits(n);
  ASSERT_TRUE((*tower)->Forward(s.input(), logits.data()).ok());
  const std::vector<double> rows(s.rows.begin(), s.rows.end());
  const std::vector<double> dense(s.dense.begin(), s.dense.end());
  const std::vector<double> ref = ReferenceLogits(config, **model, s.ref(rows, dense));
  // bf16 rounds the MLP's inputs and weights to 8 bits of mantissa (model_test's tolerance).
  const double tol = precision == BF16 ? 3e-2 : 1e-5;
  double max_abs = 0;
  for (int b = 0; b < n; ++b) {
    ASSERT_NEAR(logits[b], ref[b], tol * (1 + std::fabs(ref[b]))) << "example " << b;
    max_abs = std::max(max_abs, std::fabs(ref[b]));
  }
  EXPECT_GT(max_abs, 0.1);
  const TowerGrads g = RunTower(**model, s, 2);
  for (int b = 0; b < n; ++b) ASSERT_EQ(g.logits[b], logits[b]) << b;
}

std::string ForwardName(const ::testing::TestParamInfo<ForwardParam>& info) {
  return absl::StrCat(IsaName(std::get<0>(info.param)), "_", TypeName(std::get<1>(info.param)),
                      std::get<2>(info.param) ? "_lists" : "_single", "_",
                      Precision_Name(std::get<3>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    F32, FieldDimsForwardTest,
    ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512Core),
                       ::testing::Values(DEEPFM, FM, WIDE_DEEP, DCN_V2, DLRM, BLOCKS, DIN),
                       ::testing::Bool(), ::testing::Values(F32)),
    ForwardName);
// bf16 needs AVX512-BF16 or AMX: skipped with the missing feature named elsewhere.
INSTANTIATE_TEST_SUITE_P(
    Bf16, FieldDimsForwardTest,
    ::testing::Combine(::testing::Values(Isa::kAvx512CoreBf16),
                       ::testing::Values(DEEPFM, FM, WIDE_DEEP, DCN_V2, DLRM, BLOCKS, DIN),
                       ::testing::Bool(), ::testing::Values(BF16)),
    ForwardName);

// ---- Gradients against finite differences of the reference ----------------------------------

using GradParam = std::tuple<ModelType, bool /*lists*/, int /*threads*/>;
class FieldDimsGradientTest : public ::testing::TestWithParam<GradParam> {};

TEST_P(FieldDimsGradientTest, MatchesCentralDifferencesAndLeavesTheTailAlone) {
  const auto [type, lists, threads] = GetParam();
  if (type == DIN && !lists) GTEST_SKIP() << "DIN's history is a list field";
  const ModelConfig config = Config(type, F32, /*l2=*/0.3f);
  auto model = Model::Create(config, Inputs(type));
  ASSERT_TRUE(model.ok()) << model.status();
  const int n = 5, rd = (*model)->row_dim();
  const TowerSlice s = MakeSlice(**model, n, lists ? 4 : 0, 3);
  const TowerGrads g = RunTower(**model, s, threads);
  // The stride's tail is no parameter: its gradient stays exactly 0.
  for (size_t i = 0; i < s.rows.size(); ++i) {
    if (s.rows[i] == kTail) {
      ASSERT_EQ(g.rows[i], 0.f) << "row " << i / rd << " float " << i % rd;
    }
  }
  std::vector<double> rows(s.rows.begin(), s.rows.end());
  std::vector<double> dense(s.dense.begin(), s.dense.end());
  const ReferenceInput in = s.ref(rows, dense);
  EXPECT_NEAR(g.loss, ReferenceLoss(config, **model, in), 1e-5 * n);
  const auto objective = [&] { return ReferenceObjective(config, **model, in); };
  ExpectCentralDifferences(objective, &rows, g.rows, 0, static_cast<int64_t>(rows.size()),
                           "row_grads", /*min_abs_grad=*/1e-2, [&](int64_t i) {
                             return g.rows[i] == 0.f && rows[i] == kTail;  // checked above
                           });
  ExpectCentralDifferences(objective, &dense, g.dense, "dense_grad");
}

INSTANTIATE_TEST_SUITE_P(
    Types, FieldDimsGradientTest,
    ::testing::Combine(::testing::Values(DEEPFM, FM, WIDE_DEEP, DCN_V2, BLOCKS, DIN),
                       ::testing::Bool(), ::testing::Values(1, 3)),
    [](const auto& info) {
      return absl::StrCat(TypeName(std::get<0>(info.param)),
                          std::get<1>(info.param) ? "_lists" : "_single", "_t",
                          std::get<2>(info.param));
    });

// ---- Uniform dims are the model without dims, to the bit ------------------------------------

TEST(FieldDimsTest, UniformDimsAreBitIdenticalToNoDims) {
  for (ModelType type : {DEEPFM, LR, FM, WIDE_DEEP, DCN_V2, DLRM, BLOCKS}) {
    for (bool lists : {false, true}) {
      SCOPED_TRACE(absl::StrCat(TypeName(type), lists ? " lists" : " single"));
      const ModelConfig config = Config(type, F32, 0.1f);
      ModelInputs plain;
      plain.num_fields = 4;
      ModelInputs uniform = plain;
      uniform.field_dims.assign(4, kDim);
      // Out of the FM term means nothing to the models without one.
      if (!HasFm(type)) uniform.fm_excluded = {1, 0, 1, 0};
      auto a = Model::Create(config, plain);
      auto b = Model::Create(config, uniform);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      ASSERT_EQ((*a)->row_dim(), (*b)->row_dim());
      ASSERT_EQ((*a)->dense_size(), (*b)->dense_size());
      const TowerSlice s = MakeSlice(**a, 64, lists ? 5 : 0, 17);
      const TowerGrads ga = RunTower(**a, s, 2);
      const TowerGrads gb = RunTower(**b, s, 2);
      EXPECT_EQ(ga.logits, gb.logits);
      EXPECT_EQ(ga.rows, gb.rows);
      EXPECT_EQ(ga.dense, gb.dense);
      EXPECT_EQ(ga.loss, gb.loss);
    }
  }
}

// ---- The stride, InitRow, and what Create refuses -------------------------------------------

TEST(FieldDimsTest, RowDimIsTheWidestFieldAndInitRowKeepsTheDefaultTablesRows) {
  ModelInputs inputs;
  inputs.num_fields = 3;
  inputs.field_dims = {8, 32, 4};
  inputs.fm_excluded = {0, 1, 1};
  ModelConfig config = Config(DEEPFM);
  config.set_embedding_dim(8);
  config.set_embedding_init_stddev(0.05f);
  auto wide = Model::Create(config, inputs);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ((*wide)->row_dim(), 33);
  EXPECT_EQ((*wide)->field_dims(), inputs.field_dims);
  EXPECT_EQ((*wide)->fm_excluded(), inputs.fm_excluded);
  auto plain = Model::Create(config, 3);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->field_dims(), std::vector<int>(3, 8));
  EXPECT_EQ((*plain)->fm_excluded(), std::vector<char>(3, 0));
  std::vector<float> a(33, -1.f), b(9, -1.f);
  (*wide)->InitRow(12345, 7, a.data());
  (*plain)->InitRow(12345, 7, b.data());
  for (int j = 0; j < 9; ++j) EXPECT_EQ(a[j], b[j]) << j;
  for (int j = 9; j < 33; ++j) EXPECT_EQ(a[j], 0.f) << j;

  // k may be narrower than every field (the default table unused): the stride is still the widest.
  inputs.field_dims = {4, 4, 4};
  inputs.fm_excluded = {1, 1, 1};
  config.set_embedding_dim(16);
  auto narrow = Model::Create(config, inputs);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ((*narrow)->row_dim(), 17);
  // LR has no embeddings: its rows stay [w] whatever the dims.
  auto lr = Model::Create(Config(LR), inputs);
  ASSERT_TRUE(lr.ok()) << lr.status();
  EXPECT_EQ((*lr)->row_dim(), 1);
}

absl::Status CreateStatus(const ModelConfig& config, const ModelInputs& inputs) {
  return Model::Create(config, inputs).status();
}

TEST(FieldDimsTest, CreateRefusesWhatTheBlocksCannotCrossNamingTheField) {
  using ::testing::AllOf;
  using ::testing::HasSubstr;
  ModelInputs inputs;
  inputs.num_fields = 4;
  inputs.field_dims = kDims;
  // The FM term crosses dim k: field 1 (dim 4) must be excluded.
  for (ModelType type : {DEEPFM, FM, BLOCKS}) {
    const absl::Status st = CreateStatus(Config(type), inputs);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << TypeName(type);
    EXPECT_THAT(std::string(st.message()),
                AllOf(HasSubstr("field 1 has dim 4 but the FM term crosses dim 16"),
                      HasSubstr("fm_join: EXCLUDE")));
  }
  inputs.fm_excluded = {0, 1, 0, 0};  // field 2 (dim 8) still in
  EXPECT_THAT(std::string(CreateStatus(Config(FM), inputs).message()),
              HasSubstr("field 2 has dim 8 but the FM term crosses dim 16"));
  inputs.fm_excluded = {0, 1, 1, 0};
  EXPECT_TRUE(CreateStatus(Config(FM), inputs).ok());
  // Without an FM term, mixed dims need no exclusion.
  inputs.fm_excluded.clear();
  EXPECT_TRUE(CreateStatus(Config(WIDE_DEEP), inputs).ok());
  EXPECT_TRUE(CreateStatus(Config(DCN_V2), inputs).ok());
  // DOT's dot products need one dim.
  const absl::Status dot = CreateStatus(Config(DLRM), inputs);
  EXPECT_EQ(dot.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dot.message()), AllOf(HasSubstr("field 1 has dim 4"),
                                                HasSubstr("DOT"), HasSubstr("dim 16")));
  // DIN: the history and its target need one dim.
  ModelInputs din = Inputs(DIN);
  din.field_dims = {16, 8, 8, 4};
  EXPECT_THAT(std::string(CreateStatus(Config(DIN), din).message()),
              AllOf(HasSubstr("field 3 (dim 4) attends against field 1 (dim 8)"),
                    HasSubstr("same dim")));
  // Attention together with the FM term keeps the uniform layout only (not supported yet).
  ModelInputs fm_att = Inputs(DIN);
  ModelConfig fm_blocks = Config(BLOCKS);
  EXPECT_THAT(std::string(CreateStatus(fm_blocks, fm_att).message()),
              HasSubstr("not supported yet"));
  // Malformed inputs.
  inputs.field_dims = {16, 4, 8};
  EXPECT_THAT(std::string(CreateStatus(Config(DEEPFM), inputs).message()),
              HasSubstr("3 field dims for 4 fields"));
  inputs.field_dims = {16, 0, 8, 16};
  EXPECT_THAT(std::string(CreateStatus(Config(WIDE_DEEP), inputs).message()),
              HasSubstr("field 1 has embedding dim 0, expected 1..1024"));
  inputs.field_dims = {16, 4, 8, 16};
  inputs.fm_excluded = {1};
  EXPECT_THAT(std::string(CreateStatus(Config(DEEPFM), inputs).message()),
              HasSubstr("1 fm_excluded flags for 4 fields"));
}

}  // namespace
}  // namespace pstrain
