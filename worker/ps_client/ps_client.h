// PsClient: a worker's ParameterAccess over the PS shards (the service of
// proto/pstrain/ps_service.proto, served by ps/server/shard_server.h), by gRPC.
//
// A Pull or Push of a step sends ONE part per shard, all in flight at once: ids are grouped by
// owning partition (PartitionMap(V, P, S), partition p on shard p mod S) and the rows scattered
// back into the caller's order. The dense vector is split by size into S slices (slice s on
// shard s), so a dense pull/push touches every shard. Each shard is a ShardEndpoint
// (worker/ps_client/shard_endpoint.h): over gRPC, or, for the shard this process serves in
// ASYNC, direct calls; this class routes, scatters and keeps the versions, once for both.
//
// Failures. Every call follows the one retry policy (common/rpc/retry.h): every RPC attempt has a
// deadline (rpc_deadline_ms); UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential
// backoff and jitter, up to rpc_retries times and within the call's overall budget
// (call_deadline_ms); then the call fails with the last code and a message naming
// the shard and its address, what failed, how many attempts over how long, e.g.
//   "shard 1 (127.0.0.1:5001): Pull failed after 6 attempts over 3.1 s: UNAVAILABLE: ..."
// Other codes (e.g. INVALID_ARGUMENT) fail at once. No RPC outlives its budget; a push queued
// behind an earlier push to the same shard starts its budget when it is sent.
// Retried pushes are safe: each push carries (worker_id, incarnation, sequence) and a shard
// applies each push at most once. A shard that restarted has the rows of the checkpoint it
// restored (a restarted job's hosts restore the job's: docs/PS.md "Recovery"), or fresh ones
// (initial values); the client notices the shard's new incarnation, logs a warning and counts it
// in shard_restarts().
//
// Pipelining:
//   - PullAsync returns at once with a PsFuture; the trainer can pull the next batch's rows while
//     the current batch computes.
//   - PushAsync copies the gradients into its requests and returns at once (or, when
//     max_pushes_in_flight pushes are pending, once the oldest has finished: backpressure). The
//     pushes of one client reach each shard one at a time, in order.
//   Pull() and Push() (the ParameterAccess methods) are PullAsync / PushAsync plus Wait: a
//   trainer using only those gets read-your-writes from its own pushes in ASYNC mode.
//
// Consistency (Options.consistency; the shards enforce it, docs/PS.md):
//   - Training pulls carry their step: PullAsync counts the pulls that ask for rows AND the dense
//     vector (TrainStep's, one per step, in step order; the evaluator asks for one or the other)
//     and labels the k-th one step base + k, base being 0 or the step a resumed worker restarts
//     from (ResumeAtStep); PullAtStepAsync takes the step explicitly, and a trainer that knows
//     its step should use it. Other pulls carry step 0 and are answered at once in every mode.
//   - ASYNC: a pull issued while a push is pending may or may not see it, shard by shard; a pull
//     issued after a push's future completed (or after Flush) sees it: asynchronous SGD.
//   - BOUNDED (staleness s): the shard answers the pull of step t once every active worker has
//     pushed step t - 1 - s. SYNC: once the mean update of step t - 1 over all active workers
//     has been applied. Pushes are answered when accepted, so a trainer may pull step t + 1
//     before its push of step t completes; only the pull waits. In both modes every push goes to
//     every shard (empty where the worker has nothing for it), so each shard counts every step.
//   - FinishTraining() tells every shard that this worker will push no more, so the others stop
//     waiting for it. A held pull that cannot be answered (a dead worker) fails within the call
//     budget with the shard's message naming the step and the workers it waited for.
//   - staleness(): how far ahead of the slowest active worker this worker's training pulls were.
//   - In BOUNDED / SYNC every training pull also asks shard 0 (an empty part when the worker has
//     nothing there), whose answer carries the job state (PullResponse.job): job_state() keeps
//     the newest, so that the PS checkpointer learns of checkpoint rounds without an RPC.
//
// Thread-safety: every method may be called concurrently (the evaluator pulls while the trainer
// pushes). The destructor cancels calls still in flight and waits for them (bounded by the
// deadlines); no method may be running or called during or after destruction.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dynamic_rows.h"
#include "common/env.h"
#include "common/rpc/retry.h"
#include "common/rpc/security.h"
#include "ps/store/partition.h"
#include "pstrain/config.pb.h"
#include "pstrain/ps_service.pb.h"
#include "worker/params/params.h"
#include "worker/ps_client/local_shard.h"
#include "worker/ps_client/ps_future.h"
#include "worker/ps_client/pull_versions.h"
#include "worker/ps_client/shard_endpoint.h"
#include "worker/ps_client/shard_router.h"

