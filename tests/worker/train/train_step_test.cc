// TrainStep's pipelined API (Stage / Train / Flush): with pulls started after the previous push it
// computes exactly what the synchronous Run computes, and the order of pulls and pushes is the
// documented one, with and without prefetched pulls.
#include "worker/train/train_step.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/metrics.h"
#include "worker/params/dedup.h"
#include "worker/params/local_params.h"
#include "worker/tools/datagen.h"

namespace pstrain {
namespace {

// LocalParams that logs the order of pulls and pushes ("pull" / "push <step>").
class LoggingParams : public ForwardingParams {
 public:
  using ForwardingParams::ForwardingParams;
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override {
    log.push_back("pull");
    return ForwardingParams::Pull(ids, rows, dense);
  }
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads, const float* dense_grad,
                    int64_t step) override {
    log.push_back(absl::StrCat("push ", step));
    return ForwardingParams::Push(ids, row_grads, dense_grad, step);
  }
  std::vector<std::string> log;
};

class TrainStepTest : public testing::Test {
 protected:
  void SetUp() override {
    config_.mutable_features()->set_categorical_vocab_size(5000);
    config_.mutable_model()->set_embedding_dim(4);
    config_.mutable_model()->add_hidden(16);
    config_.mutable_dense_optimizer()->set_type(ADAM);
    config_.mutable_dense_optimizer()->set_learning_rate(1e-3f);
    auto spec = FeatureSpec::Create(config_.features());
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = std::make_unique<FeatureSpec>(*spec);
    auto model = Model::Create(config_.model(), spec_->num_fields());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto data = SyntheticData::Create(DatagenOptions{});
    ASSERT_TRUE(data.ok()) << data.status();
    RawRows raw;
    std::vector<float> probs;
    batches_.resize(6);
    for (size_t i = 0; i < batches_.size(); ++i) {
      batches_[i].Clear(spec_->num_fields());
      data->GenerateChunk(static_cast<int64_t>(i), i == 5 ? 37 : 2 * kPerTower, &raw, &probs);
      spec_->Encode(raw, &batches_[i]);
    }
  }

