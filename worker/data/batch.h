// The data layer's output and the model's input.
#pragma once

#include <cstdint>
#include <vector>

namespace pstrain {

// A batch of examples after feature processing. Every reader produces this structure.
//
// Shapes (B = size, F = num_fields), row-major by example:
//   ids[b * F + f]    global embedding row of field f for example b (the FeatureSpec's field
//                     offset already added), in [0, FeatureSpec::total_rows()).
//   values[b * F + f] scale applied to that row's embedding and first-order weight: 1 for a plain
//                     categorical value, the value itself for DENSE numeric fields and for LibSVM
//                     id:val pairs.
//   labels[b]         0 or 1 (any value in [0, 1] is accepted as a soft label).
struct Batch {
  int num_fields = 0;
  int size = 0;
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<float> labels;

  void Clear(int fields) {
    num_fields = fields;
    size = 0;
    ids.clear();
    values.clear();
    labels.clear();
  }
  void Reserve(int rows) {
    ids.reserve(static_cast<size_t>(rows) * num_fields);
    values.reserve(static_cast<size_t>(rows) * num_fields);
    labels.reserve(rows);
  }
};

// Parsed rows before feature processing: what readers parse into, what `convert` and `datagen`
// exchange with writers. Format-neutral and unhashed, so a conversion loses nothing.
//
// Shapes (N = size(), F = num_fields), row-major by example:
//   present[n * F + f]  1 if the field has a value in this example, 0 if missing.
//   key[n * F + f]      raw categorical key (a Criteo hex value, a TFRecord int64, a LibSVM id, or
//                       HashBytes() of a string); 0 when unused.
//   value[n * F + f]    numeric value (numeric fields), or the LibSVM value / 1.0 (categorical).
struct RawRows {
  int num_fields = 0;
  std::vector<float> labels;
  std::vector<uint8_t> present;
  std::vector<uint64_t> key;
  std::vector<double> value;

  int size() const { return static_cast<int>(labels.size()); }
  void Clear(int fields) {
    num_fields = fields;
    labels.clear();
    present.clear();
    key.clear();
    value.clear();
  }
  // Appends one row with every field missing and returns its index.
  int AddRow(float label) {
    labels.push_back(label);
    present.resize(present.size() + num_fields, 0);
    key.resize(key.size() + num_fields, 0);
    value.resize(value.size() + num_fields, 0.0);
    return size() - 1;
  }
  void SetCategorical(int row, int field, uint64_t k, double v = 1.0) {
    const size_t i = static_cast<size_t>(row) * num_fields + field;
    present[i] = 1;
    key[i] = k;
    value[i] = v;
  }
  void SetNumeric(int row, int field, double v) {
    const size_t i = static_cast<size_t>(row) * num_fields + field;
    present[i] = 1;
    value[i] = v;
  }
  void PopRow() {
    labels.pop_back();
    present.resize(present.size() - num_fields);
    key.resize(key.size() - num_fields);
    value.resize(value.size() - num_fields);
  }
};

}  // namespace pstrain
