// DenseStore: a slice [begin, begin + size) of the flat dense parameter vector (worker/model/model.h)
// with its optimizer state. The single-process trainer holds the whole vector (begin = 0); a PS
// shard holds its slice of the vector as split by PartitionMap (ps/store/partition.h).
//
// The slice is ONE optimizer vector: its state is StateFloats(size) floats laid out as in
// ps/store/optimizer.h (e.g. Adam: m[size], v[size], t), so Adam's bias correction counts the updates
// applied to this slice.
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
  };

  // Weights start at zero (use Set, e.g. with Model::InitDense's output); state from InitState.
  // INVALID_ARGUMENT for a bad range or a missing optimizer.
  static absl::StatusOr<std::unique_ptr<DenseStore>> Create(Options options);
  DenseStore(const DenseStore&) = delete;
  DenseStore& operator=(const DenseStore&) = delete;

  int64_t begin() const { return opt_.begin; }
  int64_t size() const { return opt_.size; }
  const Optimizer& optimizer() const { return *opt_.optimizer; }

  // out[size] = the current weights.
  void Get(float* out) const;
  // Overwrites the weights with values[size]; the optimizer state is left as it is.
  void Set(const float* values);
  // One optimizer update with grad[size]. `step` is the caller's global step, kept as
  // last_step() (the optimizer counts its own updates).
  void Apply(const float* grad, int64_t step);

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
};

}  // namespace pstrain