  std::unique_ptr<LocalParams> NewParams() {
    auto p = LocalParams::Create(*model_, spec_->total_rows(), config_, 2);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // Every row any batch touched, then the dense vector.
  std::vector<float> State(LocalParams* p) {
    absl::flat_hash_set<int64_t> seen;
    std::vector<int64_t> ids;
    for (const Batch& b : batches_) {
      for (int64_t id : b.ids) {
        if (seen.insert(id).second) ids.push_back(id);
      }
    }
    std::vector<float> out(ids.size() * p->row_dim() + p->dense_size());
    EXPECT_TRUE(p->Pull(ids, out.data(), out.data() + ids.size() * p->row_dim()).ok());
    return out;
  }

  // The pipelined loop of RunTraining over every batch: batch i + 1 is staged while step i + 1
  // trains (pulls started by Stage when `prefetch`), then Flush. Appends each step's result.
  void TrainPipelined(TrainStep* step, ParameterAccess* params, bool prefetch,
                      std::vector<StepResult>* results) {
    ASSERT_TRUE(step->Stage(batches_[0], params, prefetch).ok());
    for (size_t i = 0; i < batches_.size(); ++i) {
      auto r = step->Train(static_cast<int64_t>(i) + 1, params, [&]() -> absl::Status {
        return i + 1 < batches_.size() ? step->Stage(batches_[i + 1], params, prefetch)
                                       : absl::OkStatus();
      });
      ASSERT_TRUE(r.ok()) << r.status();
      results->push_back(*r);
    }
    ASSERT_TRUE(step->Flush().ok());
  }

  static constexpr int kPerTower = 64;
  Config config_;
  std::unique_ptr<FeatureSpec> spec_;
  std::unique_ptr<Model> model_;
  std::vector<Batch> batches_;
};

// Staging batch t+1 while batch t trains (dedup in the overlap), pulls not prefetched: the same
// parameters, bit for bit, as Run in a loop; the log is pull, push 1, pull, push 2, ...
TEST_F(TrainStepTest, PipelinedWithoutPrefetchEqualsRun) {
  auto sync_params = NewParams();
  auto pipe_params = NewParams();
  ASSERT_TRUE(sync_params && pipe_params);
  auto sync_step = TrainStep::Create(*model_, 2, kPerTower, 1);
  auto pipe_step = TrainStep::Create(*model_, 2, kPerTower, 1);
  ASSERT_TRUE(sync_step.ok() && pipe_step.ok());
  double sync_loss = 0, pipe_loss = 0;
  for (size_t i = 0; i < batches_.size(); ++i) {
    auto r = (*sync_step)->Run(batches_[i], static_cast<int64_t>(i) + 1, sync_params.get());
    ASSERT_TRUE(r.ok()) << r.status();
    sync_loss += r->loss_sum;
  }
  LoggingParams logged(pipe_params.get());
  std::vector<StepResult> results;
  ASSERT_NO_FATAL_FAILURE(TrainPipelined(pipe_step->get(), &logged, false, &results));
  for (const StepResult& r : results) pipe_loss += r.loss_sum;
  EXPECT_EQ(sync_loss, pipe_loss);
  EXPECT_TRUE(State(sync_params.get()) == State(pipe_params.get()));
  std::vector<std::string> want;
  for (size_t i = 0; i < batches_.size(); ++i) {
    want.push_back("pull");
    want.push_back(absl::StrCat("push ", i + 1));
  }
  EXPECT_EQ(logged.log, want);
}

// In-process parameters forwarded to LocalParams, counting the steps that took the in-process
// path (BeginStep) and the Pull / Push calls (the other path).
class CountingInProcess : public ForwardingParams, public InProcessParams {
 public:
  explicit CountingInProcess(LocalParams* inner)
      : ForwardingParams(inner), local_(inner->in_process()) {}
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override {
    ++pulls;
    return ForwardingParams::Pull(ids, rows, dense);
  }
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads, const float* dense_grad,
                    int64_t step) override {
    ++pushes;
    return ForwardingParams::Push(ids, row_grads, dense_grad, step);
  }
  InProcessParams* in_process() override { return this; }
  void BeginStep(int64_t step) override {
    ++steps;
    local_->BeginStep(step);
  }
  absl::Status GatherRows(absl::Span<const int64_t> ids, float* rows) override {
    return local_->GatherRows(ids, rows);
  }
  void CopyDense(int64_t begin, int64_t end, float* out) override {
    EXPECT_EQ(begin % local_->dense_chunk(), 0);
    local_->CopyDense(begin, end, out);
  }
  absl::Status ApplyRows(absl::Span<const int64_t> ids, const float* grads,
                         int64_t step) override {
    return local_->ApplyRows(ids, grads, step);
  }
  void ApplyDense(int64_t begin, int64_t end, const float* grad) override {
    EXPECT_EQ(begin % local_->dense_chunk(), 0);
    dense_applied += end - begin;
    local_->ApplyDense(begin, end, grad);
  }
  int64_t dense_chunk() const override { return local_->dense_chunk(); }
  void EndStep(bool applied) override { local_->EndStep(applied); }
  int steps = 0, pulls = 0, pushes = 0;
  std::atomic<int64_t> dense_applied{0};  // the tower threads apply their shares concurrently

