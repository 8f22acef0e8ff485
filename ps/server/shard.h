// Shard: the parameters PS shard s of S holds, and the work on them:
//   - one EmbeddingStore per table partition it owns (PartitionMap(V, P, S).PartitionsOfShard(s)),
//     at its table's width with named tables (RowFloats);
//   - one DynamicEmbeddingStore per dynamic table (issue 28), holding the keys this shard owns
//     by hash (DynamicShardOf, ps/store/dynamic_routing.h); their rows travel as negative ids
//     (common/dynamic_rows.h) and are stored and sent at 1 + the table's dim floats;
//   - one DenseStore for its slice of the flat dense vector: the vector is split by size into S
//     contiguous slices exactly like rows (PartitionMap(dense_size, S, S), slice s on shard s; the
//     first dense_size mod S slices get one extra float). A shard with an empty slice has none;
//   - routing of global row ids to its stores (and refusal of foreign ids, naming their owner);
//   - gather (pulls) and apply (pushes) through the stores' optimizers;
//   - push idempotence: a push carries (worker_id, incarnation, sequence); the shard keeps, per
//     (worker_id, incarnation), the last sequence it applied, and a push whose sequence is not
//     above it is a duplicate (BeginPush). A worker's pushes to one shard must therefore arrive in
//     sequence order (PsClient sends them one at a time per shard). Sequence 0 opts out;
//   - the counters of Stats();
//   - its checkpoint file (ps/server/shard_checkpoint.cc): a copy of the stores in memory
//     (COPY, while every worker is paused), written as <dir>/shard-<s>-of-<S> later (WRITE), and
//     the restore from any checkpoint's shard files, whatever their shard count.
// It knows nothing of consistency modes, job coordination or gRPC (ps/server/shard_server.h
// composes those).
//
// Memory: the stores (rows take memory once trained), the dense slice and its optimizer state,
// one small PushState per (worker, incarnation) that pushed with a sequence (at most
// kIncarnationsPerWorker per worker and kMaxPushWorkers workers), and between COPY and WRITE a
// full copy of the stores and the dense slice.
//
// Thread-safety: every method may be called concurrently. The stores lock their rows; the dense
// store locks itself; push_mu_ guards the map of push states and each PushState's own mutex
// serializes one worker incarnation's pushes; snap_mu_ guards the checkpoint copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
#include "checkpoint/layout.h"
#include "common/env.h"
#include "ps/store/dense_store.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/partition.h"
#include "ps/store/store_blocks.h"
#include "pstrain/config.pb.h"
#include "pstrain/ps_service.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

// Fills dense[dense_size], the whole flat dense vector (each shard keeps its slice). Typically
// Model::InitDense with the job's seed.
using DenseInit = std::function<void(float* dense)>;

