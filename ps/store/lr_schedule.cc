#include "ps/store/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace pstrain {

bool IsConstantSchedule(const LearningRateSchedule& s) {
  return s.warmup_steps() == 0 && s.decay() == LearningRateSchedule::CONSTANT;
}

double LearningRateFactor(const LearningRateSchedule& s, int64_t step) {
  step = std::max<int64_t>(step, 1);
  if (step < s.warmup_steps()) return static_cast<double>(step) / s.warmup_steps();
  const double t = static_cast<double>(step - s.warmup_steps());
  const double d = static_cast<double>(s.decay_steps());
  switch (s.decay()) {
    case LearningRateSchedule::CONSTANT:
      return 1.0;
    case LearningRateSchedule::STEP:
      return std::pow(s.decay_rate(), std::floor(t / d));
    case LearningRateSchedule::EXPONENTIAL:
      return std::pow(s.decay_rate(), t / d);
    case LearningRateSchedule::COSINE: {
      const double progress = std::min(t, d) / d;
      return s.min_factor() + (1 - s.min_factor()) * 0.5 * (1 + std::cos(M_PI * progress));
    }
  }
  return 1.0;
}

}  // namespace pstrain
