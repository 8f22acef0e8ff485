// JobCoordinator: the job's coordination, kept by shard 0 (docs/PS.md "End of job",
// docs/CHECKPOINT.md "PS mode"). Every shard has one (its Info reports it, and restored_from is
// per shard), but only shard 0's is used by the workers: ShardServer refuses Coordinate elsewhere.
//   - Reports: each worker's latest report per JobPhase (TRAINING_DONE, FINISH_SEEN).
//   - The end of the job (job_finished).
//   - Checkpoint rounds: workers request a round (one open for arrivals at a time; later requests
//     join it), arrive in it with their WorkerState, the chief collects the states (a worker that
//     reported TRAINING_DONE stands in with its final state), releases the workers after every
//     shard's COPY, and completes the round with its directory or error.
//   - restored_from: the checkpoint this shard restored.
//   - Leases (liveness): every call that names a worker renews that worker's lease (Heard); a
//     worker not heard of for `lease` that has not reported TRAINING_DONE is lost
//     (JobState.lost_workers), which wakes every long-poll, so the chief learns of it at once: it
//     aborts an open round and ends the job naming the worker (or the launcher restarts it). A
//     lost worker that calls again is no longer lost. Only workers that called once hold a lease
//     (one timer entry per worker at a time).
// Every request is checked against this state before anything changes: worker ids in
// [0, num_workers), rounds that are open (ARRIVE, COLLECT, RELEASE) or were opened (COMPLETE),
// known phases; a bad one is INVALID_ARGUMENT or FAILED_PRECONDITION naming the value.
// All of it is the job state (JobState in proto/pstrain/ps_service.proto), whose `version` grows
// by one with every change. Waiting on it is a long-poll: Hold keeps a Watch (the gRPC layer's
// reactor of a held Info or Coordinate call) until the version differs from the one the caller
// saw or its time is up, then wakes it; the caller then answers with the state as it is. No
// thread waits. The held watches are a HeldCalls list (common/rpc/held_calls.h): exactly one of
// a change, the hold's expiry, Cancel and StopHolding takes a watch off it and wakes it.
//
// Memory: the reports (one per worker and phase: bounded by num_workers x 2), the open round's
// arrived worker states (one per worker, each the worker's pipeline position: up to megabytes,
// each capped by the server's message size), the held watches (at most kMaxHeld), a lease per
// worker.
//
// Thread-safety: every method may be called concurrently; one lock (mu_) guards all of it. Watch
// callbacks run outside the lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/rpc/held_calls.h"
#include "common/rpc/timer.h"
#include "pstrain/ps_service.pb.h"

namespace pstrain {

class JobCoordinator {
 public:
  // A call held until the job state changes (a long-poll). The gRPC layer implements it; Wake is
  // called once, never under the coordinator's lock.
  class Watch : public HeldCall {
   public:
    // OK: the state changed or the hold expired: answer with the current state. Otherwise the
    // call ends with `status` (UNAVAILABLE: the shard shuts down, or holds too many calls).
    virtual void Wake(absl::Status status) = 0;
  };
  // The most calls held at once; more are refused UNAVAILABLE (the client retries later).
  static constexpr int kMaxHeld = 1024;
  // Once any worker has called, a worker that has not called within this (plus the lease) is
  // lost too: it could not start, or was refused.
  static constexpr absl::Duration kConnectGrace = absl::Seconds(120);

  // `shard` names this shard in messages; workers have ids [0, num_workers); a worker not heard
  // of for `lease` is lost. `timer` runs the expiries of held watches and leases; it must
  // outlive the coordinator and run or drop its pending functions before it is destroyed. `env`
  // is the clock (its wall clock, the timer's); it must outlive the coordinator.
  JobCoordinator(int shard, int num_workers, absl::Duration lease, Timer* timer,
                 Env* env = Env::Default());
  JobCoordinator(const JobCoordinator&) = delete;
  JobCoordinator& operator=(const JobCoordinator&) = delete;

  // The Coordinate RPC: dispatches on request.kind to the methods below (INVALID_ARGUMENT for an
  // unknown kind or a worker id outside [0, num_workers)) and sets response->job_version.
  absl::Status Coordinate(const CoordinateRequest& request, CoordinateResponse* response);

  // Report records a worker's phase (a repeated report replaces the earlier one); Reports returns
  // those of `phase`, by worker. INVALID_ARGUMENT for a worker id or phase out of range.
  absl::Status Report(const ReportRequest& report);
  std::vector<ReportRequest> Reports(JobPhase phase) const;
  // The job is over (job_finished), with `error` if it failed (JobState.job_error).
  void FinishJob(const std::string& error = "");