 private:
  InProcessParams* local_;
};

// The in-process step (each tower pulls, sums and applies its share of the rows and of the dense
// vector) against Pull, the summed gradients and one Push (what remote parameters take), with a
// dense vector of several optimizer chunks, 3 towers and a short last batch: the same parameters,
// bit for bit, and the same losses.
TEST_F(TrainStepTest, InProcessStepEqualsPullAndPush) {
  config_.mutable_model()->clear_hidden();
  config_.mutable_model()->add_hidden(200);
  config_.mutable_model()->add_hidden(150);
  auto model = Model::Create(config_.model(), spec_->num_fields());
  ASSERT_TRUE(model.ok()) << model.status();
  model_ = std::move(*model);
  ASSERT_GT(model_->dense_size(), 3 * Optimizer::kDenseChunk);
  auto split_params = NewParams();
  auto push_params = NewParams();
  ASSERT_TRUE(split_params && push_params);
  for (int towers : {1, 3}) {
    auto split_step = TrainStep::Create(*model_, towers, 2 * kPerTower, 1);
    auto push_step = TrainStep::Create(*model_, towers, 2 * kPerTower, 1);
    ASSERT_TRUE(split_step.ok() && push_step.ok());
    CountingInProcess counting(split_params.get());
    LoggingParams logged(push_params.get());  // no in_process(): Pull and Push
    std::vector<StepResult> split_results, push_results;
    ASSERT_NO_FATAL_FAILURE(TrainPipelined(split_step->get(), &counting, false, &split_results));
    ASSERT_NO_FATAL_FAILURE(TrainPipelined(push_step->get(), &logged, false, &push_results));
    EXPECT_EQ(counting.steps, static_cast<int>(batches_.size()));
    EXPECT_EQ(counting.pulls + counting.pushes, 0);
    EXPECT_EQ(counting.dense_applied.load(), model_->dense_size() * counting.steps);
    EXPECT_EQ(logged.log.size(), 2 * batches_.size());
    ASSERT_EQ(split_results.size(), push_results.size());
    for (size_t i = 0; i < split_results.size(); ++i) {
      EXPECT_EQ(split_results[i].loss_sum, push_results[i].loss_sum) << i;
      EXPECT_EQ(split_results[i].unique_rows, push_results[i].unique_rows) << i;
    }
    EXPECT_TRUE(State(split_params.get()) == State(push_params.get())) << towers << " towers";
    EXPECT_GT((*split_step)->profile().push, 0);
  }
}

// Prefetched pulls: batch t+1's pull starts before step t's push (one step of staleness), and
// step t's push comes before the pull of batch t+2. The result differs from the exact run, as
// asynchronous SGD does, but training still proceeds (finite loss).
TEST_F(TrainStepTest, PrefetchedPullsPrecedeThePreviousPush) {
  auto params = NewParams();
  ASSERT_TRUE(params);
  LoggingParams logged(params.get());
  auto step = TrainStep::Create(*model_, 2, kPerTower, 1);
  ASSERT_TRUE(step.ok());
  std::vector<StepResult> results;
  ASSERT_NO_FATAL_FAILURE(TrainPipelined(step->get(), &logged, true, &results));
  for (const StepResult& r : results) EXPECT_TRUE(std::isfinite(r.loss_sum));
  const std::vector<std::string> want = {"pull",   "pull", "push 1", "pull",   "push 2", "pull",
                                         "push 3", "pull", "push 4", "pull",   "push 5", "push 6"};
  EXPECT_EQ(logged.log, want);
}

// LocalParams with background pushes (train.async_local_updates) and prefetched pulls: the
// background thread changes only the timing. Each prefetched pull waits for the push before the
// current one, so the result is bit-identical to synchronous pushes with the same pull order.
TEST_F(TrainStepTest, BackgroundPushesEqualSynchronousPushesWithTheSameStaleness) {
  auto train = [&](bool background) {
    auto params = NewParams();
    if (background) params->EnableBackgroundPush();
    auto step = TrainStep::Create(*model_, 2, kPerTower, 1);
    EXPECT_TRUE(step.ok());
    std::vector<StepResult> results;
    TrainPipelined(step->get(), params.get(), true, &results);
    EXPECT_EQ(results.size(), batches_.size());
    return State(params.get());
  };
  const std::vector<float> sync = train(false);
  EXPECT_TRUE(train(true) == sync);
  EXPECT_TRUE(train(true) == sync);
}

// Parameters that never change: pulls read the inner store, pushes are recorded, not applied.
// Every step's gradients then depend on its batch only.
class FrozenParams : public ForwardingParams {
 public:
  using ForwardingParams::ForwardingParams;
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override {
    dense_pulls.push_back(dense != nullptr);
    return ForwardingParams::Pull(ids, rows, dense);
  }
  struct Pushed {
    int64_t step;
    std::vector<float> row_grads, dense_grad;  // dense_grad empty when the push had none
  };
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads, const float* dense_grad,
                    int64_t step) override {
    Pushed p{step, std::vector<float>(row_grads, row_grads + ids.size() * row_dim()), {}};
    if (dense_grad != nullptr) p.dense_grad.assign(dense_grad, dense_grad + dense_size());
    pushes.push_back(std::move(p));
    return absl::OkStatus();
  }
  std::vector<bool> dense_pulls;  // per pull: did it fetch the dense vector
  std::vector<Pushed> pushes;
};

