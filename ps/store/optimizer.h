// Optimizers for sparse rows and dense vectors: SGD, Adagrad, Adam (lazy, per-row state) and
// FTRL-Proximal, configured by OptimizerConfig (proto/pstrain/config.proto).
//
// A "vector" here is either one embedding row (dim floats) or a dense parameter vector (n
// floats). Every vector has its own optimizer state of StateFloats(n) floats laid out as
//
//   state = [slot_0 (n floats), ..., slot_{S-1} (n floats), extra_0, ..., extra_{E-1}]
//
// with S = state_slots() per-element arrays and E = state_extras() per-vector scalars:
//
//   type     slots                        extras   StateFloats(n)   initial values
//   SGD      -                            -        0
//   ADAGRAD  accum                        -        n                accum = initial_accumulator
//   ADAM     m, v                         t        2n + 1           m = v = 0, t = 0
//   FTRL     accum (TF "accum", the n of  -        2n               accum = initial_accumulator,
//            McMahan), linear (the z)                               linear = 0
//
// The update rules (g = gradient, all element-wise):
//   SGD:     w -= lr * g
//   ADAGRAD: accum += g^2;  w -= lr * g / sqrt(accum)              (TF ApplyAdagrad)
//   ADAM:    t += 1;  alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//            m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//            w -= alpha * m / (sqrt(v) + epsilon)                   (TF ApplyAdam, epsilon-hat)
//            t is the number of updates THIS vector has received, so for sparse rows this is lazy
//            Adam with per-row bias correction: a row's first update is always bias-corrected as
//            step 1, however late in training the row first appears. t is stored as a float; it
//            saturates at 2^24, where beta^t has long underflowed, so the update is unaffected.
//   FTRL:    accum_new = accum + g^2                                (TF ApplyFtrl)
//            linear += g - (accum_new^(-lr_power) - accum^(-lr_power)) / lr * w
//            quadratic = accum_new^(-lr_power) / lr + 2 * l2
//            w = |linear| > l1 ? (sign(linear) * l1 - linear) / quadratic : 0
//            accum = accum_new
//
// Each fast kernel here has a plain double-precision twin in ps/store/optimizer_ref.h; tests compare
// the two.
//
// Thread-safety: an Optimizer is immutable after creation; its methods may be called
// concurrently on DIFFERENT vectors. Callers serialize updates of one vector (the stores use
// per-row locks).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"

namespace pstrain {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Validates the config (INVALID_ARGUMENT naming the field, e.g. "adam epsilon must be > 0")
  // and returns the optimizer of config.type().
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config);

  const OptimizerConfig& config() const { return config_; }
  OptimizerType type() const { return config_.type(); }

  // State layout of a vector of n elements (see the table above).
  virtual int state_slots() const = 0;
  virtual int state_extras() const { return 0; }
  int64_t StateFloats(int64_t n) const { return state_slots() * n + state_extras(); }

  // Writes the initial state of a vector of n elements: state[StateFloats(n)].
  virtual void InitState(float* state, int64_t n) const = 0;

  // The learning rate of the update of step `step` (the caller's step, 1 = the job's first):
  // learning_rate x LearningRateFactor(schedule, step) (ps/store/lr_schedule.h); exactly
  // learning_rate (as a double) without a schedule. The Apply functions take it as `lr`.
  double LearningRate(int64_t step) const;

  // One update of one vector: w[n], state[StateFloats(n)], g[n], with learning rate `lr`.
  // Single-threaded.
  void ApplyRow(float* w, float* state, const float* g, int64_t n, double lr) const;

  // Sparse batch: for r in [0, rows), updates the row w[r][0..dim) with state[r] and the
  // gradient g + r * dim (g is rows x dim). Rows must be distinct vectors. Single-threaded.
  void ApplyRows(int64_t rows, float* const* w, float* const* state, const float* g, int dim,
                 double lr) const;

  // One update of a dense vector w[n] with state[StateFloats(n)] and g[n], split over up to
  // `threads` OpenMP threads (ParallelFor; runs inline when called inside a parallel region).
  void ApplyDense(float* w, float* state, const float* g, int64_t n, int threads,
                  double lr) const;

  // Per-update coefficients computed once per vector update.
  struct Step {
    double lr = 0;    // the learning rate of this update (Optimizer::LearningRate)
    float alpha = 0;  // Adam: the bias-corrected learning rate of this update.
  };
  // ApplyDense in parts, for callers that split one update over threads of their own:
  // BeginDense once (it advances the per-vector extras, Adam's t), then UpdateDense on disjoint
  // ranges [begin, end) from any threads. Ranges that start at multiples of kDenseChunk give
  // ApplyDense's result to the bit (each element takes the same vector or tail code).
  static constexpr int64_t kDenseChunk = 16384;
  Step BeginDense(float* state, int64_t n, double lr) const { return Prepare(state, n, lr); }
  void UpdateDense(float* w, float* state, const float* g, int64_t n, int64_t begin, int64_t end,
                   const Step& step) const {
    Update(w, state, g, n, begin, end, step);
  }

 protected:
  explicit Optimizer(const OptimizerConfig& config) : config_(config) {}

  // Called once per vector update before Update(): advances per-vector extras (Adam's t).
  virtual Step Prepare(float* state, int64_t n, double lr) const { return Step{lr, 0}; }
  // Updates elements [begin, end) of a vector of n elements; state slots are arrays of n.
  virtual void Update(float* w, float* state, const float* g, int64_t n, int64_t begin, int64_t end,
                      const Step& step) const = 0;

 private:
  OptimizerConfig config_;
};

}  // namespace pstrain
