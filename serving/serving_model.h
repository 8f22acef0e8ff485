// ServingModel: a trained model ready to score, read from a checkpoint (any mode, any shard
// count) or from a serving export (serving/export.h). It holds what inference needs and nothing
// of training: the feature spec and the network rebuilt from the model description the checkpoint
// or export records (pstrain.ModelDescription), the trained rows' weights (no optimizer slots),
// and the dense vector.
//
// Rows that were never trained are not stored anywhere: Gather returns their initial value
// (Model::InitRow(row, init_seed); a named table's: InitTableRow) for them, exactly what the
// trainer's own evaluation reads, so scores equal the trainer's to the bit (pstrain predict's
// promise).
//
// Memory: the trained rows (no optimizer state) in an EmbeddingStore per row table, plus at most
// 4 bytes per table row of index (in 16 KB pages, allocated for the ranges that hold trained
// rows), plus the dense vector. Without named tables (FeatureConfig.table) there is one row table,
// the whole row space at row_dim() floats a row, as before tables. With them, one row table per
// FeatureSpec table, its rows at their table's width 1 + dim (a dim-4 table's row costs 5 floats
// however wide the model's stride row_dim() is): Gather expands a row to the stride, zeros after
// its 1 + dim floats, as the trainer's pulled rows are (docs/SERVING.md "Tables").
//
// Dynamic tables (issue 28; docs/SERVING.md "Dynamic tables"): one DynamicEmbeddingStore per
// dynamic table holding its live rows at 1 + dim floats (weights only, no optimizer slots); a
// dynamic id (negative, common/dynamic_rows.h) reads its stored row, else what training reads for
// a key without a row: the table's initializer with ALWAYS admission, zeros with COUNT or
// PROBABILITY admission. Memory follows the live rows loaded (a newer export's model is a new
// object: the old one's slabs go back when its last user drops it).
//
// Thread-safety: immutable after creation; every const method may be called from any number of
// threads (shared through std::shared_ptr, e.g. by a server that swaps in a newer export while
// requests scored by the old one finish).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/layout.h"
#include "common/env.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/embedding_store.h"
#include "pstrain/state.pb.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/params.h"

namespace pstrain {

class ServingModel {
 public:
  // Where the parameters came from, for logs and the server's model info.
  struct Origin {
    std::string path;     // the checkpoint directory or the export's version directory
    int64_t step = 0;     // the training step of the checkpoint
    int64_t version = 0;  // the export version (the checkpoint's step for a checkpoint)
  };

  // The sizes a description makes, and what allocating them costs.
  // A row table: global rows [begin, end), each stored as `width` floats ([w, v_0 .. v_{d-1}]).
  struct RowTable {
    std::string name;  // the FeatureSpec table's ("" for the default table, or no named tables)
    int64_t begin = 0;
    int64_t end = 0;
    int width = 0;
  };
  struct Shape {
    int64_t table_rows = 0;
    int row_dim = 0;
    int64_t dense_size = 0;
    // In row order, covering [0, table_rows): one of row_dim floats without named tables.
    // Dynamic tables have no row range: they are not among them.
    std::vector<RowTable> row_tables;
  };
  // A description is read from files: the largest dense vector a model may claim, refused before
  // anything is allocated (Model::Create's own bound on the MLP is lower). The table's rows cost
  // memory only as they are stored, and its row index (8 bytes per 4096 rows) is bounded by the
  // store's 2^32 rows (ps/store/embedding_store.h).
  static constexpr int64_t kMaxDenseFloats = int64_t{1} << 31;
  // With tables, a store per table: at most this many tables, and 2^32 - 1 rows in all (what the
  // one store of a model without tables holds).
  static constexpr int kMaxTables = 1024;
  // The shape `description` makes, without allocating the model's parameters (only its feature
  // spec and layout); INVALID_ARGUMENT as Create's.
  static absl::StatusOr<Shape> ShapeOf(const ModelDescription& description);

  // An empty model for `description` (no trained row yet: every row reads as its initial value,
  // the dense vector is zeros until SetDense), for the loaders below and tests.
  // INVALID_ARGUMENT when the description does not make a model (no fields, a bad shape, a
  // dense vector over kMaxDenseFloats), naming the field; nothing is allocated before it knows.
  static absl::StatusOr<std::unique_ptr<ServingModel>> Create(const ModelDescription& description,
                                                              Origin origin);

  // Reads the checkpoint whose verified restore chain is `chain` (checkpoint/layout.h
  // VerifyCheckpointChain: one link for a full checkpoint; the full one and its deltas for an
  // incremental one) with the one parameter loader (ps/store/parameter_files.h): every file each
  // MANIFEST lists named shard-<i>-of-<S> is read, so a PS checkpoint of any shard count loads
  // (rows by their global ids, dense slices by their offsets). `description` is the model to
  // rebuild: the MANIFEST's own (version >= 2), or the one a caller built from a config for a
  // version-1 checkpoint. FAILED_PRECONDITION when the files' shapes disagree with it (rows, row
  // size, dense size); DATA_LOSS naming the file for a malformed block, and when the dense vector
  // is not covered exactly (its floats counted over the slices read). With tables, each table's
  // rows are read straight into its store at its width, whatever width the files hold them at
  // (LoadEmbeddingStores resizes them).
  static absl::StatusOr<std::unique_ptr<ServingModel>> FromCheckpoint(
      absl::Span<const CheckpointLink> chain, const ModelDescription& description);

