// Evaluation on the eval channels: exact AUC and logloss of the current parameters. Runs either
// synchronously (the final evaluation) or on its own thread beside training (periodic
// evaluations), reading the parameters while the trainer keeps updating them, as TF's evaluator
// reads the latest values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pstrain/config.pb.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/params.h"

namespace pstrain {

struct EvalResult {
  int64_t step = 0;
  double auc = 0, logloss = 0;
  int64_t examples = 0;
};

// Which data an evaluation reads. The periodic evaluations (train.eval_every_steps, early
// stopping, checkpoint.keep_best) choose the model: they read the validation split
// (data.validation_fraction > 0, worker/data/validation_split.h), else the eval channels. The
// final evaluation (summary.json test_auc) reports on held-out test data: the eval channels, else
// the validation split.
enum class EvalData { kPeriodic, kFinal };
// Whether config.data() has data for the periodic evaluations (or the final one: the same).
bool HasPeriodicEvalData(const DataConfig& data);

// Evaluates `params` on the data `which` names (of config.data()) with `threads` OpenMP threads.
// The calling thread runs the tower (and sets its own OpenMP thread count). A model that scores
// NaN (diverged parameters) fails with INVALID_ARGUMENT ("evaluation at step S: n of N scores
// are NaN ..."). When `probabilities` is not null it receives every example's probability, in
// the eval channels' order (tests compare other scorers with it).
absl::StatusOr<EvalResult> Evaluate(const Config& config, const FeatureSpec& spec,
                                    const Model& model, ParameterAccess* params, int64_t step,
                                    int threads, std::vector<float>* probabilities = nullptr,
                                    EvalData which = EvalData::kFinal);

// Background evaluations of the periodic data (EvalData::kPeriodic), one at a time. Thread-safe.
class BackgroundEvaluator {
 public:
  BackgroundEvaluator(const Config& config, const FeatureSpec& spec, const Model& model,
                      ParameterAccess* params, int threads)
      : config_(config), spec_(spec), model_(model), params_(params), threads_(threads) {}
  ~BackgroundEvaluator();  // waits for a running evaluation

  // Starts an evaluation of the parameters as of `step` unless one is running (then returns
  // false: evaluation never holds training back).
  bool Start(int64_t step);
  // The result of a finished evaluation not yet taken, if any.
  std::optional<absl::StatusOr<EvalResult>> Take();
  // Waits for a running evaluation.
  void Wait();

 private:
  const Config& config_;
  const FeatureSpec& spec_;
  const Model& model_;
  ParameterAccess* params_;
  const int threads_;
  absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::StatusOr<EvalResult>> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pstrain
