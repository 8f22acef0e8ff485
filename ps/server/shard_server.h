// ShardServer: parameter-server shard s of S as a gRPC service (the ParameterServer service of
// proto/pstrain/ps_service.proto, callback API). It owns three parts, each with one job and its
// own lock, and wires them to the service:
//   - Shard (ps/server/shard.h): the stores of the partitions it owns and its dense slice, id
//     routing, gather / apply, push idempotence, stats, its checkpoint file;
//   - ConsistencyTracker (ps/server/consistency_tracker.h): the BOUNDED / SYNC bookkeeping and
//     the held (deferred) training pulls;
//   - JobCoordinator (ps/server/job_coordinator.h): shard 0's job state (reports, the end of the
//     job, checkpoint rounds) and the held long-polls on it.
// The handlers do their work (gather, or the optimizer update) on the gRPC thread that delivered
// the request; nothing ever waits inside a handler, except on the per-row locks of the stores and,
// for a push that is a retry of one still being applied, on that push. Calls that must wait are
// reactors kept in a list: a pull until its answer's bytes fit the answer budget (AnswerBudget),
// a BOUNDED / SYNC training pull first until its step may be answered (the tracker), an Info or Coordinate (COLLECT, REPORTS) call with a watch until the job state changes
// or its hold expires (the coordinator: a long-poll, at most 10 s and never past the call's
// deadline). A SaveShard WRITE writes its file on a thread of its own.
//
// In BOUNDED / SYNC, shard 0's answer to a training pull carries its job state (PullResponse.job),
// so that the workers learn of checkpoint rounds from the traffic of their steps (docs/PS.md).
//
// Every request is hostile (docs/PS.md "Operations and security"): the cluster secret is checked
// on a call's headers, before its message is read (MakeServerCredentials: a call without it is
// cancelled UNAUTHENTICATED there, so no unauthenticated peer makes the shard buffer or parse a
// message), and again first thing in each handler (the in-process channel has no credentials;
// UNAUTHENTICATED, nothing read or changed); messages are capped at security.max_message_bytes
// both ways (a pull whose answer would exceed it is refused before it is gathered), and the
// answers of pulls in flight share one budget of bytes (AnswerBudget, cluster.answer_budget_mb:
// a pull waits for its bytes, in arrival order); steps must lie within kMaxStepsAhead of what the
// shard saw of the worker (ASYNC: 2^32 past the largest step pushed); worker ids within
// [0, num_workers) (pushes, training pulls, and every coordination call); non-finite gradients,
// and pushes naming a row twice, are refused (INVALID_ARGUMENT, the former counted in
// Stats().nonfinite_pushes) before anything is applied; checkpoint files are written only under
// options.checkpoint_dir, in a directory named ckpt-<step> that is not committed. Held calls
// never outlive kMaxHold. Shard 0 keeps the workers' leases (JobCoordinator): calls naming a
// worker renew its lease.
//
// Thread-safety: all public methods may be called concurrently.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/security.h"
#include "common/rpc/timer.h"
#include "ps/server/answer_budget.h"
#include "ps/server/consistency_tracker.h"
#include "ps/server/job_coordinator.h"
#include "ps/server/shard.h"
#include "pstrain/config.pb.h"
#include "ps/server/shard_metrics.h"
#include "pstrain/ps_service.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

class ShardServer {
 public:
  struct Options {
    // The table, its optimizers and checkpoint directory: the Shard's own options (shard,
    // num_shards, rows, partitions, row_dim, dense_size, the optimizers, row_init / dense_init,
    // threads, checkpoint_dir; ps/server/shard.h). SaveShard WRITE writes only under
    // data.checkpoint_dir (empty: this shard writes no checkpoint, FAILED_PRECONDITION).
    // data.env is the clock of the whole server: its timer, tracker, coordinator and metrics.
    Shard::Options data;
    // Consistency mode (ConsistencyTracker) and the workers it serves: worker ids
    // [0, num_workers), in every mode (pushes and training pulls from other ids are refused).
    Consistency consistency = ASYNC;
    int num_workers = 1;  // N >= 1
    int staleness = 0;    // BOUNDED: s >= 0
    // The cluster secret (empty: calls are not authenticated), TLS, and the message cap.
    RpcSecurity security;
    // Shard 0: a worker not heard of for this long is lost (JobCoordinator).
    absl::Duration lease = absl::Seconds(30);
    // The bytes of pull answers in flight at once (AnswerBudget; cluster.answer_budget_mb): 0 =
    // twice security.max_message_bytes; else at least max_message_bytes.
    int64_t answer_budget_bytes = 0;
  };
  // The longest a watched Info / Coordinate call is held.
  static constexpr absl::Duration kMaxWatch = absl::Seconds(10);
  // How far a request's step may lie beyond the steps this shard has seen of the worker (its
  // pushes' in BOUNDED / SYNC; the largest step pushed for a checkpoint round's target).
  static constexpr int64_t kMaxStepsAhead = 1000;

