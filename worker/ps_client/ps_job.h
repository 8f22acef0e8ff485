// PsJob: a worker's side of a PS training job's protocol with shard 0 (`pstrain host`,
// `pstrain worker`): checkpoint rounds, the lease, stops, the pass's end, the end of the job and
// failure. It is the job's JobControl (worker/train/job_control.h) and, through checkpointer(),
// its Checkpointer: in PS training a checkpoint is a round of the whole job.
//
// Checkpoint rounds, coordinated by shard 0 (docs/CHECKPOINT.md "PS mode"):
//   1. a worker asks for a round: the chief on its schedule, any worker on SIGTERM (then the
//      round ends the job); the other workers learn of the open round at once (ASYNC: a
//      background thread long-polls shard 0's Info, which shard 0 answers when its job state
//      changes; BOUNDED / SYNC: from the job state in shard 0's answers to their training pulls)
//      and join it at their next step boundary;
//      every call goes to shard 0 by RPC, also from the host that runs shard 0, so a worker
//      without a shard (`pstrain worker`) works the same;
//   Every worker keeps a long-poll open on shard 0 (its lease, JobCoordinator); the chief stops
//   the job when a worker is lost (aborting an open round: its waits end at once), and the
//   workers stop when the job failed, the chief was lost, or shard 0 has not answered them for
//   longer than the lease (they were counted lost: cut off, or shard 0 is down) (failure()).
//   The lease watches the training loop, not the process: the long-poll renews it only while the
//   loop trains steps (heartbeat(), worker/train/job_control.h LoopHeartbeat). A loop that has
//   trained no step for longer than the lease, outside a wait bounded by its own deadlines (a
//   checkpoint round), is stuck, e.g. on a shard whose host is stopped (SIGSTOP) while this
//   worker's own process runs (`pstrain host --max_restarts` runs it as a child): the worker
//   stops renewing and stops, naming the step it is stuck after, so the job's failure path starts
//   within about the lease instead of the calls' budget.
//   2. each worker flushes its pushes, arrives with its WorkerState and pauses;
//   3. the chief waits for every worker (a worker that finished training stands in with its
//      final state), asks every shard to COPY its state into memory (all writers are paused, so
//      the copies are one consistent instant), releases the workers, then has every shard WRITE
//      its file, writes the worker states and the MANIFEST, and moves LATEST;
//   4. a worker of a stopping round waits until the checkpoint is written, then the job ends.
// With BOUNDED and SYNC, a worker paused in a round would make the others wait for its pushes, so
// every worker arrives at one common step: the round's target, set by the first request to
// (requester's step) + 3 (+ staleness with BOUNDED). Every worker can reach it without anyone
// paused, and each worker checks for a round before it trains each step (so that it does not
// read ahead past the target), in the job state of shard 0's answer to its last training pull
// (PsClient::job_state(): no RPC): a worker about to train the target step has pulled the step
// before it, which shard 0 answered only after the requester's push that followed its request,
// so that answer shows the round. A stop signal makes the worker train on to the target
// (StopStep).
// The checkpoint is named ckpt-<step> with step = the sum of the workers' steps (TF's
// global_step in asynchronous training: one per applied update).
//
// The end of the job (docs/PS.md "End of job"): after its last step every worker reports
// TRAINING_DONE with its counts and final state (ReportTrainingDone); the chief waits for every
// report (WaitForTrainingDone), writes the job's final checkpoint (SaveFinal) and marks the job
// finished (FinishJob), or failed (FailJob). A host's shard stays up until no worker needs it
// (AwaitJobEnd below).
//
// Thread-safety: the JobControl methods, Restore and Save from the trainer thread; the end-of-job
// methods after training. The ASYNC watcher thread only sets an atomic; the destructor cancels
// its held call and joins it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "worker/ps_client/ps_client.h"
#include "worker/ps_client/shard_rpc.h"
#include "worker/train/checkpoint.h"
#include "worker/train/job_control.h"
#include "worker/train/trainer.h"

