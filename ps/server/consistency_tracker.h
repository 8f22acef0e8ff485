// ConsistencyTracker: a shard's BOUNDED / SYNC bookkeeping (docs/PS.md "Consistency").
//
// It tracks, per worker in [0, num_workers), the last step it pushed to this shard and whether it
// has finished (a push with worker_done). A pull carries the step it is for (0 = not a training
// pull: answered at once).
//   ASYNC:   pushes are applied as they come, pulls answered at once (the steps are still noted:
//            Info().step is the largest step pushed).
//   BOUNDED: pushes are applied as they come; the pull of step t is held until every active
//            (not finished) worker has pushed step t - 1 - staleness (stale-synchronous parallel).
//   SYNC:    the pushes of step t are kept until every active worker has pushed step t, then the
//            mean of their gradients is applied once through the Shard (rows summed by id,
//            missing rows count 0, divided by the number of pushes, summed in worker order); the
//            pull of step t is held until step t - 1 is applied. Pushes are answered as soon as
//            they are kept, never held.
// A held pull is a HeldPull (the gRPC layer's reactor) kept in a list (common/rpc/held_calls.h),
// no thread blocked; the push or worker_done that satisfies it answers it. Exactly one of that
// push, SetLost, the pull's cancellation (Cancel), its expiry and StopHolding takes it off the list
// and finishes it. Shortly before its
// deadline a held pull is failed DEADLINE_EXCEEDED with a message naming the step and the workers
// it waits for, so that the client's error says why. A worker must push its steps 1, 2, ... in
// order (PsClient does), to every shard in BOUNDED and SYNC modes.
//
// Memory: two small vectors of num_workers; with SYNC, the kept pushes of the steps not applied
// yet (at most a step or two of every worker's gradients for this shard: a push more than
// kMaxStepsAhead steps ahead is refused); the held pulls' list (at most kMaxHeld).
//
// Thread-safety: every method may be called concurrently; one lock (mu_) guards the bookkeeping
// and the list. HeldPull callbacks and the Shard's optimizer work run outside it; a SYNC step's
// mean is applied by one thread at a time, in step order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "common/rpc/held_calls.h"
#include "common/rpc/timer.h"
#include "ps/server/shard.h"
#include "pstrain/config.pb.h"
#include "pstrain/ps_service.pb.h"

namespace pstrain {

class ConsistencyTracker {
 public:
  struct Options {
    int shard = 0;  // for messages
    Consistency consistency = ASYNC;
    int num_workers = 1;  // N >= 1: the workers BOUNDED / SYNC wait for, ids [0, N)
    int staleness = 0;    // BOUNDED: s >= 0
    Env* env = Env::Default();  // the clocks; must outlive the tracker
  };

  // A training pull held until it may be answered. The gRPC layer implements it (a reactor);
  // exactly one of Answer and Fail is called, once, never under the tracker's lock.
  class HeldPull : public HeldCall {
   public:
    virtual int64_t step() const = 0;
    virtual int32_t worker_id() const = 0;
    // The pull may be answered now, with this staleness (gather the rows and finish).
    virtual void Answer(int64_t staleness) = 0;
    // The pull ends with `status` (cancelled, expired, or the shard shuts down).
    virtual void Fail(absl::Status status) = 0;
  };

  // `shard` applies SYNC's mean updates; `timer` runs the expiries of held pulls. Both must
  // outlive the tracker, and the timer must run or drop its pending functions before the tracker
  // is destroyed.
  ConsistencyTracker(Options options, Shard* shard, Timer* timer);
  ConsistencyTracker(const ConsistencyTracker&) = delete;
  ConsistencyTracker& operator=(const ConsistencyTracker&) = delete;

  Consistency consistency() const { return opt_.consistency; }
  bool Tracked(int32_t worker_id) const { return worker_id >= 0 && worker_id < opt_.num_workers; }
  // INVALID_ARGUMENT naming `what` ("push", "pull") and the valid range for a worker id outside
  // [0, num_workers), in every mode: the workers' clients refuse to connect with another id
  // (ShardRouter), so a call with one is not from the job (ASYNC took -1 and 2^31 - 1).
  absl::Status CheckWorker(int32_t worker_id, const char* what = "push") const;
  // How many steps a pull of `step` is ahead of the slowest active worker (PullResponse.staleness).
  int64_t Staleness(int64_t step) const;
  // The steps a worker's request may name, so that no request can make the shard wait for, or
  // count up to, a step no worker will reach. BOUNDED / SYNC: a training pull or a push of a
  // tracked worker at most kMaxStepsAhead past that worker's last push here (its pushes come in
  // step order); ASYNC: a push or a training pull at most kMaxAsyncStepsAhead past the largest
  // step pushed (a shard that restarted fresh still accepts the job's steps; a pull at 2^63 - 1
  // was taken). INVALID_ARGUMENT naming both steps, or a negative step; a training pull (step >
  // 0) also checks its worker id (CheckWorker).
  static constexpr int64_t kMaxStepsAhead = 1000;
  static constexpr int64_t kMaxAsyncStepsAhead = int64_t{1} << 32;
  absl::Status CheckPullStep(int32_t worker_id, int64_t step) const;
  absl::Status CheckPushStep(int32_t worker_id, int64_t step) const;
  // Shard 0: workers are lost (their lease expired; `detail` names them) or none any more ("").
  // While some are lost, a BOUNDED / SYNC pull that cannot be answered fails FAILED_PRECONDITION
  // with `detail` (held ones at once) instead of waiting for its deadline.
  void SetLost(const std::string& detail);