namespace pstrain {

class Timer;  // common/rpc/timer.h

class PsClient final : public ParameterAccess {
 public:
  struct Options {
    std::vector<std::string> shards;  // "host:port" of shard i, i in [0, S)
    int64_t rows = 0;                 // V: rows of the table, > 0
    int partitions = 0;               // P (0 = NumPartitions' default, 4 x S)
    // The tables' own partitions (Shard::Options::table_splits: the same on every worker and
    // shard); empty = one table of `rows` rows in `partitions` partitions.
    std::vector<PartitionMap::TableSplit> table_splits;
    int row_dim = 0;                  // floats per row, > 0
    int64_t dense_size = 0;           // floats of the whole dense vector, >= 0
    // The dynamic tables' floats per row (1 + dim, in dynamic index order; Shard::Options::
    // dynamic_tables' dims): their rows (negative ids) go to the shard of their key's hash, and
    // every shard must report the same (WaitForShards).
    std::vector<int> dynamic_row_dims;
    int worker_id = 0;                // this worker's index (push ids, stats)
    int rpc_deadline_ms = 10000;      // deadline of one attempt
    int rpc_retries = 5;              // retries after the first attempt (UNAVAILABLE, DEADLINE)
    // Budget of one call including retries and backoff; 0 = (rpc_retries + 1) x rpc_deadline_ms.
    int call_deadline_ms = 0;
    int initial_backoff_ms = 100;  // first retry delay; doubles per retry (jittered to 50..100%)
    int max_backoff_ms = 2000;     // also bounds gRPC's own reconnect backoff
    int max_pushes_in_flight = 2;  // PushAsync blocks beyond this many pending pushes, >= 1
    Consistency consistency = ASYNC;  // must match the shards' (see above)
    // A shard served by this process (`pstrain host`), started, not owned, outliving the client.
    // ASYNC: pulls and pushes to shard `local_shard` call it directly (LocalShard::PullDirect /
    // PushDirect: no messages, no copies beyond the caller's buffers). Every other call to it,
    // and every call in BOUNDED / SYNC, goes through its in-process channel (the same service,
    // deadlines and retries, without TCP). -1 = every shard over its address.
    int local_shard = -1;
    LocalShard* local_server = nullptr;
    // The cluster secret every call carries, TLS, and the message cap (common/rpc/security.h).
    RpcSecurity security;
    // The clock of the retries' deadlines and backoffs (the calls' Timer). Null: Env::Default().
    Env* env = nullptr;

    // INVALID_ARGUMENT naming the first bad option.
    absl::Status Validate() const;
  };

  // The options of a cluster config: shard addresses, partitions, deadlines, retries, backoff
  // max pushes in flight and consistency from `cluster`, worker_id = cluster.index().
  static Options OptionsFromConfig(const ClusterConfig& cluster, int64_t rows, int row_dim,
                                   int64_t dense_size);