  // Options of shard `shard` of `num_shards` from a job config: the partitions
  // (NumPartitions(config.cluster(), num_shards)), the sparse and dense optimizers, and
  // cluster.consistency / staleness with num_workers = num_shards (a PS job runs one worker and
  // one shard per host). The caller sets data.row_init and data.dense_init (Model::InitRow /
  // InitDense with the job's seed).
  static Options OptionsFromConfig(const Config& config, int shard, int num_shards, int64_t rows,
                                   int row_dim, int64_t dense_size);

  // Creates the stores (INVALID_ARGUMENT for bad options naming the field, or for a bad optimizer
  // config). The shard is not listening yet: the in-process operations below work.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Create(Options options);
  // Shuts down (Shutdown(absl::ZeroDuration())) if still serving.
  ~ShardServer();
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // Starts serving gRPC on `address` ("host:port", "[v6]:port"; port 0 picks a free port, see
  // port()). INVALID_ARGUMENT for an IPv6 address without brackets ("::1:5000" is ambiguous);
  // UNAVAILABLE naming the address if it cannot listen (e.g. the port is taken: SO_REUSEPORT is
  // off, so two shards never share a port). Call at most once.
  absl::Status Start(const std::string& address);
  // The address Start takes for a bind address (a host name, an IPv4 address, or an IPv6 one,
  // bracketed or not) and a port: "[::1]:5000" for ::1.
  static std::string ListenAddress(const std::string& bind, int port);
  // The port Start bound (0 before Start).
  int port() const { return port_; }
  // A channel to this server that stays in the process (no TCP), for a worker in the same
  // process (`pstrain host`); messages are still serialized. Call after Start; null before.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // Answers the held pulls and watches UNAVAILABLE, stops accepting calls, lets calls in progress
  // finish until `grace` has passed, cancels the rest, and waits for the handlers to return.
  // Idempotent.
  void Shutdown(absl::Duration grace);