class Shard {
 public:
  struct Options {
    int shard = 0;           // s in [0, num_shards)
    int num_shards = 1;      // S
    int64_t rows = 0;        // V, the table's rows, > 0
    int partitions = 1;      // P >= 1 (P < S leaves some shards without rows)
    // Tables with partitions of their own (PartitionMap's TableSplit, in row order; their rows
    // sum to `rows` and their partitions, clamped to their rows, to `partitions`). Empty: one
    // table of `rows` rows in `partitions` partitions.
    std::vector<PartitionMap::TableSplit> table_splits;
    // Floats per row the model sees (the stride), > 0; a table split's row_dim below it gives
    // that table's stores, pulls and pushes its own width (RowFloats).
    int row_dim = 0;
    int64_t dense_size = 0;  // floats of the whole dense vector, >= 0
    OptimizerConfig sparse_optimizer;
    OptimizerConfig dense_optimizer;
    RowInit row_init;      // null = zeros; a pure function of the row id (see EmbeddingStore)
    // The tables with optimizer settings of their own (EmbeddingStore::Options::
    // range_optimizers, ps/store/table_rows.h); empty: every row uses sparse_optimizer.
    std::vector<EmbeddingStore::Options::RangeOptimizer> range_optimizers;
    DenseInit dense_init;  // null = zeros
    int threads = 1;       // OpenMP threads one request's gather / update is split over
    // The dynamic tables, by dynamic index (common/dynamic_rows.h DynamicTableOf): the options of
    // each one's store on every shard (the same on all: each holds its share of the keys, so
    // max_rows / max_bytes are per shard). dim: 1 + the table's dim, <= row_dim. A null optimizer
    // takes sparse_optimizer's; threads 0 takes `threads`. At most kMaxDynamicTables.
    std::vector<DynamicEmbeddingStore::Options> dynamic_tables;
    // The dynamic tables' names (the table names of the config), by dynamic index: what their
    // block groups in the checkpoint file are called and matched by on restore. Empty, or one
    // shorter than dynamic_tables: "dynamic-<index>" for the rest.
    std::vector<std::string> dynamic_names;
    // When the dynamic stores evict (Evict: TTL, then the per-shard cap). > 0: right after the
    // shard applies a step that is a multiple of it (the first push of that step in ASYNC /
    // BOUNDED; SYNC's one mean update, so that a resumed job evicts exactly where an
    // uninterrupted one does), never at a checkpoint's COPY. 0: at every COPY (a stop's
    // included: not resume-exact). ps_setup: checkpoint.every_steps, the chief's schedule.
    int64_t dynamic_evict_every_steps = 0;
    // ASYNC: a dense push's learning rate / its staleness (DenseStore::scale_lr_by_staleness).
    bool scale_dense_lr_by_staleness = false;
    // ASYNC: rows keep versions; a row update's learning rate / its staleness
    // (EmbeddingStore::row_versions).
    bool scale_row_lr_by_staleness = false;
    // The job's checkpoint directory; WriteCheckpoint writes only under it. Empty: no writes.
    std::string checkpoint_dir;
    // A push with a gradient value of larger magnitude is refused (cluster.max_gradient_abs).
    float max_gradient_abs = 1e6f;
    // The clocks (Stats' uptime; the incarnation's seed); must outlive the shard.
    Env* env = Env::Default();
  };
  // Push states kept per worker id: the newest incarnations' (a restarted worker process is a
  // new incarnation). Older ones are forgotten: only a dead process's retries could need them.
  static constexpr int kIncarnationsPerWorker = 4;
  // Worker ids with push states at most; pushes of further ids are refused RESOURCE_EXHAUSTED.
  static constexpr int kMaxPushWorkers = 4096;

  // Creates the stores. INVALID_ARGUMENT for bad options (naming the field) or a bad optimizer
  // config.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(Options options);
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // A run of ids [begin, end) of one call that all belong to stores()[store], or, when dynamic
  // >= 0, all to dynamic_stores()[dynamic] (store is then -1).
  struct Run {
    int store;
    int64_t begin, end;
    int dynamic = -1;
  };
  // Splits ids into runs of one store each; INVALID_ARGUMENT naming the first id that is out of
  // range or owned by another shard (and its owner), or a dynamic id of a table this shard does
  // not have.
  absl::Status Route(absl::Span<const int64_t> ids, std::vector<Run>* runs) const;
  // The rows' layout, wherever rows or their gradients come in or go out (a pull's answer, a
  // push's request, GatherInto, Apply): each row at its table's width (its store's dim: 1 + the
  // table's dim with named tables, docs/ARCHITECTURE.md "Tables"; row_dim otherwise), in ids'
  // order. The floats of routed ids in that layout:
  int64_t RowFloats(absl::Span<const Run> runs) const;
  // The floats of row `id` (in [0, rows), or a dynamic id of one of this shard's dynamic tables)
  // in that layout.
  int RowWidthOf(int64_t id) const;

