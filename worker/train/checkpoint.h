// Checkpoints of in-process parameters: the single-process trainer's (`pstrain train`) and the
// allreduce mode's replica (`pstrain allreduce`, written by rank 0), and the Checkpointer
// interface through which RunTraining saves and restores in every mode. The directory layout and
// the commit rules are checkpoint/layout.h; what is specific here is the one parameter file:
//
//   <dir>/ckpt-<step>/shard-0-of-1     block file: the embedding store (EMBM + EMBR blocks) and
//                                      the dense store (DNSE), ps/store/store_blocks.h
//   <dir>/ckpt-<step>/worker-<j>.state worker 0's state (`pstrain train`), each rank's (allreduce)
//   <dir>/ckpt-<step>/dynamic-<table>  a dynamic table's store (train, allreduce), full or delta
//                                      as the checkpoint (ps/store/dynamic_file.h)
//
// docs/CHECKPOINT.md describes the files byte by byte.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/delta_chain.h"
#include "checkpoint/layout.h"
#include "common/status.h"
#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"
#include "worker/params/local_params.h"

namespace pstrain {

// Dynamic tables (issue 28). Eviction runs right before a checkpoint's snapshot, but only at the
// checkpoints of a schedule that depends on the step and the data alone, so that a resumed job
// evicts exactly where an uninterrupted one does (a stop's or a timer's checkpoint would not be
// at the same step in both): a checkpoint whose step is a multiple of `every_steps`
// (checkpoint.every_steps; 0: none), and the final checkpoint of a pass that read all its data
// (WorkerState finished, not max_steps_reached), which also ages the admission sketches
// (DynamicEmbeddingStore::AgeAdmissionCounts). The TTL in passes counts finished passes: before
// a pass's end it compares with the previous pass (a row is evicted once it missed ttl_passes
// whole passes). Counted in the stores' metrics. Returns whether it ran.
bool EvictDynamicTables(const WorkerState& state, int64_t every_steps, LocalParams* params);

// "dynamic-<table>": a dynamic table's file in a checkpoint of `pstrain train` or allreduce.
std::string DynamicTableFileName(const std::string& table);

// The model description every checkpoint's MANIFEST records (pstrain.ModelDescription): the
// resolved feature layout (FeatureSpec::Resolved), the resolved model (ResolveModelConfig),
// train.seed as the seed of Model::InitRow for rows never trained, and the optimizers.
// INVALID_ARGUMENT for a features or model config that FeatureSpec / Model refuse.
absl::StatusOr<ModelDescription> DescribeModel(const Config& config);

// The incremental checkpoints of one in-process replica (checkpoint.incremental_every): what the
// next delta builds on, and the embedding store's generation since which rows changed
// (EmbeddingStore::Snapshot changed_since). Kept by the replica's writer; SaveCheckpoint and
// RestoreLatestCheckpoint update it.
struct ReplicaDeltas {
  explicit ReplicaDeltas(int incremental_every) : chain(incremental_every) {}
  DeltaChain chain;
  uint32_t changed_since = 0;  // rows stamped >= this changed since the last committed checkpoint
};

// Writes ckpt-<state.step()> under `dir`, updates LATEST, then deletes all but the newest `keep`
// checkpoints (checkpoint/layout.h CommitCheckpoint). Each row of the stores is captured
// consistently (weights and optimizer slots from the same instant). The MANIFEST records `model`.
// A step already committed (IsCommittedCheckpoint) is not written again. Returns the checkpoint
// directory. With `deltas` (not null) the checkpoint is a delta when deltas->chain says so: only
// the rows updated since the last committed checkpoint, the whole dense state; `deltas` learns the
// commit. Must not run concurrently with updates of `params` (the trainer saves between steps).
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const WorkerState& state,
                                           LocalParams& params, int keep,
                                           const ModelDescription& model,
                                           ReplicaDeltas* deltas = nullptr);

// The same for a job of several workers that share one replica of the parameters (the allreduce
// mode): ckpt-<step> with worker-<j>.state for each entry of `workers`; MANIFEST created_by.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, int64_t step,
                                           const std::map<int, WorkerState>& workers,
                                           LocalParams& params, int keep,
                                           absl::string_view created_by,
                                           const ModelDescription& model,
                                           ReplicaDeltas* deltas = nullptr);

// Restores the checkpoint LATEST names; if it is missing or corrupt, says why on stderr and falls
// back to the next older complete checkpoint. A delta is restored with its chain (the full
// checkpoint, then every delta up to it); a delta whose chain is broken is refused and the
// previous checkpoint restored. Every file is verified completely before anything is loaded, so
// a refused checkpoint leaves `params` untouched. `deltas` (when not null) learns the checkpoint
// restored: the next delta builds on it. Returns the directory restored,
// or nullopt when there is no LATEST (a fresh start). Errors: LATEST exists but no checkpoint is
// usable (DATA_LOSS: progress is never silently discarded), or a verified checkpoint was written
// for another model (FAILED_PRECONDITION: another shape, or a MANIFEST whose description differs
// from `model`, naming the field: checkpoint/layout.h CheckCheckpointModel).
absl::StatusOr<std::optional<std::string>> RestoreLatestCheckpoint(
    const std::string& dir, LocalParams* params, WorkerState* state, const ModelDescription& model,
    ReplicaDeltas* deltas = nullptr);
