#include "cmd/ps_setup.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "checkpoint/warm_start.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/rpc/security.h"
#include "common/status.h"
#include "worker/data/feature_spec.h"
#include "worker/eval/model_inputs.h"
#include "worker/model/model.h"
#include "worker/train/checkpoint.h"

namespace pstrain {

absl::StatusOr<ShardServer::Options> ShardOptionsForJob(const Config& job_config, int shard,
                                                        int num_shards, ShardShape shape,
                                                        int num_workers) {
  // The sparse learning rates the shard applies: scaled to a worker's share of the global batch
  // (cluster.scale_sparse_lr_by_share); the checkpoints' model description keeps the configured
  // ones, so a job resumed on another worker count scales them for its own.
  const int workers = num_workers > 0 ? num_workers : num_shards;
  const double lr_factor = SparseLrShareFactor(job_config, workers);
  Config scaled;
  if (lr_factor != 1.0) {
    scaled = job_config;
    ScaleSparseLearningRates(lr_factor, &scaled);
    PSTRAIN_LOG(INFO) << "shard " << shard << ": sparse learning rate "
                      << job_config.sparse_optimizer().learning_rate() << " x sqrt(1/" << workers
                      << ") = " << scaled.sparse_optimizer().learning_rate()
                      << " (and the tables' own rates likewise): each of the " << workers
                      << " workers pushes its share of train.global_batch_size "
                      << job_config.train().global_batch_size()
                      << " as an update (cluster.scale_sparse_lr_by_share)";
  }
  const Config& config = lr_factor != 1.0 ? scaled : job_config;
  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(config.features(), ResolveModelConfig(config.model())));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> created, Model::Create(config.model(), ModelInputsOf(spec)));
  std::shared_ptr<const Model> model(std::move(created));
  // A config whose every table is dynamic has no fixed rows: the shards' fixed row space is
  // empty (rows 0: no partition holds a row, no store is made), as every worker's client has it.
  const int64_t rows = shape.rows > 0 ? shape.rows : spec.total_rows();
  const int row_dim = shape.row_dim > 0 ? shape.row_dim : model->row_dim();
  const int64_t dense_size = shape.dense_size >= 0 ? shape.dense_size : model->dense_size();
  ShardServer::Options o =
      ShardServer::OptionsFromConfig(config, shard, num_shards, rows, row_dim, dense_size);
  // The tables' own partitions (TableSplitsOf), as every worker's client has them; only for
  // the job's own row space (a shape given for another one keeps the one-table map).
  if (rows == static_cast<int64_t>(spec.total_rows())) {
    o.data.table_splits = TableSplitsOf(spec, config.cluster(), num_shards);
    if (!o.data.table_splits.empty()) {
      o.data.partitions = PartitionMap(o.data.table_splits, num_shards).partitions();
    }
  }
  o.security.max_message_bytes =
      MaxMessageBytes(config, spec.num_fields(), row_dim, dense_size);
  const uint64_t seed = config.train().seed();
  // The tables' initializers and optimizers (StoreTablesOf), as `train` and allreduce have them;
  // the lambdas hold the model, which the initializer reads.
  ASSIGN_OR_RETURN(StoreTables tables,
                   StoreTablesOf(spec, *model, config.sparse_optimizer(), seed));
  o.data.range_optimizers = std::move(tables.optimizers);
  // The dynamic tables' stores (each shard holds the keys it owns by hash; the caps are per
  // shard), as the workers' clients expect them (PsClient::Options::dynamic_row_dims).
  for (int d = 0; d < spec.num_dynamic_tables(); ++d) {
    ASSIGN_OR_RETURN(DynamicEmbeddingStore::Options dynamic,
                     DynamicStoreOptionsOf(spec.dynamic_table(d), config.sparse_optimizer(), seed));
    o.data.dynamic_tables.push_back(std::move(dynamic));
    o.data.dynamic_names.push_back(spec.dynamic_table(d).name);
  }
  // Evict on the step schedule of the chief's checkpoints (its own steps), after the shard
  // applies such a step: a resumed job evicts where an uninterrupted one does (SYNC).
  o.data.dynamic_evict_every_steps = config.checkpoint().every_steps();
  RowInit init = std::move(tables.row_init);
  if (row_dim == model->row_dim()) {
    o.data.row_init = [model, init](int64_t row, float* out) { init(row, out); };
  } else {
    o.data.row_init = [model, init, row_dim](int64_t row, float* out) {
      std::vector<float> full(model->row_dim());
      init(row, full.data());
      std::fill(out, out + row_dim, 0.f);
      std::memcpy(out, full.data(), sizeof(float) * std::min(row_dim, model->row_dim()));
    };
  }
  o.data.dense_init = [model, seed, dense_size](float* out) {
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

absl::Status RestoreShard(const Config& config, const std::optional<CheckpointChoice>& choice,
                          int shard, ShardServer* server) {
  std::optional<std::string> restored;
  if (choice) {
    RETURN_IF_ERROR(Annotate(server->RestoreCheckpoint(choice->chain),
                             absl::StrCat("restoring shard ", shard)));
    PSTRAIN_LOG(INFO) << "shard " << shard << ": restored from " << choice->dir << " ("
                      << choice->manifest.num_shards() << " shards"
                      << (choice->chain.size() > 1
                              ? absl::StrCat(", the full ", choice->chain.front().dir, " and ",
                                             choice->chain.size() - 1, " delta(s)")
                              : std::string())
                      << ")";
    restored = choice->dir;
  }
  std::optional<WarmStart> warm_start;
  if (config.train().has_warm_start()) warm_start = config.train().warm_start();
  return RestoreOrWarmStart(restored, warm_start, [&]() -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(const ModelDescription wanted, DescribeModel(config));
    std::optional<TableWarmStart> tables;
    ASSIGN_OR_RETURN(const CheckpointChoice source,
                     ChooseWarmStartCheckpoint(*warm_start, wanted, Env::Default(), &tables));
    RETURN_IF_ERROR(Annotate(
        server->WarmStart(source.chain, warm_start->reset_optimizer(), tables),
        absl::StrCat("warm start of shard ", shard, " from ", source.dir)));
    PSTRAIN_LOG(INFO) << "shard " << shard << ": warm start from " << source.dir << " ("
                      << source.manifest.num_shards() << " shard(s)"
                      << (warm_start->reset_optimizer() ? ", optimizer slots reset" : "")
                      << (tables ? "; " + tables->Summary() : std::string()) << ")";
    return source.dir;
  }).status();
}

}  // namespace pstrain
