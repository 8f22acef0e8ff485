#include "worker/eval/evaluator.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/pipeline.h"
#include "worker/eval/metrics.h"
#include "worker/params/dedup.h"

namespace pstrain {

bool HasPeriodicEvalData(const DataConfig& data) {
  return data.eval_size() > 0 || data.validation_fraction() > 0;
}

absl::StatusOr<EvalResult> Evaluate(const Config& config, const FeatureSpec& spec,
                                    const Model& model, ParameterAccess* params, int64_t step,
                                    int threads, std::vector<float>* probabilities,
                                    EvalData which) {
  const DataConfig& data = config.data();
  if (!HasPeriodicEvalData(data)) {
    return absl::FailedPreconditionError(
        "no eval channel configured (set data.eval or --eval, or data.validation_fraction)");
  }
  omp_set_num_threads(threads);
  const int batch_size = config.train().eval_batch_size();
  const bool validation = data.validation_fraction() > 0 &&
                          (which == EvalData::kPeriodic || data.eval_size() == 0);
  PipelineOptions po =
      validation ? ValidationOptionsFromConfig(data, batch_size)
                 : OptionsFromConfig(data, /*train=*/false, batch_size, /*shard_index=*/0,
                                     /*num_shards=*/1, /*epochs=*/1);
  po.reader_threads = 1;
  ASSIGN_OR_RETURN(auto pipeline, Pipeline::Create(std::move(po), spec));
  ASSIGN_OR_RETURN(auto tower, model.CreateTower(batch_size, threads));

  const int D = model.row_dim();
  std::vector<float> dense(model.dense_size()), rows, logits;
  RETURN_IF_ERROR(params->Pull({}, nullptr, dense.data()));
  Deduper dedup;
  std::vector<int64_t> unique;
  std::vector<int32_t> slots;
  AucAccumulator acc;
  Batch batch;
  int64_t epoch;
  while (true) {
    ASSIGN_OR_RETURN(bool more, pipeline->Next(&batch, &epoch));
    if (!more) break;
    if (batch.size == 0) continue;
    dedup.Run(batch.ids, &unique, &slots);
    rows.resize(unique.size() * D);
    RETURN_IF_ERROR(params->Pull(unique, rows.data(), nullptr));
    logits.resize(batch.size);
    Tower::Input in;
    in.n = batch.size;
    in.slots = slots.data();
    in.scales = batch.values.data();
    in.labels = batch.labels.data();
    in.rows = rows.data();
    in.dense = dense.data();
    in.offsets = batch.offsets.empty() ? nullptr : batch.offsets.data();
    RETURN_IF_ERROR(tower->Forward(in, logits.data()));
    for (int i = 0; i < batch.size; ++i) {
      acc.Add(ProbabilityOfLogit(logits[i]), batch.labels[i]);
      if (probabilities != nullptr) probabilities->push_back(ProbabilityOfLogit(logits[i]));
    }
  }
  // NaN scores (diverged parameters) fail the evaluation with the metrics' INVALID_ARGUMENT.
  const std::string where = absl::StrCat("evaluation at step ", step);
  absl::StatusOr<double> auc = acc.Auc();
  if (!auc.ok()) return Annotate(auc.status(), where);
  absl::StatusOr<double> logloss = acc.LogLoss();
  if (!logloss.ok()) return Annotate(logloss.status(), where);
  EvalResult r;
  r.step = step;
  r.auc = *auc;
  r.logloss = *logloss;
  r.examples = acc.count();
  return r;
}

BackgroundEvaluator::~BackgroundEvaluator() { Wait(); }

bool BackgroundEvaluator::Start(int64_t step) {
  absl::MutexLock l(&mu_);
  if (running_) return false;
  if (thread_.joinable()) thread_.join();  // finished: its result is stored
  running_ = true;
  thread_ = std::thread([this, step] {
    auto r = Evaluate(config_, spec_, model_, params_, step, threads_, /*probabilities=*/nullptr,
                      EvalData::kPeriodic);
    absl::MutexLock l(&mu_);
    result_ = std::move(r);
    running_ = false;
  });
  return true;
}

std::optional<absl::StatusOr<EvalResult>> BackgroundEvaluator::Take() {
  absl::MutexLock l(&mu_);
  auto r = std::move(result_);
  result_.reset();
  return r;
}

void BackgroundEvaluator::Wait() {
  std::thread t;
  {
    absl::MutexLock l(&mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

}  // namespace pstrain