// cluster.dense_sync_steps = 4 over 6 steps: the dense vector is fetched by pulls 1 and 5 only;
// step 4's push carries the mean of steps 1-4's dense gradients, Flush pushes the mean of steps 5
// and 6 (no rows), and every step's row gradients are pushed as with k = 1.
TEST_F(TrainStepTest, DenseSyncEveryKStepsPushesTheMeanOfTheirGradients) {
  auto store = NewParams();
  ASSERT_TRUE(store);
  auto train = [&](int k, FrozenParams* params) {
    auto step = TrainStep::Create(*model_, 2, kPerTower, 1);
    ASSERT_TRUE(step.ok());
    (*step)->set_dense_sync_steps(k);
    std::vector<StepResult> results;
    TrainPipelined(step->get(), params, false, &results);
  };
  FrozenParams every(store.get()), blocks(store.get());
  ASSERT_NO_FATAL_FAILURE(train(1, &every));
  ASSERT_NO_FATAL_FAILURE(train(4, &blocks));
  ASSERT_EQ(every.pushes.size(), 6u);
  EXPECT_EQ(every.dense_pulls, std::vector<bool>(6, true));
  EXPECT_EQ(blocks.dense_pulls, (std::vector<bool>{true, false, false, false, true, false}));
  ASSERT_EQ(blocks.pushes.size(), 7u);
  auto mean = [&](int first, int last) {  // of every's dense gradients, steps first..last
    std::vector<float> m = every.pushes[first - 1].dense_grad;
    for (int s = first + 1; s <= last; ++s) {
      for (size_t i = 0; i < m.size(); ++i) m[i] += every.pushes[s - 1].dense_grad[i];
    }
    for (float& x : m) x *= 1.0f / static_cast<float>(last - first + 1);
    return m;
  };
  for (int s = 1; s <= 6; ++s) {
    const auto& got = blocks.pushes[s - 1];
    EXPECT_EQ(got.step, s);
    EXPECT_TRUE(got.row_grads == every.pushes[s - 1].row_grads) << "step " << s;
    if (s == 4) {
      EXPECT_TRUE(got.dense_grad == mean(1, 4));
    } else {
      EXPECT_TRUE(got.dense_grad.empty()) << "step " << s;
    }
  }
  const auto& flushed = blocks.pushes[6];
  EXPECT_EQ(flushed.step, 6);
  EXPECT_TRUE(flushed.row_grads.empty());
  EXPECT_TRUE(flushed.dense_grad == mean(5, 6));
  // The dense gradients differ from step to step (else the means above prove little).
  EXPECT_FALSE(every.pushes[0].dense_grad == every.pushes[1].dense_grad);
}

TEST_F(TrainStepTest, MisuseIsAnError) {
  auto params = NewParams();
  auto step = TrainStep::Create(*model_, 2, kPerTower, 1);
  ASSERT_TRUE(params && step.ok());
  EXPECT_EQ((*step)->Train(1, params.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*step)->Stage(batches_[0], params.get(), false).ok());
  ASSERT_TRUE((*step)->Stage(batches_[1], params.get(), false).ok());
  EXPECT_EQ((*step)->Stage(batches_[2], params.get(), false).code(),
            absl::StatusCode::kFailedPrecondition);
  Batch big;
  big.Clear(spec_->num_fields());
  for (int i = 0; i < 3; ++i) {
    RawRows raw;
    std::vector<float> probs;
    auto data = SyntheticData::Create(DatagenOptions{});
    data->GenerateChunk(i, kPerTower, &raw, &probs);
    spec_->Encode(raw, &big);
  }
  auto fresh = TrainStep::Create(*model_, 2, kPerTower, 1);
  EXPECT_EQ((*fresh)->Stage(big, params.get(), false).code(), absl::StatusCode::kInvalidArgument);
}

