// DIN's target attention (worker/model/target_attention.h) through the tower, against its double
// twin (reference.h): forward on every kernel path, gradients of the rows (history and candidate)
// and of the attention MLP against central finite differences, determinism over thread counts,
// the missing row and one-id histories, permutation invariance, the target's one-entry rule,
// and the model types that cannot attend (tests/worker/eval/model_inputs_test.cc: the config).
#include <algorithm>
#include <cmath>
#include <cstdio>
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

// Fields: 0 the candidate item, 1 its history (attended against 0), 2.. plain single-valued
// fields; with two_lists, field 3 is a second history attended against field 2.
constexpr int kFields = 5;

ModelConfig ModelCfg(ModelType type, int k, float l2 = 0.f) {
  ModelConfig config;
  config.set_type(type);
  config.set_embedding_dim(k);
  config.add_hidden(16);
  config.add_hidden(9);
  config.set_embedding_l2(l2);
  return config;
}

// DeepFM's blocks (FM_TERM + MLP) under the grammar: the FM term takes the attended vector.
ModelConfig DeepFmBlocks(int k, float l2 = 0.f) {
  ModelConfig config = ModelCfg(BLOCKS, k, l2);
  config.mutable_blocks()->set_interaction(ModelBlocks::FM_TERM);
  config.mutable_blocks()->set_mlp(true);
  return config;
}

// chunk_rows: ModelInputs::attention_chunk_rows (0: TargetAttention's default).
ModelInputs Inputs(std::vector<int> hidden = {36}, bool two_lists = false,
                   int64_t chunk_rows = 0) {
  ModelInputs inputs;
  inputs.num_fields = kFields;
  inputs.attention_chunk_rows = chunk_rows;
  inputs.attention.push_back({1, 0, hidden});
  if (two_lists) inputs.attention.push_back({3, 2, {7}});
  return inputs;
}

// The attended fields hold 1..max_len entries (duplicates included, scales as the combiners
// leave them); the other fields one entry each. Row 0 is the missing row.
TowerSlice MakeSlice(const Model& model, int n, int max_len, uint64_t seed) {
  TowerSlice s;
  const int F = model.num_fields();
  s.n = n;
  s.rows_used = std::max(4, n * F);
  Rng rng(seed);
  std::vector<bool> attended(F, false);
  for (const ModelInputs::Attention& a : model.attention()) attended[a.field] = true;
  s.offsets.push_back(0);
  for (int e = 0; e < n * F; ++e) {
    const int len = attended[e % F] ? 1 + static_cast<int>(rng.Uniform(max_len)) : 1;
    for (int i = 0; i < len; ++i) {
      s.slots.push_back(static_cast<int32_t>(rng.Uniform(s.rows_used)));
      s.scales.push_back(static_cast<float>(1.5 * rng.UniformDouble() - 0.25));
    }
    s.offsets.push_back(static_cast<int32_t>(s.slots.size()));
  }
  for (int b = 0; b < n; ++b) s.labels.push_back(static_cast<float>(rng.Uniform(2)));
  s.rows.resize(static_cast<size_t>(s.rows_used) * model.row_dim());
  for (float& v : s.rows) v = static_cast<float>(0.5 * rng.Normal());
  RandomDense(model, seed, &rng, &s.dense);
  return s;
}


std::vector<float> RunForward(const Model& model, const TowerSlice& s, int threads = 1) {
  auto tower = model.CreateTower(std::max(s.n, 1), threads);
  EXPECT_TRUE(tower.ok()) << tower.status();
  std::vector<float> logits(s.n);
  const absl::Status st = (*tower)->Forward(s.input(), logits.data());
  EXPECT_TRUE(st.ok()) << st;
  return logits;
}

