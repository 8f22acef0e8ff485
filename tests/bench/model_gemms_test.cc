// bench/model_gemms.h: the GEMMs of a step, read off the shipped DCN-v2 and DLRM models' dense
// layouts, are the ones their blocks run (counted against the models' own FLOP counts); DIN's
// attention MLP runs over the batch's list entries.
#include "bench/model_gemms.h"

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "pstrain/config.pb.h"
#include "worker/model/model.h"

namespace pstrain {
namespace {

ModelInputs Inputs(int num_fields, const std::vector<int>& dense_fields = {}) {
  ModelInputs inputs;
  inputs.num_fields = num_fields;
  inputs.dense_fields = dense_fields;
  return inputs;
}

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool>;

std::map<Key, std::pair<int, bool>> Shapes(const Model& model, int batch, bool bf16,
                                           int64_t attention_rows = 0) {
  std::map<Key, std::pair<int, bool>> out;
  for (const auto& [s, count] : ModelStepGemms(model, batch, bf16, attention_rows)) {
    out[Key{s.m, s.k, s.n, s.trans_a, s.trans_b}] = {count, s.bf16};
  }
  return out;
}

ModelConfig Preset(ModelType type) {
  ModelConfig c;
  c.set_type(type);
  c.set_embedding_dim(16);
  for (int h : {400, 400, 400}) c.add_hidden(h);
  if (type == DCN_V2) c.mutable_blocks()->set_cross_layers(3);
  if (type == DLRM) {
    c.mutable_blocks()->add_bottom_hidden(256);
    c.mutable_blocks()->add_bottom_hidden(64);
  }
  return c;
}

TEST(ModelGemmsTest, DcnV2CrossLayersAndMlpForwardAndBothBackwards) {
  auto model = Model::Create(Preset(DCN_V2), Inputs(39));
  ASSERT_TRUE(model.ok()) << model.status();
  const auto shapes = Shapes(**model, 1024, /*bf16=*/true);
  // 3 cross layers [624, 624]: forward, backward-weights (x read transposed), backward-data; in
  // bf16, as worker/model/cross_network.h runs them under precision BF16.
  EXPECT_EQ(shapes.at(Key{1024, 624, 624, false, false}), std::make_pair(3, true));
  EXPECT_EQ(shapes.at(Key{624, 1024, 624, true, false}), std::make_pair(3, true));
  EXPECT_EQ(shapes.at(Key{1024, 624, 624, false, true}), std::make_pair(3, true));
  // The MLP 624-400-400-400 in bf16 (the output layer, N = 1, is not a GEMM).
  EXPECT_EQ(shapes.at(Key{1024, 624, 400, false, false}), std::make_pair(1, true));
  EXPECT_EQ(shapes.at(Key{1024, 400, 624, false, true}), std::make_pair(1, true));
  EXPECT_EQ(shapes.at(Key{1024, 400, 400, false, false}), std::make_pair(2, true));
  EXPECT_EQ(shapes.size(), 9u);
  const double gemm = 6.0 * (3 * 624 * 624 + 624 * 400 + 2 * 400 * 400);
  EXPECT_DOUBLE_EQ(ModelStepGemmFlopsPerExample(**model, 1024, true), gemm);
  // The model's own count adds the non-GEMM work only: the output layer and elementwise passes.
  EXPECT_GT((*model)->flops_per_example(), gemm);
  EXPECT_LT((*model)->flops_per_example(), gemm * 1.01);
}

TEST(ModelGemmsTest, DcnMixExpertsAndGateRunThreeGemmsEach) {
  ModelConfig config = Preset(DCN_V2);
  config.mutable_blocks()->set_cross_rank(64);
  config.mutable_blocks()->set_cross_experts(4);
  auto model = Model::Create(config, Inputs(39));
  ASSERT_TRUE(model.ok()) << model.status();
  const auto shapes = Shapes(**model, 1024, /*bf16=*/false);
  // 3 layers x 4 experts: V_i [624, 64], C_i [64, 64], U_i [64, 624]; the gate [624, 4] a layer.
  EXPECT_EQ(shapes.at(Key{1024, 624, 64, false, false}), std::make_pair(12, false));
  EXPECT_EQ(shapes.at(Key{64, 1024, 64, true, false}), std::make_pair(12, false));
  EXPECT_EQ(shapes.at(Key{1024, 64, 64, false, true}), std::make_pair(12, false));
  EXPECT_EQ(shapes.at(Key{1024, 64, 624, false, false}), std::make_pair(12, false));
  EXPECT_EQ(shapes.at(Key{1024, 624, 4, false, false}), std::make_pair(3, false));
  EXPECT_EQ(shapes.at(Key{1024, 4, 624, false, true}), std::make_pair(3, false));
  EXPECT_EQ(shapes.size(), 12u + 6u);  // and the MLP's 6
  const double gemm = 6.0 * (3 * (4 * (2 * 624 * 64 + 64 * 64) + 624 * 4) + 624 * 400 +
                             2 * 400 * 400);
  EXPECT_DOUBLE_EQ(ModelStepGemmFlopsPerExample(**model, 1024, false), gemm);
  EXPECT_GT((*model)->flops_per_example(), gemm);
  EXPECT_LT((*model)->flops_per_example(), gemm * 1.01);
}

TEST(ModelGemmsTest, DlrmHasNoBackwardDataIntoTheNumericInputs) {
  std::vector<int> dense(13);
  for (int f = 0; f < 13; ++f) dense[f] = f;
  auto model = Model::Create(Preset(DLRM), Inputs(39, dense));
  ASSERT_TRUE(model.ok()) << model.status();
  const auto shapes = Shapes(**model, 512, /*bf16=*/false);
  EXPECT_EQ(shapes.count(Key{512, 13, 256, false, false}), 1u);
  EXPECT_EQ(shapes.count(Key{13, 512, 256, true, false}), 1u);
  EXPECT_EQ(shapes.count(Key{512, 256, 13, false, true}), 0u);
  // The top MLP reads [bottom output (16), 40 * 39 / 2 = 780 dots].
  EXPECT_EQ(shapes.at(Key{512, 796, 400, false, false}), std::make_pair(1, false));
  EXPECT_EQ(shapes.size(), 14u);
  const double gemm = 4.0 * 13 * 256 + 6.0 * (256 * 64 + 64 * 16) +
                      6.0 * (796 * 400 + 2 * 400 * 400);
  EXPECT_DOUBLE_EQ(ModelStepGemmFlopsPerExample(**model, 512, false), gemm);
  // The model's own count is these GEMMs (so every bottom layer but the first has its
  // backward-data: it counted 4 in * out for all of them, 35k FLOPs an example short), the dots
  // (2 k a pair forward, 4 k backward), the output layer and the 4 F of the embeddings.
  EXPECT_DOUBLE_EQ((*model)->flops_per_example(), gemm + 6.0 * 16 * 780 + 6.0 * 400 + 4.0 * 39);
  // Under bf16 the bottom MLP's GEMMs are bf16 too (worker/model/bottom_mlp.h), as the top's.
  const auto low = Shapes(**model, 512, /*bf16=*/true);
  EXPECT_EQ(low.at(Key{512, 13, 256, false, false}), std::make_pair(1, true));
  EXPECT_EQ(low.at(Key{512, 796, 400, false, false}), std::make_pair(1, true));
}

TEST(ModelGemmsTest, DinAttentionMlpRunsOverTheListEntries) {
  // configs/din.textproto's shape: 39 fields and the history (field 39) attending against C3
  // (field 15) through 36 ReLU units; MLP 640-400-400-400.
  ModelConfig config = Preset(DIN);
  ModelInputs inputs;
  inputs.num_fields = 40;
  inputs.attention.push_back({39, 15, {36}});
  auto model = Model::Create(config, inputs);
  ASSERT_TRUE(model.ok()) << model.status();
  // Without the entries' count the attention is left out (not counted at the examples' M).
  const auto plain = Shapes(**model, 1024, /*bf16=*/true);
  EXPECT_EQ(plain.size(), 6u);
  EXPECT_EQ(plain.at(Key{1024, 640, 400, false, false}), std::make_pair(1, true));
  EXPECT_EQ(plain.count(Key{1024, 64, 36, false, false}), 0u);
  // 25,000 entries in the tower's batch: the first layer as TargetAttention runs it, per entry
  // v [R, 2k = 32] x [We + Wd; Wp] [32, 36] in 25 chunks of 1,024 rows, and per example
  // c [1024, k = 16] x (Wc - Wd) [16, 36], each forward, backward-weights and backward-data (d v
  // and d c feed the rows), f32 even under BF16; the output unit [36, 1] is not a GEMM. No GEMM
  // has u's K = 4k = 64.
  const auto shapes = Shapes(**model, 1024, /*bf16=*/true, 25000);
  EXPECT_EQ(shapes.at(Key{1024, 32, 36, false, false}), std::make_pair(25, false));
  EXPECT_EQ(shapes.at(Key{32, 1024, 36, true, false}), std::make_pair(25, false));
  EXPECT_EQ(shapes.at(Key{1024, 36, 32, false, true}), std::make_pair(25, false));
  EXPECT_EQ(shapes.at(Key{1024, 16, 36, false, false}), std::make_pair(1, false));
  EXPECT_EQ(shapes.at(Key{16, 1024, 36, true, false}), std::make_pair(1, false));
  EXPECT_EQ(shapes.at(Key{1024, 36, 16, false, true}), std::make_pair(1, false));
  EXPECT_EQ(shapes.count(Key{1024, 64, 36, false, false}), 0u);
  EXPECT_EQ(shapes.count(Key{25000, 32, 36, false, false}), 0u) << "not in one piece";
  // Entries that fit one chunk: one GEMM of their rows.
  const auto one_chunk = Shapes(**model, 1024, /*bf16=*/true, 900);
  EXPECT_EQ(one_chunk.at(Key{900, 32, 36, false, false}), std::make_pair(1, false));
  EXPECT_EQ(shapes.at(Key{1024, 640, 400, false, false}), std::make_pair(1, true));
  EXPECT_EQ(shapes.size(), 12u);
  const double mlp = 6.0 * (640 * 400 + 2 * 400 * 400);
  EXPECT_DOUBLE_EQ(ModelStepGemmFlopsPerExample(**model, 1024, true), mlp);
  EXPECT_DOUBLE_EQ(ModelStepGemmFlopsPerExample(**model, 1024, true, 25000),
                   mlp + 6.0 * 32 * 36 * 25 * 1024 / 1024 + 6.0 * 16 * 36);
  // Per entry: the first layer at K 2k and the output unit, as the model counts its own MLP;
  // per example: the target's term.
  EXPECT_DOUBLE_EQ(AttentionFlopsPerEntry(**model), 6.0 * 32 * 36 + 6.0 * 36);
  EXPECT_DOUBLE_EQ(AttentionFlopsPerExample(**model), 6.0 * 16 * 36);
  // The model's own count (per example) has the MLP but not the attention.
  EXPECT_GT((*model)->flops_per_example(), mlp);
  EXPECT_LT((*model)->flops_per_example(), mlp * 1.01);
  // A second attention layer runs per entry at its full K (only the first is split).
  ModelInputs two = inputs;
  two.attention[0].hidden = {36, 5};
  auto deeper = Model::Create(config, two);
  ASSERT_TRUE(deeper.ok()) << deeper.status();
  const auto deep_shapes = Shapes(**deeper, 1024, /*bf16=*/false, 25000);
  EXPECT_EQ(deep_shapes.at(Key{1024, 36, 5, false, false}), std::make_pair(25, false));
  EXPECT_EQ(deep_shapes.at(Key{36, 1024, 5, true, false}), std::make_pair(25, false));
  EXPECT_EQ(deep_shapes.at(Key{1024, 5, 36, false, true}), std::make_pair(25, false));
  EXPECT_DOUBLE_EQ(AttentionFlopsPerEntry(**deeper), 6.0 * (32 * 36 + 36 * 5 + 5));
  EXPECT_DOUBLE_EQ(AttentionFlopsPerExample(**deeper), 6.0 * 16 * 36);
  auto dlrm = Model::Create(Preset(DLRM), 39);
  ASSERT_TRUE(dlrm.ok()) << dlrm.status();
  EXPECT_EQ(AttentionFlopsPerEntry(**dlrm), 0.0);
  EXPECT_EQ(AttentionFlopsPerExample(**dlrm), 0.0);
}

}  // namespace
}  // namespace pstrain