  // Creates the channels (connections are made lazily). INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(Options options);
  // The same over the given endpoints (shard s = shards[s]), e.g. fakes in a test: the options'
  // addresses only name the shards, their security and local shard are unused.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      Options options, std::vector<std::unique_ptr<ShardEndpoint>> shards);
  ~PsClient() override;
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Ends every call in progress and every later one with `reason` (not OK), e.g. when the job
  // failed or a peer was lost: a trainer blocked in a pull or push returns at once with the
  // reason instead of waiting for its deadline. Idempotent (the first reason stays).
  void Abort(absl::Status reason);
  // Abort's reason, or OK.
  absl::Status aborted() const;

  // Asks every shard for its Info, waiting up to `timeout` for shards that are not up yet, and
  // checks that shard i is shard i of S with the same V, P, row_dim and dense_size as this
  // client (FAILED_PRECONDITION naming both sides otherwise). Call before training.
  absl::Status WaitForShards(absl::Duration timeout);

  int row_dim() const override { return opt_.row_dim; }
  int64_t dense_size() const override { return opt_.dense_size; }
  int num_shards() const { return static_cast<int>(opt_.shards.size()); }
  const PartitionMap& map() const { return router_.map(); }

  // ParameterAccess: PullAsync(...)->Wait() and PushAsync(...)->Wait().
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override {
    return PullAsync(ids, rows, dense)->Wait();
  }
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads, const float* dense_grad,
                    int64_t step) override {
    return PushAsync(ids, row_grads, dense_grad, step)->Wait();
  }
  // ParameterAccess's asynchronous calls (the trainer's pipelining): PullAtStepAsync, every
  // StartPull with ids being a training pull (with or without the dense vector, see
  // cluster.dense_sync_steps), and PushAsync.
  ParamsOp StartPull(absl::Span<const int64_t> ids, float* rows, float* dense) override {
    const int64_t step = ids.empty() ? 0 : training_pulls_.fetch_add(1) + 1;
    std::shared_ptr<PsFuture> f = PullAtStepAsync(ids, rows, dense, step);
    return ParamsOp([f] { return f->Wait(); });
  }
  ParamsOp StartPush(absl::Span<const int64_t> ids, const float* row_grads,
                     const float* dense_grad, int64_t step) override {
    std::shared_ptr<PsFuture> f = PushAsync(ids, row_grads, dense_grad, step);
    return ParamsOp([f] { return f->Wait(); });
  }

  // Starts pulling rows `ids` (in [0, V); unique, though repeats work) into rows[n x row_dim],
  // and, if dense is not null, the dense vector into dense[dense_size]. `ids` is copied before
  // return; rows and dense must stay valid until the future completes. INVALID_ARGUMENT (in the
  // future) for an id outside [0, V).
  // A pull with non-empty ids and dense is a training pull (see Consistency above).
  std::shared_ptr<PsFuture> PullAsync(absl::Span<const int64_t> ids, float* rows, float* dense);
  // PullAsync for training step `step` (>= 1; 0 = not a training pull), e.g. for a trainer that
  // knows its step. Does not advance PullAsync's count.
  std::shared_ptr<PsFuture> PullAtStepAsync(absl::Span<const int64_t> ids, float* rows,
                                            float* dense, int64_t step);

  // A worker resumed from a checkpoint after `step` steps: the next training pull (PullAsync's or
  // StartPull's) is step + 1.
  // Call before the first training pull.
  void ResumeAtStep(int64_t step) { training_pulls_ = step; }

  // Starts pushing row_grads[n x row_dim] for the unique `ids` and, if not null,
  // dense_grad[dense_size]; `step` is the 1-based global step. Everything is copied before
  // return. Blocks while max_pushes_in_flight pushes are pending.
  std::shared_ptr<PsFuture> PushAsync(absl::Span<const int64_t> ids, const float* row_grads,
                                      const float* dense_grad, int64_t step);

  // Waits for every push started so far and returns the first error of a push that finished since
  // the previous Flush (OK if none failed).
  absl::Status Flush();