void ExpectMatchesReference(const ModelConfig& config, const Model& model, const TowerSlice& s,
                            const std::vector<float>& logits) {
  const std::vector<double> rows(s.rows.begin(), s.rows.end());
  const std::vector<double> dense(s.dense.begin(), s.dense.end());
  const std::vector<double> ref = ReferenceLogits(config, model, s.ref(rows, dense));
  double max_abs = 0;
  for (int b = 0; b < s.n; ++b) {
    ASSERT_NEAR(logits[b], ref[b], 1e-5 * (1 + std::fabs(ref[b]))) << "example " << b;
    max_abs = std::max(max_abs, std::fabs(ref[b]));
  }
  EXPECT_GT(max_abs, 0.05);
}

TEST(TargetAttentionTest, TheAttentionMlpJoinsTheDenseVectorAfterTheBias) {
  auto model = Model::Create(ModelCfg(DIN, 8), Inputs({36, 5}));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<DenseTensor>& layout = (*model)->dense_layout();
  ASSERT_GE(layout.size(), 7u);
  EXPECT_EQ(layout[0].name, "bias");
  EXPECT_EQ(layout[1].name, "att1/mlp0/w");
  EXPECT_EQ(layout[1].shape, (std::vector<int64_t>{32, 36}));
  EXPECT_EQ(layout[2].name, "att1/mlp0/b");
  EXPECT_EQ(layout[3].name, "att1/mlp1/w");
  EXPECT_EQ(layout[3].shape, (std::vector<int64_t>{36, 5}));
  EXPECT_EQ(layout[5].name, "att1/out/w");
  EXPECT_EQ(layout[5].shape, (std::vector<int64_t>{5, 1}));
  EXPECT_EQ(layout[6].name, "att1/out/b");
  EXPECT_EQ(layout[7].name, "mlp0/w");
  EXPECT_EQ(layout[7].shape, (std::vector<int64_t>{kFields * 8, 16}));
}

// ---- Forward against the reference ------------------------------------------------------------

using ForwardParam = std::tuple<Isa, int /*k*/, int /*n*/, bool /*fm*/>;
class TargetAttentionForwardTest : public ::testing::TestWithParam<ForwardParam> {};

TEST_P(TargetAttentionForwardTest, MatchesReference) {
  const auto [isa, k, n, fm] = GetParam();
  PSTRAIN_SCOPED_KERNEL_ISA(isa);
  const ModelConfig config = fm ? DeepFmBlocks(k) : ModelCfg(DIN, k);
  auto model = Model::Create(config, Inputs({36}, /*two_lists=*/true));
  ASSERT_TRUE(model.ok()) << model.status();
  const TowerSlice s = MakeSlice(**model, n, 12, 3 + n + k);
  const std::vector<float> logits = RunForward(**model, s);
  ExpectMatchesReference(config, **model, s, logits);
  // ForwardBackward's logits are Forward's.
  const TowerGrads g = RunTower(**model, s, 1);
  for (int b = 0; b < n; ++b) ASSERT_EQ(g.logits[b], logits[b]) << b;
}

INSTANTIATE_TEST_SUITE_P(Paths, TargetAttentionForwardTest,
                         ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512Core),
                                            ::testing::Values(3, 8, 16),
                                            ::testing::Values(1, 9, 300), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(IsaName(std::get<0>(info.param)), "_k",
                                               std::get<1>(info.param), "_n",
                                               std::get<2>(info.param),
                                               std::get<3>(info.param) ? "_fm" : "");
                         });

// The attended vector reaches the grammar's other dense blocks as well.
TEST(TargetAttentionTest, CrossAndDotModelsAttendToo) {
  for (ModelType type : {DCN_V2, DLRM}) {
    const ModelConfig config = ModelCfg(type, 4);
    auto model = Model::Create(config, Inputs());
    ASSERT_TRUE(model.ok()) << model.status();
    const TowerSlice s = MakeSlice(**model, 17, 6, 5);
    ExpectMatchesReference(config, **model, s, RunForward(**model, s));
  }
}

// ---- Gradients against finite differences of the reference -----------------------------------

using GradParam =
    std::tuple<Isa, int /*k*/, float /*l2*/, int /*threads*/, bool /*two layers*/, bool /*fm*/>;
class TargetAttentionGradientTest : public ::testing::TestWithParam<GradParam> {};

