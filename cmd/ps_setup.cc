#include "cmd/ps_setup.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/train/checkpoint.h"

namespace pstrain {

absl::StatusOr<ShardServer::Options> ShardOptionsForJob(const Config& config, int shard,
                                                        int num_shards, ShardShape shape) {
  ASSIGN_OR_RETURN(FeatureSpec spec, FeatureSpec::Create(config.features()));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> created, Model::Create(config.model(), spec.num_fields()));
  std::shared_ptr<const Model> model(std::move(created));
  const int64_t rows = shape.rows > 0 ? shape.rows : spec.total_rows();
  const int row_dim = shape.row_dim > 0 ? shape.row_dim : model->row_dim();
  const int64_t dense_size = shape.dense_size >= 0 ? shape.dense_size : model->dense_size();
  ShardServer::Options o =
      ShardServer::OptionsFromConfig(config, shard, num_shards, rows, row_dim, dense_size);
  const uint64_t seed = config.train().seed();
  if (row_dim == model->row_dim()) {
    o.row_init = [model, seed](int64_t row, float* out) { model->InitRow(row, seed, out); };
  } else {
    o.row_init = [model, seed, row_dim](int64_t row, float* out) {
      std::vector<float> full(model->row_dim());
      model->InitRow(row, seed, full.data());
      std::fill(out, out + row_dim, 0.f);
      std::memcpy(out, full.data(), sizeof(float) * std::min(row_dim, model->row_dim()));
    };
  }
  o.dense_init = [model, seed, dense_size](float* out) {
    std::vector<float> full(model->dense_size());
    model->InitDense(seed, full.data());
    std::fill(out, out + dense_size, 0.f);
    std::memcpy(out, full.data(), sizeof(float) * std::min<int64_t>(dense_size, full.size()));
  };
  return o;
}

absl::StatusOr<std::optional<CheckpointChoice>> ChooseJobCheckpoint(const Config& config) {
  ASSIGN_OR_RETURN(std::optional<CheckpointChoice> choice,
                   ChooseCheckpoint(JobCheckpointDir(config)));
  if (choice) {
    ASSIGN_OR_RETURN(const ModelDescription wanted, DescribeModel(config));
    RETURN_IF_ERROR(CheckCheckpointModel(choice->dir, choice->manifest, wanted));
  }
  return choice;
}

}  // namespace pstrain
