#include "serving/serving_model.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/block_file.h"
#include "checkpoint/layout.h"
#include "common/logging.h"
#include "common/dynamic_rows.h"
#include "common/status.h"
#include "ps/store/dynamic_checkpoint.h"
#include "ps/store/optimizer.h"
#include "ps/store/parameter_files.h"
#include "ps/store/store_blocks.h"
#include "ps/store/table_rows.h"
#include "worker/eval/model_inputs.h"

namespace pstrain {
namespace {

// The most rows one EmbeddingStore holds (ps/store/embedding_store.h: 2^32 - 1).
constexpr int64_t kMaxStoreRows = (int64_t{1} << 32) - 1;

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
  if (!spec.has_named_tables()) {
    shape.row_tables.push_back({"", 0, shape.table_rows, shape.row_dim});
    return shape;
  }
  // A store per table: each costs a fixed 64 KB (its lock stripes) and pointer arrays of 16 bytes
  // per 4096 rows, so the tables' count and rows are bounded as the one table's were (2^32 - 1
  // rows in all, what one store held before tables).
  if (spec.num_tables() > kMaxTables) {
    return absl::InvalidArgumentError(absl::StrCat("features: ", spec.num_tables(),
                                                   " tables (a served model has at most ",
                                                   kMaxTables, ")"));
  }
  for (const FeatureSpec::Table& t : spec.tables()) {
    const std::string what = t.is_default
                                 ? std::string("the default table (fields naming no table)")
                                 : absl::StrCat("features table '", t.name, "'");
    // The model's stride must hold the table's row (Model::row_dim() = 1 + the largest dim once
    // the model takes per-field dims; a model that does not would read a wider row wrong).
    if (1 + t.dim > shape.row_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": rows of 1 + ", t.dim, " floats do not fit the model's rows of ", shape.row_dim,
          " floats (this build's model takes no per-field dims)"));
    }
    if (t.is_dynamic()) continue;  // no row range: a DynamicEmbeddingStore of its own
    if (t.rows > static_cast<uint64_t>(kMaxStoreRows)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", t.rows, " rows (a served table "
                                                     "holds at most 2^32 - 1)"));
    }
    shape.row_tables.push_back({t.name, static_cast<int64_t>(t.offset),
                                static_cast<int64_t>(t.offset + t.rows), 1 + t.dim});
  }
  if (shape.table_rows > kMaxStoreRows) {
    return absl::InvalidArgumentError(absl::StrCat("features: the tables hold ", shape.table_rows,
                                                   " rows (a served model holds at most "
                                                   "2^32 - 1)"));
  }
  return shape;
}

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::Create(
    const ModelDescription& description, Origin origin) {
  // A description is read from files: refuse shapes no trained model has before allocating them.
  ASSIGN_OR_RETURN(Shape shape, ShapeOf(description));
  std::unique_ptr<ServingModel> m(new ServingModel());
  m->description_ = description;
  m->origin_ = std::move(origin);
  ASSIGN_OR_RETURN(m->spec_,
                   FeatureSpec::Create(description.features(), description.model()));
  ASSIGN_OR_RETURN(m->model_, Model::Create(description.model(), ModelInputsOf(m->spec_)));
  m->row_tables_ = std::move(shape.row_tables);
  OptimizerConfig none;
  none.set_type(SGD);  // no optimizer state is kept: SGD's is empty
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> created, Optimizer::Create(none));
  std::shared_ptr<const Optimizer> optimizer(std::move(created));
  const Model* model = m->model_.get();
  const uint64_t seed = description.init_seed();
  const int stride = m->model_->row_dim();
  // The spec's table of each row table (the dynamic tables have none).
  std::vector<int> spec_table;
  for (int t = 0; t < m->spec_.num_tables(); ++t) {
    if (!m->spec_.tables()[t].is_dynamic()) spec_table.push_back(t);
  }
  for (size_t i = 0; i < m->row_tables_.size(); ++i) {
    const RowTable& rt = m->row_tables_[i];
    EmbeddingStore::Options o;
    o.begin = rt.begin;
    o.end = rt.end;
    o.dim = rt.width;
    o.optimizer = optimizer;
    // Rows never trained read as their initial value, the rule of every mode: the default
    // table's Model::InitRow (over the stride; its first 1 + dim floats kept), a named table's
    // initializer (InitTableRow).
    if (!m->spec_.has_named_tables()) {
      o.row_init = [model, seed](int64_t row, float* out) { model->InitRow(row, seed, out); };
    } else if (m->spec_.tables()[spec_table[i]].is_default) {
      const int width = rt.width;
      o.row_init = [model, seed, stride, width](int64_t row, float* out) {
        thread_local std::vector<float> full;
        full.resize(stride);
        model->InitRow(row, seed, full.data());
        std::copy(full.begin(), full.begin() + width, out);
      };
    } else {
      const FeatureSpec::Table& t = m->spec_.tables()[spec_table[i]];
      const TableInitializer init = t.initializer;
      const int dim = t.dim;
      o.row_init = [init, dim, seed](int64_t row, float* out) {
        InitTableRow(init, dim, 1 + dim, row, seed, out);
      };
    }
    absl::StatusOr<std::unique_ptr<EmbeddingStore>> store = EmbeddingStore::Create(std::move(o));
    if (!store.ok()) {
      return Annotate(store.status(), rt.name.empty() ? std::string("the rows")
                                                      : absl::StrCat("table '", rt.name, "'"));
    }
    m->rows_.push_back(*std::move(store));
  }
  for (int d = 0; d < m->spec_.num_dynamic_tables(); ++d) {
    const FeatureSpec::Table& t = m->spec_.dynamic_table(d);
    ASSIGN_OR_RETURN(DynamicEmbeddingStore::Options o, DynamicStoreOptionsOf(t, none, seed));
    o.optimizer = optimizer;  // weights only
    // What training reads for a key without a row (ps/store/dynamic_store.h): the initializer
    // with ALWAYS admission (o.row_init), zeros otherwise; no sketch, no eviction, no coin.
    if (o.admission != DynamicEmbeddingStore::Admission::kAlways) {
      o.admission = DynamicEmbeddingStore::Admission::kProbability;
      o.admit_probability = 1.0;
      o.row_init = nullptr;
    }
    o.ttl_steps = 0;
    o.ttl_passes = 0;
    o.max_rows = 0;
    o.max_bytes = 0;
    absl::StatusOr<std::unique_ptr<DynamicEmbeddingStore>> store =
        DynamicEmbeddingStore::Create(std::move(o));
    if (!store.ok()) return Annotate(store.status(), absl::StrCat("dynamic table '", t.name, "'"));
    m->dynamic_.push_back(*std::move(store));
  }
  m->dense_.assign(m->model_->dense_size(), 0.f);
  return m;
}