TEST_P(TargetAttentionGradientTest, MatchesCentralDifferences) {
  const auto [isa, k, l2, threads, two_layers, fm] = GetParam();
  PSTRAIN_SCOPED_KERNEL_ISA(isa);
  const int n = 6;
  const ModelConfig config = fm ? DeepFmBlocks(k, l2) : ModelCfg(DIN, k, l2);
  // Chunks of at most 8 stacked rows: the 6 examples' 6-30 entries cross chunk boundaries, and
  // the padded rows of every chunk must stay out of the gradients.
  auto model = Model::Create(config, Inputs(two_layers ? std::vector<int>{6, 5}
                                                       : std::vector<int>{7},
                                            /*two_lists=*/two_layers, /*chunk_rows=*/8));
  ASSERT_TRUE(model.ok()) << model.status();
  TowerSlice s = MakeSlice(**model, n, 5, 9 + k);
  // The candidate's row also appears in the history (DIN's shared rows): both paths reach it.
  s.slots[s.offsets[1 * kFields + 1]] = s.slots[s.offsets[1 * kFields + 0]];
  const TowerGrads g = RunTower(**model, s, threads);
  std::vector<double> rows(s.rows.begin(), s.rows.end());
  std::vector<double> dense(s.dense.begin(), s.dense.end());
  const ReferenceInput in = s.ref(rows, dense);
  EXPECT_NEAR(g.loss, ReferenceLoss(config, **model, in), 1e-5 * n);
  const auto objective = [&] { return ReferenceObjective(config, **model, in); };
  const auto check = [&](std::vector<double>* params, const std::vector<float>& grad,
                         int64_t begin, int64_t end, const std::string& what) {
    ExpectCentralDifferences(objective, params, grad, begin, end, what, /*min_abs_grad=*/1e-3);
  };
  check(&rows, g.rows, 0, static_cast<int64_t>(rows.size()), "row_grads");
  // Each attention tensor separately: none may be trivially zero.
  for (const DenseTensor& t : (*model)->dense_layout()) {
    if (t.name.rfind("att", 0) != 0) continue;
    int64_t size = 1;
    for (int64_t d : t.shape) size *= d;
    check(&dense, g.dense, t.offset, t.offset + size, t.name);
  }
  check(&dense, g.dense, 0, static_cast<int64_t>(dense.size()), "dense_grad");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TargetAttentionGradientTest,
    ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512Core), ::testing::Values(3, 8),
                       ::testing::Values(0.f, 0.5f), ::testing::Values(1, 3),
                       ::testing::Bool(), ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(IsaName(std::get<0>(info.param)), "_k", std::get<1>(info.param),
                          std::get<2>(info.param) > 0 ? "_l2" : "", "_t", std::get<3>(info.param),
                          std::get<4>(info.param) ? "_two_layers" : "",
                          std::get<5>(info.param) ? "_fm" : "");
    });

// ---- Determinism, special lists ---------------------------------------------------------------

