#include "ps/store/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "ps/store/lr_schedule.h"

// The kernels are plain loops that GCC vectorizes for AVX-512 under -march=native. Their sqrt
// calls only vectorize without errno semantics, hence -fno-math-errno on this file
// (ps/CMakeLists.txt); every sqrt argument here is >= 0 anyway.

namespace pstrain {

double Optimizer::LearningRate(int64_t step) const {
  const double lr = config_.learning_rate();
  if (IsConstantSchedule(config_.schedule())) return lr;
  return lr * LearningRateFactor(config_.schedule(), step);
}

void Optimizer::ApplyRow(float* w, float* state, const float* g, int64_t n, double lr) const {
  Update(w, state, g, n, 0, n, Prepare(state, n, lr));
}

void Optimizer::ApplyRows(int64_t rows, float* const* w, float* const* state, const float* g,
                          int dim, double lr) const {
  for (int64_t r = 0; r < rows; ++r) ApplyRow(w[r], state[r], g + r * dim, dim, lr);
}

void Optimizer::ApplyDense(float* w, float* state, const float* g, int64_t n, int threads,
                           double lr) const {
  const Step step = Prepare(state, n, lr);
  // Chunks of at least 16k floats: below that a thread team costs more than it saves.
  const int64_t kChunk = kDenseChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  ParallelFor(chunks, threads, [&](int, int, int64_t cb, int64_t ce) {
    Update(w, state, g, n, cb * kChunk, std::min(n, ce * kChunk), step);
  });
}

namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& c) : Optimizer(c) {}
  int state_slots() const override { return 0; }
  void InitState(float*, int64_t) const override {}

 protected:
  void Update(float* __restrict w, float*, const float* __restrict g, int64_t, int64_t b, int64_t e,
              const Step& step) const override {
    const float lr = static_cast<float>(step.lr);
#pragma omp simd
    for (int64_t i = b; i < e; ++i) w[i] -= lr * g[i];
  }
};

class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(const OptimizerConfig& c)
      : Optimizer(c), init_(c.initial_accumulator()) {}
  int state_slots() const override { return 1; }
  void InitState(float* state, int64_t n) const override { std::fill(state, state + n, init_); }

 protected:
  void Update(float* __restrict w, float* __restrict accum, const float* __restrict g, int64_t,
              int64_t b, int64_t e, const Step& step) const override {
    const float lr = static_cast<float>(step.lr);
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float a = accum[i] + g[i] * g[i];
      accum[i] = a;
      w[i] -= lr * g[i] / std::sqrt(a);
    }
  }

 private:
  const float init_;
};

// beta^t for the integer step counts t that Adam keeps, as a product of two table entries
// (b^(256 hi) * b^lo) for t < 65536, else exp(t log b). A row update pays a multiply instead of
// an exp; this runs once per row, and rows have only 17 floats.
class BetaPower {
 public:
  explicit BetaPower(double beta) : log_beta_(std::log(beta)) {
    for (int i = 0; i < 256; ++i) {
      lo_[i] = std::pow(beta, i);
      hi_[i] = std::pow(beta, 256.0 * i);
    }
  }
  double operator()(float t) const {
    const auto n = static_cast<uint32_t>(t);
    if (n < 65536) return hi_[n >> 8] * lo_[n & 255];
    return std::exp(t * log_beta_);
  }

 private:
  double log_beta_;
  double lo_[256], hi_[256];
};

class Adam final : public Optimizer {
 public:
  explicit Adam(const OptimizerConfig& c)
      : Optimizer(c),
        b1_(c.beta1()),
        b2_(c.beta2()),
        eps_(c.epsilon()),
        pow1_(c.beta1()),
        pow2_(c.beta2()) {}
  int state_slots() const override { return 2; }
  int state_extras() const override { return 1; }
  void InitState(float* state, int64_t n) const override {
    std::fill(state, state + 2 * n + 1, 0.0f);
  }

 protected:
  Step Prepare(float* state, int64_t n, double lr) const override {
    const float t = state[2 * n] + 1.0f;
    state[2 * n] = t;
    return Step{lr, static_cast<float>(lr * std::sqrt(1.0 - pow2_(t)) / (1.0 - pow1_(t)))};
  }
  void Update(float* __restrict w, float* __restrict state, const float* __restrict g, int64_t n,
              int64_t b, int64_t e, const Step& step) const override {
    float* __restrict m = state;
    float* __restrict v = state + n;
    const float b1 = b1_, c1 = 1.0f - b1_, b2 = b2_, c2 = 1.0f - b2_, eps = eps_;
    const float alpha = step.alpha;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i];
      const float mi = b1 * m[i] + c1 * gi;
      const float vi = b2 * v[i] + c2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      w[i] -= alpha * mi / (std::sqrt(vi) + eps);
    }
  }

 private:
  const float b1_, b2_, eps_;
  const BetaPower pow1_, pow2_;
};