namespace pstrain {

class PsJob final : public JobControl {
 public:
  struct Options {
    std::string dir;  // the job's checkpoint directory, shared by every host
    int worker = 0;   // this worker; 0 is the chief
    int num_workers = 1;
    int keep = 3;
    // checkpoint.incremental_every: the chief asks the shards for deltas between full ones.
    int incremental_every = 1;
    std::vector<std::string> shards;     // every shard's address, shard 0 first
    // Required: flushed before arriving; with BOUNDED / SYNC its job_state() tells of rounds.
    PsClient* client = nullptr;
    std::atomic<bool>* stop = nullptr;   // raised when a round asks the job to stop
    absl::Duration timeout = absl::Minutes(10);  // for a round's waits
    Consistency consistency = ASYNC;  // BOUNDED / SYNC: rounds at one common step (see .cc)
    int staleness = 0;                // BOUNDED's
    // The checkpoint this host's shard restored (ChooseCheckpoint), if any.
    std::optional<CheckpointChoice> restored;
    // What the MANIFEST records about the model (worker/train/checkpoint.h DescribeModel).
    ModelDescription model;
    // The cluster secret, TLS and message cap of every call (common/rpc/security.h).
    RpcSecurity security;
    // The lease shard 0 keeps for each worker (cluster.lease_ms): the watcher's long-poll, held
    // at most a third of it, renews this worker's while its training loop trains (heartbeat()).
    // Shard 0 not answering for longer than the lease, or the loop training no step for longer
    // than it, fails this worker (failure()): it has been, or is about to be, counted lost.
    absl::Duration lease = absl::Seconds(30);
    // The lease counts from shard 0's first answer to the watcher; until then (a busy shard 0
    // at start-up, its peers still starting) the watcher waits up to this long for it.
    absl::Duration first_contact = absl::Seconds(120);
    // Worker i's host, for messages (`pstrain host`: the cluster spec); empty = unknown.
    std::vector<std::string> worker_hosts;
    // Called once, on the thread that found it, when this worker must stop (failure()), with
    // FailureStatus(): the command bounds the process's remaining life with it (cmd/
    // stop_signal.h ExitWithin). May be empty.
    std::function<void(const absl::Status&)> on_failure;
    // The lease watch's clock (how long shard 0 has been silent). Null: Env::Default(). The
    // calls' own deadlines are gRPC's, on the system clock.
    Env* env = nullptr;
  };

  explicit PsJob(Options options);
  ~PsJob() override;

  // The job's checkpoints as RunTraining sees them: Restore and Save below.
  Checkpointer* checkpointer() { return &checkpoints_; }

  // JobControl.
  // Options::stop: a stop signal, or a round that ended the job.
  bool StopRequested() const override { return opt_.stop != nullptr && opt_.stop->load(); }
  bool CheckpointRequested(int64_t step) override;
  absl::StatusOr<int64_t> StopStep(int64_t step) override;
  // Chief: requests a stopping round that ends the job's pass (CoordinateRequest.end_pass; with
  // BOUNDED / SYNC at a common target step, as StopStep's). Every worker joins it as it joins a
  // SIGTERM's round, and after it stops with PassEnded() true: it ends as at the end of its input
  // (TRAINING_DONE with its final state), and the chief's SaveFinal marks the pass's end on the
  // round's checkpoint (nothing trained since, so nothing is written again). Returns true.
  absl::StatusOr<bool> EndPass(int64_t step) override;
  bool PassEnded() const override { return pass_ended_; }
  // FailureStatus() once failure() is set.
  absl::Status Failure() const override {
    return failed_.load() ? FailureStatus() : absl::OkStatus();
  }
  // The training loop's heartbeat, which the lease watches (see the top of this file).
  LoopHeartbeat* heartbeat() override { return &heartbeat_; }

  // Checkpointer.
  // This worker's state from the restored checkpoint. When the checkpoint was written by another
  // number of workers, the data positions cannot be mapped: the parameters are restored, the
  // data starts from the beginning, and a warning says so.
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state);
  // final = true records the state for the end-of-job report (ReportTrainingDone) and writes
  // nothing: the chief writes the job's last checkpoint with SaveFinal once every worker is done.
  absl::StatusOr<std::string> Save(const WorkerState& state, bool final);

  // The end of the job.
  // Reports this worker's TRAINING_DONE to shard 0: its counts (of `summary`), staleness, final
  // state and restarts.
  absl::Status ReportTrainingDone(const TrainSummary& summary, const PsClient::Staleness& staleness,
                                  const std::vector<std::string>& restart_log);
  // Chief: every worker's TRAINING_DONE report (bounded by Options::timeout).
  absl::StatusOr<std::vector<ReportRequest>> WaitForTrainingDone();
  // Chief: marks the job finished on shard 0 (the hosts then shut their shards down).
  absl::Status FinishJob();
  // Chief: tells shard 0 that the job failed with `error`, so that the other workers learn it at
  // once (their long-polls answer) instead of when shard 0's calls time out. Best effort.
  void FailJob(const absl::Status& error);
  // Why this worker must stop, if it must ("" otherwise): the chief learnt that workers were
  // lost, or a worker learnt that the job failed (shard 0's job_error) or that the chief was
  // lost. Then CheckpointRequested() is true and Save() returns FAILED_PRECONDITION with this message and
  // the last good checkpoint.
  std::string failure() const;
  // failure() as the error Save returns, naming the last good checkpoint.
  absl::Status FailureStatus() const;
  // Chief, after every worker reported TRAINING_DONE: a round made of their final states.
  absl::StatusOr<std::string> SaveFinal();