  // ---- The service's operations, callable in-process (the gRPC handlers call these) ----
  // Pull: rows of request.ids (owned by this shard) and optionally the dense slice, at once (only
  // the gRPC service holds pulls in BOUNDED / SYNC mode); in BOUNDED / SYNC shard 0 adds its job
  // state to a training pull's answer.
  absl::Status Pull(const PullRequest& request, PullResponse* response);
  // Push: applies the gradients once per push id (Shard; in SYNC mode keeps them for the step's
  // mean), or records worker_done. Nothing is applied when the request is invalid (sizes,
  // foreign ids; in BOUNDED / SYNC a worker id outside [0, num_workers); in SYNC a step already
  // applied or a push after worker_done: FAILED_PRECONDITION).
  absl::Status Push(const PushRequest& request, PushResponse* response);
  // The fast path for a worker in this process (`pstrain host`) on an ASYNC shard: Pull and Push
  // on the caller's buffers, without messages or their copies (BOUNDED / SYNC hold pulls and
  // count pushes per step: use InProcessChannel() there; FAILED_PRECONDITION here). ids must be
  // owned by this shard (INVALID_ARGUMENT otherwise, nothing applied). PullDirect fills rows in
  // ids' order, each at its table's width as on the wire (Shard::RowFloats) and, if dense is not
  // null, dense[the slice size];
  // *staleness as PullResponse.staleness (0 for step 0), and *dense_version (if not null) as
  // PullResponse.dense_version. PushDirect applies row_grads (the same layout) and, if not
  // null, dense_grad[the slice size] computed from the slice's `dense_version` (-1: unknown) at
  // once (a call cannot be lost, so no push id). Both count in Stats() except bytes in/out
  // (nothing crosses a wire).
  // With per-row staleness (row_versions()), the rows' versions likewise.
  absl::Status PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows, float* dense,
                          int64_t* staleness, int64_t* dense_version = nullptr,
                          uint32_t* row_versions = nullptr);
  absl::Status PushDirect(int32_t worker_id, int64_t step, absl::Span<const int64_t> ids,
                          const float* row_grads, const float* dense_grad,
                          int64_t dense_version = -1, const uint32_t* row_versions = nullptr);
  bool row_versions() const { return opt_.data.scale_row_lr_by_staleness; }
  // The shard's map and state, with the job state of its coordinator and step = the tracker's
  // step (SYNC's applied step, else the largest step pushed).
  InfoResponse Info() const;
  ShardStats Stats() const;
  // The Coordinate RPC (JobCoordinator::Coordinate); FAILED_PRECONDITION on a shard other than 0;
  // INVALID_ARGUMENT for a round's target step more than kMaxStepsAhead past step().
  absl::Status Coordinate(const CoordinateRequest& request, CoordinateResponse* response);
  // The Report RPC (JobCoordinator::Report).
  absl::Status Report(const ReportRequest& report);
  // What the gRPC handler checks of a pull before it is held or answered: the answer's size
  // against the message cap (RESOURCE_EXHAUSTED), the step (ConsistencyTracker::CheckPullStep).
  absl::Status CheckPull(const PullRequest& request) const;
  // The bytes a pull's answer takes from the answer budget: its rows, its dense slice if asked,
  // and 1 KiB for the rest.
  int64_t AnswerBytes(const PullRequest& request) const;
  // Shard 0: a call of worker `worker_id` renews its lease.
  void Heard(int32_t worker_id);

  // ---- Checkpoints (docs/CHECKPOINT.md "PS mode") ----
  // COPY: the Shard's copy-on-write image of this instant, with this instant's Info as the
  // file's header and the tracker's bookkeeping (Shard::CopyForCheckpoint). WRITE:
  // Shard::WriteCheckpoint into <options.checkpoint_dir>/<name>.
  // `delta_parent`: an incremental checkpoint's parent step (SaveShardRequest.delta_parent_step);
  // `end_pass`, `step`: SaveShardRequest.end_pass and step (the pass's end, once per step).
  absl::Status CopyForCheckpoint(int64_t round,
                                 std::optional<int64_t> delta_parent = std::nullopt,
                                 bool end_pass = false, int64_t step = 0);
  absl::StatusOr<SaveShardResponse> WriteCheckpoint(int64_t round, const std::string& name);
  // Shard::RestoreCheckpoint, then the tracker's bookkeeping: exactly as saved when the
  // checkpoint has this shard's layout and workers, else every worker as having pushed the
  // checkpoint's step; records restored_from. `chain`: CheckpointChoice::chain (a full
  // checkpoint, or a delta with the checkpoints it builds on). Call before Start.
  absl::Status RestoreCheckpoint(absl::Span<const CheckpointLink> chain);
  // A warm start (docs/CHECKPOINT.md "Warm start"): the rows and dense values this shard owns from
  // another job's checkpoint of any shard count or mode, with its optimizer slots unless
  // `reset_optimizer`; the job's step and bookkeeping stay those of a fresh job (step 0). The
  // files must have been verified by the caller. Call before Start.
  // `tables`: a warm start across changed tables (ChooseWarmStartCheckpoint's plan).
  absl::Status WarmStart(absl::Span<const CheckpointLink> chain, bool reset_optimizer,
                         const std::optional<TableWarmStart>& tables = std::nullopt);

  // ---- The parts ----
  Shard& data() { return *data_; }
  const Shard& data() const { return *data_; }
  ConsistencyTracker& consistency() { return *tracker_; }
  const ConsistencyTracker& consistency() const { return *tracker_; }
  JobCoordinator& coordinator() { return *coordinator_; }
  const JobCoordinator& coordinator() const { return *coordinator_; }
  // Every gRPC pull's answer takes its bytes from it until sent (ps/server/answer_budget.h).
  const AnswerBudget& answer_budget() const { return *budget_; }

  // Shorthands of data()'s, for the commands' logs.
  const PartitionMap& map() const { return data_->map(); }
  int shard() const { return opt_.data.shard; }
  int64_t dense_begin() const { return data_->dense_begin(); }
  int64_t dense_slice_size() const { return data_->dense_slice_size(); }

 private:
  class Service;
  class PullMessages;
  class PullAllocator;
  class PullReactor;
  class WatchReactor;

  explicit ShardServer(Options options);
  // Pull's answer after the consistency wait: shard 0's job state (a BOUNDED / SYNC training
  // pull), then the Shard's gather.
  absl::Status Gather(const PullRequest& request, PullResponse* response);
  // When a call with `deadline` that asks to be held `watch_ms` is answered at the latest.
  absl::Time WatchUntil(absl::Time deadline, int64_t watch_ms) const;
  // When a pull with `deadline` stops waiting for the answer budget.
  absl::Time BudgetWaitUntil(absl::Time deadline) const;

  const Options opt_;
  const SecretChecker secret_;
  // Calls the credentials refused on their headers (added to Stats().unauthenticated_calls); shared
  // with gRPC's credentials, which may outlive this server.
  const std::shared_ptr<std::atomic<int64_t>> refused_before_message_ =
      std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<Shard> data_;
  std::unique_ptr<Timer> timer_;  // expiries of held pulls and watches
  std::unique_ptr<ConsistencyTracker> tracker_;
  std::unique_ptr<JobCoordinator> coordinator_;
  std::unique_ptr<AnswerBudget> budget_;  // of the gRPC pulls' answers

  absl::Mutex server_mu_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<ShardMetrics> metrics_;  // Prometheus (ps/server/shard_metrics.h)
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  bool shut_down_ ABSL_GUARDED_BY(server_mu_) = false;
  std::atomic<bool> writing_{false};  // a SaveShard WRITE thread runs
  int port_ = 0;
};

}  // namespace pstrain
