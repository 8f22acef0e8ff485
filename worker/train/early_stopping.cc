#include "worker/train/early_stopping.h"

namespace pstrain {

EarlyStopper::EarlyStopper(const EarlyStopping& config, EarlyStoppingState restored)
    : config_(config), state_(std::move(restored)) {}

double EarlyStopper::Value(const EvalResult& result) const {
  return config_.metric() == EarlyStopping::LOGLOSS ? result.logloss : result.auc;
}

std::string EarlyStopper::metric_name() const {
  return EarlyStopping::Metric_Name(config_.metric());
}

EarlyStopper::Outcome EarlyStopper::Observe(const EvalResult& result) {
  const double value = Value(result);
  // How much better than the best so far (positive: better), whatever the metric's direction.
  const double gain = config_.metric() == EarlyStopping::LOGLOSS ? state_.best() - value
                                                                 : value - state_.best();
  Outcome out;
  out.improved = state_.evals() == 0 || gain > config_.min_delta();
  state_.set_evals(state_.evals() + 1);
  if (out.improved) {
    state_.set_best(value);
    state_.set_best_step(result.step);
    state_.set_evals_since_best(0);
  } else {
    state_.set_evals_since_best(state_.evals_since_best() + 1);
  }
  out.stop = config_.patience_evals() > 0 && state_.evals_since_best() >= config_.patience_evals();
  return out;
}

}  // namespace pstrain