int64_t ServingModel::dynamic_rows() const {
  int64_t n = 0;
  for (const auto& d : dynamic_) n += d->metrics().rows_live;
  return n;
}

absl::Status ServingModel::StoreDynamicRows(int d, absl::Span<const uint64_t> keys,
                                            const float* weights) {
  if (d < 0 || d >= static_cast<int>(dynamic_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic table ", d, " of ", dynamic_.size()));
  }
  DynamicEmbeddingStore& store = *dynamic_[d];
  // A delta of rows only (no tombstones): Restore writes them and keeps the other rows.
  DynamicSnapshot s;
  s.dim = store.dim();
  s.optimizer = store.options().optimizer->type();
  s.state_floats = store.state_floats();
  s.changed_since = 1;
  s.keys.assign(keys.begin(), keys.end());
  s.weights.assign(weights, weights + keys.size() * store.dim());
  s.counts.assign(keys.size(), 0);
  s.last_pass.assign(keys.size(), 0);
  s.last_step_of.assign(keys.size(), 0);
  return store.Restore(s);
}

int64_t ServingModel::memory_bytes() const {
  int64_t bytes = static_cast<int64_t>(dense_.size() * sizeof(float));
  for (const auto& r : rows_) bytes += r->stats().bytes;
  for (const auto& d : dynamic_) bytes += d->metrics().bytes;
  return bytes;
}

int64_t ServingModel::stored_rows() const {
  int64_t n = 0;
  for (const auto& r : rows_) n += r->stats().rows_initialized;
  return n;
}

int ServingModel::RowTableOf(int64_t row) const {
  if (row < 0 || row >= table_rows()) return -1;
  // Contiguous in row order: the last table beginning at or before `row`.
  auto it = std::upper_bound(row_tables_.begin(), row_tables_.end(), row,
                             [](int64_t r, const RowTable& t) { return r < t.begin; });
  return static_cast<int>(it - row_tables_.begin()) - 1;
}

absl::Status ServingModel::Gather(absl::Span<const int64_t> ids, float* rows) const {
  if (dynamic_.empty() ||
      std::none_of(ids.begin(), ids.end(), [](int64_t id) { return IsDynamicRow(id); })) {
    return GatherFixed(ids, rows);
  }
  const int stride = row_dim();
  std::vector<int64_t> fixed;
  std::vector<size_t> fixed_at;
  std::vector<std::vector<uint64_t>> keys(dynamic_.size());
  std::vector<std::vector<size_t>> keys_at(dynamic_.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!IsDynamicRow(ids[i])) {
      fixed.push_back(ids[i]);
      fixed_at.push_back(i);
      continue;
    }
    const int d = DynamicTableOf(ids[i]);
    if (d >= static_cast<int>(dynamic_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("row id ", ids[i], " is of dynamic table ",
                                                     d, ", the model has ", dynamic_.size()));
    }
    keys[d].push_back(DynamicKeyOf(ids[i]));
    keys_at[d].push_back(i);
  }
  std::vector<float> part(fixed.size() * stride);
  RETURN_IF_ERROR(GatherFixed(fixed, part.data()));
  for (size_t j = 0; j < fixed.size(); ++j) {
    std::copy_n(part.data() + j * stride, stride, rows + fixed_at[j] * stride);
  }
  for (size_t d = 0; d < dynamic_.size(); ++d) {
    if (keys[d].empty()) continue;
    const int width = dynamic_[d]->dim();
    part.resize(keys[d].size() * width);
    dynamic_[d]->Gather(keys[d], part.data());
    for (size_t j = 0; j < keys[d].size(); ++j) {
      float* out = rows + keys_at[d][j] * stride;
      std::copy_n(part.data() + j * width, width, out);
      std::fill(out + width, out + stride, 0.f);
    }
  }
  return absl::OkStatus();
}

