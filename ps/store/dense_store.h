// DenseStore: a slice [begin, begin + size) of the flat dense parameter vector (worker/model/model.h)
// with its optimizer state. The single-process trainer holds the whole vector (begin = 0); a PS
// shard holds its slice of the vector as split by PartitionMap (ps/store/partition.h).
//
// The slice is ONE optimizer vector: its state is StateFloats(size) floats laid out as in
// ps/store/optimizer.h (e.g. Adam: m[size], v[size], t), so Adam's bias correction counts the updates
// applied to this slice.
//
// Versions and staleness (async PS): every Apply makes a new version of the weights (0 when
// created; restores keep the count going). Get returns the version it copied. An Apply that
// names the version its gradient was computed from has staleness tau = (versions applied since
// then); it is counted in staleness(), and with scale_lr_by_staleness the update's learning
// rate is divided by max(1, tau): the staleness-aware ASGD of Zhang, Gupta, Lian and Liu
// (IJCAI 2016, "Staleness-aware Async-SGD for distributed deep learning"), which keeps the
// dense weights' rate of change that of one synchronous worker however many workers push.
//
// Thread-safety: all methods may be called concurrently; one mutex serializes updates, and
// readers see whole updates only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ps/store/optimizer.h"

namespace pstrain {

// The weights and optimizer state of a dense slice, copied at one instant.
struct DenseSnapshot {
  int64_t begin = 0;  // offset of the slice in the global dense vector
  int64_t size = 0;
  OptimizerType optimizer = SGD;
  int64_t state_floats = 0;  // StateFloats(size)
  int64_t last_step = 0;
  std::vector<float> weights;  // size
  std::vector<float> state;    // state_floats
};

class DenseStore {
 public:
  struct Options {
    int64_t begin = 0;  // offset of the slice in the global dense vector, >= 0
    int64_t size = 0;   // floats, > 0
    std::shared_ptr<const Optimizer> optimizer;  // required
    int threads = 1;                             // OpenMP threads of one Apply (ParallelFor)
    bool scale_lr_by_staleness = false;          // lr / max(1, tau) for a versioned Apply
  };
  // The staleness of the versioned updates applied so far.
  struct Staleness {
    int64_t updates = 0;  // versioned Applies
    int64_t sum = 0;      // of their tau
    int64_t max = 0;
  };

  // Weights start at zero (use Set, e.g. with Model::InitDense's output); state from InitState.
  // INVALID_ARGUMENT for a bad range or a missing optimizer.
  static absl::StatusOr<std::unique_ptr<DenseStore>> Create(Options options);
  DenseStore(const DenseStore&) = delete;
  DenseStore& operator=(const DenseStore&) = delete;

  int64_t begin() const { return opt_.begin; }
  int64_t size() const { return opt_.size; }
  const Optimizer& optimizer() const { return *opt_.optimizer; }

  // out[size] = the current weights; returns their version.
  int64_t Get(float* out) const;
  // Overwrites the weights with values[size]; the optimizer state is left as it is.
  void Set(const float* values);
  // One optimizer update with grad[size]. `step` is the caller's global step, kept as
  // last_step() (the optimizer counts its own updates). `computed_from` is the version of the
  // weights the gradient was computed from (a Get's answer), or -1 when unknown (no staleness
  // counted or compensated). A version above the current one (the store was restored since) counts
  // as tau = 0.
  void Apply(const float* grad, int64_t step, int64_t computed_from = -1);
  // One step's read and update split over the caller's threads (LocalParams' in-process step,
  // worker/params/params.h InProcessParams): BeginStep takes the store's lock, so readers (Get,
  // Snapshot) wait for the whole update as they do for Apply, and prepares the update of `step`
  // (the optimizer's per-vector extras advance: Adam's t). Until EndStep, any threads may call
  // CopyRange (out[begin, end) = the weights) and UpdateRange (with grad[begin, end); `out` and
  // `grad` span the whole slice) on disjoint ranges [begin, end) of the slice; ranges starting at
  // multiples of Optimizer::kDenseChunk update exactly as Apply does. EndStep counts the
  // update (version, last_step) when `applied` (else it restores the extras: a step whose towers
  // failed updates nothing), and releases the lock. BeginStep and EndStep come
  // from one thread, with no other call of this store's writers between them.
  void BeginStep(int64_t step) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_);
  void CopyRange(int64_t begin, int64_t end, float* out) const ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void UpdateRange(int64_t begin, int64_t end, const float* grad) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void EndStep(bool applied) ABSL_UNLOCK_FUNCTION(mu_);

  int64_t version() const;
  Staleness staleness() const;

  DenseSnapshot Snapshot() const;
  // Restores a snapshot of exactly this slice: FAILED_PRECONDITION if its range, optimizer type
  // or state size differ.
  absl::Status Restore(const DenseSnapshot& snapshot);
  // Re-partitioning: copies the part of `snapshot` (a slice of the same dense vector, possibly
  // cut differently) that overlaps this store's slice, weights and every per-element slot, and
  // takes the per-slice extras (Adam's t) from it. Returns the number of elements copied (0 if
  // the slices are disjoint). FAILED_PRECONDITION if the optimizer type differs.
  absl::StatusOr<int64_t> RestoreOverlap(const DenseSnapshot& snapshot);

  int64_t last_step() const;

 private:
  explicit DenseStore(Options options);

  const Options opt_;
  mutable absl::Mutex mu_;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::vector<float> state_ ABSL_GUARDED_BY(mu_);
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // The update BeginStep prepared, and its step.
  Optimizer::Step split_ ABSL_GUARDED_BY(mu_);
  int64_t split_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> split_extras_ ABSL_GUARDED_BY(mu_);
  Staleness staleness_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain
