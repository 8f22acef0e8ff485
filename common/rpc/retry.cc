#include "common/rpc/retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::Status RetryPolicy::Validate() const {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("retry policy: ", what));
  };
  if (attempt_timeout <= absl::ZeroDuration()) {
    return bad(absl::StrCat("attempt_timeout must be > 0, got ",
                            absl::FormatDuration(attempt_timeout)));
  }
  if (budget <= absl::ZeroDuration()) {
    return bad(absl::StrCat("budget must be > 0, got ", absl::FormatDuration(budget)));
  }
  if (max_attempts < 0) return bad(absl::StrCat("max_attempts must be >= 0, got ", max_attempts));
  if (initial_backoff <= absl::ZeroDuration() || max_backoff < initial_backoff) {
    return bad(absl::StrCat("need 0 < initial_backoff (", absl::FormatDuration(initial_backoff),
                            ") <= max_backoff (", absl::FormatDuration(max_backoff), ")"));
  }
  if (!(jitter >= 0 && jitter <= 1)) {
    return bad(absl::StrCat("jitter must be in [0, 1], got ", jitter));
  }
  return absl::OkStatus();
}

RetryPolicy RetryPolicy::SingleAttempt() const {
  RetryPolicy p = *this;
  p.attempt_timeout = budget;
  p.max_attempts = 1;
  return p;
}

bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

RetrySchedule::RetrySchedule(const RetryPolicy& policy, absl::Time start, uint64_t seed)
    : policy_(policy), start_(start), end_(start + policy.budget), rng_(seed) {}

absl::Time RetrySchedule::BeginAttempt(absl::Time now) {
  ++attempts_;
  return std::min(now + policy_.attempt_timeout, end_);
}

absl::Duration RetrySchedule::BaseBackoff(int retry) const {
  const int shift = std::min(std::max(retry, 1) - 1, 30);
  // Doubling in Duration arithmetic saturates; the min keeps it bounded either way.
  return std::min(policy_.max_backoff, policy_.initial_backoff * (int64_t{1} << shift));
}

std::optional<absl::Time> RetrySchedule::NextAttempt(absl::StatusCode code, absl::Time now) {
  if (!IsRetryable(code)) return std::nullopt;
  if (policy_.max_attempts > 0 && attempts_ >= policy_.max_attempts) return std::nullopt;
  const absl::Duration base = BaseBackoff(attempts_);
  const absl::Duration backoff =
      base * (1.0 - policy_.jitter + policy_.jitter * rng_.UniformDouble());
  if (now + backoff >= end_) return std::nullopt;
  return now + backoff;
}

bool CancellableClock::WaitUntil(absl::Time t) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), t - env_->Now());
  return !cancelled_;
}

void CancellableClock::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool CancellableClock::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

absl::Status CallWithRetry(const RetryPolicy& policy, uint64_t seed, RetryClock* clock,
                           absl::FunctionRef<absl::Status(absl::Time deadline)> attempt,
                           int* attempts) {
  RetrySchedule schedule(policy, clock->Now(), seed);
  absl::Status status;
  while (true) {
    status = attempt(schedule.BeginAttempt(clock->Now()));
    if (status.ok()) break;
    const std::optional<absl::Time> next = schedule.NextAttempt(status.code(), clock->Now());
    if (!next) break;
    if (!clock->WaitUntil(*next)) {
      status = absl::CancelledError(
          absl::StrCat("cancelled while waiting to retry after: ", status.ToString()));
      break;
    }
  }
  if (attempts != nullptr) *attempts = schedule.attempts();
  return status;
}

}  // namespace pstrain
