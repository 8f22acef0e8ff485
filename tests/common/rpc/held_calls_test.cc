// The list of held calls (common/rpc/held_calls.h): the cap, expiry on a fake clock, cancel,
// stop, and that every call is completed exactly once whoever races to complete it.
#include "common/rpc/held_calls.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/rpc/timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_env.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

struct FakeCall : HeldCall {
  std::atomic<int> ends{0};
  absl::Status status = absl::UnknownError("not ended");
  absl::Notification ended;
};

// Completes a call the way a server's reactor would: once (counted, so that a second completion
// shows).
void Complete(FakeCall* call, absl::Status status) {
  if (call->ends.fetch_add(1) == 0) {
    call->status = std::move(status);
    call->ended.Notify();
  }
}

// An owner of a list: its lock guards the list. The timer is declared last, so that it is
// destroyed first and runs its pending expiries while the list still exists.
struct Owner {
  explicit Owner(Env* env, int max_held = 1024)
      : list({"server 7", "calls", max_held}, &mu, &timer, env, &Complete,
             [this](FakeCall*, absl::Duration held_for) {
               held_for_seen = held_for;
               return absl::DeadlineExceededError("expired");
             }),
        timer(env) {}

  // Holds `call` as an owner does: under its lock, if the list may hold it.
  absl::Status Hold(FakeCall* call, uint64_t* id) {
    absl::MutexLock lock(&mu);
    absl::Status can = list.CanHold();
    if (can.ok()) *id = list.Hold(call);
    return can;
  }
  int size() {
    absl::MutexLock lock(&mu);
    return list.size();
  }

  absl::Mutex mu;
  absl::Duration held_for_seen = absl::ZeroDuration();  // guarded by mu (set by `expired`)
  HeldCalls<FakeCall> list;
  Timer timer;
};

TEST(HeldCalls, RefusesBeyondTheCapAndHoldsAgainOnceOneIsTaken) {
  FakeEnv env;
  Owner owner(&env, /*max_held=*/2);
  FakeCall a, b, c;
  uint64_t id = 0;
  ASSERT_TRUE(owner.Hold(&a, &id).ok());
  ASSERT_TRUE(owner.Hold(&b, &id).ok());
  const absl::Status refused = owner.Hold(&c, &id);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.message(), "server 7 holds 2 calls already; retry later");
  EXPECT_EQ(owner.size(), 2);
  EXPECT_EQ(c.ends, 0);  // a refused call is the owner's to complete

  std::vector<FakeCall*> taken;
  {
    absl::MutexLock lock(&owner.mu);
    owner.list.TakeIf([&](FakeCall* call) {
      if (call != &a) return false;
      taken.push_back(call);
      return true;
    });
  }
  EXPECT_EQ(taken, std::vector<FakeCall*>{&a});
  EXPECT_TRUE(owner.Hold(&c, &id).ok());
  EXPECT_EQ(owner.size(), 2);
  EXPECT_EQ(a.ends, 0);  // taken, not ended: the owner answers it
}

