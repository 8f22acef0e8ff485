// The one retry policy (common/rpc/retry.h), driven by a fake clock: attempt deadlines, the
// attempt limit, backoff bounds with and without jitter, the budget, non-retryable codes, the
// single-attempt policy of a SaveShard WRITE, and cancellation of the backoff wait.
#include "common/rpc/retry.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// Time moves only when an attempt takes time or the call waits.
class FakeClock : public RetryClock {
 public:
  absl::Time Now() override { return now; }
  bool WaitUntil(absl::Time t) override {
    waits.push_back(t - now);
    now = std::max(now, t);
    return true;
  }
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<absl::Duration> waits;
};

RetryPolicy Policy() {
  RetryPolicy p;
  p.attempt_timeout = absl::Seconds(1);
  p.budget = absl::Seconds(60);
  p.initial_backoff = absl::Milliseconds(100);
  p.max_backoff = absl::Milliseconds(800);
  p.jitter = 0;
  return p;
}

TEST(RetryPolicy, ValidateNamesTheBadField) {
  EXPECT_TRUE(Policy().Validate().ok());
  RetryPolicy p = Policy();
  p.attempt_timeout = absl::ZeroDuration();
  EXPECT_THAT(p.Validate().message(), HasSubstr("attempt_timeout"));
  p = Policy();
  p.budget = -absl::Seconds(1);
  EXPECT_THAT(p.Validate().message(), HasSubstr("budget"));
  p = Policy();
  p.max_backoff = absl::Milliseconds(50);
  EXPECT_THAT(p.Validate().message(), HasSubstr("max_backoff"));
  p = Policy();
  p.jitter = 1.5;
  EXPECT_THAT(p.Validate().message(), HasSubstr("jitter"));
  p = Policy();
  p.max_attempts = -1;
  EXPECT_EQ(p.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RetryPolicy, OnlyUnavailableAndDeadlineExceededAreRetryable) {
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(IsRetryable(absl::StatusCode::kDeadlineExceeded));
  for (absl::StatusCode c :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kCancelled, absl::StatusCode::kAborted, absl::StatusCode::kInternal,
        absl::StatusCode::kNotFound, absl::StatusCode::kResourceExhausted}) {
    SCOPED_TRACE(absl::StatusCodeToString(c));
    EXPECT_FALSE(IsRetryable(c));
    RetrySchedule s(Policy(), absl::UnixEpoch(), 1);
    s.BeginAttempt(absl::UnixEpoch());
    EXPECT_FALSE(s.NextAttempt(c, absl::UnixEpoch()).has_value());
  }
}

TEST(RetrySchedule, AttemptDeadlinesAreCutToTheBudget) {
  RetryPolicy p = Policy();
  p.budget = absl::Milliseconds(2500);
  const absl::Time t0 = absl::UnixEpoch();
  RetrySchedule s(p, t0, 1);
  EXPECT_EQ(s.end(), t0 + absl::Milliseconds(2500));
  EXPECT_EQ(s.BeginAttempt(t0), t0 + absl::Seconds(1));
  EXPECT_EQ(s.BeginAttempt(t0 + absl::Seconds(2)), t0 + absl::Milliseconds(2500));
  EXPECT_EQ(s.attempts(), 2);
}

TEST(RetrySchedule, BackoffDoublesUpToTheMaxWithoutJitter) {
  RetrySchedule s(Policy(), absl::UnixEpoch(), 1);
  const std::vector<int> want_ms = {100, 200, 400, 800, 800, 800};
  absl::Time now = absl::UnixEpoch();
  for (int ms : want_ms) {
    s.BeginAttempt(now);
    const auto next = s.NextAttempt(absl::StatusCode::kUnavailable, now);
    ASSERT_TRUE(next.has_value());
    EXPECT_EQ(*next - now, absl::Milliseconds(ms));
    now = *next;
  }
  EXPECT_EQ(s.BaseBackoff(1), absl::Milliseconds(100));
  EXPECT_EQ(s.BaseBackoff(40), absl::Milliseconds(800));  // no overflow far out
}