  // ---- Pulls ----
  // Fills response's rows (request.ids' order), the dense slice and its version when want_dense,
  // dense_begin, last_step and incarnation; counts the pull and its bytes. Does not touch
  // staleness or job.
  absl::Status Gather(const PullRequest& request, PullResponse* response);
  // Rows of `ids` into rows (the rows' layout above: ids.size() x row_dim floats at most), the
  // dense slice into dense and its version
  // into *dense_version if not null; counts the pull (not its bytes: nothing crossed a wire).
  // With scale_row_lr_by_staleness and row_versions not null, also the rows' versions.
  absl::Status GatherInto(absl::Span<const int64_t> ids, float* rows, float* dense,
                          int64_t* dense_version = nullptr, uint32_t* row_versions = nullptr);

  // ---- Pushes ----
  // A push's payload, unpacked (views into the request's bytes, or into the scratch when they
  // are not aligned) and routed. Valid while the request lives.
  struct Update {
    absl::Span<const int64_t> ids;
    absl::Span<const float> grads, dense_grad;
    int64_t dense_version = -1;  // PushRequest.dense_version, -1 when absent
    absl::Span<const uint32_t> row_versions;  // PushRequest.row_versions: empty or one per id
    std::vector<Run> runs;
    std::vector<int64_t> id_scratch;
    std::vector<float> grad_scratch, dense_scratch;
    std::vector<uint32_t> version_scratch;
  };
  // INVALID_ARGUMENT for sizes that do not fit (gradient floats per row, the dense slice), a
  // foreign id, an id named twice, or a NaN / infinite gradient (counted in nonfinite_pushes);
  // nothing is applied then.
  absl::Status Unpack(const PushRequest& request, Update* update);
  // Unpack's checks of a push's payload, wherever it comes from (a request, or the SYNC pushes
  // kept in a checkpoint's consistency state): the sizes, finite values, and every id routed into
  // runs. The same errors as Unpack.
  absl::Status Check(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                     absl::Span<const float> dense_grad, std::vector<Run>* runs);
  // INVALID_ARGUMENT (counted) when a gradient of row_floats floats, or of the dense slice
  // when dense_grad is not null, is NaN or infinite.
  absl::Status CheckFinite(size_t row_floats, const float* row_grads, const float* dense_grad);
  // Applies an unpacked update with the optimizers' step `step`; counts its rows.
  absl::Status Apply(const Update& update, int64_t step);
  // Routes and applies row_grads (the rows' layout above) and, if not null, dense_grad[the slice
  // size] computed from the slice's `dense_version` (-1: unknown) (a push from this process: no
  // message).
  absl::Status Apply(absl::Span<const int64_t> ids, const float* row_grads,
                     const float* dense_grad, int64_t step, int64_t dense_version = -1,
                     const uint32_t* row_versions = nullptr);
  // With scale_row_lr_by_staleness: the per-row staleness of the row updates (zeros otherwise).
  EmbeddingStore::Staleness RowStaleness() const;
  bool row_versions() const { return opt_.scale_row_lr_by_staleness; }
  // The staleness of the dense pushes that named their version (zeros without a dense slice).
  DenseStore::Staleness DenseStaleness() const;

  // The idempotence of one push: holds the lock of the pushing worker incarnation (so that a
  // retry waits for the push it repeats) until destroyed or Release()d. A guard of sequence 0 is
  // empty (never a duplicate, nothing locked).
  class PushGuard {
   public:
    PushGuard() = default;
    PushGuard(PushGuard&&) = default;
    PushGuard& operator=(PushGuard&&) = default;
    // The push had been applied before (its sequence is not above the last applied).
    bool duplicate() const { return duplicate_; }
    // Records the push as applied (call while still held).
    void Commit();
    void Release();

