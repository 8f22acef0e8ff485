// AnswerBudget: one shard-wide budget of bytes for the answers of pulls in flight (issue 26 item
// 7: the message cap bounds one answer, not their sum; eight concurrent 1.4M-id pulls, each
// answered 95 MB, took a shard to 1.55 GB). Every gRPC pull takes its answer's bytes before it
// gathers (Acquire) and gives them back once gRPC has sent the answer and freed it (Release, from
// the call's message holder, ShardServer's PullMessages), so the bytes of answers gathered and
// not yet freed never exceed the budget.
//
// A pull whose bytes do not fit waits, without a thread, in a list (HeldCalls) in arrival order:
// Release admits the waiters from the front while they fit, and stops at the first that does
// not (a large answer is not starved by a stream of small ones). A waiter ends, instead:
//   - at `until` (the caller's: shortly before the call's deadline): DEADLINE_EXCEEDED naming the
//     budget and what is in flight, which the PS client retries like a held pull's expiry;
//   - when its client cancels it (Cancel), or the shard stops (Stop: UNAVAILABLE);
//   - at once when the list is full (kMaxWaiting: UNAVAILABLE, retried), or when its answer alone
//     exceeds the budget (RESOURCE_EXHAUSTED; a shard's budget is at least its message cap, which
//     CheckPull enforces first, so no legal pull meets it).
//
// Memory: one map entry per waiter (at most kMaxWaiting). Thread-safety: every method may be
// called from any thread; Admit and Refuse run outside the lock, on the thread that decided
// (Acquire's caller, Release's, the timer's, Cancel's or Stop's) and must not call back into it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/rpc/held_calls.h"
#include "common/rpc/timer.h"

namespace pstrain {

class AnswerBudget {
 public:
  // The most pulls that wait for the budget at once.
  static constexpr int kMaxWaiting = 4096;

  // A pull that asks for bytes: exactly one of Admit and Refuse is called, once.
  class Waiter : public HeldCall {
   public:
    // Its bytes are taken: gather and answer (and Release them when the answer is sent).
    virtual void Admit() = 0;
    // It ends with `status` without its bytes (nothing to Release).
    virtual void Refuse(absl::Status status) = 0;

   private:
    friend class AnswerBudget;
    int64_t bytes_ = 0;  // under the budget's lock, while it waits
  };

  // `budget` > 0 bytes; `owner` names the shard in messages ("shard 3"). `timer` and `env` must
  // outlive the budget, and the timer must run or drop its pending functions before it is
  // destroyed.
  AnswerBudget(int64_t budget, std::string owner, Timer* timer, Env* env);
  AnswerBudget(const AnswerBudget&) = delete;
  AnswerBudget& operator=(const AnswerBudget&) = delete;

  // Takes `bytes` for `waiter`: at once (Admit on this thread) when they fit and nobody waits;
  // else it waits until Release makes room (Admit on the releasing thread) or `until`.
  void Acquire(Waiter* waiter, int64_t bytes, absl::Time until);
  // Gives back the bytes of an admitted waiter and admits the waiters that now fit.
  void Release(int64_t bytes);
  // The waiter's client cancelled: if it still waits, Refuse(CANCELLED).
  void Cancel(Waiter* waiter);
  // Refuses every waiter UNAVAILABLE, and every later Acquire that does not fit at once.
  void Stop();

  int64_t budget() const { return budget_; }
  // Bytes taken now, the most ever taken at once, and how many Acquires had to wait.
  int64_t in_use() const;
  int64_t peak() const;
  int64_t waited() const;

 private:
  absl::Status TooLarge(int64_t bytes) const;
  absl::Status Expired(int64_t bytes, absl::Duration waited) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t budget_;
  const std::string owner_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waited_ ABSL_GUARDED_BY(mu_) = 0;
  HeldCalls<Waiter> waiting_;  // guarded by mu_ (HeldCalls' contract)
};

}  // namespace pstrain
