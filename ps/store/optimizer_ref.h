// Reference twins of the optimizer kernels in ps/store/optimizer.h (the FBGEMM RefImplementations
// habit): written straight from the math, one element at a time, in double precision, with no
// attention to speed. They share the fast kernels' state layout (see ps/store/optimizer.h), so a test
// can run both on copies of the same row and compare. Not for production use.
#pragma once

#include <cstdint>

#include "pstrain/config.pb.h"

namespace pstrain::ref {

// StateFloats(n) of config.type(): SGD 0, ADAGRAD n, ADAM 2n + 1, FTRL 2n.
int64_t StateFloats(const OptimizerConfig& config, int64_t n);

// The initial state of a vector of n elements.
void InitState(const OptimizerConfig& config, float* state, int64_t n);

// One update of w[n] with state[StateFloats(n)] and gradient g[n], the update of step `step`
// (its learning rate follows config.schedule()). The config is assumed valid.
void ApplyRow(const OptimizerConfig& config, float* w, float* state, const float* g, int64_t n,
              int64_t step);

}  // namespace pstrain::ref
