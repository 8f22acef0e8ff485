// HeldCalls: a server's list of held calls (long-polls): calls kept, with no thread blocked, until
// their owner can answer them, they expire, their client cancels them, or the server stops. The
// PS shard's two lists use it: ConsistencyTracker's held training pulls and JobCoordinator's
// held watches of the job state (ps/server/).
//
// The list belongs to an owner that decides when a call may be answered, and it is guarded by the
// owner's lock (`mu`, given to the constructor), so that the owner's decision to hold a call and
// its decision to answer the held ones happen under one lock with its own state:
//   - under the owner's lock: CanHold, Hold, TakeIf, TakeAll, size, stopped;
//   - without it (each takes the lock itself): Arm, Cancel, Stop, and the expiries the timer runs.
//
// A call is completed exactly once, by whoever takes it off the list, always outside the lock:
//   - the owner, with what TakeIf / TakeAll return (it answers those calls itself);
//   - Cancel: `end(call, status)` with the caller's status, if the call is still held;
//   - its expiry: `end(call, expired(call, held_for))`, where `expired` runs under the lock (it may
//     read the owner's state to say what the call waited for);
//   - Stop: `end(call, UNAVAILABLE "<owner> is shutting down")` for every call still held.
// Since every removal happens under the lock and by hold id, an expiry or a cancellation that
// comes after the call was completed finds nothing and does nothing; the timer's closure keeps the
// id, never the pointer, so a call may be destroyed once it is completed.
//
// The cap: at most `max_held` calls at once. CanHold is UNAVAILABLE at the cap ("<owner> holds
// <max_held> <noun> already; retry later") and after Stop ("<owner> is shutting down"); the owner
// refuses the call with that status (the client retries later). Stop is final: nothing is held
// after it.
//
// Expiry: Arm(id, when) runs the expiry on `timer` at `when` (the Env's wall clock, as gRPC
// deadlines are). How long a call was held is measured on the Env's monotonic clock.
//
// Memory: one map entry per held call (at most max_held).
// Thread-safety: as above; `end` and `expired` must not call back into the list.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/rpc/timer.h"

namespace pstrain {

// The part of a held call that the list keeps: a call type derives from it. Its fields are read
// and written only by HeldCalls, under the owner's lock.
class HeldCall {
 public:
  virtual ~HeldCall() = default;

 private:
  template <typename Call>
  friend class HeldCalls;
  uint64_t hold_id_ = 0;    // 0 = not held
  absl::Duration since_;  // Env::MonotonicNow() when it was held
};

template <typename Call>
class HeldCalls {
  static_assert(std::is_base_of_v<HeldCall, Call>, "a held call derives from HeldCall");

 public:
  struct Options {
    std::string owner;  // names the server in messages: "shard 3"
    std::string noun;   // what it holds, plural, in the cap's message: "pulls"
    int max_held = 1024;
  };
  // Ends a call that the list took off itself (cancel, expiry, stop). Called outside the lock.
  using EndFn = std::function<void(Call* call, absl::Status status)>;
  // The status an expired call ends with, given how long it was held. Called under the lock.
  using ExpiredFn = std::function<absl::Status(Call* call, absl::Duration held_for)>;

  // `mu` is the owner's lock; `timer` runs the expiries and `env` is the clock. All three must
  // outlive the list, and the timer must run or drop its pending functions before the list is
  // destroyed.
  HeldCalls(Options options, absl::Mutex* mu, Timer* timer, Env* env, EndFn end, ExpiredFn expired)
      : opt_(std::move(options)),
        mu_(mu),
        timer_(timer),
        env_(env),
        end_(std::move(end)),
        expired_(std::move(expired)) {}
  HeldCalls(const HeldCalls&) = delete;
  HeldCalls& operator=(const HeldCalls&) = delete;

  // ---- Under the owner's lock ----
  // OK if a call may be held now; UNAVAILABLE after Stop or at the cap.
  absl::Status CanHold() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) {
    if (stopped_) return absl::UnavailableError(absl::StrCat(opt_.owner, " is shutting down"));
    if (static_cast<int>(held_.size()) >= opt_.max_held) {
      return absl::UnavailableError(absl::StrCat(opt_.owner, " holds ", opt_.max_held, " ",
                                                 opt_.noun, " already; retry later"));
    }
    return absl::OkStatus();
  }
  // Holds `call` (CanHold() must be OK) and returns its hold id, for Arm once the lock is released.
  uint64_t Hold(Call* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) {
    PSTRAIN_CHECK(CanHold().ok() && call->hold_id_ == 0) << "HeldCalls::Hold of " << opt_.noun;
    call->hold_id_ = ++next_id_;
    call->since_ = env_->MonotonicNow();
    held_[call->hold_id_] = call;
    return call->hold_id_;
  }
  // Takes off the list, in the order they were held, the calls for which `take(call)` is true;
  // the owner completes them after releasing the lock.
  template <typename TakeFn>
  void TakeIf(TakeFn&& take) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) {
    for (auto it = held_.begin(); it != held_.end();) {
      if (take(it->second)) {
        it->second->hold_id_ = 0;
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Takes every call off the list, in the order they were held.
  std::vector<Call*> TakeAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) {
    std::vector<Call*> all;
    all.reserve(held_.size());
    TakeIf([&all](Call* call) {
      all.push_back(call);
      return true;
    });
    return all;
  }
  int size() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) { return static_cast<int>(held_.size()); }
  bool stopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) { return stopped_; }

  // ---- Without the owner's lock ----
  // Expires held call `id` at `when` (at once, on the caller, if the timer has stopped).
  void Arm(uint64_t id, absl::Time when) ABSL_LOCKS_EXCLUDED(*mu_) {
    timer_->At(when, [this, id] { Expire(id); });
  }
  // The call's client cancelled it: if it is still held, takes it off and ends it with `status`.
  void Cancel(Call* call, absl::Status status) ABSL_LOCKS_EXCLUDED(*mu_) {
    {
      absl::MutexLock lock(mu_);
      if (call->hold_id_ == 0) return;  // completed already
      held_.erase(call->hold_id_);
      call->hold_id_ = 0;
    }
    end_(call, std::move(status));
  }
  // Shutdown: ends every held call UNAVAILABLE and holds nothing more.
  void Stop() ABSL_LOCKS_EXCLUDED(*mu_) {
    std::vector<Call*> held;
    absl::Status status;
    {
      absl::MutexLock lock(mu_);
      stopped_ = true;
      status = CanHold();
      held = TakeAll();
    }
    for (Call* call : held) end_(call, status);
  }

 private:
  void Expire(uint64_t id) ABSL_LOCKS_EXCLUDED(*mu_) {
    Call* call = nullptr;
    absl::Status status;
    {
      absl::MutexLock lock(mu_);
      auto it = held_.find(id);
      if (it == held_.end()) return;  // answered, cancelled or stopped already
      call = it->second;
      held_.erase(it);
      call->hold_id_ = 0;
      status = expired_(call, env_->MonotonicNow() - call->since_);
    }
    end_(call, std::move(status));
  }

  const Options opt_;
  absl::Mutex* const mu_;
  Timer* const timer_;
  Env* const env_;
  const EndFn end_;
  const ExpiredFn expired_;

  std::map<uint64_t, Call*> held_ ABSL_GUARDED_BY(*mu_);  // by hold id: the order they came
  uint64_t next_id_ ABSL_GUARDED_BY(*mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(*mu_) = false;
};

}  // namespace pstrain
