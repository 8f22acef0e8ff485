#include "serving/serving_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/layout.h"
#include "common/logging.h"
#include "common/status.h"
#include "ps/store/optimizer.h"
#include "ps/store/store_blocks.h"

namespace pstrain {
namespace {

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Marks [begin, begin + size) of the dense vector as read from `file`; FAILED_PRECONDITION when it
// leaves the vector or overlaps a slice read before.
absl::Status CoverDense(const std::string& file, int64_t begin, int64_t size,
                        std::vector<uint8_t>* covered) {
  const int64_t n = static_cast<int64_t>(covered->size());
  if (begin < 0 || size < 0 || begin > n || size > n - begin) {
    return absl::FailedPreconditionError(absl::StrCat(file, ": dense slice [", begin, ", +", size,
                                                      ") is outside the model's dense vector of ",
                                                      n, " floats"));
  }
  for (int64_t i = begin; i < begin + size; ++i) {
    if ((*covered)[i]) {
      return absl::FailedPreconditionError(
          absl::StrCat(file, ": dense slice [", begin, ", +", size, ") overlaps another file's"));
    }
    (*covered)[i] = 1;
  }
  return absl::OkStatus();
}

// Reads the embedding groups and dense slices of one checkpoint parameter file (`pstrain train`'s
// shard-0-of-1, or a PS shard file with its SHRD / CONS blocks first) into `model`.
absl::Status ReadParameterFile(const std::string& path, ServingModel* model,
                               std::vector<uint8_t>* covered) {
  ASSIGN_OR_RETURN(auto reader, BlockReader::Open(path));
  const int dim = model->row_dim();
  while (true) {
    ASSIGN_OR_RETURN(std::string tag, reader->PeekTag());
    if (tag.empty()) return absl::OkStatus();
    if (tag == kEmbeddingMetaTag) {
      auto load = LoadEmbeddingRows(
          reader.get(), [&](const EmbeddingMeta& meta, absl::Span<const int64_t> ids,
                            const float* weights, const float*) -> absl::Status {
            if (meta.dim != dim) {
              return absl::FailedPreconditionError(absl::StrCat(
                  path, ": rows of ", meta.dim, " floats, the model's have ", dim));
            }
            if (meta.end > model->table_rows()) {
              return absl::FailedPreconditionError(
                  absl::StrCat(path, ": rows [", meta.begin, ", ", meta.end,
                               ") past the model's table of ", model->table_rows(), " rows"));
            }
            return model->StoreRows(ids, weights);
          });
      RETURN_IF_ERROR(load.status());
    } else if (tag == kDenseTag) {
      ASSIGN_OR_RETURN(DenseSnapshot slice, LoadDenseSnapshot(reader.get()));
      RETURN_IF_ERROR(CoverDense(path, slice.begin, slice.size, covered));
      std::copy(slice.weights.begin(), slice.weights.end(),
                model->mutable_dense()->begin() + slice.begin);
    } else {
      Block skipped;  // SHRD, CONS, or a block kind this reader does not know
      RETURN_IF_ERROR(reader->Next(&skipped).status());
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::Create(
    const ModelDescription& description, Origin origin) {
  std::unique_ptr<ServingModel> m(new ServingModel());
  m->description_ = description;
  m->origin_ = std::move(origin);
  ASSIGN_OR_RETURN(m->spec_, FeatureSpec::Create(description.features()));
  ASSIGN_OR_RETURN(m->model_, Model::Create(description.model(), m->spec_.num_fields()));
  // A description is read from files: refuse shapes no trained model has before allocating them.
  constexpr int64_t kMaxDense = int64_t{1} << 31;
  if (m->model_->dense_size() > kMaxDense) {
    return absl::InvalidArgumentError(absl::StrCat("model: a dense vector of ",
                                                   m->model_->dense_size(), " floats (at most ",
                                                   kMaxDense, ")"));
  }
  OptimizerConfig none;
  none.set_type(SGD);  // no optimizer state is kept: SGD's is empty
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(none));
  EmbeddingStore::Options o;
  o.begin = 0;
  o.end = static_cast<int64_t>(m->spec_.total_rows());
  o.dim = m->model_->row_dim();
  o.optimizer = std::move(optimizer);
  const Model* model = m->model_.get();
  const uint64_t seed = description.init_seed();
  o.row_init = [model, seed](int64_t row, float* out) { model->InitRow(row, seed, out); };
  ASSIGN_OR_RETURN(m->rows_, EmbeddingStore::Create(std::move(o)));
  m->dense_.assign(m->model_->dense_size(), 0.f);
  return m;
}

int64_t ServingModel::memory_bytes() const {
  return rows_->stats().bytes + static_cast<int64_t>(dense_.size() * sizeof(float));
}

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::FromCheckpoint(
    const std::string& ckpt, const CheckpointManifest& manifest,
    const ModelDescription& description) {
  Origin origin{ckpt, manifest.step(), manifest.step()};
  ASSIGN_OR_RETURN(std::unique_ptr<ServingModel> m, Create(description, std::move(origin)));
  if (manifest.table_rows() != m->table_rows() || manifest.row_dim() != m->row_dim() ||
      manifest.dense_size() != m->dense_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt, " holds rows ", manifest.table_rows(), " x ", manifest.row_dim(), " and dense ",
        manifest.dense_size(), ", but its model description makes rows ", m->table_rows(), " x ",
        m->row_dim(), " and dense ", m->dense_size()));
  }
  std::vector<uint8_t> covered(m->dense_size(), 0);
  int files = 0;
  for (const auto& f : manifest.file()) {
    if (!IsShardFileName(f.name())) continue;
    RETURN_IF_ERROR(ReadParameterFile(ckpt + "/" + f.name(), m.get(), &covered));
    ++files;
  }
  if (files == 0) {
    return absl::DataLossError(absl::StrCat(ckpt, "/", kManifestFileName,
                                            ": lists no parameter file (shard-<i>-of-<S>)"));
  }
  const int64_t missing = std::count(covered.begin(), covered.end(), 0);
  if (missing > 0) {
    return absl::DataLossError(absl::StrCat(ckpt, ": ", missing, " of ", covered.size(),
                                            " dense floats are in none of its shard files"));
  }
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
    const ModelDescription* config_description) {
  ChosenCheckpoint c;
  if (checkpoint.empty()) {
    ASSIGN_OR_RETURN(std::optional<CheckpointChoice> choice, ChooseCheckpoint(model_dir));
    if (!choice) {
      return absl::NotFoundError(absl::StrCat(model_dir, " has no checkpoint (no ", model_dir,
                                              "/", kLatestFileName, ")"));
    }
    c.dir = choice->dir;
    c.manifest = std::move(choice->manifest);
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
    RETURN_IF_ERROR(VerifyCheckpoint(c.dir, &c.manifest));
  } else {
    // A name under model_dir ("ckpt-12"), or a path to the checkpoint directory itself.
    c.dir = ParseCheckpointName(checkpoint) && IsDir(model_dir + "/" + checkpoint)
                ? model_dir + "/" + checkpoint
                : checkpoint;
    if (!IsDir(c.dir)) {
      return absl::NotFoundError(absl::StrCat("--checkpoint ", checkpoint, ": neither ", model_dir,
                                              "/", checkpoint, " nor ", checkpoint,
                                              " is a checkpoint directory"));
    }
    RETURN_IF_ERROR(VerifyCheckpoint(c.dir, &c.manifest));
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
