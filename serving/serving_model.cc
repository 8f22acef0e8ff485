#include "serving/serving_model.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/layout.h"
#include "common/logging.h"
#include "common/status.h"
#include "ps/store/optimizer.h"
#include "ps/store/parameter_files.h"
#include "ps/store/store_blocks.h"
#include "worker/eval/model_inputs.h"

namespace pstrain {
namespace {

}  // namespace

absl::StatusOr<ServingModel::Shape> ServingModel::ShapeOf(const ModelDescription& description) {
  ASSIGN_OR_RETURN(FeatureSpec spec,
                   FeatureSpec::Create(description.features(), description.model()));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Create(description.model(), ModelInputsOf(spec)));
  Shape shape;
  shape.table_rows = static_cast<int64_t>(spec.total_rows());
  shape.row_dim = model->row_dim();
  shape.dense_size = model->dense_size();
  if (shape.dense_size > kMaxDenseFloats) {
    return absl::InvalidArgumentError(absl::StrCat("model: a dense vector of ", shape.dense_size,
                                                   " floats (at most ", kMaxDenseFloats, ")"));
  }
  return shape;
}

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::Create(
    const ModelDescription& description, Origin origin) {
  // A description is read from files: refuse shapes no trained model has before allocating them.
  RETURN_IF_ERROR(ShapeOf(description).status());
  std::unique_ptr<ServingModel> m(new ServingModel());
  m->description_ = description;
  m->origin_ = std::move(origin);
  ASSIGN_OR_RETURN(m->spec_,
                   FeatureSpec::Create(description.features(), description.model()));
  ASSIGN_OR_RETURN(m->model_, Model::Create(description.model(), ModelInputsOf(m->spec_)));
  OptimizerConfig none;
  none.set_type(SGD);  // no optimizer state is kept: SGD's is empty
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(none));
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = static_cast<int64_t>(m->spec_.total_rows());
  o.dim = m->model_->row_dim();
  o.optimizer = std::move(optimizer);
  // Untrained rows read as their initial value: the tables' initializers (StoreTablesOf).
  // Serving keeps no optimizer state, so the tables' optimizers are left out.
  ASSIGN_OR_RETURN(StoreTables tables,
                   StoreTablesOf(m->spec_, *m->model_, none, description.init_seed()));
  o.row_init = std::move(tables.row_init);
  ASSIGN_OR_RETURN(m->rows_, EmbeddingStore::Create(std::move(o)));
  m->dense_.assign(m->model_->dense_size(), 0.f);
  return m;
}

int64_t ServingModel::memory_bytes() const {
  return rows_->stats().bytes + static_cast<int64_t>(dense_.size() * sizeof(float));
}

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::FromCheckpoint(
    absl::Span<const CheckpointLink> chain, const ModelDescription& description) {
  if (chain.empty()) return absl::InvalidArgumentError("ServingModel: no checkpoint to read");
  const std::string& ckpt = chain.back().dir;
  const CheckpointManifest& manifest = chain.back().manifest;
  Origin origin{ckpt, manifest.step(), manifest.step()};
  ASSIGN_OR_RETURN(std::unique_ptr<ServingModel> m, Create(description, std::move(origin)));
  if (manifest.table_rows() != m->table_rows() || manifest.row_dim() != m->row_dim() ||
      manifest.dense_size() != m->dense_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt, " holds rows ", manifest.table_rows(), " x ", manifest.row_dim(), " and dense ",
        manifest.dense_size(), ", but its model description makes rows ", m->table_rows(), " x ",
        m->row_dim(), " and dense ", m->dense_size()));
  }
  if (std::none_of(manifest.file().begin(), manifest.file().end(),
                   [](const auto& f) { return IsShardFileName(f.name()); })) {
    return absl::DataLossError(absl::StrCat(ckpt, "/", kManifestFileName,
                                            ": lists no parameter file (shard-<i>-of-<S>)"));
  }
  // The dense vector goes through a store of the whole vector (SGD: no slots to keep).
  OptimizerConfig sgd;
  sgd.set_type(SGD);
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(sgd));
  DenseStore::Options d;
  d.size = m->dense_size();
  d.optimizer = std::move(optimizer);
  ASSIGN_OR_RETURN(std::unique_ptr<DenseStore> dense, DenseStore::Create(std::move(d)));
  ParameterLoadMode mode;
  mode.keep_step = false;
  mode.keep_optimizer_state = false;  // a served model keeps no optimizer state
  EmbeddingStore* stores[] = {m->rows_.get()};
  ASSIGN_OR_RETURN(ParameterLoadCounts counts,
                   LoadParameterFiles(chain, stores, dense.get(), mode));
  if (counts.dense_floats != m->dense_size()) {
    return absl::DataLossError(absl::StrCat(
        ckpt, ": its shard files hold ", counts.dense_floats, " dense floats for a vector of ",
        m->dense_size(), counts.dense_floats < m->dense_size()
                             ? " (some floats are in none of its shard files)"
                             : " (slices overlap)"));
  }
  dense->Get(m->dense_.data());
  return m;
}