  // End of this worker's training: Flush(), then tells every shard (PushRequest.worker_done) that
  // this worker pushes no more steps, so BOUNDED / SYNC shards stop waiting for it. Returns the
  // first error (of the flush or a shard). Call once, after the last push; pulls still work.
  absl::Status FinishTraining();

  // Staleness of this worker's training pulls that succeeded: per pull, the largest of its
  // shards' PullResponse.staleness (steps ahead of the slowest active worker).
  struct Staleness {
    int64_t pulls = 0;  // training pulls measured
    int64_t max = 0;
    double sum = 0;  // mean = sum / pulls
    double mean() const { return pulls > 0 ? sum / pulls : 0.0; }
  };
  Staleness staleness() const;

  // Each shard's counters, in shard order (see FormatShardBalance above).
  absl::StatusOr<std::vector<ShardStats>> GetStats();

  // Client-side counters since creation, over every shard.
  using Traffic = ShardTraffic;
  Traffic traffic() const;
  // Times a shard answered with an incarnation different from the one seen before.
  int64_t shard_restarts() const { return shard_restarts_.load(); }
  // The newest job state shard 0 sent with an answer to a training pull (BOUNDED / SYNC; see
  // Consistency above); version 0 before the first.
  JobState job_state() const;

 private:
  struct Parts;
  struct PullOp;
  struct PushOp;

  explicit PsClient(Options options);
  absl::Duration CallBudget() const;
  // A pull part of `op` finished: its answer (on OK) goes to the versions and the caller's rows;
  // the last part completes the operation.
  void PullPartDone(PullOp* op, int part, absl::Status st);
  void PushPartDone(PushOp* op, int part, absl::Status st);
  // The indexes of an operation's parts (for `shards`), the local shard's last: the other
  // shards' calls are in flight while its part (done on the calling thread) runs.
  std::vector<size_t> RemoteFirst(const std::vector<int>& shards) const;
  // One call of `call(shard, request, response, done)` per shard, in parallel; waits for all and
  // returns the first error.
  template <typename Req, typename Resp, typename Call>
  absl::Status CallAllShards(const Req& request, std::vector<Resp>* responses, Call call);
  // Floats of row `id` (routed already) on the wire: its table's width (compact widths,
  // PartitionMap::PartitionRowDim), row_dim without tables.
  // A dynamic table's row (a negative id, common/dynamic_rows.h): 1 + its dim.
  int RowWidthOf(int64_t id) const {
    if (IsDynamicRow(id)) return router_.dynamic_row_dim(DynamicTableOf(id));
    return compact_ ? RowWidth(router_.map(), router_.map().PartitionOf(id), opt_.row_dim)
                    : opt_.row_dim;
  }
  void NoteIncarnation(int shard, uint64_t incarnation);
  void NoteJobState(uint64_t incarnation, const JobState& job);
  void OpStarted();
  void OpFinished();

  const Options opt_;
  const ShardRouter router_;
  const bool compact_;  // some table's rows are narrower than row_dim (RowWidthOf)
  Env* const env_;              // Options::env
  const uint64_t incarnation_;  // random per client instance (push ids)
  PullVersions pull_versions_;  // what each push was computed from (its staleness)
  std::unique_ptr<Timer> timer_;  // the endpoints' retry backoffs
  std::vector<std::unique_ptr<ShardEndpoint>> shards_;
  std::unique_ptr<std::atomic<uint64_t>[]> incarnations_;  // last seen per shard; 0 = none yet
  std::atomic<int64_t> shard_restarts_{0};
  std::atomic<int64_t> training_pulls_{0};  // PullAsync's count of training pulls

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  int64_t ops_in_flight_ ABSL_GUARDED_BY(mu_) = 0;     // all operations (for the destructor)
  int64_t pushes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // push operations
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status push_error_ ABSL_GUARDED_BY(mu_);  // first push error since the last Flush
  Staleness staleness_ ABSL_GUARDED_BY(mu_);
  JobState job_ ABSL_GUARDED_BY(mu_);
  uint64_t job_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pstrain
