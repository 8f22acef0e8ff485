// Early stopping and the choice of the best checkpoint (train.early_stopping,
// checkpoint.keep_best; docs/CONFIG.md "Early stopping and the best checkpoint"): the chief feeds
// each periodic evaluation's result to Observe, in the order the evaluations ran, and learns
// whether it improved on the best so far and whether the training pass should stop.
//
// An evaluation improves when its metric beats the best value by more than min_delta (AUC:
// higher, LOGLOSS: lower; the first evaluation always improves), as Keras' EarlyStopping counts.
// After patience_evals evaluations in a row without an improvement, Observe says stop (never
// with patience_evals 0). The bookkeeping is an EarlyStoppingState, saved in the chief's worker
// state, so that a resumed job goes on counting where it stopped.
//
// Thread-compatible: the trainer thread owns it.
#pragma once

#include <string>

#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"
#include "worker/eval/evaluator.h"

namespace pstrain {

class EarlyStopper {
 public:
  struct Outcome {
    bool improved = false;  // a new best value
    bool stop = false;      // patience_evals evaluations without an improvement
  };

  // `restored`: the state a checkpoint saved (empty for a fresh job).
  EarlyStopper(const EarlyStopping& config, EarlyStoppingState restored);

  Outcome Observe(const EvalResult& result);

  // The metric's value in `result`.
  double Value(const EvalResult& result) const;
  // "AUC" or "LOGLOSS".
  std::string metric_name() const;
  const EarlyStoppingState& state() const { return state_; }

 private:
  const EarlyStopping config_;
  EarlyStoppingState state_;
};

}  // namespace pstrain