// Lists through the step on datagen's history field (DatagenOptions::history_mean_length), the
// quality target in miniature: DeepFM with the history pooled against the same model whose
// history lists are emptied, on the same rows; the teacher's Bayes AUC bounds both.
TEST(TrainStepLists, PoolingDatagensHistoryBeatsTheModelWithout) {
  DatagenOptions o;
  o.history_mean_length = 10;
  o.history_max_length = 40;
  o.max_cardinality = 2000;
  auto data = SyntheticData::Create(o);
  ASSERT_TRUE(data.ok()) << data.status();
  auto spec = FeatureSpec::Create(data->Features());
  ASSERT_TRUE(spec.ok());
  Config config;
  *config.mutable_features() = data->Features();
  config.mutable_model()->set_embedding_dim(8);
  config.mutable_model()->add_hidden(32);
  config.mutable_dense_optimizer()->set_type(ADAM);
  config.mutable_dense_optimizer()->set_learning_rate(1e-3f);
  auto model = Model::Create(config.model(), spec->num_fields());
  ASSERT_TRUE(model.ok());
  constexpr int kRows = 512, kTrain = 120, kTest = 16;
  RawRows raw;
  std::vector<float> probs;
  std::vector<Batch> with(kTrain + kTest), without(kTrain + kTest);
  AucAccumulator bayes;
  for (int i = 0; i < kTrain + kTest; ++i) {
    data->GenerateChunk(i, kRows, &raw, &probs);
    if (i >= kTrain) bayes.Add(probs, raw.labels);
    with[i].Clear(40);
    spec->Encode(raw, &with[i]);
    for (int r = 0; r < raw.size(); ++r) raw.StartList(r, 39);  // every history emptied
    without[i].Clear(40);
    spec->Encode(raw, &without[i]);
  }
  double auc[2];
  for (int h = 0; h < 2; ++h) {
    const std::vector<Batch>& batches = h ? with : without;
    auto params = LocalParams::Create(**model, spec->total_rows(), config, 2);
    ASSERT_TRUE(params.ok());
    auto step = TrainStep::Create(**model, 2, kRows / 2, 1);
    ASSERT_TRUE(step.ok());
    for (int i = 0; i < kTrain; ++i) ASSERT_TRUE((*step)->Run(batches[i], i + 1, params->get()).ok());
    auto tower = (*model)->CreateTower(kRows, 1);
    ASSERT_TRUE(tower.ok());
    std::vector<float> dense((*model)->dense_size()), rows, logits(kRows);
    ASSERT_TRUE((*params)->Pull({}, nullptr, dense.data()).ok());
    Deduper dedup;
    std::vector<int64_t> unique;
    std::vector<int32_t> slots;
    AucAccumulator acc;
    for (int i = kTrain; i < kTrain + kTest; ++i) {
      const Batch& b = batches[i];
      dedup.Run(b.ids, &unique, &slots);
      rows.resize(unique.size() * (*model)->row_dim());
      ASSERT_TRUE((*params)->Pull(unique, rows.data(), nullptr).ok());
      Tower::Input in;
      in.n = b.size;
      in.slots = slots.data();
      in.scales = b.values.data();
      in.rows = rows.data();
      in.dense = dense.data();
      in.offsets = b.offsets.data();
      ASSERT_TRUE((*tower)->Forward(in, logits.data()).ok());
      for (int j = 0; j < b.size; ++j) acc.Add(ProbabilityOfLogit(logits[j]), b.labels[j]);
    }
    auc[h] = *acc.Auc();
  }
  const double bayes_auc = *bayes.Auc();
  std::printf("test AUC without history %.4f, with history %.4f, Bayes %.4f\n", auc[0], auc[1],
              bayes_auc);
  EXPECT_GT(auc[1], auc[0] + 0.005);
  EXPECT_LT(auc[1], bayes_auc);
}

}  // namespace
}  // namespace pstrain
