#include "worker/train/step_timing.h"

#include <algorithm>

#include "common/status.h"

namespace pstrain {
NextBatchFn CycleBatches(const std::vector<Batch>* pool) {
  size_t i = 0;
  return [pool, i]() mutable -> absl::StatusOr<const Batch*> {
    return &(*pool)[i++ % pool->size()];
  };
}

absl::StatusOr<StepTiming> TimeTrainSteps(TrainStep* step, ParameterAccess* params,
                                          const NextBatchFn& next,
                                          const StepTimingOptions& options, int64_t* global_step) {
  int64_t unique = 0;
  // Pipelined: the batch staged for the next step, if any (staged across the steps of a window).
  bool staged = false;
  const Batch* staged_batch = nullptr;
  // Runs one step; `last` ends a window (no read-ahead, everything flushed).
  auto run_one = [&](bool last) -> absl::StatusOr<int> {
    if (!options.pipelined) {
      absl::StatusOr<const Batch*> b = next();
      if (!b.ok()) return b.status();
      absl::StatusOr<StepResult> r = step->Run(**b, ++*global_step, params);
      if (!r.ok()) return r.status();
      unique += r->unique_rows;
      return r->examples;
    }
    if (!staged) {
      ASSIGN_OR_RETURN(staged_batch, next());
      RETURN_IF_ERROR(step->Stage(*staged_batch, params, options.prefetch_pulls));
    }
    staged = false;
    absl::StatusOr<StepResult> r = step->Train(++*global_step, params, [&]() -> absl::Status {
      if (last) return absl::OkStatus();
      ASSIGN_OR_RETURN(staged_batch, next());
      RETURN_IF_ERROR(step->Stage(*staged_batch, params, options.prefetch_pulls));
      staged = true;
      return absl::OkStatus();
    });
    if (!r.ok()) return r.status();
    if (last) RETURN_IF_ERROR(step->Flush());
    unique += r->unique_rows;
    return r->examples;
  };
  for (int i = 0; i < options.warmup_steps; ++i) {
    if (auto r = run_one(i + 1 == options.warmup_steps); !r.ok()) return r.status();
  }
  unique = 0;
  const StepProfile before = step->profile();
  StepTiming t;
  const double t0 = options.env->MonotonicSeconds();
  for (int w = 0; w < options.windows; ++w) {
    const double s = options.env->MonotonicSeconds();
    int64_t examples = 0, steps = 0;
    double elapsed = 0;
    while (steps < options.min_steps || elapsed < options.min_seconds) {
      // Whether this step ends the window is known by count only; a window that also needs
      // min_seconds ends at the first step after both, flushing then.
      const bool last = steps + 1 >= options.min_steps &&
                        options.env->MonotonicSeconds() - s >= options.min_seconds;
      absl::StatusOr<int> n = run_one(last);
      if (!n.ok()) return n.status();
      examples += *n;
      ++steps;
      elapsed = options.env->MonotonicSeconds() - s;
      if (last) break;
    }
    t.window_examples_per_sec.push_back(examples / elapsed);
    t.steps += steps;
  }
  t.seconds = options.env->MonotonicSeconds() - t0;
  t.examples_per_sec = Median(t.window_examples_per_sec);
  t.unique_rows_per_step = t.steps > 0 ? static_cast<double>(unique) / t.steps : 0;
  const StepProfile& p = step->profile();
  t.profile = {p.dedup - before.dedup, p.pull - before.pull, p.compute - before.compute,
               p.reduce - before.reduce, p.push - before.push};
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace pstrain
