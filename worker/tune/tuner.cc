#include "worker/tune/tuner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/data/pipeline.h"
#include "worker/eval/model_inputs.h"
#include "worker/params/local_params.h"
#include "worker/train/train_step.h"
#include "worker/tune/report.h"

namespace pstrain {
namespace {

bool HasTrainingData(const Config& config) {
  bool have_data = false;
  for (const Channel& c : config.data().train()) have_data |= c.path_size() > 0;
  return have_data;
}

}  // namespace

Tuner::Tuner(const Config& config, TunerOptions options, FeatureSpec spec,
             std::unique_ptr<Model> model)
    : config_(config),
      options_(std::move(options)),
      spec_(std::move(spec)),
      model_(std::move(model)) {}

void Tuner::Print(const std::string& line) const {
  if (options_.print) options_.print(line);
}

absl::StatusOr<std::unique_ptr<Tuner>> Tuner::Create(const Config& config, TunerOptions options) {
  const int cores = options.cores;
  TuneSpace space{cores, cores, HasTrainingData(config), 0};
  // OMP_NUM_THREADS caps intra_op_threads (each tower sets its OpenMP team to intra_op_threads,
  // which would otherwise override it).
  if (const int n = options.omp_num_threads; n > 0) {
    space.intra_cap = std::min(cores, n);
    if (options.print) {
      options.print(absl::StrFormat("OMP_NUM_THREADS=%d caps intra_op_threads at %d\n", n,
                                    space.intra_cap));
    }
  }
  Config defaults;
  ResolveThreadDefaults(cores, &defaults, options.omp_num_threads);
  space.default_inter = defaults.threads().inter_op_threads();

  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(config.features(), ResolveModelConfig(config.model())));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config.model(), ModelInputsOf(spec)));
  std::unique_ptr<Tuner> t(
      new Tuner(config, std::move(options), std::move(spec), std::move(model)));
  t->space_ = space;
  if (space.search_inter) {
    t->Print("input: the train channels through the pipeline (inter_op_threads parser threads), "
             "repeated as needed\n");
  } else {
    ASSIGN_OR_RETURN(SyntheticData d, SyntheticData::Create(DatagenOptions{}));
    t->datagen_.emplace(std::move(d));
    t->Print(absl::StrFormat(
        "input: no training data given: datagen batches held in memory; inter_op_threads "
        "(parser threads) is not exercised and stays at the default %d\n",
        space.default_inter));
  }

  // The global batch of the config as given (its towers resolved for these cores) stays fixed.
  Config resolved = config;
  ResolveThreadDefaults(cores, &resolved, t->options_.omp_num_threads);
  t->global_batch_ = static_cast<int>(StepBatch(resolved.train(), resolved.threads()));
  if (config.train().global_batch_size() > 0) {
    t->Print(absl::StrFormat("global batch %d (train.global_batch_size) is kept: a candidate with "
                             "T towers splits it over them\n",
                             t->global_batch_));
  } else {
    t->Print(absl::StrFormat(
        "global batch %d (threads.towers %d x train.batch_size %d, resolved for %d cores) is "
        "kept: a candidate with T towers runs %d / T a tower. Set train.global_batch_size to "
        "state it once, whatever the cores\n",
        t->global_batch_, resolved.threads().towers(), config.train().batch_size(), cores,
        t->global_batch_));
  }
  return t;
}

absl::StatusOr<TuneResult> Tuner::Run() {
  TuneSearchOptions so;
  so.space = space_;
  so.global_batch = global_batch_;
  so.batch_sizes = options_.batch_sizes;
  so.allow_batch_change = options_.allow_batch_change;
  so.budget_s = options_.budget_s;
  so.env = options_.env;
  so.on_measured = [this](const MeasuredSetting& m) { Print(FormatMeasured(m)); };
  return SearchSettings(so, [this](const TuneCandidate& c) { return Measure(c); });
}

absl::StatusOr<double> Tuner::Measure(const TuneCandidate& c) const {
  Config config = config_;
  config.mutable_threads()->set_towers(c.towers);
  config.mutable_threads()->set_intra_op_threads(c.intra);
  config.mutable_threads()->set_inter_op_threads(c.inter);
  config.mutable_train()->set_batch_size(c.batch());
  ASSIGN_OR_RETURN(StoreTables tables, StoreTablesOf(spec_, *model_, config.sparse_optimizer(),
                                                    config.train().seed()));
  ASSIGN_OR_RETURN(auto params, LocalParams::Create(*model_, spec_.total_rows(), config,
                                                    c.towers * c.intra, std::move(tables)));
  ASSIGN_OR_RETURN(auto step, TrainStep::Create(*model_, c.towers, c.batch(), c.intra));
  int64_t global_step = 0;
  absl::StatusOr<StepTiming> t;
  if (datagen_.has_value()) {
    const std::vector<Batch> pool = DatagenBatches(*datagen_, spec_, 8, c.step);
    t = TimeTrainSteps(step.get(), params.get(), CycleBatches(&pool), options_.timing,
                       &global_step);
  } else {
    PipelineOptions po = OptionsFromConfig(config.data(), /*train=*/true, c.step,
                                           /*shard_index=*/0, /*num_shards=*/1, /*epochs=*/0);
    po.reader_threads = c.inter;
    ASSIGN_OR_RETURN(auto pipeline, Pipeline::Create(std::move(po), spec_));
    Batch batch;
    auto next = [&]() -> absl::StatusOr<const Batch*> {
      int64_t epoch;
      ASSIGN_OR_RETURN(bool got, pipeline->Next(&batch, &epoch));
      if (!got || batch.size == 0) {
        return absl::FailedPreconditionError("the training data is empty");
      }
      return &batch;
    };
    t = TimeTrainSteps(step.get(), params.get(), next, options_.timing, &global_step);
  }
  if (!t.ok()) return t.status();
  return t->examples_per_sec;
}

}  // namespace pstrain
