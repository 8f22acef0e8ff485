// Synchronous data parallelism over MPI (`pstrain allreduce`, docs/ALLREDUCE.md). Every rank
// holds a full replica of the parameters (a LocalParams) and trains its own shard of the data;
// at every step the ranks exchange their gradients and apply the same averaged update to their
// replicas, so the replicas stay identical bit for bit:
//   - dense gradient: one MPI_Allreduce (sum) of the whole dense vector, divided by the number
//     of ranks that stepped;
//   - sparse gradients: MPI_Allgatherv of every rank's (id, gradient row) pairs, summed per id in
//     rank order (the same float additions in the same order on every rank), divided likewise;
//     or, with sparse_as_dense, one MPI_Allreduce of the whole table's gradient;
//   - then LocalParams::Push on every rank with the same ids, rows, dense gradient and step.
// Pull reads the local replica.
//
// Every collective goes through "rounds" that all ranks enter in the same order. A round starts
// with an MPI_Allgather of a small header per rank (what the rank is doing: a step, a checkpoint,
// or waiting because its data ran out; its step; its SIGTERM flag; whether a checkpoint is due).
// From the headers every rank draws the same conclusions:
//   - a SIGTERM seen by any rank raises agreed_stop() on every rank after the same step (pass it
//     to RunTraining as TrainerOptions::stop, and the process's own signal flag as local_stop);
//   - a checkpoint due by rank 0's clock (every_seconds) makes TakeCheckpointRequest() return
//     true on every rank at the same step boundary; every_steps needs no agreement (ScheduledAt).
//     The trainer's own chief-only schedule must be switched off (checkpoint.every_* = 0 in its
//     config);
//   - a rank whose data ran out (the trainer's final Save) keeps taking part in the other ranks'
//     steps with empty gradients ("join", as Horovod's hvd.join) until every rank has finished;
//     the final checkpoint is then written by all of them together.
//
// Failures: MPI_COMM_WORLD gets MPI_ERRORS_RETURN; a failing MPI call becomes an UNAVAILABLE
// status naming this rank, the call and the step. The command layer then calls MPI_Abort, so
// the whole job ends (mpirun kills the other ranks) instead of hanging.
//
// Thread-safety: Pull may be called from any thread (the evaluator's); every other method is a
// collective and must be called from one thread (the training thread), in the same order on
// every rank. MPI must be initialized (at least MPI_THREAD_FUNNELED, calls from that thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/params/local_params.h"
#include "worker/params/params.h"
#include "worker/train/checkpoint.h"
#include "worker/train/job_control.h"
#include "worker/train/trainer.h"

namespace pstrain {

struct AllreduceOptions {
  // Allreduce the whole table's gradient (table rows x row_dim floats) instead of allgathering
  // (id, row) pairs. Create refuses it when that buffer exceeds max_dense_table_bytes.
  bool sparse_as_dense = false;
  int64_t max_dense_table_bytes = int64_t{64} << 20;
  // Checkpoints: rank 0 writes them to checkpoint_dir (shared by all ranks for Restore).
  std::string checkpoint_dir;
  int keep = 3;
  // checkpoint.incremental_every: rank 0 writes its replica's deltas (every rank applies the same
  // updates, so rank 0's changed rows are the job's).
  int incremental_every = 1;
  int64_t checkpoint_every_steps = 0;    // 0 = off
  double checkpoint_every_seconds = 0;   // rank 0's clock (env's monotonic one); 0 = off
  Env* env = Env::Default();
  // This process's SIGTERM flag (not owned; may be null).
  const std::atomic<bool>* local_stop = nullptr;
  // What the checkpoints' MANIFEST records, and what a restore must match (DescribeModel).
  ModelDescription model;
  // train.warm_start: every rank warm-starts its replica when checkpoint_dir has no checkpoint
  // (worker/train/checkpoint.h RestoreOrWarmStart).
  std::optional<WarmStart> warm_start;
  // Bytes the replica may grow to (-1: no bound). A step whose new rows could take the replica
  // past it fails before they are stored, with FAILED_PRECONDITION naming both sizes, on every
  // rank at the same step (the replicas, and so their sizes, are identical): the job stops
  // cleanly instead of being killed by the OOM killer (worker/allreduce/replica_memory.h).
  int64_t replica_budget_bytes = -1;
};

class AllreduceParams : public ParameterAccess {
 public:
  // Takes the replica (created identically on every rank: same config, same seeds). Collective:
  // every rank of MPI_COMM_WORLD must call it.
  static absl::StatusOr<std::unique_ptr<AllreduceParams>> Create(
      std::unique_ptr<LocalParams> replica, AllreduceOptions options);
  AllreduceParams(const AllreduceParams&) = delete;
  AllreduceParams& operator=(const AllreduceParams&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  int row_dim() const override { return replica_->row_dim(); }
  int64_t dense_size() const override { return replica_->dense_size(); }
  // The local replica (thread-safe).
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override;
  // One step round (collective): `row_grads`/`dense_grad` are this rank's gradients averaged
  // over its own batch; the update applied is their average over the ranks that stepped.
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads,
                    const float* dense_grad, int64_t step) override;

  // Checkpointer contract (worker/train/checkpoint.h), collective. Restore: every rank restores the
  // newest usable checkpoint of checkpoint_dir into its replica and its own worker-<rank>.state;
  // the ranks then compare what they restored and fail together if they disagree. Save: rank 0
  // gathers every rank's WorkerState and writes the checkpoint (its replica + worker-<r>.state
  // for each rank r); every rank returns rank 0's result. Save(final) first joins (see above).
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state);
  absl::StatusOr<std::string> Save(const WorkerState& state, bool final);
  // True (once) at the step boundary where every rank is due to checkpoint.
  bool TakeCheckpointRequest();
  // The step schedule (checkpoint.every_steps), known to every rank in advance. Not at the step
  // of the last checkpoint saved or restored (0 for a fresh job): the trainer also asks at the
  // first boundary of a run and after a stop's round, where a checkpoint would repeat the last
  // one (and, with dynamic tables, evict at the start of a new pass).
  bool ScheduledAt(int64_t step) const {
    return opt_.checkpoint_every_steps > 0 && step % opt_.checkpoint_every_steps == 0 &&
           step != checkpoint_step_;
  }

  // Raised on every rank after the same step once any rank's local_stop was set, or a rank
  // asked to end the pass.
  const std::atomic<bool>* agreed_stop() const { return &agreed_stop_; }
  // The chief's early stopping (JobControl::EndPass): this rank's next round header asks every
  // rank to stop after that round's step, as a SIGTERM does, but ending the training pass:
  // pass_ended() is then true on every rank, and the ranks end as at the end of their data (the
  // final checkpoint, Finish's checksums).
  void EndPass() { end_pass_ = true; }
  bool pass_ended() const { return pass_ended_; }

  // End of job, every rank, as TrainerOptions::after_training (a no-op when the job was stopped
  // by a signal's agreed_stop: then the ranks are not all here). Compares the replicas'
  // checksums (INTERNAL error if they differ), prints "pstrain allreduce: rank r of N: replica
  // crc32c XXXXXXXX after step S" on stdout, replaces examples, examples_this_run and
  // examples_per_sec with the job's totals and steps with the job's step count, and sets
  // wire_bytes. unique_rows_per_step stays this rank's.
  absl::Status Finish(TrainSummary* summary);

