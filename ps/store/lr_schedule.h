// Learning-rate schedules (config LearningRateSchedule): the factor the optimizers multiply their
// learning_rate by for the update of step s. A pure function of the step, so a job resumed from a
// checkpoint (which holds the step) continues the schedule exactly. The formulas are in
// proto/pstrain/config.proto; docs/CONFIG.md "Learning-rate schedules" shows examples.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "pstrain/config.pb.h"

namespace pstrain {

// The schedule is validated with the config (common/config.h ValidateConfig: warmup_steps >= 0;
// decay_steps > 0 for a decay; decay_rate in (0, 1]; min_factor in [0, 1]).
// The factor of step `step` (>= 1 for the steps a job trains; 0 and below count as 1). 1 for the
// default schedule. Computed in double.
double LearningRateFactor(const LearningRateSchedule& s, int64_t step);

// Whether the schedule is constant 1 (no warm-up, CONSTANT decay): the optimizers then skip it.
bool IsConstantSchedule(const LearningRateSchedule& s);

}  // namespace pstrain