TEST(RetrySchedule, JitteredBackoffStaysWithinItsBounds) {
  RetryPolicy p = Policy();
  p.jitter = 0.5;
  p.budget = absl::Hours(10);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    RetrySchedule s(p, absl::UnixEpoch(), seed);
    absl::Time now = absl::UnixEpoch();
    for (int retry = 1; retry <= 8; ++retry) {
      s.BeginAttempt(now);
      const auto next = s.NextAttempt(absl::StatusCode::kDeadlineExceeded, now);
      ASSERT_TRUE(next.has_value());
      const absl::Duration base = s.BaseBackoff(retry);
      EXPECT_GE(*next - now, base / 2) << "retry " << retry << ", seed " << seed;
      EXPECT_LE(*next - now, base) << "retry " << retry << ", seed " << seed;
      now = *next;
    }
  }
  // Different seeds spread the retries of calls that failed together.
  RetrySchedule a(p, absl::UnixEpoch(), 1), b(p, absl::UnixEpoch(), 2);
  a.BeginAttempt(absl::UnixEpoch());
  b.BeginAttempt(absl::UnixEpoch());
  EXPECT_NE(*a.NextAttempt(absl::StatusCode::kUnavailable, absl::UnixEpoch()),
            *b.NextAttempt(absl::StatusCode::kUnavailable, absl::UnixEpoch()));
}

TEST(CallWithRetry, StopsAtMaxAttemptsWithTheLastError) {
  RetryPolicy p = Policy();
  p.max_attempts = 4;
  FakeClock clock;
  int calls = 0, attempts = 0;
  const absl::Status s = CallWithRetry(
      p, 7, &clock,
      [&](absl::Time) {
        ++calls;
        return absl::UnavailableError(absl::StrCat("down ", calls));
      },
      &attempts);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "down 4");
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(attempts, 4);
  EXPECT_THAT(clock.waits, ::testing::ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                                                  absl::Milliseconds(400)));
}

TEST(CallWithRetry, SucceedsAfterRetries) {
  FakeClock clock;
  int calls = 0;
  const absl::Status s = CallWithRetry(Policy(), 7, &clock, [&](absl::Time) {
    return ++calls < 3 ? absl::UnavailableError("restarting") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
}

TEST(CallWithRetry, NonRetryableCodesFailAtOnce) {
  FakeClock clock;
  int calls = 0;
  const absl::Status s = CallWithRetry(Policy(), 7, &clock, [&](absl::Time) {
    ++calls;
    return absl::FailedPreconditionError("no");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(clock.waits.empty());
}

// Every attempt runs into its deadline: the call ends within its budget, each attempt's deadline
// inside it, and no backoff would pass its end.
TEST(CallWithRetry, TheBudgetBoundsTheWholeCall) {
  RetryPolicy p = Policy();
  p.budget = absl::Milliseconds(5300);
  p.jitter = 0.5;
  FakeClock clock;
  const absl::Time start = clock.now;
  std::vector<absl::Time> deadlines;
  int attempts = 0;
  const absl::Status s = CallWithRetry(
      p, 3, &clock,
      [&](absl::Time deadline) {
        deadlines.push_back(deadline);
        clock.now = deadline;  // the attempt runs until its deadline
        return absl::DeadlineExceededError("slow");
      },
      &attempts);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LE(clock.now, start + p.budget);
  EXPECT_GE(attempts, 3);
  EXPECT_EQ(attempts, static_cast<int>(deadlines.size()));
  for (absl::Time d : deadlines) EXPECT_LE(d, start + p.budget);
}

// SaveShard WRITE's policy: one attempt that may take the whole budget; a failure is final.
TEST(CallWithRetry, SingleAttemptTakesTheWholeBudgetOnce) {
  RetryPolicy p = Policy();
  p.budget = absl::Minutes(10);
  const RetryPolicy write = p.SingleAttempt();
  EXPECT_EQ(write.max_attempts, 1);
  EXPECT_EQ(write.attempt_timeout, absl::Minutes(10));
  FakeClock clock;
  const absl::Time start = clock.now;
  int calls = 0;
  absl::Time deadline;
  const absl::Status s = CallWithRetry(write, 1, &clock, [&](absl::Time d) {
    ++calls;
    deadline = d;
    return absl::UnavailableError("connection reset");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(deadline, start + absl::Minutes(10));
}

// The real clock's wait is a condition variable that Cancel() ends at once.
TEST(CancellableClock, CancelEndsTheBackoffWait) {
  RetryPolicy p = Policy();
  p.initial_backoff = absl::Seconds(30);
  p.max_backoff = absl::Seconds(30);
  p.budget = absl::Minutes(5);
  CancellableClock clock;
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(100));
    clock.Cancel();
  });
  const absl::Time start = absl::Now();
  const absl::Status s =
      CallWithRetry(p, 1, &clock, [](absl::Time) { return absl::UnavailableError("down"); });
  cancel.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(s.message(), HasSubstr("down"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(clock.cancelled());
  EXPECT_FALSE(clock.WaitUntil(absl::Now() + absl::Hours(1)));  // later waits end at once too
}

}  // namespace
}  // namespace pstrain
