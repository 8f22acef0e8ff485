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
class FeatureSpec {
 public:
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
  };

  // Expands the preset, applies explicit fields, assigns offsets. Errors name the field path.
  static absl::StatusOr<FeatureSpec> Create(const FeatureConfig& config);

  int num_fields() const { return static_cast<int>(fields_.size()); }
  const Field& field(int f) const { return fields_[f]; }
  const std::vector<Field>& fields() const { return fields_; }
  uint64_t total_rows() const { return total_rows_; }
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
  // for DENSE fields), plus hash_seed and label_name. Create(Resolved()) gives this spec again;
  // checkpoints record it (pstrain.ModelDescription.features).
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
  std::vector<Field> fields_;
  uint64_t total_rows_ = 0;
  uint64_t hash_seed_ = 0;
  bool has_lists_ = false;
  std::string label_name_;
};

}  // namespace pstrain