TEST(HeldCalls, ACallExpiresAtItsTimeOnTheFakeClock) {
  FakeEnv env;
  Owner owner(&env);
  FakeCall call;
  uint64_t id = 0;
  ASSERT_TRUE(owner.Hold(&call, &id).ok());
  const absl::Time start = env.Now();
  owner.list.Arm(id, start + absl::Seconds(10));

  RunTimerUntil(&env, &owner.timer, start + absl::Seconds(9));
  EXPECT_FALSE(call.ended.HasBeenNotified());
  EXPECT_EQ(owner.size(), 1);

  RunTimerUntil(&env, &owner.timer, start + absl::Seconds(10));
  ASSERT_TRUE(call.ended.HasBeenNotified());
  EXPECT_EQ(call.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(call.ends, 1);
  EXPECT_EQ(owner.size(), 0);
  absl::MutexLock lock(&owner.mu);
  EXPECT_EQ(owner.held_for_seen, absl::Seconds(10));  // measured on the fake monotonic clock
}

TEST(HeldCalls, CancelEndsAHeldCallOnceAndItsExpiryFindsNothing) {
  FakeEnv env;
  Owner owner(&env);
  FakeCall call, other;
  uint64_t id = 0, other_id = 0;
  ASSERT_TRUE(owner.Hold(&call, &id).ok());
  ASSERT_TRUE(owner.Hold(&other, &other_id).ok());
  EXPECT_NE(id, other_id);
  owner.list.Arm(id, env.Now() + absl::Seconds(1));

  owner.list.Cancel(&call, absl::CancelledError("call cancelled"));
  ASSERT_TRUE(call.ended.HasBeenNotified());
  EXPECT_EQ(call.status.code(), absl::StatusCode::kCancelled);
  owner.list.Cancel(&call, absl::CancelledError("again"));  // not held any more: nothing
  RunTimerUntil(&env, &owner.timer, env.Now() + absl::Seconds(2));
  EXPECT_EQ(call.ends, 1);
  EXPECT_EQ(call.status.message(), "call cancelled");
  EXPECT_EQ(owner.size(), 1);
  EXPECT_EQ(other.ends, 0);
}

TEST(HeldCalls, StopEndsEveryHeldCallAndHoldsNothingMore) {
  FakeEnv env;
  Owner owner(&env);
  FakeCall a, b, late;
  uint64_t id_a = 0, id_b = 0, id = 0;
  ASSERT_TRUE(owner.Hold(&a, &id_a).ok());
  ASSERT_TRUE(owner.Hold(&b, &id_b).ok());
  owner.list.Arm(id_a, env.Now() + absl::Seconds(1));
  owner.list.Stop();
  for (FakeCall* call : {&a, &b}) {
    ASSERT_TRUE(call->ended.HasBeenNotified());
    EXPECT_EQ(call->status.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(call->status.message(), "server 7 is shutting down");
  }
  const absl::Status refused = owner.Hold(&late, &id);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("shutting down"));
  {
    absl::MutexLock lock(&owner.mu);
    EXPECT_TRUE(owner.list.stopped());
  }
  RunTimerUntil(&env, &owner.timer, env.Now() + absl::Seconds(2));  // a's expiry: nothing
  owner.list.Cancel(&b, absl::CancelledError(""));                 // nothing either
  EXPECT_EQ(a.ends, 1);
  EXPECT_EQ(b.ends, 1);
  EXPECT_EQ(owner.size(), 0);
}

TEST(HeldCalls, EveryCallIsCompletedExactlyOnceUnderRacingCompletions) {
  // The owner's answer, the client's cancel, the expiry and the shutdown race for every call;
  // each call must end exactly once. Real clock: the expiries are due at once.
  constexpr int kRounds = 20;
  constexpr int kCalls = 200;
  for (int round = 0; round < kRounds; ++round) {
    auto owner = std::make_unique<Owner>(Env::Default());
    std::vector<std::unique_ptr<FakeCall>> calls;
    std::vector<uint64_t> ids(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      calls.push_back(std::make_unique<FakeCall>());
      ASSERT_TRUE(owner->Hold(calls.back().get(), &ids[i]).ok());
    }
    absl::Notification go;
    std::vector<std::thread> threads;
    threads.emplace_back([&] {  // the owner answers every other call, then the rest
      go.WaitForNotification();
      for (int pass = 0; pass < 2; ++pass) {
        std::vector<FakeCall*> taken;
        {
          absl::MutexLock lock(&owner->mu);
          int n = 0;
          owner->list.TakeIf([&](FakeCall* call) {
            const bool take = pass == 1 || n++ % 2 == 0;
            if (take) taken.push_back(call);
            return take;
          });
        }
        for (FakeCall* call : taken) Complete(call, absl::OkStatus());
      }
    });
    threads.emplace_back([&] {  // clients cancel every call
      go.WaitForNotification();
      for (auto& call : calls) owner->list.Cancel(call.get(), absl::CancelledError(""));
    });
    threads.emplace_back([&] {  // every call expires now
      go.WaitForNotification();
      for (uint64_t id : ids) owner->list.Arm(id, absl::InfinitePast());
    });
    threads.emplace_back([&] {  // and the server stops
      go.WaitForNotification();
      owner->list.Stop();
    });
    go.Notify();
    for (std::thread& t : threads) t.join();
    for (auto& call : calls) {
      ASSERT_TRUE(call->ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
    }
    EXPECT_EQ(owner->size(), 0);
    owner.reset();  // joins the timer: every expiry has run (and found nothing to end again)
    for (auto& call : calls) EXPECT_EQ(call->ends, 1);
  }
}

}  // namespace
}  // namespace pstrain
