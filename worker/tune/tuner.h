// Tuner: `pstrain tune`'s work below the command line. It measures settings of a config with
// short timed runs of the real training step (TrainStep against in-process LocalParams, on fresh
// parameters per candidate) and searches them as worker/tune/search.h describes.
//
// Input: with training data configured, each candidate is fed by a live Pipeline over the train
// channels with inter_op_threads parser threads (repeating the data), so the parser threads
// compete for the cores exactly as in `pstrain train` and inter_op_threads is measured. Without
// data, batches come from datagen and are held in memory; inter_op_threads is then not
// exercised and stays at its default.
//
// The global batch (train.global_batch_size, or towers x batch_size with the config's towers
// resolved for `cores` when that is 0) is kept fixed: a candidate with T towers splits it over
// them, so the towers change how fast the model trains but not what it learns.
//
// Thread-safety: one call at a time; Run() uses the machine's cores for its measurements.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "pstrain/config.pb.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/tools/datagen.h"
#include "worker/train/step_timing.h"
#include "worker/tune/search.h"

namespace pstrain {

struct TunerOptions {
  int cores = 1;            // the cores to tune for (>= 1)
  int omp_num_threads = 0;  // OMP_NUM_THREADS (0 = unset): caps intra_op_threads
  std::vector<int> batch_sizes;
  bool allow_batch_change = false;
  double budget_s = 60;
  StepTimingOptions timing;  // warm-up and timed windows of one candidate
  Env* env = Env::Default();
  // Receives the lines that tell the user what is measured and why (the cap, the input, the
  // global batch) and one per measured setting (report.h FormatMeasured), each ending in "\n".
  // May be empty.
  std::function<void(const std::string&)> print;
};

class Tuner {
 public:
  // Builds the feature spec, the model and (without training data) the datagen source of
  // `config`, and prints what the search will keep and vary. Errors are those of the feature
  // spec, the model and datagen.
  static absl::StatusOr<std::unique_ptr<Tuner>> Create(const Config& config,
                                                       TunerOptions options);
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  // Measures and searches (search.h SearchSettings). An error is a candidate's measurement,
  // prefixed with its name.
  absl::StatusOr<TuneResult> Run();

  const Config& config() const { return config_; }

 private:
  Tuner(const Config& config, TunerOptions options, FeatureSpec spec,
        std::unique_ptr<Model> model);
  void Print(const std::string& line) const;
  // One candidate's median examples/s over timed windows after a warm-up, on fresh parameters.
  absl::StatusOr<double> Measure(const TuneCandidate& c) const;

  const Config config_;
  const TunerOptions options_;
  const FeatureSpec spec_;
  const std::unique_ptr<Model> model_;
  TuneSpace space_;
  int global_batch_ = 1;
  std::optional<SyntheticData> datagen_;  // the input without training data
};

}  // namespace pstrain
