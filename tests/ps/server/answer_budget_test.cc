// AnswerBudget (ps/server/answer_budget.h): the bytes taken never exceed the budget; waiters are
// admitted in arrival order as bytes come back, none passing the first that does not fit; a
// waiter ends at its time naming the budget, when cancelled, at the list's cap or at Stop; an
// answer larger than the budget is refused at once.
#include "ps/server/answer_budget.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_env.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// Records what happened to it.
struct Recorder final : AnswerBudget::Waiter {
  explicit Recorder(std::vector<std::string>* log, std::string name)
      : log(log), name(std::move(name)) {}
  void Admit() override {
    admitted = true;
    log->push_back(name);
  }
  void Refuse(absl::Status s) override {
    status = std::move(s);
    log->push_back(absl::StrCat(name, ":", absl::StatusCodeToString(status.code())));
  }
  std::vector<std::string>* log;
  std::string name;
  bool admitted = false;
  absl::Status status;
};

// The timer runs (or finds nothing for) its pending expiries before the budget goes.
struct Fixture {
  ~Fixture() { timer_owner.reset(); }
  FakeEnv env;
  std::unique_ptr<Timer> timer_owner = std::make_unique<Timer>(&env);
  Timer& timer = *timer_owner;
  AnswerBudget budget{100, "shard 2", timer_owner.get(), &env};
  std::vector<std::string> log;
  absl::Time Later() { return env.Now() + absl::Seconds(30); }
};

TEST(AnswerBudget, AdmitsInArrivalOrderAsBytesComeBack) {
  Fixture f;
  Recorder a(&f.log, "a"), b(&f.log, "b"), c(&f.log, "c"), d(&f.log, "d");
  f.budget.Acquire(&a, 60, f.Later());
  EXPECT_TRUE(a.admitted);  // at once, on this thread
  f.budget.Acquire(&b, 60, f.Later());
  f.budget.Acquire(&c, 30, f.Later());  // would fit, but b came first
  EXPECT_FALSE(b.admitted);
  EXPECT_FALSE(c.admitted);
  EXPECT_EQ(f.budget.in_use(), 60);
  EXPECT_EQ(f.budget.waited(), 2);
  f.budget.Release(60);  // a's answer was sent: b (60) and c (30) fit together
  EXPECT_EQ(f.log, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(f.budget.in_use(), 90);
  f.budget.Acquire(&d, 20, f.Later());  // 110 > 100: waits
  EXPECT_FALSE(d.admitted);
  f.budget.Release(60);
  EXPECT_TRUE(d.admitted);
  f.budget.Release(30);
  f.budget.Release(20);
  EXPECT_EQ(f.budget.in_use(), 0);
  EXPECT_LE(f.budget.peak(), f.budget.budget());
  EXPECT_EQ(f.budget.peak(), 90);
}

TEST(AnswerBudget, WaitersEndAtTheirTimeWhenCancelledAndAtStop) {
  Fixture f;
  Recorder big(&f.log, "big"), late(&f.log, "late"), gone(&f.log, "gone"), left(&f.log, "left");
  // Alone larger than the budget: refused at once, naming it.
  f.budget.Acquire(&big, 101, f.Later());
  EXPECT_EQ(big.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status.message(), HasSubstr("shard 2: a pull answering 101 bytes exceeds"));
  EXPECT_THAT(big.status.message(), HasSubstr("cluster.answer_budget_mb"));

  Recorder holder(&f.log, "holder");
  f.budget.Acquire(&holder, 100, f.Later());
  ASSERT_TRUE(holder.admitted);
  const absl::Time soon = f.env.Now() + absl::Seconds(2);
  f.budget.Acquire(&late, 10, soon);
  f.budget.Acquire(&gone, 10, f.Later());
  f.budget.Acquire(&left, 10, f.Later());
  RunTimerUntil(&f.env, &f.timer, soon);
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.status.message(),
              HasSubstr("shard 2: a pull answering 10 bytes waited 2.0 s for the shard's answer "
                        "budget (100 bytes, cluster.answer_budget_mb; 100 in flight"));
  f.budget.Cancel(&gone);
  EXPECT_EQ(gone.status.code(), absl::StatusCode::kCancelled);
  f.budget.Cancel(&gone);  // again: nothing
  f.budget.Stop();
  EXPECT_EQ(left.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.log, (std::vector<std::string>{"big:RESOURCE_EXHAUSTED", "holder",
                                             "late:DEADLINE_EXCEEDED", "gone:CANCELLED",
                                             "left:UNAVAILABLE"}));
  // Nothing of theirs was taken; the admitted one gives its bytes back.
  EXPECT_EQ(f.budget.in_use(), 100);
  f.budget.Release(100);
  EXPECT_EQ(f.budget.in_use(), 0);
  // After Stop, what fits is still answered (calls in progress finish); nothing waits.
  Recorder after(&f.log, "after"), blocked(&f.log, "blocked");
  f.budget.Acquire(&after, 100, f.Later());
  EXPECT_TRUE(after.admitted);
  f.budget.Acquire(&blocked, 1, f.Later());
  EXPECT_EQ(blocked.status.code(), absl::StatusCode::kUnavailable);
}

TEST(AnswerBudget, TheWaitingListIsBounded) {
  Fixture f;
  Recorder holder(&f.log, "holder");
  f.budget.Acquire(&holder, 100, f.Later());
  std::vector<std::unique_ptr<Recorder>> waiters;
  for (int i = 0; i <= AnswerBudget::kMaxWaiting; ++i) {
    waiters.push_back(std::make_unique<Recorder>(&f.log, "w"));
    f.budget.Acquire(waiters.back().get(), 1, f.Later());
  }
  EXPECT_EQ(waiters.back()->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(waiters.back()->status.message(), HasSubstr("retry later"));
  f.budget.Stop();  // ends the others before they go
}

}  // namespace
}  // namespace pstrain
