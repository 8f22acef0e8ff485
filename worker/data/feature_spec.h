// Resolved feature layout: which fields exist, how raw values become embedding rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"
#include "worker/data/batch.h"

namespace pstrain {

// Immutable after Create(); safe to share across threads.
//
// The embedding space is one logical table: field f owns rows [offset(f), offset(f) + rows(f)).
// Row offset(f) + 0 is the field's "missing" row. Encoding rules (docs/FORMATS.md):
//   CATEGORICAL:          row = 1 + Reduce(HashKey(key, seed_f), rows(f) - 1), scale = value
//   NUMERIC, BUCKET:      b = floor(ln(x)^2) if x > 2 else trunc(x);
//                         row = 1 + Reduce(HashKey(uint64(b), seed_f), rows(f) - 1), scale = 1
// where Reduce(h, n) = (h * n) >> 64 in 128-bit arithmetic maps a hash onto [0, n).
//   NUMERIC, DENSE:       row = 1, scale = log1p(max(x, 0)) (numeric_transform LOG1P, the
//                         default) or x (NO_TRANSFORM)
//   missing (any kind):   row = 0, scale = 1
// A list field (FieldSpec.list) has one entry per id, each encoded as a CATEGORICAL value with
// scale = w_i * c (c: the combiner's 1 / sum w, 1 / sqrt(sum w^2) or 1), the first max_length ids
// only; an empty list, or one whose combiner denominator is 0, is the missing row (one entry,
// scale 1). A field with share_rows_with uses its target's offset, rows and seed.
//
// Tables (FeatureConfig.table, docs/CONFIG.md "Tables"): the row space is a sequence of tables,
// each a contiguous range [offset, offset + rows) of global rows whose rows hold 1 + dim floats.
// The fields that name no table keep the layout above exactly: their slices form the "default
// table" (tables()[0] when some field uses it), dimension model.embedding_dim, rows [0, n). The
// named tables follow in config order; a field naming table t hashes with t's seed into
// [offset_t + 1, offset_t + rows_t), and offset_t is the missing row of every field of t.
//
// Dynamic tables (TableConfig.dynamic, docs/ARCHITECTURE.md "Dynamic tables") take no global
// rows: a field of dynamic table t (dynamic index d) encodes a present value as the negative id
// DynamicRow(d, HashKey(key, seed_t)) (the bucket b instead of key for NUMERIC bucket fields) and
// a missing or empty value as DynamicMissingRow(d) (common/dynamic_rows.h); the stores key the
// row by the hash.
class FeatureSpec {
 public:
  struct Table {
    std::string name;      // "" for the default table
    bool is_default = false;
    int dim = 0;           // embedding dimension (a row holds 1 + dim floats)
    uint64_t rows = 0;
    uint64_t offset = 0;   // first global row
    uint64_t seed = 0;     // hash seed of the fields that name it (default table: unused)
    // Resolved: stddev set (model.embedding_init_stddev when unset), limit set for UNIFORM.
    // The default table's is NORMAL with model.embedding_init_stddev (Model::InitRow).
    TableInitializer initializer;
    TableOptimizer optimizer;  // overrides of the job's sparse optimizer, as configured
    int partitions = 0;        // 0 = the cluster's rule
    TableConfig::FmJoin fm_join = TableConfig::REFUSE;
    // Dynamic tables (TableConfig.dynamic, docs/CONFIG.md "Dynamic tables"): the table's index
    // among the dynamic tables in config order (common/dynamic_rows.h), or -1 for a fixed table.
    // A dynamic table has rows 0 and takes no global rows: offset is where it would start.
    int dynamic_index = -1;
    DynamicTableConfig dynamic;  // as configured (defaults of unset members apply)
    bool is_dynamic() const { return dynamic_index >= 0; }
  };
  struct Field {
    std::string name;
    FieldKind kind = CATEGORICAL;
    NumericMode numeric_mode = LOG_SQUARED_BUCKET;
    NumericTransform numeric_transform = LOG1P;  // DENSE fields only
    uint64_t rows = 0;    // rows of this field's slice (>= 2)
    uint64_t offset = 0;  // first global row
    uint64_t seed = 0;    // per-field hash seed
    // List fields (FieldSpec.list): `list` is set and the rest is its ListSpec.
    bool list = false;
    Combiner combiner = MEAN;
    int max_length = 1;
    ListOverflow overflow = TRUNCATE;
    std::string separator;
    std::string weights_key;
    int shares_rows_of = -1;  // the field whose slice this one uses (share_rows_with), or -1
    // list.attention_target: the target field's index, or -1 (combiner pooling), and the
    // attention MLP's widths (36 when the config lists none).
    int attention_target = -1;
    std::vector<int> attention_hidden;
    int table = 0;  // index into tables()
    int dynamic = -1;  // its table's dynamic_index (rows and offset then unused), or -1
    int dim = 0;    // its table's dim
    // True when the field's dim differs from model.embedding_dim and its table's fm_join is
    // EXCLUDE: it stays out of the FM term (ModelInputs::fm_excluded).
    bool fm_excluded = false;
  };