  // ---- Pushes ----
  // An ASYNC / BOUNDED push of `step` was applied: notes the worker's step and (BOUNDED) answers
  // the pulls that may go now.
  void NoteApplied(int32_t worker_id, int64_t step);
  // SYNC: keeps a push for its step's mean; *duplicate (nothing kept) if the worker had pushed
  // that step. FAILED_PRECONDITION for a push after worker_done or of a step already applied.
  // Call AdvanceSync() afterwards (outside the pushing worker's lock).
  absl::Status KeepSyncPush(int32_t worker_id, int64_t step, absl::Span<const int64_t> ids,
                            absl::Span<const float> grads, absl::Span<const float> dense_grad,
                            bool* duplicate);
  // SYNC: applies every complete step in order, then answers the pulls that may be answered.
  void AdvanceSync();
  // A worker finished (worker_done): it is not waited for any more.
  void MarkDone(int32_t worker_id);

  // ---- Held pulls (BOUNDED / SYNC training pulls over gRPC) ----
  // The most pulls held at once (more are refused UNAVAILABLE), and the longest one is held
  // whatever the client's deadline.
  static constexpr int kMaxHeld = 4096;
  static constexpr absl::Duration kMaxHold = absl::Seconds(60);
  // Answers `pull` now if it may be, else holds it and arms its expiry shortly before `deadline`
  // (1/10 of the time left, at most 500 ms, earlier), at most kMaxHold from now. Fails it
  // UNAVAILABLE after StopHolding or beyond kMaxHeld.
  void HoldOrAnswer(HeldPull* pull, absl::Time deadline);
  // The pull's call was cancelled: if it is still held, takes it off the list and fails it.
  void Cancel(HeldPull* pull);
  // Shutdown: fails every held pull UNAVAILABLE and holds nothing more.
  void StopHolding();
  int held_pulls() const;

  // ---- The bookkeeping ----
  // SYNC: the last step whose mean update has been applied (0 before the first).
  int64_t applied_step() const;
  // SYNC's applied step, else the largest step pushed (InfoResponse.step).
  int64_t step() const;
  // Every worker as having pushed `step` (and SYNC as having applied it): after a restore from a
  // checkpoint of other workers or shards.
  void ResumeSteps(int64_t step);
  // The whole bookkeeping, for checkpoints of a job that resumes with the same workers and
  // shards (Restore: INVALID_ARGUMENT for another worker count, or a corrupt kept push). A
  // restored state in which every worker had finished (a job's last checkpoint) makes them all
  // active again: the job that restores it trains a new pass.
  ConsistencyState Save() const;
  absl::Status Restore(const ConsistencyState& state);

 private:
  struct SyncPush {  // SYNC: one worker's gradients for a step not applied yet
    std::vector<int64_t> ids;
    std::vector<float> row_grads, dense_grad;
  };

  // Smallest step pushed by an active worker; INT64_MAX when every worker has finished.
  int64_t MinActivePushedLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool PullReadyLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t StalenessLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why a pull of `step` is still held (for its DEADLINE_EXCEEDED message).
  std::string WaitingForLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Answers the held pulls that may be answered now.
  void ReleaseReady();
  void ApplyMean(int64_t step, const std::map<int, SyncPush>& pushes);

  const Options opt_;
  Shard* const shard_;

  mutable absl::Mutex mu_;
  std::vector<int64_t> pushed_ ABSL_GUARDED_BY(mu_);  // per worker: last step pushed here
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);       // per worker: sent worker_done
  int64_t applied_ ABSL_GUARDED_BY(mu_) = 0;          // SYNC: last step applied
  bool applying_ ABSL_GUARDED_BY(mu_) = false;        // SYNC: a thread is applying a step
  // SYNC: step -> worker -> its push of that step.
  std::map<int64_t, std::map<int, SyncPush>> sync_steps_ ABSL_GUARDED_BY(mu_);
  HeldCalls<HeldPull> held_;              // guarded by mu_
  std::string lost_ ABSL_GUARDED_BY(mu_);  // SetLost's detail; "" = no worker lost
};

}  // namespace pstrain