  const ModelDescription& description() const { return description_; }
  const FeatureSpec& spec() const { return spec_; }
  const Model& model() const { return *model_; }
  const Origin& origin() const { return origin_; }
  int row_dim() const { return model_->row_dim(); }
  int64_t table_rows() const { return static_cast<int64_t>(spec_.total_rows()); }
  int64_t dense_size() const { return model_->dense_size(); }
  const std::vector<float>& dense() const { return dense_; }
  // Rows with stored (trained) values, of the fixed tables.
  int64_t stored_rows() const;
  // The dynamic tables' stores (by dynamic index) and their table names; live rows in all.
  const std::vector<std::unique_ptr<DynamicEmbeddingStore>>& dynamic_stores() const {
    return dynamic_;
  }
  const std::string& dynamic_name(int d) const { return spec_.dynamic_table(d).name; }
  int64_t dynamic_rows() const;
  // Bytes held by the rows and their index, and the dense vector.
  int64_t memory_bytes() const;

  // The row tables, in row order (Shape::row_tables), and the one holding `row` (-1 outside
  // [0, table_rows())).
  const std::vector<RowTable>& row_tables() const { return row_tables_; }
  int RowTableOf(int64_t row) const;

  // rows[i * row_dim(), (i + 1) * row_dim()) = the weights of ids[i]: the stored row, else its
  // initial value (Model::InitRow(ids[i], init_seed) for the default table, a named table's
  // initializer: ps/store/table_rows.h InitTableRow), expanded to the stride (zeros after its
  // table's width); a dynamic id as above. INVALID_ARGUMENT naming the first id outside
  // [0, table_rows()) or of a dynamic table the model does not have.
  absl::Status Gather(absl::Span<const int64_t> ids, float* rows) const;
  // Every stored row in [from, to), ascending, at the stride row_dim() (zeros after a row's
  // table width): for tests and tools. Memory: that range's rows.
  EmbeddingSnapshot StoredRows(int64_t from, int64_t to) const;
  // Every stored row of row table t in [from, to), ascending, at the table's width (the
  // snapshot's dim), for writers (export). Memory: that range's rows.
  EmbeddingSnapshot StoredTableRows(int t, int64_t from, int64_t to) const {
    return rows_[t]->Snapshot(from, to);
  }

  // ---- Building (loaders only; not thread-safe, before the model is shared) ----
  // Stores rows: weights is ids.size() x row_dim (a row of a narrower table keeps its first
  // width floats). INVALID_ARGUMENT naming the first id out of range.
  absl::Status StoreRows(absl::Span<const int64_t> ids, const float* weights);
  // Stores rows of row table t: weights is ids.size() x row_tables()[t].width. INVALID_ARGUMENT
  // naming the first id outside the table.
  absl::Status StoreTableRows(int t, absl::Span<const int64_t> ids, const float* weights) {
    return rows_[t]->RestoreRows(ids, weights, nullptr);
  }
  std::vector<float>* mutable_dense() { return &dense_; }
  // Stores rows of dynamic table d: keys ascending and unique, weights keys.size() x its width
  // (1 + dim). INVALID_ARGUMENT for a bad d or keys (the store's Restore checks).
  absl::Status StoreDynamicRows(int d, absl::Span<const uint64_t> keys, const float* weights);

 private:
  ServingModel() = default;
  // Gather of fixed-table ids only.
  absl::Status GatherFixed(absl::Span<const int64_t> ids, float* rows) const;

  ModelDescription description_;
  Origin origin_;
  FeatureSpec spec_;
  std::unique_ptr<Model> model_;
  std::vector<RowTable> row_tables_;
  std::vector<std::unique_ptr<EmbeddingStore>> rows_;  // one per row table
  std::vector<std::unique_ptr<DynamicEmbeddingStore>> dynamic_;  // one per dynamic table
  std::vector<float> dense_;
};

// A ServingModel seen as ParameterAccess, read-only: Pull gathers rows and copies the dense
// vector; Push is FAILED_PRECONDITION. Lets the trainer's evaluator (worker/eval/evaluator.h)
// score a loaded model. Thread-safe.
class ServingParams : public ParameterAccess {
 public:
  explicit ServingParams(std::shared_ptr<const ServingModel> model) : model_(std::move(model)) {}
  int row_dim() const override { return model_->row_dim(); }
  int64_t dense_size() const override { return model_->dense_size(); }
  absl::Status Pull(absl::Span<const int64_t> ids, float* rows, float* dense) override;
  absl::Status Push(absl::Span<const int64_t> ids, const float* row_grads,
                    const float* dense_grad, int64_t step) override;

 private:
  std::shared_ptr<const ServingModel> model_;
};

// The checkpoint a reader of `model_dir` should use: `checkpoint` ("" = the one LATEST names,
// with ChooseCheckpoint's verification and fallback; "best" = the one model_dir/BEST names
// (checkpoint.keep_best), verified completely; else a name "ckpt-<step>" under model_dir or
// a checkpoint directory's path, verified completely), and the model description to read it
// with: the MANIFEST's; or, for a version-1 checkpoint, `config_description` (an error asking for
// --config when there is none). When both exist they must agree (CompareModelDescriptions, naming
// the field). NOT_FOUND when model_dir has no checkpoint.
struct ChosenCheckpoint {
  std::string dir;
  CheckpointManifest manifest;
  std::vector<CheckpointLink> chain;  // what restores it (CheckpointChoice::chain)
  ModelDescription description;
};
absl::StatusOr<ChosenCheckpoint> ChooseCheckpointToRead(const std::string& model_dir,
                                                        const std::string& checkpoint,
                                                        const ModelDescription* config_description,
                                                        Env* env = Env::Default());

}  // namespace pstrain