// Row gradients (history and candidate rows shared, many duplicates) and logits are the same to
// the bit for 1, 2 and 3 threads: the owner partition sums each row in one order. On the avx2
// path the logits still are, but the row gradients only to rounding: the attention's backward
// GEMMs (the gradients of its inputs, which reach the rows) run on oneDNN 2.6's avx2 gemm:jit,
// whose sums depend on the thread count (on AVX-512, brgemm's do not).
TEST(TargetAttentionTest, RowGradientsAreBitIdenticalOverThreadCounts) {
  const bool exact = KernelIsa() != Isa::kAvx2;
  if (!exact) std::printf("avx2 path: row gradients compared to 1e-5 relative, not to the bit\n");
  for (bool fm : {false, true}) {
  SCOPED_TRACE(fm ? "FM_TERM + MLP" : "DIN");
  const int n = 300;
  auto model = Model::Create(fm ? DeepFmBlocks(16, 0.1f) : ModelCfg(DIN, 16, 0.1f),
                             Inputs({36}, /*two_lists=*/true));
  ASSERT_TRUE(model.ok());
  TowerSlice s = MakeSlice(**model, n, 20, 21);
  s.rows_used = 40;
  for (int32_t& slot : s.slots) slot %= s.rows_used;
  const TowerGrads one = RunTower(**model, s, 1);
  for (int threads : {2, 3}) {
    const TowerGrads t = RunTower(**model, s, threads);
    if (exact) {
      EXPECT_EQ(t.rows, one.rows) << threads << " threads";
    } else {
      ASSERT_EQ(t.rows.size(), one.rows.size());
      for (size_t i = 0; i < one.rows.size(); ++i) {
        ASSERT_NEAR(t.rows[i], one.rows[i], 1e-5 * (1 + std::fabs(one.rows[i])))
            << threads << " threads, row float " << i;
      }
    }
    EXPECT_EQ(t.logits, one.logits) << threads << " threads";
    ASSERT_EQ(t.dense.size(), one.dense.size());
    for (size_t i = 0; i < one.dense.size(); ++i) {
      ASSERT_NEAR(t.dense[i], one.dense[i], 1e-5 * (1 + std::fabs(one.dense[i])))
          << threads << " threads, dense " << i;
    }
  }
  }
}

// The chunks are a schedule, not a model: any chunk size (smaller than the longest history,
// a few examples, the whole slice) gives the logits, the row gradients and the dense gradient of
// one chunk to float rounding (the layers' weight gradients are summed chunk by chunk), for one
// and for two attention layers, on every kernel path.
TEST(TargetAttentionTest, ChunkSizesAgreeToRounding) {
  for (const Isa isa : {Isa::kAvx2, Isa::kAvx512Core}) {
    PSTRAIN_SCOPED_KERNEL_ISA(isa);
    for (const bool two_layers : {false, true}) {
      SCOPED_TRACE(absl::StrCat(IsaName(isa), two_layers ? " two layers" : " one layer"));
      const std::vector<int> hidden = two_layers ? std::vector<int>{12, 5} : std::vector<int>{36};
      const int n = 200;
      auto whole = Model::Create(ModelCfg(DIN, 8, 0.1f),
                                 Inputs(hidden, /*two_lists=*/true, /*chunk_rows=*/1 << 30));
      ASSERT_TRUE(whole.ok()) << whole.status();
      TowerSlice s = MakeSlice(**whole, n, 20, 33);
      s.rows_used = 50;
      for (int32_t& slot : s.slots) slot %= s.rows_used;
      const TowerGrads one = RunTower(**whole, s, 1);
      double max_dense = 0;
      for (float v : one.dense) max_dense = std::max<double>(max_dense, std::fabs(v));
      ASSERT_GT(max_dense, 1e-3);
      for (const int64_t chunk : {7, 64, 1024}) {
        for (const int threads : {1, 2}) {
          SCOPED_TRACE(absl::StrCat("chunk_rows ", chunk, ", ", threads, " threads"));
          auto model = Model::Create(ModelCfg(DIN, 8, 0.1f),
                                     Inputs(hidden, /*two_lists=*/true, chunk));
          ASSERT_TRUE(model.ok()) << model.status();
          const TowerGrads t = RunTower(**model, s, threads);
          // The forward's floats do not depend on the chunks: one row's GEMM over K is one sum.
          ASSERT_EQ(t.logits.size(), one.logits.size());
          for (size_t b = 0; b < one.logits.size(); ++b) {
            ASSERT_NEAR(t.logits[b], one.logits[b], 1e-6 * (1 + std::fabs(one.logits[b]))) << b;
          }
          ASSERT_EQ(t.rows.size(), one.rows.size());
          for (size_t i = 0; i < one.rows.size(); ++i) {
            ASSERT_NEAR(t.rows[i], one.rows[i], 1e-5 * (1 + std::fabs(one.rows[i]))) << i;
          }
          ASSERT_EQ(t.dense.size(), one.dense.size());
          for (size_t i = 0; i < one.dense.size(); ++i) {
            ASSERT_NEAR(t.dense[i], one.dense[i], 1e-5 * (1 + std::fabs(one.dense[i]))) << i;
          }
        }
      }
    }
  }
}