absl::Status ServingModel::GatherFixed(absl::Span<const int64_t> ids, float* rows) const {
  const int stride = row_dim();
  if (rows_.size() == 1 && row_tables_[0].width == stride) return rows_[0]->Gather(ids, rows);
  // Rows by table: each table's rows gathered at its width, then expanded to the stride. The ids
  // are bucketed by table in one pass (a counting sort: O(ids + tables)).
  const size_t num_tables = rows_.size();
  std::vector<int> table(ids.size());
  std::vector<size_t> start(num_tables + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    table[i] = RowTableOf(ids[i]);
    if (table[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("row id ", ids[i], " is outside the table [0, ", table_rows(), ")"));
    }
    ++start[table[i] + 1];
  }
  for (size_t t = 0; t < num_tables; ++t) start[t + 1] += start[t];
  std::vector<int64_t> sorted(ids.size());
  std::vector<size_t> where(ids.size());
  {
    std::vector<size_t> next(start.begin(), start.end() - 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t at = next[table[i]]++;
      sorted[at] = ids[i];
      where[at] = i;
    }
  }
  std::vector<float> narrow;
  for (size_t t = 0; t < num_tables; ++t) {
    const size_t n = start[t + 1] - start[t];
    if (n == 0) continue;
    const int width = row_tables_[t].width;
    narrow.resize(n * width);
    RETURN_IF_ERROR(rows_[t]->Gather(absl::MakeConstSpan(sorted).subspan(start[t], n),
                                     narrow.data()));
    for (size_t j = 0; j < n; ++j) {
      float* out = rows + where[start[t] + j] * stride;
      std::copy(narrow.begin() + j * width, narrow.begin() + (j + 1) * width, out);
      std::fill(out + width, out + stride, 0.f);
    }
  }
  return absl::OkStatus();
}

