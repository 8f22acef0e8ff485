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
  };

  // Expands the preset, applies explicit fields, assigns offsets. Errors name the field path.
  static absl::StatusOr<FeatureSpec> Create(const FeatureConfig& config);

  int num_fields() const { return static_cast<int>(fields_.size()); }
  const Field& field(int f) const { return fields_[f]; }
  const std::vector<Field>& fields() const { return fields_; }
  uint64_t total_rows() const { return total_rows_; }
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

 private:
  std::vector<Field> fields_;
  uint64_t total_rows_ = 0;
  uint64_t hash_seed_ = 0;
  std::string label_name_;
};

}  // namespace pstrain