// The same for worker `worker` of a job of `num_workers` sharing one replica (the allreduce
// mode): reads worker-<worker>.state; a checkpoint of another number of workers is refused.
absl::StatusOr<std::optional<std::string>> RestoreLatestCheckpoint(
    const std::string& dir, LocalParams* params, WorkerState* state, int worker, int num_workers,
    const ModelDescription& model, ReplicaDeltas* deltas = nullptr);

// A warm start of in-process parameters (docs/CHECKPOINT.md "Warm start"): the checkpoint
// ChooseWarmStartCheckpoint picks for `warm_start` and `model` (any mode, any shard count) is
// loaded into `params`, with its optimizer slots unless warm_start.reset_optimizer(), and
// every store's step at 0. FAILED_PRECONDITION for another shape (rows, row size, dense size);
// errors name the source. Returns the checkpoint directory copied.
absl::StatusOr<std::string> WarmStartParams(const WarmStart& warm_start,
                                            const ModelDescription& model, LocalParams* params);

// What a Checkpointer's Restore does when its model dir has no checkpoint and the config asks
// for a warm start: `warm_start_params` copies the parameters (returns the source directory);
// the worker state stays that of a fresh job (step 0). With a checkpoint of its own, the job
// resumes it and says on stderr that the warm start is ignored. Returns `restored` unchanged.
absl::StatusOr<std::optional<std::string>> RestoreOrWarmStart(
    std::optional<std::string> restored, const std::optional<WarmStart>& warm_start,
    const std::function<absl::StatusOr<std::string>()>& warm_start_params);

// How RunTraining saves and restores the parameters it trains, one implementation per mode:
// LocalCheckpointer (below) for `pstrain train`, the PS mode's coordinated shards (PsJob's
// rounds, worker/ps_client/ps_job.h), the allreduce mode's rank-0 writer. When to checkpoint
// and when to stop is the job's (JobControl, worker/train/job_control.h). The trainer calls,
// from its training thread only:
//   - Restore once before the first step;
//   - Save(state, final) at a step boundary when
//       (a) options.chief and the checkpoint schedule (every_steps / every_seconds) says so,
//       (b) JobControl::CheckpointRequested(step) returned true (another worker asked for a
//           checkpoint),
//       (c) the trainer stops after a stop signal: training ends after this Save, or
//       (d) training ended (final = true), before after_training and the final evaluation.
//     `state` is this worker's position after state.step() steps of its own. An implementation
//     may answer (a) by arranging a checkpoint at a later step (returning "" now) and having the
//     job ask for it with CheckpointRequested() then.
// In multi-worker modes Save is collective: the implementation makes every worker take part in
// the same checkpoint (and may block this worker until the others arrive, with a deadline).
class Checkpointer {
 public:
  virtual ~Checkpointer() = default;
  // Restores the newest usable checkpoint into the parameters and `state`; returns its
  // directory, or nullopt for a fresh start.
  virtual absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) = 0;
  // Returns the checkpoint directory written ("" if this worker does not know it).
  virtual absl::StatusOr<std::string> Save(const WorkerState& state, bool final) = 0;
};

// `pstrain train`: SaveCheckpoint / RestoreLatestCheckpoint of in-process parameters.
class LocalCheckpointer : public Checkpointer {
 public:
  // `warm_start`: train.warm_start when the config has one. `incremental_every`:
  // checkpoint.incremental_every.
  LocalCheckpointer(std::string dir, LocalParams* params, int keep, ModelDescription model,
                    std::optional<WarmStart> warm_start = std::nullopt,
                    int incremental_every = 1)
      : dir_(std::move(dir)),
        params_(params),
        keep_(keep),
        model_(std::move(model)),
        warm_start_(std::move(warm_start)),
        deltas_(incremental_every) {}
  absl::StatusOr<std::optional<std::string>> Restore(WorkerState* state) override {
    ASSIGN_OR_RETURN(std::optional<std::string> restored,
                     RestoreLatestCheckpoint(dir_, params_, state, model_, &deltas_));
    return RestoreOrWarmStart(std::move(restored), warm_start_,
                              [&] { return WarmStartParams(*warm_start_, model_, params_); });
  }
  absl::StatusOr<std::string> Save(const WorkerState& state, bool /*final*/) override {
    EvictDynamicTables(state, evict_every_steps_, params_);
    return SaveCheckpoint(dir_, state, *params_, keep_, model_, &deltas_);
  }
  // checkpoint.every_steps: the dynamic tables' eviction schedule (EvictDynamicTables).
  void set_evict_every_steps(int64_t every) { evict_every_steps_ = every; }

 private:
  const std::string dir_;
  LocalParams* const params_;
  const int keep_;
  const ModelDescription model_;
  const std::optional<WarmStart> warm_start_;
  ReplicaDeltas deltas_;
  int64_t evict_every_steps_ = 0;
};

}  // namespace pstrain
