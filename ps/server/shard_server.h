// ShardServer: parameter-server shard s of S. It holds
//   - one EmbeddingStore per table partition it owns (PartitionMap(V, P, S).PartitionsOfShard(s));
//   - one DenseStore for its slice of the flat dense vector: the vector is split by size into S
//     contiguous slices exactly like rows (PartitionMap(dense_size, S, S), slice s on shard s; the
//     first dense_size mod S slices get one extra float). A shard with an empty slice has none.
// and answers the ParameterServer gRPC service (proto/pstrain/ps_service.proto) with the gRPC
// callback API: each handler does its work (gather, or the optimizer update) on the gRPC thread
// that delivered the request; nothing ever waits inside a handler, except on the per-row locks of
// the stores and, for a push that is a retry of one still being applied, on that push.
//
// Push idempotence: a push carries (worker_id, incarnation, sequence). The shard keeps, per
// (worker_id, incarnation), the last sequence it applied, and answers a push whose sequence is
// not above it with OK and `duplicate` without applying it. A worker's pushes to one shard must
// therefore arrive in sequence order (PsClient sends them one at a time per shard). Sequence 0
// opts out (always applied).
//
// Consistency (Options.consistency, docs/PS.md). The shard tracks, per worker in
// [0, num_workers), the last step it pushed here and whether it has finished (a push with
// worker_done). A pull carries the step it is for (0 = not a training pull: answered at once).
//   ASYNC:   pushes are applied as they come, pulls answered at once.
//   BOUNDED: pushes are applied as they come; the pull of step t is held until every active
//            (not finished) worker has pushed step t - 1 - staleness (stale-synchronous parallel).
//   SYNC:    the pushes of step t are kept until every active worker has pushed step t, then the
//            mean of their gradients is applied once (rows summed by id, missing rows count 0,
//            divided by the number of pushes); the pull of step t is held until step t - 1 is
//            applied. Pushes are answered as soon as they are kept, never held.
// A held pull is a reactor kept in a list (no thread blocked); the push or worker_done that
// satisfies it answers it. A cancelled pull (client gone, deadline) is removed and finished
// once; shortly before its deadline a held pull is answered DEADLINE_EXCEEDED with a message
// naming the step and the workers it waits for, so the client's error says why. A worker must
// push its steps 1, 2, ... in order (PsClient does), to every shard in BOUNDED and SYNC modes.
//
// Checkpoints (ps/server/shard_checkpoint.cc; protocol in docs/CHECKPOINT.md "PS mode"): every shard
// copies its state into memory when asked (COPY, while all workers are paused, so the copy is
// one consistent instant of the whole cluster) and writes it as ckpt-<step>/shard-<i>-of-<S>
// (WRITE, while training goes on). Shard 0 also coordinates the rounds: workers request a
// round, arrive in it with their WorkerState, and the chief collects them. A shard restores
// from any checkpoint's shard files, whatever their shard count (re-partitioning).
//
// Thread-safety: all public methods may be called concurrently.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/timer.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/partition.h"
#include "pstrain/config.pb.h"
#include "pstrain/ps_service.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

// Fills dense[dense_size], the whole flat dense vector (each shard keeps its slice). Typically
// Model::InitDense with the job's seed.
using DenseInit = std::function<void(float* dense)>;

class ShardServer {
 public:
  struct Options {
    int shard = 0;           // s in [0, num_shards)
    int num_shards = 1;      // S
    int64_t rows = 0;        // V, the table's rows, > 0
    int partitions = 1;      // P >= 1 (P < S leaves some shards without rows)
    int row_dim = 0;         // floats per row, > 0
    int64_t dense_size = 0;  // floats of the whole dense vector, >= 0
    OptimizerConfig sparse_optimizer;
    OptimizerConfig dense_optimizer;
    RowInit row_init;  // null = zeros; must be a pure function of the row id (see EmbeddingStore)
    DenseInit dense_init;  // null = zeros
    // OpenMP threads one request's gather/update is split over. gRPC already runs requests on
    // several threads, so 1 (the default) avoids oversubscribing cores.
    int threads = 1;
    // Consistency mode (see above) and the workers it waits for: worker ids [0, num_workers).
    // ASYNC accepts any worker id (ids outside the range are not tracked).
    Consistency consistency = ASYNC;
    int num_workers = 1;  // N >= 1
    int staleness = 0;    // BOUNDED: s >= 0
  };

  // Options of shard `shard` of `num_shards` from a job config: the partitions
  // (NumPartitions(config.cluster(), num_shards)), the sparse and dense optimizers, and
  // cluster.consistency / staleness with num_workers = num_shards (a PS job runs one worker and
  // one shard per host). The caller sets row_init and dense_init (Model::InitRow / InitDense with
  // the job's seed).
  static Options OptionsFromConfig(const Config& config, int shard, int num_shards, int64_t rows,
                                   int row_dim, int64_t dense_size);

