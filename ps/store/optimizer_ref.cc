#include "ps/store/optimizer_ref.h"

#include <cmath>

#include "ps/store/lr_schedule.h"

namespace pstrain::ref {

int64_t StateFloats(const OptimizerConfig& config, int64_t n) {
  switch (config.type()) {
    case SGD:
      return 0;
    case ADAGRAD:
      return n;
    case ADAM:
      return 2 * n + 1;
    case FTRL:
      return 2 * n;
  }
  return 0;
}

void InitState(const OptimizerConfig& config, float* state, int64_t n) {
  for (int64_t i = 0; i < StateFloats(config, n); ++i) state[i] = 0.0f;
  if (config.type() == ADAGRAD || config.type() == FTRL) {
    for (int64_t i = 0; i < n; ++i) state[i] = config.initial_accumulator();
  }
}

void ApplyRow(const OptimizerConfig& config, float* w, float* state, const float* g, int64_t n,
              int64_t step) {
  const double lr =
      static_cast<double>(config.learning_rate()) * LearningRateFactor(config.schedule(), step);
  switch (config.type()) {
    case SGD:
      for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(w[i] - lr * g[i]);
      return;
    case ADAGRAD:
      for (int64_t i = 0; i < n; ++i) {
        const double accum = static_cast<double>(state[i]) + static_cast<double>(g[i]) * g[i];
        w[i] = static_cast<float>(w[i] - lr * g[i] / std::sqrt(accum));
        state[i] = static_cast<float>(accum);
      }
      return;
    case ADAM: {
      float* m = state;
      float* v = state + n;
      const double t = static_cast<double>(state[2 * n]) + 1.0;
      state[2 * n] = static_cast<float>(t);
      const double beta1 = config.beta1(), beta2 = config.beta2(), eps = config.epsilon();
      const double alpha = lr * std::sqrt(1.0 - std::pow(beta2, t)) / (1.0 - std::pow(beta1, t));
      for (int64_t i = 0; i < n; ++i) {
        const double mi = beta1 * m[i] + (1.0 - beta1) * g[i];
        const double vi = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
        w[i] = static_cast<float>(w[i] - alpha * mi / (std::sqrt(vi) + eps));
        m[i] = static_cast<float>(mi);
        v[i] = static_cast<float>(vi);
      }
      return;
    }
    case FTRL: {
      float* accum = state;
      float* linear = state + n;
      const double l1 = config.l1(), l2 = config.l2(), p = -static_cast<double>(config.lr_power());
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g[i], a = accum[i], a_new = a + gi * gi;
        const double lin = linear[i] + gi - (std::pow(a_new, p) - std::pow(a, p)) / lr * w[i];
        const double quadratic = std::pow(a_new, p) / lr + 2.0 * l2;
        const double sign = lin > 0 ? 1.0 : (lin < 0 ? -1.0 : 0.0);
        w[i] = std::fabs(lin) > l1 ? static_cast<float>((sign * l1 - lin) / quadratic) : 0.0f;
        linear[i] = static_cast<float>(lin);
        accum[i] = static_cast<float>(a_new);
      }
      return;
    }
  }
}

}  // namespace pstrain::ref