EmbeddingSnapshot ServingModel::StoredRows(int64_t from, int64_t to) const {
  const int stride = row_dim();
  if (rows_.size() == 1 && row_tables_[0].width == stride) return rows_[0]->Snapshot(from, to);
  EmbeddingSnapshot out;
  out.begin = from;
  out.end = to;
  out.dim = stride;
  for (size_t t = 0; t < rows_.size(); ++t) {
    const RowTable& rt = row_tables_[t];
    const int64_t lo = std::max(from, rt.begin);
    const int64_t hi = std::min(to, rt.end);
    if (lo >= hi) continue;
    const EmbeddingSnapshot snap = rows_[t]->Snapshot(lo, hi);
    for (int64_t r = 0; r < snap.rows(); ++r) {
      out.ids.push_back(snap.ids[r]);
      const float* w = snap.weights.data() + r * rt.width;
      out.weights.insert(out.weights.end(), w, w + rt.width);
      out.weights.resize(out.weights.size() + (stride - rt.width), 0.f);
    }
  }
  return out;
}

absl::Status ServingModel::StoreRows(absl::Span<const int64_t> ids, const float* weights) {
  const int stride = row_dim();
  if (rows_.size() == 1 && row_tables_[0].width == stride) {
    return rows_[0]->RestoreRows(ids, weights, nullptr);
  }
  for (int64_t id : ids) {
    if (RowTableOf(id) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("row id ", id, " is outside the table [0, ", table_rows(), ")"));
    }
  }
  std::vector<int64_t> tids;
  std::vector<float> narrow;
  for (size_t t = 0; t < rows_.size(); ++t) {
    const int width = row_tables_[t].width;
    tids.clear();
    narrow.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (RowTableOf(ids[i]) != static_cast<int>(t)) continue;
      tids.push_back(ids[i]);
      narrow.insert(narrow.end(), weights + i * stride, weights + i * stride + width);
    }
    if (!tids.empty()) RETURN_IF_ERROR(rows_[t]->RestoreRows(tids, narrow.data(), nullptr));
  }
  return absl::OkStatus();
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
  // Each table's store at its width: the loader resizes a group written at another width (a
  // checkpoint's table at its width, or at the stride before compact widths; docs/CHECKPOINT.md
  // "Tables") row by row.
  std::vector<EmbeddingStore*> stores;
  for (const auto& rows : m->rows_) stores.push_back(rows.get());
  ASSIGN_OR_RETURN(ParameterLoadCounts counts,
                   LoadParameterFiles(chain, stores, dense.get(), mode));
  // The dynamic tables' rows, from every shard file of every link (PS checkpoints).
  if (!m->dynamic_.empty()) {
    std::vector<DynamicEmbeddingStore*> dynamic;
    std::vector<std::string> names;
    for (size_t d = 0; d < m->dynamic_.size(); ++d) {
      dynamic.push_back(m->dynamic_[d].get());
      names.push_back(m->dynamic_name(static_cast<int>(d)));
    }
    RETURN_IF_ERROR(LoadDynamicTables(chain, dynamic, names, nullptr, "", mode));
  }
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
