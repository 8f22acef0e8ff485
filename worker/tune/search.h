// The search of `pstrain tune`: which thread settings to measure, in what order, within what
// budget, and which one to recommend. The measurement itself is a function the caller gives
// (worker/tune/tuner.h times the real training step; tests give a fake), so this file trains
// nothing and reads no clock but its Env's.
//
// The space: towers x intra_op_threads x inter_op_threads at a fixed global batch (the examples
// of one step, and so of one update). Compute threads (towers x intra_op) must fit the cores
// (OpenMP teams spin, so oversubscribing them only loses); parser threads block when the
// prefetch queue is full, so they may overlap the compute threads by a quarter of the cores (at
// least one). Without training data inter_op_threads is not searched and stays at its default.
//
// The order: first every allowed setting whose values are powers of two (or the core count),
// fullest compute first, then more towers, then fewer parser threads (the likely winners before
// the budget runs out); then the neighbours (+-1 in each dimension) of the best; then the
// --batch_sizes per-tower sizes at the best threads, which change the global batch.
//
// The budget: the first candidate is always measured; each later one only if the time spent so
// far plus the mean time of a measured candidate stays within the budget. Candidates that did
// not fit are kept, in order, as not tried.
//
// The ranking: the fastest setting at the fixed global batch is recommended. A faster setting
// that changes the global batch (a --batch_sizes candidate) is recommended only when the caller
// allows it (allow_batch_change): it changes what the model learns, not only its speed, and is
// never taken silently (the report says what it would cost).
//
// Thread-safety: plain values and functions; SearchSettings runs the measurements one at a time
// on the calling thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace pstrain {

// One setting to measure.
struct TuneCandidate {
  int towers = 1;
  int intra = 1;  // threads.intra_op_threads
  int inter = 1;  // threads.inter_op_threads (parser threads)
  int step = 1;   // examples a step: the global batch, one update
  // Examples per tower: the largest share of the step.
  int batch() const;
  bool operator<(const TuneCandidate& o) const;
  bool operator==(const TuneCandidate& o) const;
  // "towers x intra x inter @ step": "4x2x3@512".
  std::string Name() const;
};

// Which settings are allowed on this machine.
struct TuneSpace {
  int cores = 1;
  int intra_cap = 1;          // the cores, or OMP_NUM_THREADS when lower
  bool search_inter = false;  // parser threads are measured only when the input is real data
  int default_inter = 1;      // inter_op_threads when not searched
  bool Allowed(const TuneCandidate& c) const;
};

// 1, 2, 4, ... up to n, and n itself (n >= 1).
std::vector<int> PowersOfTwo(int n);

struct CoarseGrid {
  std::vector<TuneCandidate> candidates;  // allowed, in measuring order
  int not_allowed = 0;                    // combinations of the grid the space refused
};
// The powers-of-two grid at `global_batch`, allowed settings only, in measuring order.
CoarseGrid CoarseCandidates(const TuneSpace& space, int global_batch);
// The allowed neighbours (+-1 in each dimension, the best itself included) of `best` at its step.
std::vector<TuneCandidate> NeighbourCandidates(const TuneSpace& space, const TuneCandidate& best);
// `best`'s threads at each per-tower size of `batch_sizes` (global batch towers x size, at most
// kMaxBatch).
std::vector<TuneCandidate> BatchSizeCandidates(const TuneCandidate& best,
                                               const std::vector<int>& batch_sizes);

// Whether one more candidate fits the budget. Starts its clock when made.
class TuneBudget {
 public:
  TuneBudget(Env* env, double budget_s);
  // True for the first candidate; else when elapsed() plus the mean seconds of a measured
  // candidate stays within the budget.
  bool Fits() const;
  // Counts one measured candidate that took `seconds`.
  void Charge(double seconds);
  double elapsed() const;
  double budget_s() const { return budget_s_; }

 private:
  Env* const env_;
  const double budget_s_;
  const double start_;
  double spent_ = 0;  // seconds of the measured candidates
  int measured_ = 0;
};

struct MeasuredSetting {
  TuneCandidate c;
  double examples_per_sec = 0;
};

// Examples per second of one candidate; an error ends the search.
using MeasureFn = std::function<absl::StatusOr<double>(const TuneCandidate&)>;

struct TuneSearchOptions {
  TuneSpace space;
  int global_batch = 1;          // kept by every candidate but the batch-size ones
  std::vector<int> batch_sizes;  // per-tower sizes to measure at the best threads (may be empty)
  bool allow_batch_change = false;
  double budget_s = 60;
  Env* env = Env::Default();
  // Called after each measurement (progress); may be empty.
  std::function<void(const MeasuredSetting&)> on_measured;
};

struct TuneResult {
  TuneSpace space;
  int global_batch = 1;
  double budget_s = 0;
  bool allow_batch_change = false;
  std::vector<MeasuredSetting> measured;  // in the order measured (never empty)
  std::vector<TuneCandidate> not_tried;   // over the budget, in order
  int not_allowed = 0;                    // of the coarse grid
  double seconds = 0;                     // the search's time
  MeasuredSetting best_fixed;   // the fastest at the fixed global batch
  MeasuredSetting fastest;      // the fastest of all (may change the global batch)
  MeasuredSetting recommended;  // best_fixed, or fastest when allowed to change the batch
  bool batch_changes() const { return fastest.c.step != global_batch; }
};

// Runs the search (the file comment). A measurement's error comes back prefixed with the
// candidate's name ("4x2x3@512: ..."), its code kept.
absl::StatusOr<TuneResult> SearchSettings(const TuneSearchOptions& options,
                                          const MeasureFn& measure);

}  // namespace pstrain
