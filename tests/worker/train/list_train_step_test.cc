// The training step with a list field (Batch::offsets): the towers' slices rebase the offsets
// (1 and 3 towers, in-process and pull/push paths agree to the bit), and a DeepFM model that
// pools a history list sharing the item field's rows learns what the history tells, beating the
// same model trained without it.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/metrics.h"
#include "worker/params/dedup.h"
#include "worker/params/local_params.h"
#include "worker/train/train_step.h"

namespace pstrain {
namespace {

constexpr int kItems = 200;

// label, item, hist (a list of up to 12 items sharing item's rows, MEAN), user.
Config ListConfig(bool with_history) {
  Config c;
  FeatureConfig* f = c.mutable_features();
  f->set_preset(NO_PRESET);
  FieldSpec* item = f->add_field();
  item->set_name("item");
  item->set_vocab_size(4 * kItems);
  FieldSpec* hist = f->add_field();
  hist->set_name("hist");
  hist->set_share_rows_with("item");
  hist->mutable_list()->set_max_length(12);
  FieldSpec* user = f->add_field();
  user->set_name("user");
  user->set_vocab_size(100);
  (void)with_history;
  c.mutable_model()->set_embedding_dim(8);
  c.mutable_model()->add_hidden(32);
  c.mutable_dense_optimizer()->set_type(ADAM);
  c.mutable_dense_optimizer()->set_learning_rate(3e-3f);
  c.mutable_sparse_optimizer()->set_learning_rate(0.1f);
  return c;
}

// Each item has one of 4 topics; a user's history is 1..12 items, mostly of one topic, and the
// click probability is high when the candidate's topic is the history's. Without the history a
// model sees only the item and the user (uninformative ids): AUC near the items' base rates.
void Generate(int n, uint64_t seed, bool with_history, RawRows* raw) {
  Rng rng(seed);
  raw->Clear(3);
  for (int r = 0; r < n; ++r) {
    const int topic = static_cast<int>(rng.Uniform(4));
    const int item = static_cast<int>(rng.Uniform(kItems));
    const int len = 1 + static_cast<int>(rng.Uniform(12));
    const bool match = item % 4 == topic;
    const float label = rng.UniformDouble() < (match ? 0.8 : 0.2) ? 1.f : 0.f;
    const int row = raw->AddRow(label);
    raw->SetCategorical(row, 0, static_cast<uint64_t>(item));
    raw->StartList(row, 1);
    if (with_history) {
      for (int i = 0; i < len; ++i) {
        const int t = rng.Uniform(5) == 0 ? static_cast<int>(rng.Uniform(4)) : topic;
        raw->AddToList(row, 1, static_cast<uint64_t>(4 * rng.Uniform(kItems / 4) + t));
      }
    }
    raw->SetCategorical(row, 2, rng.Uniform(100));
  }
}

class ListTrainStepTest : public ::testing::Test {
 protected:
  void Make(bool with_history) {
    config_ = ListConfig(with_history);
    auto spec = FeatureSpec::Create(config_.features());
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = std::make_unique<FeatureSpec>(*spec);
    ASSERT_TRUE(spec_->has_lists());
    auto model = Model::Create(config_.model(), spec_->num_fields());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }
  std::vector<Batch> Batches(int count, int size, uint64_t seed, bool with_history) {
    std::vector<Batch> out(count);
    RawRows raw;
    for (int i = 0; i < count; ++i) {
      Generate(size, seed + i, with_history, &raw);
      out[i].Clear(spec_->num_fields());
      spec_->Encode(raw, &out[i]);
    }
    return out;
  }
  std::unique_ptr<LocalParams> NewParams() {
    auto p = LocalParams::Create(*model_, spec_->total_rows(), config_, 2);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }
  // AUC of the current parameters on `batches`, through a tower's Forward with offsets.
  double Auc(LocalParams* params, const std::vector<Batch>& batches) {
    auto tower = model_->CreateTower(batches[0].size, 1);
    EXPECT_TRUE(tower.ok());
    std::vector<float> dense(model_->dense_size()), rows, logits;
    EXPECT_TRUE(params->Pull({}, nullptr, dense.data()).ok());
    Deduper dedup;
    std::vector<int64_t> unique;
    std::vector<int32_t> slots;
    AucAccumulator acc;
    for (const Batch& b : batches) {
      dedup.Run(b.ids, &unique, &slots);
      rows.resize(unique.size() * model_->row_dim());
      EXPECT_TRUE(params->Pull(unique, rows.data(), nullptr).ok());
      logits.resize(b.size);
      Tower::Input in;
      in.n = b.size;
      in.slots = slots.data();
      in.scales = b.values.data();
      in.rows = rows.data();
      in.dense = dense.data();
      in.offsets = b.offsets.data();
      EXPECT_TRUE((*tower)->Forward(in, logits.data()).ok());
      for (int i = 0; i < b.size; ++i) acc.Add(ProbabilityOfLogit(logits[i]), b.labels[i]);
    }
    auto auc = acc.Auc();
    EXPECT_TRUE(auc.ok()) << auc.status();
    return auc.ok() ? *auc : 0;
  }

  Config config_;
  std::unique_ptr<FeatureSpec> spec_;
  std::unique_ptr<Model> model_;
};

// No in_process(): the step pulls and pushes.
class PullPushOnly : public ForwardingParams {
 public:
  using ForwardingParams::ForwardingParams;
};

TEST_F(ListTrainStepTest, TowerSlicesRebaseOffsetsAndThePathsAgree) {
  Make(true);
  const std::vector<Batch> batches = Batches(5, 90, 1, true);
  ASSERT_FALSE(batches[0].offsets.empty());
  ASSERT_GT(batches[0].ids.size(), 3u * 90);
  double first_loss[4] = {};
  for (int towers : {1, 3}) {
    auto in_process = NewParams();
    auto pull_push = NewParams();
    auto a = TrainStep::Create(*model_, towers, 90, 1);
    auto b = TrainStep::Create(*model_, towers, 90, 1);
    ASSERT_TRUE(a.ok() && b.ok());
    PullPushOnly forwarding(pull_push.get());
    for (size_t i = 0; i < batches.size(); ++i) {
      auto ra = (*a)->Run(batches[i], static_cast<int64_t>(i) + 1, in_process.get());
      auto rb = (*b)->Run(batches[i], static_cast<int64_t>(i) + 1, &forwarding);
      ASSERT_TRUE(ra.ok()) << ra.status();
      ASSERT_TRUE(rb.ok()) << rb.status();
      EXPECT_EQ(ra->loss_sum, rb->loss_sum) << towers << " towers, step " << i;
      EXPECT_TRUE(std::isfinite(ra->loss_sum));
      if (i == 0) first_loss[towers] = ra->loss_sum;
    }
    EXPECT_EQ(Auc(in_process.get(), batches), Auc(pull_push.get(), batches)) << towers;
  }
  // The first step's loss is the initial model's on the whole batch, however it is sliced.
  EXPECT_NEAR(first_loss[3], first_loss[1], 1e-5 * first_loss[1]);
}

TEST_F(ListTrainStepTest, RefusesOffsetsThatDoNotMatchTheBatch) {
  Make(true);
  std::vector<Batch> batches = Batches(1, 10, 1, true);
  batches[0].offsets.pop_back();
  auto params = NewParams();
  auto step = TrainStep::Create(*model_, 1, 10, 1);
  ASSERT_TRUE(step.ok());
  auto r = (*step)->Run(batches[0], 1, params.get());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("batch offsets"), std::string::npos)
      << r.status();
}

// The history decides the label: pooled, it gives a much better AUC than the same model with
// empty histories (which sees only item and user ids).
TEST_F(ListTrainStepTest, PoolingTheHistoryLearnsWhatItTells) {
  double auc[2];
  for (bool with_history : {false, true}) {
    Make(with_history);
    const std::vector<Batch> train = Batches(120, 128, 100, with_history);
    const std::vector<Batch> test = Batches(10, 200, 9000, with_history);
    auto params = NewParams();
    auto step = TrainStep::Create(*model_, 2, 64, 1);
    ASSERT_TRUE(step.ok());
    int64_t s = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (const Batch& b : train) ASSERT_TRUE((*step)->Run(b, ++s, params.get()).ok());
    }
    auc[with_history] = Auc(params.get(), test);
  }
  std::printf("test AUC without history %.4f, with history %.4f\n", auc[0], auc[1]);
  // The teacher's match rate (0.8 vs 0.2 by topic, the history ~84% on topic) allows ~0.75+.
  EXPECT_GT(auc[1], 0.65);
  EXPECT_GT(auc[1], auc[0] + 0.1) << "without history " << auc[0];
}

}  // namespace
}  // namespace pstrain