// A negative chunk size is refused when the model is created.
TEST(TargetAttentionTest, NegativeChunkRowsAreRefused) {
  auto model = Model::Create(ModelCfg(DIN, 8), Inputs({36}, false, /*chunk_rows=*/-1));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("attention_chunk_rows is -1"), std::string::npos)
      << model.status();
}

// Histories of one id, and empty histories (which the feature spec encodes as the missing row 0
// with scale 1), match the reference and their gradients reach the rows.
TEST(TargetAttentionTest, OneIdAndMissingHistoriesMatchTheReference) {
  const int k = 8, n = 12;
  const ModelConfig config = ModelCfg(DIN, k);
  auto model = Model::Create(config, Inputs());
  ASSERT_TRUE(model.ok());
  TowerSlice s = MakeSlice(**model, n, 1, 41);  // every history holds one id
  for (int b = 0; b < n; b += 2) {
    const int i = s.offsets[b * kFields + 1];
    s.slots[i] = 0;
    s.scales[i] = 1.f;
  }
  ExpectMatchesReference(config, **model, s, RunForward(**model, s));
  const TowerGrads g = RunTower(**model, s, 2);
  double missing = 0;
  for (int j = 0; j < k; ++j) missing += std::fabs(g.rows[1 + j]);
  EXPECT_GT(missing, 0.0) << "the missing row's embedding gets no gradient through attention";
}

// DIN has no positions: permuting a history does not change the logit (to float rounding).
TEST(TargetAttentionTest, HistoryOrderDoesNotMatter) {
  auto model = Model::Create(ModelCfg(DIN, 8), Inputs());
  ASSERT_TRUE(model.ok());
  TowerSlice s = MakeSlice(**model, 20, 12, 7);
  const std::vector<float> before = RunForward(**model, s);
  for (int b = 0; b < s.n; ++b) {
    const int lo = s.offsets[b * kFields + 1], hi = s.offsets[b * kFields + 2];
    std::reverse(s.slots.begin() + lo, s.slots.begin() + hi);
    std::reverse(s.scales.begin() + lo, s.scales.begin() + hi);
  }
  const std::vector<float> after = RunForward(**model, s);
  for (int b = 0; b < s.n; ++b) EXPECT_NEAR(after[b], before[b], 1e-5 * (1 + std::fabs(before[b])));
}

// The attention is not the combiner: with the same parameters, attention and the plain sum
// (WIDE_DEEP's blocks: BLOCKS without the attention) give different logits.
TEST(TargetAttentionTest, AttentionIsNotTheCombinerSum) {
  ModelConfig blocks = ModelCfg(BLOCKS, 8);
  blocks.mutable_blocks()->set_interaction(ModelBlocks::NO_INTERACTION);
  blocks.mutable_blocks()->set_mlp(true);
  auto din = Model::Create(ModelCfg(DIN, 8), Inputs());
  ModelInputs plain_inputs;
  plain_inputs.num_fields = kFields;
  auto plain = Model::Create(blocks, plain_inputs);
  ASSERT_TRUE(din.ok() && plain.ok());
  TowerSlice s = MakeSlice(**din, 30, 8, 11);
  const std::vector<float> attended = RunForward(**din, s);
  // The plain model's dense vector: DIN's without the attention tensors (the MLP's follow).
  const int64_t mlp = (*din)->dense_layout()[5].offset;
  ASSERT_EQ((*din)->dense_layout()[5].name, "mlp0/w");
  std::vector<float> plain_dense = {s.dense[0]};
  plain_dense.insert(plain_dense.end(), s.dense.begin() + mlp, s.dense.end());
  s.dense = plain_dense;
  ASSERT_EQ(static_cast<int64_t>(s.dense.size()), (*plain)->dense_size());
  const std::vector<float> summed = RunForward(**plain, s);
  double diff = 0;
  for (int b = 0; b < s.n; ++b) diff = std::max(diff, double{std::fabs(attended[b] - summed[b])});
  EXPECT_GT(diff, 1e-3);
}