   private:
    friend class Shard;
    struct State {  // the last push applied for one (worker_id, incarnation)
      std::mutex mu;  // held while that worker's push is applied (serializes a retry with it)
      uint64_t last_sequence = 0;
      uint64_t last_use = 0;  // Shard's push counter at its last push (eviction order)
    };
    std::shared_ptr<State> state_;  // kept alive by the guard if evicted meanwhile
    uint64_t sequence_ = 0;
    bool duplicate_ = false;
    std::unique_lock<std::mutex> lock_;
  };
  // RESOURCE_EXHAUSTED when kMaxPushWorkers worker ids have push states already.
  absl::StatusOr<PushGuard> BeginPush(int32_t worker_id, uint64_t incarnation, uint64_t sequence);

  // ---- Counters ----
  void CountPushRequest(int64_t bytes_in);
  void CountDuplicatePush();
  void CountUnauthenticated();
  void CountBytesOut(int64_t bytes);
  ShardStats Stats() const;
  // The largest step any store or the dense slice applied.
  int64_t LastStep() const;
  // The shard's part of InfoResponse: index, map, readiness, dense slice, incarnation, optimizers,
  // last_step.
  void FillInfo(InfoResponse* info) const;

  // ---- The checkpoint file (ps/server/shard_checkpoint.cc, docs/CHECKPOINT.md "PS mode") ----
  // CopyForCheckpoint freezes this instant of the stores (EmbeddingStore::Freeze: a
  // copy-on-write image, no row copied; the caller pauses the writers for a cluster-wide
  // instant) and copies the dense slice, keeping `header` (the shard's InfoResponse, serialized)
  // and `consistency` (its ConsistencyState, serialized) to write with them; a copy of an earlier
  // round not written yet is dropped. WriteCheckpoint streams that instant to
  // <dir>/shard-<s>-of-<S> (block file: SHRD, CONS, then EMBM/EMBR groups, then DNSE) while
  // training goes on, and ends the copy; returns the file's name, size and rows.
  // FAILED_PRECONDITION when no copy of `round` is held. Memory: the rows updated between COPY
  // and the end of the WRITE keep a pre-image each (at most the rows stored at the instant).
  // `delta_parent` (an incremental checkpoint): write only the rows updated since this shard
  // copied (or restored) checkpoint ckpt-<delta_parent>; every row when it has no record of it.
  // Every copy starts a new store generation (which drops the change logs no later delta
  // needs), and a successful WRITE records it under the checkpoint's step for the deltas after
  // it.
  // `end_pass` (SaveShardRequest.end_pass): first the pass's end of the dynamic tables
  // (EvictDynamic), once per checkpoint `step` (SaveShardRequest.step, the chief's): a COPY with
  // end_pass at the step of the last pass end (pass_end_step(), restored with the checkpoint) is
  // a redo (a retried COPY, or the round redone after a restore from the checkpoint that holds
  // it) and ends nothing (logged); step 0 (unknown) always ends a pass. The header written gets
  // that step as its pass_end_step.
  absl::Status CopyForCheckpoint(int64_t round, std::string header, std::string consistency,
                                 std::optional<int64_t> delta_parent = std::nullopt,
                                 bool end_pass = false, int64_t step = 0);
  // The checkpoint step of the last pass end (CopyForCheckpoint), 0 = none.
  int64_t pass_end_step() {
    absl::MutexLock lock(&snap_mu_);
    return pass_end_step_;
  }
  // `name` must be a checkpoint directory name (ckpt-<step>, checkpoint/layout.h) of a directory
  // that exists under options.checkpoint_dir and is not committed (no MANIFEST, LATEST does not
  // name it): INVALID_ARGUMENT / FAILED_PRECONDITION naming the path otherwise.
  absl::StatusOr<SaveShardResponse> WriteCheckpoint(int64_t round, const std::string& name);
  // Whether a copy of `round` (> 0) is held for a WRITE.
  bool HoldsCopy(int64_t round);
  // What a restore found besides the parameters.
  struct Restored {
    int64_t step = 0;  // the largest SHRD step of the files
    int64_t pass_end_step = 0;  // the largest SHRD pass_end_step of the files (0: none)
    // This shard's own CONS block, when the checkpoint has the same layout (shard index, shard
    // count, partitions).
    std::optional<ConsistencyState> consistency;
  };
  // Restores rows and dense values from every shard file the manifest lists (any shard count:
  // rows this shard does not own are skipped, dense slices are cut to this shard's). Call before
  // serving. The files must have been verified (checksums) by the caller; FAILED_PRECONDITION if
  // they were written for another shape (rows, row_dim, dense size). The files may be a PS job's
  // or an in-process replica's (`shard-0-of-1` without SHRD / CONS: step = the MANIFEST's).
  // `mode`: a resume keeps everything; a warm start restarts the step and may reset the slots.
  // `chain` is the checkpoint's verified restore chain (checkpoint/layout.h
  // VerifyCheckpointChain): the full checkpoint and its deltas, each link's rows over the older
  // ones'; the shape, SHRD and CONS are the last link's. A resume (mode.keep_step) records the
  // checkpoint as the parent the next delta may build on.
  absl::StatusOr<Restored> RestoreCheckpoint(absl::Span<const CheckpointLink> chain,
                                             ParameterLoadMode mode = {});