absl::Status ServingParams::Pull(absl::Span<const int64_t> ids, float* rows, float* dense) {
  if (!ids.empty()) RETURN_IF_ERROR(model_->Gather(ids, rows));
  if (dense != nullptr) std::copy(model_->dense().begin(), model_->dense().end(), dense);
  return absl::OkStatus();
}

absl::Status ServingParams::Push(absl::Span<const int64_t>, const float*, const float*, int64_t) {
  return absl::FailedPreconditionError("a served model is read-only: it cannot be trained");
}

absl::StatusOr<ChosenCheckpoint> ChooseCheckpointToRead(
    const std::string& model_dir, const std::string& checkpoint,
    const ModelDescription* config_description, Env* env) {
  ChosenCheckpoint c;
  if (checkpoint.empty()) {
    ASSIGN_OR_RETURN(std::optional<CheckpointChoice> choice, ChooseCheckpoint(model_dir));
    if (!choice) {
      return absl::NotFoundError(absl::StrCat(model_dir, " has no checkpoint (no ", model_dir,
                                              "/", kLatestFileName, ")"));
    }
    c.dir = choice->dir;
    c.manifest = std::move(choice->manifest);
    c.chain = std::move(choice->chain);
  } else if (checkpoint == "best") {
    // checkpoint.keep_best's: the one <model_dir>/BEST names.
    absl::StatusOr<int64_t> best = ReadBest(model_dir);
    if (absl::IsNotFound(best.status())) {
      return absl::NotFoundError(absl::StrCat("--checkpoint best: ", model_dir, " has no ",
                                              kBestFileName, " file (train with "
                                              "checkpoint.keep_best: true to keep one)"));
    }
    if (!best.ok()) return best.status();
    c.dir = CheckpointPath(model_dir, *best);
    ASSIGN_OR_RETURN(c.chain, VerifyCheckpointChain(c.dir));
    c.manifest = c.chain.back().manifest;
  } else {
    // A name under model_dir ("ckpt-12"), or a path to the checkpoint directory itself.
    c.dir = ParseCheckpointName(checkpoint) && env->IsDirectory(model_dir + "/" + checkpoint)
                ? model_dir + "/" + checkpoint
                : checkpoint;
    if (!env->IsDirectory(c.dir)) {
      return absl::NotFoundError(absl::StrCat("--checkpoint ", checkpoint, ": neither ", model_dir,
                                              "/", checkpoint, " nor ", checkpoint,
                                              " is a checkpoint directory"));
    }
    ASSIGN_OR_RETURN(c.chain, VerifyCheckpointChain(c.dir));
    c.manifest = c.chain.back().manifest;
  }
  if (c.manifest.has_model()) {
    c.description = c.manifest.model();
    if (config_description != nullptr) {
      RETURN_IF_ERROR(CheckCheckpointModel(c.dir, c.manifest, *config_description));
    }
  } else if (config_description != nullptr) {
    c.description = *config_description;
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        c.dir, " was written before checkpoints recorded their model (MANIFEST version 1): pass "
               "the config it was trained with (--config, --set)"));
  }
  return c;
}

}  // namespace pstrain
