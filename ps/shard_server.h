// ShardServer: parameter-server shard s of S. It holds
//   - one EmbeddingStore per table partition it owns (PartitionMap(V, P, S).PartitionsOfShard(s));
//   - one DenseStore for its slice of the flat dense vector: the vector is split by size into S
//     contiguous slices exactly like rows (PartitionMap(dense_size, S, S), slice s on shard s; the
//     first dense_size mod S slices get one extra float). A shard with an empty slice has none.
// and answers the ParameterServer gRPC service (proto/pstrain/ps_service.proto) with the gRPC
// callback API: each handler does its work (gather, or the optimizer update) on the gRPC thread
// that delivered the request and finishes the reactor before returning; nothing ever waits
// inside a handler, except on the per-row locks of the stores and, for a push that is a retry
// of one still being applied, on that push.
//
// Push idempotence: a push carries (worker_id, incarnation, sequence). The shard keeps, per
// (worker_id, incarnation), the last sequence it applied, and answers a push whose sequence is
// not above it with OK and `duplicate` without applying it. A worker's pushes to one shard must
// therefore arrive in sequence order (PsClient sends them one at a time per shard). Sequence 0
// opts out (always applied).
//
// Consistency: ASYNC only (every pull sees whatever has been applied). The BOUNDED and SYNC
// modes of DESIGN.md are not implemented; the wire protocol reserves their fields.
//
// Checkpoints (ps/shard_checkpoint.cc; protocol in docs/CHECKPOINT.md "PS mode"): every shard
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
#include "ps/dense_store.h"
#include "ps/embedding_store.h"
#include "ps/partition.h"
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
  };

  // Options of shard `shard` of `num_shards` from a job config: the partitions
  // (NumPartitions(config.cluster(), num_shards)) and the sparse and dense optimizers. The caller
  // sets row_init and dense_init (Model::InitRow / InitDense with the job's seed).
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
  // Stops accepting calls, lets calls in progress finish until `grace` has passed, cancels the
  // rest, and waits for the handlers to return. Idempotent.
  void Shutdown(absl::Duration grace);

  // The service's operations, callable in-process (the gRPC handlers call these).
  // Pull: rows of request.ids (owned by this shard) and optionally the dense slice.
  absl::Status Pull(const PullRequest& request, PullResponse* response);
  // Push: applies the gradients once per push id (see above). Nothing is applied when the
  // request is invalid (sizes, foreign ids).
  absl::Status Push(const PushRequest& request, PushResponse* response);
  InfoResponse Info() const;
  ShardStats Stats() const;

  // ---- Job coordination (shard 0; ps/shard_checkpoint.cc, docs/CHECKPOINT.md "PS mode") ----
  // The Coordinate RPC: dispatches on request.kind to the methods below. FAILED_PRECONDITION on
  // a shard other than 0.
  absl::Status Coordinate(const CoordinateRequest& request, CoordinateResponse* response);
  // Report records a worker's phase (the Report RPC); Reports returns those of `phase`, by worker.
  void Report(const ReportRequest& report);
  std::vector<ReportRequest> Reports(JobPhase phase) const;
  void FinishJob();
  // RequestCheckpoint opens a round unless one is open for arrivals and returns the open round;
  // `stop` marks it as the job's last. ArriveCheckpoint records a paused worker's state
  // (FAILED_PRECONDITION if `round` is not open). CollectArrivals fills out->worker_states with
  // the state each of workers 0..n-1 arrived with in `round` (a worker that reported
  // TRAINING_DONE stands in with its final state) and out->missing with the others;
  // FAILED_PRECONDITION if `round` is not the open round. ReleaseCheckpoint lets the arrived
  // workers go on (after every shard's COPY); CompleteCheckpoint publishes the result.
  int64_t RequestCheckpoint(bool stop);
  absl::Status ArriveCheckpoint(int64_t round, int worker, std::string state);
  absl::Status CollectArrivals(int64_t round, int n, CoordinateResponse* out) const;
  void ReleaseCheckpoint(int64_t round);
  void CompleteCheckpoint(int64_t round, const std::string& dir, const std::string& error);

  // ---- Checkpoint files (every shard; ps/shard_checkpoint.cc) ----
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

  explicit ShardServer(Options options);
  // Splits ids into runs of one store each; INVALID_ARGUMENT naming the first id that is out of
  // range or owned by another shard (and its owner).
  absl::Status Route(absl::Span<const int64_t> ids, std::vector<Run>* runs) const;
  PushState* PushStateOf(int32_t worker_id, uint64_t incarnation);
  int64_t LastStep() const;

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

  mutable absl::Mutex job_mu_;
  // phase -> worker id -> its latest report
  std::map<int, std::map<int, ReportRequest>> reports_ ABSL_GUARDED_BY(job_mu_);
  bool job_finished_ ABSL_GUARDED_BY(job_mu_) = false;

  // Checkpoint rounds (coordinator), under job_mu_.
  int64_t ckpt_round_ ABSL_GUARDED_BY(job_mu_) = 0;
  bool ckpt_stop_ ABSL_GUARDED_BY(job_mu_) = false;
  std::map<int, std::string> ckpt_arrivals_ ABSL_GUARDED_BY(job_mu_);
  int64_t ckpt_released_ ABSL_GUARDED_BY(job_mu_) = 0;
  int64_t ckpt_done_ ABSL_GUARDED_BY(job_mu_) = 0;
  std::string ckpt_done_dir_ ABSL_GUARDED_BY(job_mu_);
  std::string ckpt_error_ ABSL_GUARDED_BY(job_mu_);
  std::string restored_from_ ABSL_GUARDED_BY(job_mu_);
  // The snapshot between COPY and WRITE.
  std::mutex snap_mu_;
  int64_t snap_round_ = 0;
  std::vector<EmbeddingSnapshot> snap_stores_;
  std::unique_ptr<DenseSnapshot> snap_dense_;

  absl::Mutex server_mu_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  bool shut_down_ ABSL_GUARDED_BY(server_mu_) = false;
  int port_ = 0;
};

// Table partitions P of a cluster: cluster.num_partitions, or 4 x shards when it is 0.
int NumPartitions(const ClusterConfig& cluster, int shards);

// A table of per-shard stats and the max/mean imbalance of rows, bytes, pulled rows and traffic,
// for the user to see a skewed shard at a glance. Several lines, no trailing newline.
std::string FormatShardBalance(const std::vector<ShardStats>& stats);

}  // namespace pstrain