class Ftrl final : public Optimizer {
 public:
  explicit Ftrl(const OptimizerConfig& c)
      : Optimizer(c),
        l1_(c.l1()),
        two_l2_(2.0f * c.l2()),
        power_(-c.lr_power()),
        init_(c.initial_accumulator()) {}
  int state_slots() const override { return 2; }
  void InitState(float* state, int64_t n) const override {
    std::fill(state, state + n, init_);
    std::fill(state + n, state + 2 * n, 0.0f);
  }

 protected:
  void Update(float* __restrict w, float* __restrict state, const float* __restrict g, int64_t n,
              int64_t b, int64_t e, const Step& step) const override {
    const float inv_lr = 1.0f / static_cast<float>(step.lr);
    // As TF does, lr_power = -0.5 (the default) takes sqrt, which vectorizes; pow does not.
    if (power_ == 0.5f) {
      Kernel(w, state, state + n, g, b, e, inv_lr, [](float x) { return std::sqrt(x); });
    } else {
      const float p = power_;
      Kernel(w, state, state + n, g, b, e, inv_lr, [p](float x) { return std::pow(x, p); });
    }
  }

 private:
  template <typename Pow>
  void Kernel(float* __restrict w, float* __restrict accum, float* __restrict linear,
              const float* __restrict g, int64_t b, int64_t e, float inv_lr,
              Pow power_fn) const {
    const float l1 = l1_, two_l2 = two_l2_;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i], a = accum[i], an = a + gi * gi;
      const float pn = power_fn(an);
      const float l = linear[i] + gi - (pn - power_fn(a)) * inv_lr * w[i];
      linear[i] = l;
      const float quadratic = pn * inv_lr + two_l2;
      w[i] = std::fabs(l) > l1 ? (std::copysign(l1, l) - l) / quadratic : 0.0f;
      accum[i] = an;
    }
  }

  const float l1_, two_l2_, power_, init_;
};

absl::Status Invalid(absl::string_view what, double got) {
  return absl::InvalidArgumentError(absl::StrCat("optimizer: ", what, ", got ", got));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& c) {
  const std::string name = OptimizerType_Name(c.type());
  if (!(c.learning_rate() > 0) || !std::isfinite(c.learning_rate())) {
    return Invalid(absl::StrCat(name, " learning_rate must be finite and > 0"), c.learning_rate());
  }
  switch (c.type()) {
    case SGD:
      return std::unique_ptr<Optimizer>(new Sgd(c));
    case ADAGRAD:
      if (!(c.initial_accumulator() > 0)) {
        return Invalid("ADAGRAD initial_accumulator must be > 0", c.initial_accumulator());
      }
      return std::unique_ptr<Optimizer>(new Adagrad(c));
    case ADAM:
      if (!(c.beta1() >= 0 && c.beta1() < 1)) {
        return Invalid("ADAM beta1 must be in [0, 1)", c.beta1());
      }
      if (!(c.beta2() >= 0 && c.beta2() < 1)) {
        return Invalid("ADAM beta2 must be in [0, 1)", c.beta2());
      }
      // epsilon = 0 would make 0/0 of every element whose gradient has always been 0.
      if (!(c.epsilon() > 0)) return Invalid("ADAM epsilon must be > 0", c.epsilon());
      return std::unique_ptr<Optimizer>(new Adam(c));
    case FTRL:
      if (!(c.lr_power() <= 0)) return Invalid("FTRL lr_power must be <= 0", c.lr_power());
      if (!(c.l1() >= 0)) return Invalid("FTRL l1 must be >= 0", c.l1());
      if (!(c.l2() >= 0)) return Invalid("FTRL l2 must be >= 0", c.l2());
      if (!(c.initial_accumulator() > 0)) {
        return Invalid("FTRL initial_accumulator must be > 0", c.initial_accumulator());
      }
      return std::unique_ptr<Optimizer>(new Ftrl(c));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer: unknown type ", static_cast<int>(c.type())));
}

}  // namespace pstrain
