#include "ps/store/dense_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<DenseStore>> DenseStore::Create(Options o) {
  if (o.begin < 0 || o.size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense store: bad slice begin=", o.begin, " size=", o.size));
  }
  if (o.optimizer == nullptr) return absl::InvalidArgumentError("dense store: no optimizer given");
  if (o.threads < 1) o.threads = 1;
  return std::unique_ptr<DenseStore>(new DenseStore(std::move(o)));
}

DenseStore::DenseStore(Options options)
    : opt_(std::move(options)),
      weights_(opt_.size, 0.0f),
      state_(opt_.optimizer->StateFloats(opt_.size)) {
  opt_.optimizer->InitState(state_.data(), opt_.size);
}

int64_t DenseStore::Get(float* out) const {
  absl::ReaderMutexLock lock(&mu_);
  std::memcpy(out, weights_.data(), weights_.size() * sizeof(float));
  return version_;
}

void DenseStore::Set(const float* values) {
  absl::MutexLock lock(&mu_);
  std::memcpy(weights_.data(), values, weights_.size() * sizeof(float));
}

void DenseStore::Apply(const float* grad, int64_t step, int64_t computed_from) {
  absl::MutexLock lock(&mu_);
  double lr = opt_.optimizer->LearningRate(step);
  if (computed_from >= 0) {
    const int64_t tau = std::max<int64_t>(0, version_ - computed_from);
    ++staleness_.updates;
    staleness_.sum += tau;
    staleness_.max = std::max(staleness_.max, tau);
    if (opt_.scale_lr_by_staleness && tau > 1) lr /= static_cast<double>(tau);
  }
  opt_.optimizer->ApplyDense(weights_.data(), state_.data(), grad, opt_.size, opt_.threads, lr);
  last_step_ = std::max(last_step_, step);
  ++version_;
}

void DenseStore::BeginStep(int64_t step) {
  mu_.Lock();
  // The per-vector extras (Adam's t) as they were, for an EndStep that applied nothing.
  const int64_t extras = opt_.optimizer->state_extras();
  split_extras_.assign(state_.end() - extras, state_.end());
  split_ = opt_.optimizer->BeginDense(state_.data(), opt_.size, opt_.optimizer->LearningRate(step));
  split_step_ = step;
}

void DenseStore::CopyRange(int64_t begin, int64_t end, float* out) const {
  std::memcpy(out + begin, weights_.data() + begin, (end - begin) * sizeof(float));
}

void DenseStore::UpdateRange(int64_t begin, int64_t end, const float* grad) {
  opt_.optimizer->UpdateDense(weights_.data(), state_.data(), grad, opt_.size, begin, end, split_);
}

void DenseStore::EndStep(bool applied) {
  if (applied) {
    last_step_ = std::max(last_step_, split_step_);
    ++version_;
  } else {
    std::copy(split_extras_.begin(), split_extras_.end(), state_.end() - split_extras_.size());
  }
  mu_.Unlock();
}

int64_t DenseStore::version() const {
  absl::ReaderMutexLock lock(&mu_);
  return version_;
}

DenseStore::Staleness DenseStore::staleness() const {
  absl::ReaderMutexLock lock(&mu_);
  return staleness_;
}

int64_t DenseStore::last_step() const {
  absl::ReaderMutexLock lock(&mu_);
  return last_step_;
}

DenseSnapshot DenseStore::Snapshot() const {
  DenseSnapshot s;
  s.begin = opt_.begin;
  s.size = opt_.size;
  s.optimizer = opt_.optimizer->type();
  s.state_floats = opt_.optimizer->StateFloats(opt_.size);
  absl::ReaderMutexLock lock(&mu_);
  s.last_step = last_step_;
  s.weights = weights_;
  s.state = state_;
  return s;
}

absl::Status DenseStore::Restore(const DenseSnapshot& s) {
  if (s.begin != opt_.begin || s.size != opt_.size) {
    return absl::FailedPreconditionError(
        absl::StrCat("dense store holds [", opt_.begin, ", ", opt_.begin + opt_.size,
                     "); the snapshot holds [", s.begin, ", ", s.begin + s.size, ")"));
  }
  return RestoreOverlap(s).status();
}

absl::StatusOr<int64_t> DenseStore::RestoreOverlap(const DenseSnapshot& s) {
  const Optimizer& o = *opt_.optimizer;
  if (s.optimizer != o.type() || s.state_floats != o.StateFloats(s.size)) {
    return absl::FailedPreconditionError(
        absl::StrCat("dense store uses ", OptimizerType_Name(o.type()), " state of ",
                     o.StateFloats(s.size), " floats for ", s.size, " weights; the snapshot has ",
                     OptimizerType_Name(s.optimizer), " state of ", s.state_floats, " floats"));
  }
  if (static_cast<int64_t>(s.weights.size()) != s.size ||
      static_cast<int64_t>(s.state.size()) != s.state_floats) {
    return absl::InvalidArgumentError("dense snapshot: weights/state sizes do not match its size");
  }
  const int64_t lo = std::max(opt_.begin, s.begin);
  const int64_t hi = std::min(opt_.begin + opt_.size, s.begin + s.size);
  if (lo >= hi) return 0;
  const int64_t n = hi - lo, dst = lo - opt_.begin, src = lo - s.begin;
  absl::MutexLock lock(&mu_);
  std::memcpy(weights_.data() + dst, s.weights.data() + src, n * sizeof(float));
  for (int k = 0; k < o.state_slots(); ++k) {
    std::memcpy(state_.data() + k * opt_.size + dst, s.state.data() + k * s.size + src,
                n * sizeof(float));
  }
  for (int x = 0; x < o.state_extras(); ++x) {
    state_[o.state_slots() * opt_.size + x] = s.state[o.state_slots() * s.size + x];
  }
  last_step_ = std::max(last_step_, s.last_step);
  return n;
}

}  // namespace pstrain