// Under precision BF16 the deep MLP reads a bf16 x0 (the attention itself stays f32): the
// attended vector reaches it, the logits track f32 to bf16 accuracy.
TEST(TargetAttentionTest, Bf16PrecisionWritesTheAttendedVectorInBf16) {
  PSTRAIN_SKIP_UNLESS_BF16();
  ModelConfig f32 = ModelCfg(DIN, 16);
  ModelConfig bf16 = f32;
  bf16.set_precision(BF16);
  auto a = Model::Create(f32, Inputs());
  auto b = Model::Create(bf16, Inputs());
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  const TowerSlice s = MakeSlice(**a, 64, 10, 13);
  const std::vector<float> want = RunForward(**a, s, 2);
  const std::vector<float> got = RunForward(**b, s, 2);
  for (int i = 0; i < s.n; ++i) EXPECT_NEAR(got[i], want[i], 3e-2 * (1 + std::fabs(want[i]))) << i;
  ExpectMatchesReference(f32, **a, s, want);
}

// A batch without offsets (one entry per cell) gives what the same batch with explicit offsets
// gives, also when the FM term takes the list path for the attention (the tower's own offsets).
TEST(TargetAttentionTest, BatchesWithoutOffsetsMatchOneEntryLists) {
  for (bool fm : {false, true}) {
    const ModelConfig config = fm ? DeepFmBlocks(8) : ModelCfg(DIN, 8);
    auto model = Model::Create(config, Inputs());
    ASSERT_TRUE(model.ok());
    const TowerSlice s = MakeSlice(**model, 25, 1, 17);  // every cell one entry
    const TowerGrads with = RunTower(**model, s, 2);
    TowerSlice plain = s;
    Tower::Input in = plain.input();
    in.offsets = nullptr;
    auto tower = (*model)->CreateTower(s.n, 2);
    ASSERT_TRUE(tower.ok());
    TowerGrads without;
    without.logits.assign(s.n, 0.f);
    without.rows.assign(s.rows.size(), 0.f);
    without.dense.assign(s.dense.size(), 0.f);
    ASSERT_TRUE((*tower)->ForwardBackward(in, without.rows.data(), without.dense.data(),
                                          without.logits.data()).ok());
    EXPECT_EQ(without.logits, with.logits) << fm;
    EXPECT_EQ(without.rows, with.rows) << fm;
  }
}

TEST(TargetAttentionTest, ATargetWithOtherThanOneEntryIsRefused) {
  auto model = Model::Create(ModelCfg(DIN, 4), Inputs());
  ASSERT_TRUE(model.ok());
  TowerSlice s = MakeSlice(**model, 3, 4, 1);
  // Example 1's target cell gets a second entry (the next field loses its one).
  s.offsets[1 * kFields + 1] += 1;
  auto tower = (*model)->CreateTower(3, 1);
  ASSERT_TRUE(tower.ok());
  std::vector<float> logits(3);
  const absl::Status st = (*tower)->Forward(s.input(), logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("attention target"), std::string::npos) << st;
}

// ---- Configuration ----------------------------------------------------------------------------

TEST(TargetAttentionTest, ModelTypesThatCannotAttendAreRefused) {
  for (ModelType type : {LR, FM, DEEPFM, WIDE_DEEP}) {
    auto model = Model::Create(ModelCfg(type, 4), Inputs());
    ASSERT_FALSE(model.ok()) << ModelType_Name(type);
    EXPECT_NE(model.status().message().find("target attention"), std::string::npos)
        << model.status();
  }
  // The FM term takes the attended vector only with the MLP (which carries d c).
  ModelConfig fm = DeepFmBlocks(4);
  EXPECT_TRUE(Model::Create(fm, Inputs()).ok());
  fm.mutable_blocks()->set_mlp(false);
  auto model = Model::Create(fm, Inputs());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("FM_TERM"), std::string::npos) << model.status();
  // DIN without an attended field.
  model = Model::Create(ModelCfg(DIN, 4), kFields);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("attention_target"), std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace pstrain
