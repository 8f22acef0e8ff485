// A checkpoint of a huge table without training it for hours: fills the in-process embedding
// store of a config (LocalParams, as `pstrain train` builds it) with --rows rows of random
// weights (first-order weight ~ N(0, 0.01), embedding ~ N(0, --stddev); optimizer slots at their
// initial state), rows 0 .. --rows-1 of the table, and saves it as `pstrain train` would
// (SaveCheckpoint: a MANIFEST v2 with the config's model description). The dense weights are the
// model's initial ones. For timing `pstrain export` (and predict/serve's loading) at the shipped
// config's 26M categorical rows; the values are not a trained model's, so the scores mean nothing.
//
// usage: fill_store_app --config configs/deepfm_criteo.textproto --model_dir /tmp/big
//                       [--rows 26000000] [--stddev 0.05] [--seed 1]
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/app_util.h"
#include "checkpoint/layout.h"
#include "common/config.h"
#include "common/flags.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"
#include "worker/train/checkpoint.h"

namespace pstrain {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "fill_store_app: %s\n", s.ToString().c_str());
  return 1;
}

int Main(int argc, char** argv) {
  std::string config_path, model_dir;
  int64_t rows = 26000000;
  double stddev = 0.05;
  int seed = 1;
  FlagSet flags("fill_store_app", "Saves a checkpoint of --rows random rows at a config.");
  flags.String("config", &config_path, "the training config (required)");
  flags.String("model_dir", &model_dir, "where the checkpoint goes (required)");
  flags.Int64("rows", &rows, "rows to fill: 0 .. rows-1 of the table");
  flags.Double("stddev", &stddev, "standard deviation of the embedding values");
  flags.Int("seed", &seed, "random seed");
  if (std::optional<int> code = ParseAppFlags(flags, argc, argv)) return *code;
  if (config_path.empty() || model_dir.empty() || rows < 1) {
    std::fprintf(stderr, "--config and --model_dir are required, --rows >= 1\n");
    return 2;
  }
  absl::StatusOr<Config> loaded = LoadConfigFile(config_path);
  if (!loaded.ok()) return Fail(loaded.status());
  Config config = *loaded;
  ApplyConfigDefaults(&config);
  config.mutable_train()->set_model_dir(model_dir);
  absl::StatusOr<FeatureSpec> spec = FeatureSpec::Create(config.features());
  if (!spec.ok()) return Fail(spec.status());
  if (rows > spec->total_rows()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrFormat("--rows %d: the table has %d rows", rows, spec->total_rows())));
  }
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(config.model(), spec->num_fields());
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<std::unique_ptr<LocalParams>> params =
      LocalParams::Create(**model, spec->total_rows(), config, 2);
  if (!params.ok()) return Fail(params.status());
  absl::StatusOr<ModelDescription> description = DescribeModel(config);
  if (!description.ok()) return Fail(description.status());

  const auto start = std::chrono::steady_clock::now();
  const int dim = (*params)->row_dim();
  constexpr int64_t kBatch = 1 << 20;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> first(0, 0.01f), embedding(0, static_cast<float>(stddev));
  std::vector<int64_t> ids;
  std::vector<float> weights;
  for (int64_t begin = 0; begin < rows; begin += kBatch) {
    const int64_t n = std::min(kBatch, rows - begin);
    ids.resize(n);
    weights.resize(n * dim);
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = begin + i;
      weights[i * dim] = first(rng);
      for (int j = 1; j < dim; ++j) weights[i * dim + j] = embedding(rng);
    }
    if (absl::Status s = (*params)->embedding()->RestoreRows(ids, weights.data(), nullptr);
        !s.ok()) {
      return Fail(s);
    }
  }
  const double filled =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WorkerState state;
  state.set_step(1);
  absl::StatusOr<std::string> saved = SaveCheckpoint(JobCheckpointDir(config), state, **params,
                                                     /*keep=*/1, *description);
  if (!saved.ok()) return Fail(saved.status());
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  absl::PrintF("fill_store_app: %d rows of %d floats filled in %.1f s, saved to %s in %.1f s\n",
               rows, dim, filled, *saved, total - filled);
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) { return pstrain::Main(argc, argv); }