  // crc32c of the replica's trained rows (ids, weights, optimizer state) and dense weights and
  // state. Not thread-safe against Push.
  uint32_t ReplicaChecksum() const;
  // The replica (its dynamic tables: the trainer sets their pass and reports their metrics,
  // TrainerOptions::replica).
  LocalParams* replica() const { return replica_.get(); }
  // Bytes this rank has sent in collectives (ring model, docs/ALLREDUCE.md).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Header;
  AllreduceParams(std::unique_ptr<LocalParams> replica, AllreduceOptions options, int rank,
                  int size);
  absl::Status Check(int rc, const char* call, int64_t step) const;
  absl::StatusOr<std::vector<Header>> ExchangeHeaders(int64_t kind, int64_t step, int64_t n_ids,
                                                      bool due);
  absl::Status Exchange(const std::vector<Header>& all, absl::Span<const int64_t> ids,
                        const float* row_grads, const float* dense_grad);
  absl::StatusOr<std::string> SaveRound(const WorkerState& state);
  // Dynamic tables, every rank before rank 0 writes a checkpoint: agrees on the job's step
  // (returned in `step`) and on whether the pass ended (every rank finished its data), then
  // evicts as `pstrain train` does at that point (EvictDynamicTables: the step schedule
  // checkpoint.every_steps and the pass's end), on every rank alike.
  absl::Status EvictDynamic(const WorkerState& state, int64_t* step);
  // FAILED_PRECONDITION when this step's merged rows could take the replica past
  // opt_.replica_budget_bytes.
  absl::Status CheckReplicaGrowth(int64_t step) const;
  void CountAllgather(int64_t bytes) { bytes_sent_ += (size_ - 1) * bytes; }
  void CountAllreduce(int64_t bytes) { bytes_sent_ += 2 * (size_ - 1) * bytes / size_; }

  const std::unique_ptr<LocalParams> replica_;
  const AllreduceOptions opt_;
  const int rank_, size_;
  ReplicaDeltas deltas_;  // rank 0's: what its next checkpoint builds on
  std::atomic<bool> agreed_stop_{false};
  bool end_pass_ = false, pass_ended_ = false;
  bool checkpoint_requested_ = false;
  double last_checkpoint_time_;
  int64_t bytes_sent_ = 0;  // by this rank
  int64_t last_step_ = 0;   // the job's step of the last update applied
  int64_t checkpoint_step_ = 0;  // the step of the last checkpoint saved or restored
  // Step buffers, reused.
  std::vector<float> dense_;
  std::vector<int64_t> all_ids_, merged_ids_;
  std::vector<float> all_rows_, merged_rows_, table_;
  std::vector<int> counts_, displs_;
  absl::flat_hash_map<int64_t, int64_t> slot_;
};

// The Checkpointer RunTraining drives in `pstrain allreduce`: AllreduceParams' collectives.
class AllreduceCheckpointer : public Checkpointer {
 public:
  explicit AllreduceCheckpointer(AllreduceParams* params) : params_(params) {}
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) override {
    return params_->Restore(state);
  }
  absl::StatusOr<std::string> Save(const WorkerState& state, bool final) override {
    return params_->Save(state, final);
  }

 private:
  AllreduceParams* const params_;
};

// The JobControl of `pstrain allreduce`: the ranks agree on stops, checkpoints and the pass's
// end in each step's round header (AllreduceParams), so every rank sees them at the same step.
class AllreduceJob : public JobControl {
 public:
  explicit AllreduceJob(AllreduceParams* params) : params_(params) {}
  // The stop the ranks agreed on (a signal on any rank, or the chief's pass end).
  bool StopRequested() const override { return params_->agreed_stop()->load(); }
  // Asked before step `step` trains, for the boundary after it: the step schedule is known to
  // every rank in advance; a timed checkpoint is agreed in a step's header and served one
  // boundary later, the same one on every rank.
  bool CheckpointRequested(int64_t step) override {
    return params_->TakeCheckpointRequest() || params_->ScheduledAt(step);
  }
  absl::StatusOr<bool> EndPass(int64_t /*step*/) override {
    params_->EndPass();
    return true;
  }
  bool PassEnded() const override { return params_->pass_ended(); }

 private:
  AllreduceParams* const params_;
};

}  // namespace pstrain