  // Creates the stores (INVALID_ARGUMENT for bad options naming the field, or for a bad optimizer
  // config). The shard is not listening yet: Pull/Push/Info/Stats work in-process.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Create(Options options);
  // Shuts down (Shutdown(absl::ZeroDuration())) if still serving.
  ~ShardServer();
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // Starts serving gRPC on `address` ("host:port"; port 0 picks a free port, see port()).
  // UNAVAILABLE naming the address if it cannot listen (e.g. the port is taken: SO_REUSEPORT is
  // off, so two shards never share a port). Call at most once.
  absl::Status Start(const std::string& address);
  // The port Start bound (0 before Start).
  int port() const { return port_; }
  // A channel to this server that stays in the process (no TCP), for a worker in the same
  // process (`pstrain host`); messages are still serialized. Call after Start; null before.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // Answers the held pulls UNAVAILABLE, stops accepting calls, lets calls in progress finish
  // until `grace` has passed, cancels the rest, and waits for the handlers to return. Idempotent.
  void Shutdown(absl::Duration grace);

  // The service's operations, callable in-process (the gRPC handlers call these).
  // Pull: rows of request.ids (owned by this shard) and optionally the dense slice, at once (only
  // the gRPC service holds pulls in BOUNDED / SYNC mode).
  absl::Status Pull(const PullRequest& request, PullResponse* response);
  // Push: applies the gradients once per push id (see above; in SYNC mode keeps them for the
  // step's mean), or records worker_done. Nothing is applied when the request is invalid (sizes,
  // foreign ids; in BOUNDED / SYNC a worker id outside [0, num_workers); in SYNC a step already
  // applied or a push after worker_done: FAILED_PRECONDITION).
  absl::Status Push(const PushRequest& request, PushResponse* response);
  // The fast path for a worker in this process (`pstrain host`) on an ASYNC shard: Pull and Push
  // on the caller's buffers, without messages or their copies (BOUNDED / SYNC hold pulls and
  // count pushes per step: use InProcessChannel() there; FAILED_PRECONDITION here). ids must be
  // owned by this shard (INVALID_ARGUMENT otherwise, nothing applied). PullDirect fills
  // rows[ids.size() x row_dim] in ids' order and, if dense is not null, dense[the slice size];
  // *staleness as PullResponse.staleness (0 for step 0). PushDirect applies row_grads[ids.size()
  // x row_dim] and, if not null, dense_grad[the slice size] at once (a call cannot be lost, so
  // no push id). Both count in Stats() except bytes in/out (nothing crosses a wire).
  absl::Status PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows, float* dense,
                          int64_t* staleness);
  absl::Status PushDirect(int32_t worker_id, int64_t step, absl::Span<const int64_t> ids,
                          const float* row_grads, const float* dense_grad);
  // SYNC: the last step whose mean update has been applied (0 before the first).
  // Info().step: SYNC's applied step, else the largest step pushed. ResumeSteps sets the step
  // bookkeeping of BOUNDED / SYNC after a restore (every worker as having pushed `step`).
  int64_t consistency_step() const;
  void ResumeSteps(int64_t step);
  // The whole BOUNDED / SYNC bookkeeping, for checkpoints of a job that resumes with the same
  // workers and shards (RestoreConsistency: INVALID_ARGUMENT for another worker count).
  ConsistencyState SaveConsistency() const;
  absl::Status RestoreConsistency(const ConsistencyState& state);
  int64_t applied_step() const;
  InfoResponse Info() const;
  ShardStats Stats() const;

  // ---- Job coordination (shard 0; ps/server/shard_checkpoint.cc, docs/CHECKPOINT.md "PS mode") ----
  // The Coordinate RPC: dispatches on request.kind to the methods below. FAILED_PRECONDITION on
  // a shard other than 0.
  absl::Status Coordinate(const CoordinateRequest& request, CoordinateResponse* response);
  // Report records a worker's phase (the Report RPC); Reports returns those of `phase`, by worker.
  void Report(const ReportRequest& report);
  std::vector<ReportRequest> Reports(JobPhase phase) const;
  void FinishJob();
  // RequestCheckpoint opens a round unless one is open for arrivals and returns the open round;
  // `stop` marks it as the job's last; a new round takes `target_step` (0: none). ArriveCheckpoint records a paused worker's state
  // (FAILED_PRECONDITION if `round` is not open). CollectArrivals fills out->worker_states with
  // the state each of workers 0..n-1 arrived with in `round` (a worker that reported
  // TRAINING_DONE stands in with its final state) and out->missing with the others;
  // FAILED_PRECONDITION if `round` is not the open round. ReleaseCheckpoint lets the arrived
  // workers go on (after every shard's COPY); CompleteCheckpoint publishes the result.
  int64_t RequestCheckpoint(bool stop, int64_t target_step = 0);
  absl::Status ArriveCheckpoint(int64_t round, int worker, std::string state);
  absl::Status CollectArrivals(int64_t round, int n, CoordinateResponse* out) const;
  void ReleaseCheckpoint(int64_t round);
  void CompleteCheckpoint(int64_t round, const std::string& dir, const std::string& error);

  // ---- Checkpoint files (every shard; ps/server/shard_checkpoint.cc) ----
  // CopyForCheckpoint snapshots the stores and the dense slice into memory (each row
  // consistent; the caller pauses the writers for a cluster-wide instant) and returns the rows
  // copied. WriteCheckpoint writes that copy to <dir>/shard-<i>-of-<S> (block file: SHRD, then
  // EMBM/EMBR groups, then DNSE) and frees it; returns the file name and size.
  // FAILED_PRECONDITION when no copy of `round` is held.
  absl::StatusOr<int64_t> CopyForCheckpoint(int64_t round);
  absl::StatusOr<SaveShardResponse> WriteCheckpoint(int64_t round, const std::string& dir);
  // Restores rows and dense values from every shard file the manifest lists (any shard count:
  // rows this shard does not own are skipped, dense slices are cut to this shard's). Call before
  // Start. The files must have been verified (checksums) by the caller; FAILED_PRECONDITION if
  // they were written for another shape (rows, row_dim, dense size, optimizer).
  absl::Status RestoreCheckpoint(const std::string& ckpt_dir, const CheckpointManifest& manifest);
  static std::string ShardFileName(int shard, int num_shards);

  const PartitionMap& map() const { return map_; }
  int shard() const { return opt_.shard; }
  int64_t dense_begin() const { return dense_begin_; }
  int64_t dense_slice_size() const { return dense_slice_size_; }
  // Stores of the owned partitions, ascending by partition (partition shard + i * num_shards).
  const std::vector<std::unique_ptr<EmbeddingStore>>& stores() const { return stores_; }
  // The dense slice, or null if this shard's slice is empty.
  DenseStore* dense() const { return dense_.get(); }
  uint64_t incarnation() const { return incarnation_; }

 private:
  class Service;
  // A run of request ids [begin, end) that all belong to stores_[store].
  struct Run {
    int store;
    int64_t begin, end;
  };
  struct PushState {  // the last push applied for one (worker_id, incarnation)
    std::mutex mu;    // held while that worker's push is applied (serializes a retry with it)
    uint64_t last_sequence = 0;
  };
  class DeferredPull;
  struct SyncPush {  // SYNC: one worker's gradients for a step not applied yet
    std::vector<int64_t> ids;
    std::vector<float> row_grads, dense_grad;
  };

  explicit ShardServer(Options options);
  // Splits ids into runs of one store each; INVALID_ARGUMENT naming the first id that is out of
  // range or owned by another shard (and its owner).
  absl::Status Route(absl::Span<const int64_t> ids, std::vector<Run>* runs) const;
  PushState* PushStateOf(int32_t worker_id, uint64_t incarnation);
  int64_t LastStep() const;
  // The work of Pull after the staleness: gather and stats.
  absl::Status Gather(const PullRequest& request, PullResponse* response);
  // Rows of `ids` into rows[ids.size() x row_dim], the dense slice into dense if not null; counts
  // the pull.
  absl::Status GatherInto(absl::Span<const int64_t> ids, float* rows, float* dense);
  // Applies a routed ASYNC / BOUNDED push and notes the worker's step.
  absl::Status ApplyUpdate(absl::Span<const int64_t> ids, const std::vector<Run>& runs,
                           const float* grads, const float* dense_grad, int32_t worker_id,
                           int64_t step);

  // Consistency (sync_mu_).
  bool Tracked(int32_t worker_id) const { return worker_id >= 0 && worker_id < opt_.num_workers; }
  // Smallest step pushed by an active worker; INT64_MAX when every worker has finished.
  int64_t MinActivePushedLocked() const ABSL_SHARED_LOCKS_REQUIRED(sync_mu_);
  bool PullReadyLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(sync_mu_);
  int64_t StalenessLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(sync_mu_);
  // Why a pull of `step` is still held (for its DEADLINE_EXCEEDED message).
  std::string WaitingForLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(sync_mu_);
  // The gRPC Pull in BOUNDED / SYNC mode: answers `pull` now if it may be, else holds it (and
  // arms its expiry shortly before `deadline`).
  void HoldOrAnswer(DeferredPull* pull, absl::Time deadline);
  // Answers the held pulls that may be answered now.
  void ReleaseReady();
  // Takes held pull `id` off the list (if still there) and finishes it with `status`, or with
  // DEADLINE_EXCEEDED saying what it waits for when `expired`.
  void DropHeld(uint64_t id, grpc::Status status, bool expired);
  // Gathers the answer of a pull that is not (or no longer) held and finishes it.
  void Answer(DeferredPull* pull, int64_t staleness);
  absl::Status MarkDone(const PushRequest& request, PushResponse* response);
  // SYNC: keeps a push for its step's mean; *duplicate if the worker had pushed that step.
  absl::Status KeepSyncPush(const PushRequest& request, absl::Span<const int64_t> ids,
                            absl::Span<const float> grads, absl::Span<const float> dense_grad,
                            bool* duplicate);
  // SYNC: applies every complete step in order, then answers the pulls that may be answered.
  void AdvanceSync();
  void ApplyMean(int64_t step, const std::map<int, SyncPush>& pushes);

  const Options opt_;
  const PartitionMap map_;
  int64_t dense_begin_ = 0;
  int64_t dense_slice_size_ = 0;
  std::vector<std::unique_ptr<EmbeddingStore>> stores_;
  std::unique_ptr<DenseStore> dense_;
  const uint64_t incarnation_;
  const absl::Time start_time_;

  absl::Mutex push_mu_;
  absl::flat_hash_map<std::pair<int32_t, uint64_t>, std::unique_ptr<PushState>> push_states_
      ABSL_GUARDED_BY(push_mu_);

  std::atomic<int64_t> pull_requests_{0}, push_requests_{0}, duplicate_pushes_{0};
  std::atomic<int64_t> pull_rows_{0}, push_rows_{0}, bytes_in_{0}, bytes_out_{0};

  // Consistency state (see the class comment).
  mutable absl::Mutex sync_mu_;
  std::vector<int64_t> pushed_ ABSL_GUARDED_BY(sync_mu_);  // per worker: last step pushed here
  std::vector<bool> done_ ABSL_GUARDED_BY(sync_mu_);       // per worker: sent worker_done
  int64_t applied_ ABSL_GUARDED_BY(sync_mu_) = 0;          // SYNC: last step applied
  bool applying_ ABSL_GUARDED_BY(sync_mu_) = false;        // SYNC: a thread is applying a step
  // SYNC: step -> worker -> its push of that step.
  std::map<int64_t, std::map<int, SyncPush>> sync_steps_ ABSL_GUARDED_BY(sync_mu_);
  std::map<uint64_t, DeferredPull*> held_ ABSL_GUARDED_BY(sync_mu_);  // by hold id
  uint64_t next_hold_id_ ABSL_GUARDED_BY(sync_mu_) = 0;
  bool holding_stopped_ ABSL_GUARDED_BY(sync_mu_) = false;  // Shutdown: hold nothing more
  std::unique_ptr<Timer> timer_;                            // expiry of held pulls (not ASYNC)

  mutable absl::Mutex job_mu_;
  // phase -> worker id -> its latest report
  std::map<int, std::map<int, ReportRequest>> reports_ ABSL_GUARDED_BY(job_mu_);
  bool job_finished_ ABSL_GUARDED_BY(job_mu_) = false;

  // Checkpoint rounds (coordinator), under job_mu_.
  int64_t ckpt_round_ ABSL_GUARDED_BY(job_mu_) = 0;
  bool ckpt_stop_ ABSL_GUARDED_BY(job_mu_) = false;
  int64_t ckpt_target_ ABSL_GUARDED_BY(job_mu_) = 0;
  std::map<int, std::string> ckpt_arrivals_ ABSL_GUARDED_BY(job_mu_);
  int64_t ckpt_released_ ABSL_GUARDED_BY(job_mu_) = 0;
  int64_t ckpt_done_ ABSL_GUARDED_BY(job_mu_) = 0;
  std::string ckpt_done_dir_ ABSL_GUARDED_BY(job_mu_);
  std::string ckpt_error_ ABSL_GUARDED_BY(job_mu_);
  std::string restored_from_ ABSL_GUARDED_BY(job_mu_);
  // The snapshot between COPY and WRITE.
  std::mutex snap_mu_;
  int64_t snap_round_ = 0;
  std::string snap_header_;  // InfoResponse at the copy
  std::string snap_consistency_;  // ConsistencyState at the copy
  std::vector<EmbeddingSnapshot> snap_stores_;
  std::unique_ptr<DenseSnapshot> snap_dense_;

  absl::Mutex server_mu_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  bool shut_down_ ABSL_GUARDED_BY(server_mu_) = false;
  int port_ = 0;
};

}  // namespace pstrain