  // Expands the preset, applies explicit fields, assigns offsets, resolves the tables. Errors name
  // the field or table path. `model` gives the dimension of the default table and of tables with
  // dim 0 (model.embedding_dim, as ResolveModelConfig leaves it: 0 for LR), the default stddev
  // and the blocks a table's dimension must fit (the FM term: fm_join; DLRM's DOT and target
  // attention: one dimension). The one-argument form uses ModelConfig's defaults and checks no
  // model: for callers that only encode, or that read a Resolved() config (explicit dims).
  static absl::StatusOr<FeatureSpec> Create(const FeatureConfig& config, const ModelConfig& model);
  static absl::StatusOr<FeatureSpec> Create(const FeatureConfig& config);

  int num_fields() const { return static_cast<int>(fields_.size()); }
  const Field& field(int f) const { return fields_[f]; }
  const std::vector<Field>& fields() const { return fields_; }
  uint64_t total_rows() const { return total_rows_; }
  // The tables, in row order: the default table first when some field names no table.
  const std::vector<Table>& tables() const { return tables_; }
  int num_tables() const { return static_cast<int>(tables_.size()); }
  // True when the config names tables (FeatureConfig.table not empty): a spec without them is
  // exactly the one-table layout of before tables existed.
  bool has_named_tables() const { return has_named_tables_; }
  // model.embedding_dim as Create got it.
  int embedding_dim() const { return embedding_dim_; }
  // max(embedding_dim, every table's dim): a pulled row's stride is 1 + max_dim().
  int max_dim() const { return max_dim_; }
  // The table holding global row `row` (in [0, total_rows())), or -1 outside.
  int TableOfRow(int64_t row) const;
  // Index of the table with this name (the default table: ""), or -1.
  int TableIndex(const std::string& name) const;
  // The dynamic tables in dynamic-index order: dynamic_table(d).dynamic_index == d.
  int num_dynamic_tables() const { return static_cast<int>(dynamic_tables_.size()); }
  bool has_dynamic_tables() const { return !dynamic_tables_.empty(); }
  const Table& dynamic_table(int d) const { return tables_[dynamic_tables_[d]]; }
  // The index into tables() of dynamic table d.
  int dynamic_table_index(int d) const { return dynamic_tables_[d]; }
  // True when some field holds lists: Encode then fills Batch::offsets.
  bool has_lists() const { return has_lists_; }
  // The most entries Encode makes for one example: 1 a field, max_length for a list field.
  int64_t max_entries_per_example() const {
    int64_t n = 0;
    for (const Field& f : fields_) n += f.list ? f.max_length : 1;
    return n;
  }
  // The first list field's name, for the modes that cannot carry lists yet: an error naming the
  // field and `what` ("serve requests"), or OK when no field holds lists.
  absl::Status RefuseLists(const std::string& what) const;
  const std::string& label_name() const { return label_name_; }
  uint64_t hash_seed() const { return hash_seed_; }
  // The config this spec was made from, resolved: preset NO_PRESET and every field listed in
  // table order with its name, kind, numeric_mode, numeric_transform and vocab_size (its rows: 2
  // for DENSE fields; fields that name a table have `table` instead), plus hash_seed, label_name
  // and every named table with its dim, rows and initializer resolved. Create(Resolved(), model)
  // gives this spec again; checkpoints record it (pstrain.ModelDescription.features).
  FeatureConfig Resolved() const;
  // Index of the field with this name, or -1.
  int FieldIndex(const std::string& name) const;
  // The NUMERIC fields with numeric_mode DENSE, increasing (ModelInputs::dense_fields: their
  // values feed DLRM's bottom MLP).
  std::vector<int> DenseNumericFields() const {
    std::vector<int> dense;
    for (int f = 0; f < num_fields(); ++f) {
      if (fields_[f].kind == NUMERIC && fields_[f].numeric_mode == DENSE) dense.push_back(f);
    }
    return dense;
  }

  // The FuxiCTR / Kaggle-winners bucket of a numeric value.
  static int64_t LogSquaredBucket(double x);

  // Encodes rows [0, raw.size()) of `raw` and appends them to *batch (batch->num_fields must
  // equal num_fields(), or batch must be empty).
  void Encode(const RawRows& raw, Batch* batch) const;
  // Encodes one field value; used by Encode and by tests.
  void EncodeOne(int f, bool present, uint64_t key, double value, int64_t* row, float* scale) const;
  // Appends the entries of list cell i of `raw` (field f) to ids / values.
  void EncodeList(int f, const RawRows& raw, size_t i, std::vector<int64_t>* ids,
                  std::vector<float>* values) const;

 private:
  static absl::StatusOr<FeatureSpec> CreateImpl(const FeatureConfig& config,
                                                 const ModelConfig& model, bool check_model);
  // The model's constraints on the tables' dimensions (Create's doc).
  absl::Status CheckTableDims(const FeatureConfig& config, const ModelConfig& model) const;

  std::vector<Field> fields_;
  std::vector<Table> tables_;
  std::vector<int> dynamic_tables_;  // indexes into tables_, by dynamic_index
  bool has_named_tables_ = false;
  int embedding_dim_ = 0;
  int max_dim_ = 0;
  uint64_t total_rows_ = 0;
  uint64_t hash_seed_ = 0;
  bool has_lists_ = false;
  std::string label_name_;
};

}  // namespace pstrain
