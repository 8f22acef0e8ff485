// Throughput measurement of the training step (TrainStep against some ParameterAccess), shared by
// bench/train_throughput_app and `pstrain tune`: warm up, then time a few windows and take the
// median, the way a benchmark should (never a timed unit test).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/data/batch.h"
#include "worker/params/params.h"
#include "worker/train/train_step.h"

namespace pstrain {

// Delivers the next batch to train on; the pointer stays valid until the next call.
using NextBatchFn = std::function<absl::StatusOr<const Batch*>()>;

// Cycles through a pool (not owned; must outlive the function and be non-empty).
NextBatchFn CycleBatches(const std::vector<Batch>* pool);

struct StepTimingOptions {
  int warmup_steps = 5;          // untimed steps first (primitives, first-touch rows, caches)
  int windows = 5;               // timed windows; the median is reported
  int min_steps = 1;             // each window runs at least this many steps ...
  double min_seconds = 0;        // ... and at least this long
  // The trainer's pipelined step (TrainStep Stage/Train/Flush: the next batch is read, deduped
  // and, with prefetch_pulls, pulled while the current one computes) instead of TrainStep::Run.
  // Each window ends flushed.
  bool pipelined = false;
  bool prefetch_pulls = false;
  Env* env = Env::Default();  // the clock of the timings (its monotonic one)
};

struct StepTiming {
  std::vector<double> window_examples_per_sec;
  double examples_per_sec = 0;     // median over the windows
  double seconds = 0;              // wall time of the timed windows
  double unique_rows_per_step = 0; // mean over the timed steps
  StepProfile profile;             // phase times accumulated over the timed windows (seconds)
  int64_t steps = 0;               // timed steps
};

// Runs `step` on batches from `next` (global steps *global_step + 1, ...; *global_step is
// advanced past every step run, warm-up included). Errors of a step or of `next` end it.
absl::StatusOr<StepTiming> TimeTrainSteps(TrainStep* step, ParameterAccess* params,
                                          const NextBatchFn& next,
                                          const StepTimingOptions& options, int64_t* global_step);

// Median of `v` (the upper one for an even count; 0 for none).
double Median(std::vector<double> v);

}  // namespace pstrain