  const Options& options() const { return opt_; }
  const PartitionMap& map() const { return map_; }
  int shard() const { return opt_.shard; }
  int row_dim() const { return opt_.row_dim; }
  int64_t dense_begin() const { return dense_begin_; }
  int64_t dense_slice_size() const { return dense_slice_size_; }
  // Stores of the owned partitions, ascending by partition (partition shard + i * num_shards).
  const std::vector<std::unique_ptr<EmbeddingStore>>& stores() const { return stores_; }
  // The dynamic tables' stores, by dynamic index (this shard's keys of each).
  const std::vector<std::unique_ptr<DynamicEmbeddingStore>>& dynamic_stores() const {
    return dynamic_stores_;
  }
  // The dense slice, or null if this shard's slice is empty.
  DenseStore* dense() const { return dense_.get(); }
  // Random per process: a client seeing it change knows the shard restarted.
  uint64_t incarnation() const { return incarnation_; }

 private:
  explicit Shard(Options options);
  // The run of dynamic id `id` at position i (appended, or extending the last run).
  absl::Status RouteDynamic(int64_t id, int64_t i, std::vector<Run>* runs) const;
  // Gathers / applies one dynamic run, its rows at the store's 1 + dim floats in the rows' layout
  // (RowFloats): `rows` / `grads` point at the run's first row.
  void GatherDynamic(absl::Span<const int64_t> ids, const Run& r, float* rows) const;
  void ApplyDynamic(absl::Span<const int64_t> ids, const Run& r, const float* grads,
                    int64_t step);
  // Evicts the dynamic stores (counted, logged); `why` for the log.
  // The TTL in passes counts finished passes, as `pstrain train` does: before a pass's end it
  // compares with pass() - 1; at a pass's end (`pass_end`) with pass(), then the admission
  // sketches age and the stores count the next pass (SetPass(pass() + 1), which the copy that
  // follows saves, so that a restored job trains its next pass with it).
  void EvictDynamic(const std::string& why, bool pass_end = false);
  // After an update of `step`: evicts when step is a multiple of dynamic_evict_every_steps, once
  // per such step.
  void MaybeEvictAfter(int64_t step);
  std::atomic<int64_t> evicted_at_step_{0};  // the last step MaybeEvictAfter evicted after
  // Applies row_grads (the rows' layout, RowFloats) run by run.
  absl::Status ApplyRuns(absl::Span<const Run> runs, absl::Span<const int64_t> ids,
                         const float* row_grads, int64_t step, const uint32_t* row_versions);
  // GatherInto of routed ids.
  absl::Status GatherRuns(absl::Span<const int64_t> ids, absl::Span<const Run> runs, float* rows,
                          float* dense, int64_t* dense_version, uint32_t* row_versions);

  const Options opt_;
  const PartitionMap map_;
  int64_t dense_begin_ = 0;
  int64_t dense_slice_size_ = 0;
  std::vector<std::unique_ptr<EmbeddingStore>> stores_;
  std::vector<std::unique_ptr<DynamicEmbeddingStore>> dynamic_stores_;
  std::unique_ptr<DenseStore> dense_;
  const uint64_t incarnation_;
  const absl::Duration start_time_;  // opt_.env->MonotonicNow() at creation

  absl::Mutex push_mu_;
  // worker id -> incarnation -> its push state (at most kIncarnationsPerWorker per worker).
  absl::flat_hash_map<int32_t, absl::flat_hash_map<uint64_t, std::shared_ptr<PushGuard::State>>>
      push_states_ ABSL_GUARDED_BY(push_mu_);
  uint64_t push_clock_ ABSL_GUARDED_BY(push_mu_) = 0;

  std::atomic<int64_t> pull_requests_{0}, push_requests_{0}, duplicate_pushes_{0};
  std::atomic<int64_t> pull_rows_{0}, push_rows_{0}, bytes_in_{0}, bytes_out_{0};
  std::atomic<int64_t> nonfinite_pushes_{0}, unauthenticated_{0};

  // The copy between COPY and WRITE.
  absl::Mutex snap_mu_;
  int64_t snap_round_ ABSL_GUARDED_BY(snap_mu_) = 0;
  std::string snap_header_ ABSL_GUARDED_BY(snap_mu_);       // InfoResponse at the copy
  std::string snap_consistency_ ABSL_GUARDED_BY(snap_mu_);  // ConsistencyState at the copy
  std::vector<std::unique_ptr<EmbeddingStore::Image>> snap_images_ ABSL_GUARDED_BY(snap_mu_);
  uint32_t snap_changed_since_ ABSL_GUARDED_BY(snap_mu_) = 0;  // 0: a full checkpoint
  std::unique_ptr<DenseSnapshot> snap_dense_ ABSL_GUARDED_BY(snap_mu_);
  // The dynamic stores' snapshots at the copy (full, or the delta since snap_changed_since_),
  // by dynamic index: copies (DynamicEmbeddingStore has no copy-on-write image yet).
  std::vector<DynamicSnapshot> snap_dynamic_ ABSL_GUARDED_BY(snap_mu_);
  std::string DynamicName(int d) const;
  // Restores the dynamic stores from the chain's DYN* groups of every shard file (see
  // RestoreCheckpoint).
  absl::Status RestoreDynamic(absl::Span<const CheckpointLink> chain, ParameterLoadMode mode);
  // Remembers that rows stamped >= generation changed after checkpoint ckpt-<step>.
  void RecordDeltaParent(int64_t step, uint32_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(snap_mu_);
  // Incremental checkpoints: the stores' generation (all stores share it), the one the held copy
  // started, and for recent checkpoints this shard wrote or restored, the generation since which
  // rows changed after them (step -> generation; at most kDeltaParents, the newest).
  static constexpr size_t kDeltaParents = 16;
  uint32_t generation_ ABSL_GUARDED_BY(snap_mu_) = 1;
  uint32_t snap_generation_ ABSL_GUARDED_BY(snap_mu_) = 0;
  std::map<int64_t, uint32_t> delta_parents_ ABSL_GUARDED_BY(snap_mu_);
  // The checkpoint step of the last pass end (CopyForCheckpoint's end_pass), 0 = none: a resume
  // restores it from the SHRD headers, a warm start (a new job counting its own steps) zeroes it.
  int64_t pass_end_step_ ABSL_GUARDED_BY(snap_mu_) = 0;
};

}  // namespace pstrain