 private:
  class Checkpoints final : public Checkpointer {
   public:
    explicit Checkpoints(PsJob* job) : job_(job) {}
    absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) override {
      return job_->Restore(state);
    }
    absl::StatusOr<std::string> Save(const WorkerState& state, bool final) override {
      return job_->Save(state, final);
    }

   private:
    PsJob* const job_;
  };

  bool chief() const { return opt_.worker == 0; }
  // A round's outcome as Save and SaveFinal return it: an error is FailureStatus() once this
  // worker must stop (asking shard 0 for its job state first, when the watcher has not seen it).
  absl::StatusOr<std::string> AsFailure(absl::StatusOr<std::string> dir);
  // Save's work: the final state, a request for a round, or this worker's part in one.
  absl::StatusOr<std::string> SaveOrJoin(const WorkerState& state, bool final);
  // BOUNDED / SYNC: every worker pauses at the round's target step, checked before every step.
  bool lockstep() const;
  int64_t TargetAfter(int64_t step) const;
  // Whether `round` (of shard 0's job state, with `released`) is open and this worker has not
  // taken part in it.
  bool OpenForMe(int64_t round, int64_t released) const;
  // Shard 0's Info, with checkpoint_round set to 0 unless a round is open that this worker has
  // not taken part in.
  absl::StatusOr<InfoResponse> OpenRound();
  absl::StatusOr<int64_t> Request(bool stop, int64_t target, bool end_pass = false);
  // Chief: steps 3 of the protocol for `round`; returns the checkpoint directory.
  absl::StatusOr<std::string> RunRound(int64_t round);
  absl::StatusOr<std::string> RunRoundSteps(int64_t round);
  // Long-polls shard 0's Info on watch_rpc_ until the destructor cancels it (every mode: it
  // renews this worker's lease; ASYNC: it tells of rounds; every worker: of lost workers).
  void Watch();
  // Notes what shard 0's job state says of lost workers and the job's failure.
  void NoteJobHealth(const InfoResponse& info);
  // Whether the training loop is stuck (no step for longer than the lease outside a bounded
  // wait); then this worker fails, naming it, and its lease is not renewed again.
  bool LoopStuck();
  // The first failure sticks: failure() becomes `why`, the PS client's calls in flight end
  // with FailureStatus() (a trainer blocked in a pull or push returns at once), and so do this
  // checkpointer's calls to the shards (a round's waits and writes).
  void Fail(const std::string& why);
  // "worker 2 (host h2:2223)".
  std::string DescribeWorker(int worker) const;

  const Options opt_;
  Checkpoints checkpoints_{this};
  LoopHeartbeat heartbeat_;
  std::vector<std::unique_ptr<ShardRpc>> shards_;
  int64_t handled_round_ = 0;  // the last round this worker took part in
  int64_t step_base_ = 0;      // added to the workers' steps in checkpoint names (see Restore)
  DeltaChain deltas_;          // chief: what the next checkpoint builds on
  std::string final_state_;
  bool stopped_ = false;  // a round ended the job: later saves return last_saved_dir_
  bool pass_ended_ = false;  // that round ended the job's pass (the chief's EndPass)
  std::string last_saved_dir_;

  // ASYNC: the open round as the watcher thread last saw it (0 = none), and the watcher's own
  // connection to shard 0 (Cancel() ends its held call).
  std::atomic<int64_t> open_round_{0};
  std::unique_ptr<ShardRpc> watch_rpc_;
  // The end of the job's calls to shard 0: not cancelled by a failure (FailJob must still tell).
  std::unique_ptr<ShardRpc> end_rpc_;
  std::thread watcher_;
  std::atomic<bool> failed_{false};
  mutable absl::Mutex failure_mu_;
  std::string failure_ ABSL_GUARDED_BY(failure_mu_);
};

// A host's part of the end of the job once its worker is done (docs/PS.md "End of job"): its
// shard must stay up until no worker needs it (the chief's evaluation reads every shard).
//   - The chief (host 0) reports FINISH_SEEN itself and waits (60 s; not fatal: a host that does
//     not acknowledge only loses its shard early) for every host's report.
//   - Another host waits for shard 0's job_finished (`barrier_timeout`; a shard 0 silent for
//     longer than `lease` ends the wait: it counts this host as lost), then reports FINISH_SEEN;
//     a `preempted` host (it saw its checkpoint written) reports at once.
// Errors: shard 0 not reached, or the job failed (naming its error), with the last good
// checkpoint of `checkpoint_dir`; the caller then shuts its shard down and exits 1.
struct HostEnd {
  int host = 0;
  int num_hosts = 1;
  bool preempted = false;
  absl::Duration barrier_timeout = absl::Hours(1);
  absl::Duration lease = absl::Seconds(30);
  std::string checkpoint_dir;
};
absl::Status AwaitJobEnd(ShardRpc& shard_zero, const HostEnd& end);

}  // namespace pstrain