  // ---- Leases ----
  // Worker `worker` made a call: renews its lease (ids outside [0, num_workers) are ignored).
  // Cheap when the worker is not lost: one atomic store.
  void Heard(int worker);
  // Called (outside the lock) with the lost workers' description whenever the set of lost
  // workers changes ("" = none lost any more). Set before serving.
  void SetLostCallback(std::function<void(const std::string&)> on_lost) {
    on_lost_ = std::move(on_lost);
  }
  std::vector<int> lost_workers() const;

  // RequestCheckpoint opens a round unless one is open for arrivals and returns the open round;
  // `stop` marks it as the job's last, and `end_pass` with `stop` as the end of the job's training
  // pass (the chief's early stopping: JobState.checkpoint_end_pass); a new round takes
  // `target_step` (0: none).
  // ArriveCheckpoint records a paused worker's state (FAILED_PRECONDITION if `round` is not
  // open). CollectArrivals fills out->worker_states with the state each of workers 0..n-1 arrived
  // with in `round` (a worker that reported TRAINING_DONE stands in with its final state) and
  // out->missing with the others; FAILED_PRECONDITION if `round` is not the open round.
  // ReleaseCheckpoint lets the arrived workers go on (after every shard's COPY);
  // CompleteCheckpoint publishes the result. RELEASE must name the open round and COMPLETE a
  // round that was opened and not completed yet (FAILED_PRECONDITION otherwise); n of COLLECT
  // must be in [1, num_workers].
  int64_t RequestCheckpoint(bool stop, int64_t target_step = 0, bool end_pass = false);
  absl::Status ArriveCheckpoint(int64_t round, int worker, std::string state);
  absl::Status CollectArrivals(int64_t round, int n, CoordinateResponse* out) const;
  absl::Status ReleaseCheckpoint(int64_t round);
  absl::Status CompleteCheckpoint(int64_t round, const std::string& dir,
                                  const std::string& error);
  void SetRestoredFrom(const std::string& dir);

  // The job state now (PullResponse.job), and its version.
  JobState State() const;
  int64_t version() const;
  // The job's fields of InfoResponse (job_finished, checkpoint_*, restored_from, job_version).
  void FillInfo(InfoResponse* info) const;

  // ---- Long-polls ----
  // Holds `watch` while the version equals `version`, until `until` at the latest, then wakes it
  // OK. Wakes it at once (outside the lock, possibly before returning) when the version already
  // differs or `until` has passed (OK), or when holding has stopped or kMaxHeld calls are held
  // (UNAVAILABLE).
  void Hold(Watch* watch, int64_t version, absl::Time until);
  // The watch's call was cancelled: if it is still held, takes it off the list and wakes it with
  // CANCELLED.
  void Cancel(Watch* watch);
  // Shutdown: wakes every held watch UNAVAILABLE and holds nothing more.
  void StopHolding();
  int held_watches() const;

 private:
  // A change of the job state: bumps the version and takes the held watches to wake (after the
  // lock is released) into *wake.
  void ChangedLocked(std::vector<Watch*>* wake) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void WakeAll(const std::vector<Watch*>& wake);
  absl::Status CheckWorker(int worker, const char* what) const;
  // The lease timer of `worker` fired: marks it lost if its lease expired, else re-arms.
  void CheckLease(int worker);
  // kConnectGrace + lease after the first call: the workers that never called are lost.
  void CheckNeverCalled();
  std::string LostDetailLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Fills reports' lost workers into a COLLECT / REPORTS answer.
  void FillLostLocked(CoordinateResponse* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void NotifyLost(const std::string& detail);

  const int shard_;
  const int num_workers_;
  const absl::Duration lease_;
  Timer* const timer_;
  Env* const env_;
  std::function<void(const std::string&)> on_lost_;

  // Per worker: when it was last heard of (unix ns), and whether its lease timer is armed.
  std::unique_ptr<std::atomic<int64_t>[]> heard_ns_;
  std::unique_ptr<std::atomic<bool>[]> armed_;
  std::unique_ptr<std::atomic<bool>[]> lost_flag_;  // mirrors lost_, read without the lock
  std::atomic<bool> started_{false};                // some worker has called
  absl::Time started_at_;                           // when (written once, before the timer)

  mutable absl::Mutex mu_;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  // phase -> worker id -> its latest report
  std::map<int, std::map<int, ReportRequest>> reports_ ABSL_GUARDED_BY(mu_);
  bool job_finished_ ABSL_GUARDED_BY(mu_) = false;
  // Checkpoint rounds.
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool end_pass_ ABSL_GUARDED_BY(mu_) = false;
  int64_t target_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::string> arrivals_ ABSL_GUARDED_BY(mu_);
  int64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  std::string done_dir_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::string restored_from_ ABSL_GUARDED_BY(mu_);
  std::string job_error_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Time> lost_ ABSL_GUARDED_BY(mu_);  // lost worker -> last heard of
  HeldCalls<Watch> held_;  // the held watches; guarded by mu_
};

}  // namespace pstrain
