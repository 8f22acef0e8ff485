// The one retry policy of every client call of the PS protocol: PsClient's pulls, pushes and
// Info / Stats calls (asynchronous, their backoff on a Timer) and ShardRpc's control calls
// (blocking, their backoff a wait that Cancel() interrupts).
//
// A call is a series of attempts. Each attempt has its own deadline (attempt_timeout, cut to the
// end of the call's budget). A failed attempt is retried when its code is retryable (UNAVAILABLE:
// the shard is unreachable or restarting; DEADLINE_EXCEEDED: the attempt's deadline passed, e.g.
// a held pull whose condition did not come), fewer than max_attempts were made, and the backoff
// ends before the budget does. The backoff before retry k is min(max_backoff,
// initial_backoff x 2^(k-1)), jittered down to a uniform draw in [(1 - jitter) x that, that], so
// that workers retrying together spread out. Other codes (INVALID_ARGUMENT, FAILED_PRECONDITION,
// ...) fail at once: a retry would get the same answer.
//
// A call with special needs takes a policy of its own rather than a special case in the loop:
// SaveShard WRITE writes a whole file and may not be repeated (its snapshot is gone after the
// first attempt), so it is one attempt with the whole budget (SingleAttempt).
//
// Thread-safety: RetryPolicy is a value. A RetrySchedule belongs to one call (not thread-safe;
// the attempts of one call never overlap). CancellableClock is thread-safe.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/random.h"

namespace pstrain {

struct RetryPolicy {
  absl::Duration attempt_timeout = absl::Seconds(10);  // deadline of one attempt, > 0
  absl::Duration budget = absl::Seconds(60);  // the whole call: attempts and backoff, > 0
  int max_attempts = 0;                       // 0 = as many as the budget allows
  absl::Duration initial_backoff = absl::Milliseconds(100);  // before the first retry, > 0
  absl::Duration max_backoff = absl::Seconds(2);             // >= initial_backoff
  double jitter = 0.5;  // in [0, 1]: each backoff is drawn from [(1 - jitter) b, b]

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate() const;
  // This policy with one attempt that may take the whole budget (no retry).
  RetryPolicy SingleAttempt() const;
};

// UNAVAILABLE and DEADLINE_EXCEEDED.
bool IsRetryable(absl::StatusCode code);

// The schedule of one call under a policy: when each attempt must end and whether (and when)
// the next one starts. Times come from the caller, so a test drives it with a fake clock.
class RetrySchedule {
 public:
  // `start` begins the budget; `seed` draws the jitter (calls that start together should pass
  // different seeds).
  RetrySchedule(const RetryPolicy& policy, absl::Time start, uint64_t seed);

  // Counts an attempt starting at `now` and returns its deadline: min(now + attempt_timeout,
  // end()).
  absl::Time BeginAttempt(absl::Time now);
  // The attempt failed with `code` at `now`: when the next attempt should begin, or nullopt when
  // the call fails now (the code is not retryable, max_attempts are used up, or the backoff would
  // reach end()).
  std::optional<absl::Time> NextAttempt(absl::StatusCode code, absl::Time now);

  int attempts() const { return attempts_; }
  absl::Time start() const { return start_; }
  absl::Time end() const { return end_; }
  const RetryPolicy& policy() const { return policy_; }
  // The backoff before retry k >= 1 before jitter: min(max_backoff, initial_backoff x 2^(k-1)).
  absl::Duration BaseBackoff(int retry) const;

 private:
  const RetryPolicy policy_;
  const absl::Time start_, end_;
  int attempts_ = 0;
  Rng rng_;
};

// Time and the wait between the attempts of a blocking call. The real one is CancellableClock;
// tests pass a fake that advances time without waiting.
class RetryClock {
 public:
  virtual ~RetryClock() = default;
  virtual absl::Time Now() = 0;
  // Waits until `t`; false when the wait was interrupted (the call is being cancelled).
  virtual bool WaitUntil(absl::Time t) = 0;
};

// The real clock: `env`'s wall clock (Env::Now(), as gRPC deadlines are); Cancel() interrupts
// every wait, now and later. The wait is a condition variable, not Env::SleepFor, because it must
// be interruptible; it waits the time left until `t` by env's clock. Thread-safe.
class CancellableClock final : public RetryClock {
 public:
  explicit CancellableClock(Env* env = Env::Default()) : env_(env) {}
  absl::Time Now() override { return env_->Now(); }
  bool WaitUntil(absl::Time t) override;
  void Cancel();
  bool cancelled() const;

 private:
  Env* const env_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// A blocking call under `policy`: runs attempt(deadline) until it returns OK or the schedule
// says stop, waiting the backoff on `clock`. Returns the last attempt's status, or CANCELLED when
// the clock's wait was interrupted. *attempts, if not null, gets the number of attempts made.
absl::Status CallWithRetry(const RetryPolicy& policy, uint64_t seed, RetryClock* clock,
                           absl::FunctionRef<absl::Status(absl::Time deadline)> attempt,
                           int* attempts = nullptr);

}  // namespace pstrain
