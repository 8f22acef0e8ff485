// libFuzzer target: the config loader (common/config.h) and what a valid config builds: a
// text-format Config, given its defaults and validated; when valid, its feature spec
// (FeatureSpec::Create), its model (Model::Create: the dense vector's layout from the hidden
// layers and the embedding size), the dense vector initialized (InitDense), and a tower for a
// small batch (CreateTower: the MLP's buffers, oneDNN's primitives), as every command does before
// training. The input's first line is also applied as a `--set` override, validated and built
// the same way.
//
// The memory cap: validation bounds every size (issue 26 item 5: layers, widths, batches, towers,
// the dense vector at kMaxDenseFloats = 2^28 floats, 1 GiB). scripts/fuzz.sh runs with
// -rss_limit_mb=2048 (and libFuzzer's malloc limit as large), so a config that validation accepts
// and that allocates beyond that in construction is a finding. The one size that may legitimately
// approach the cap, the dense vector (1 GiB at its bound, twice that with a tower's gradient), is
// built only up to kBuildDenseFloats below: larger valid models stop after Model::Create (which
// allocates no dense-sized buffer).
// Seed corpus: fuzz/corpus/config/ (the shipped configs/, overrides, and configs at the bounds).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "fuzz/fuzz_util.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"
#include "worker/model/model.h"

namespace {

using namespace pstrain;

// Dense vectors up to 64 Mi floats (256 MB) are allocated and initialized, and get a tower.
constexpr int64_t kBuildDenseFloats = int64_t{1} << 26;
// The tower's batch: the config's, at most this (its buffers grow with the batch x widths).
constexpr int kTowerBatch = 64;

void Build(const Config& config) {
  // With the model, as every command (the tables' dims resolve against it).
  auto spec = FeatureSpec::Create(config.features(), ResolveModelConfig(config.model()));
  if (!spec.ok()) return;
  // With the DENSE numeric and attention fields, as every caller (ModelInputsOf).
  auto model = Model::Create(config.model(), ModelInputsOf(*spec));
  if (!model.ok()) return;
  const int64_t dense = (*model)->dense_size();
  if (dense > kBuildDenseFloats) return;
  std::vector<float> weights(dense);
  (*model)->InitDense(config.train().seed(), weights.data());
  std::vector<float> row((*model)->row_dim());
  (*model)->InitRow(0, config.train().seed(), row.data());
  (void)(*model)->CreateTower(std::min(config.train().batch_size(), kTowerBatch), 1);
}

void LoadAndBuild(Config* config) {
  ApplyConfigDefaults(config);
  if (ValidateConfig(*config).ok()) Build(*config);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfigText(text, "fuzz");
  if (config.ok()) LoadAndBuild(&*config);
  Config base;
  const std::string first = text.substr(0, text.find('\n'));
  if (ApplyOverride(first, &base).ok()) LoadAndBuild(&base);
  return 0;
}
