// The data layer's output and the model's input.
#pragma once

#include <algorithm>
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
//
// With list fields (FieldSpec.list; FeatureSpec::has_lists()), the entries are jagged:
//   offsets[b * F + f] .. offsets[b * F + f + 1]   the entries of (example b, field f) in ids and
//                     values; offsets has B * F + 1 elements, offsets[0] = 0, and every (b, f) has
//                     at least one entry (an empty list is the field's missing row, scale 1).
//   values[i]         the id's weight with the field's combiner folded in (MEAN: w_i / sum w,
//                     SQRTN: w_i / sqrt(sum w^2), SUM: w_i), so that the field's pooled vector is
//                     x_f = sum_i values[i] * v_{ids[i]}; single-valued fields keep one entry.
// offsets is empty when no field holds lists: the layout above, one entry per (b, f).
struct Batch {
  int num_fields = 0;
  int size = 0;
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<float> labels;
  std::vector<int32_t> offsets;

  // The entries of the first `examples` examples (all of ids when offsets is empty).
  int64_t entries(int examples) const {
    return offsets.empty() ? int64_t{examples} * num_fields
                           : offsets[static_cast<size_t>(examples) * num_fields];
  }

  void Clear(int fields) {
    num_fields = fields;
    size = 0;
    ids.clear();
    values.clear();
    labels.clear();
    offsets.clear();
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
//
// List fields (FieldSpec.list) keep their ids and weights, unhashed, in side arrays: cell
// i = n * F + f holds list_key / list_weight[list_begin[i] .. list_begin[i] + list_size[i]),
// with present[i] = 1 when the list was given (possibly empty) and key / value unused. The cell
// arrays are allocated by the first list (ListSize() is 0 for any cell before); rows without list
// fields never touch them. truncated_lists counts the lists readers cut to max_length.
struct RawRows {
  int num_fields = 0;
  std::vector<float> labels;
  std::vector<uint8_t> present;
  std::vector<uint64_t> key;
  std::vector<double> value;
  std::vector<uint32_t> list_begin, list_size;
  std::vector<uint64_t> list_key;
  std::vector<double> list_weight;
  uint64_t truncated_lists = 0;

  int size() const { return static_cast<int>(labels.size()); }
  void Clear(int fields) {
    num_fields = fields;
    labels.clear();
    present.clear();
    key.clear();
    value.clear();
    list_begin.clear();
    list_size.clear();
    list_key.clear();
    list_weight.clear();
    truncated_lists = 0;
  }
  // Appends one row with every field missing and returns its index.
  int AddRow(float label) {
    labels.push_back(label);
    present.resize(present.size() + num_fields, 0);
    key.resize(key.size() + num_fields, 0);
    value.resize(value.size() + num_fields, 0.0);
    if (!list_begin.empty()) {
      list_begin.resize(present.size(), 0);
      list_size.resize(present.size(), 0);
    }
    return size() - 1;
  }
  size_t Cell(int row, int field) const { return static_cast<size_t>(row) * num_fields + field; }
  uint32_t ListSize(size_t cell) const { return cell < list_size.size() ? list_size[cell] : 0; }
  // Marks (row, field) as a given list, empty so far (replacing an earlier list there: its ids
  // stay in the side arrays, unreferenced, unless they were the last ones appended).
  void StartList(int row, int field) {
    if (list_begin.size() < present.size()) {
      list_begin.resize(present.size(), 0);
      list_size.resize(present.size(), 0);
    }
    const size_t i = Cell(row, field);
    if (list_size[i] > 0 && list_begin[i] + list_size[i] == list_key.size()) {
      list_key.resize(list_begin[i]);
      list_weight.resize(list_begin[i]);
    }
    present[i] = 1;
    key[i] = 0;
    value[i] = 0.0;
    list_begin[i] = static_cast<uint32_t>(list_key.size());
    list_size[i] = 0;
  }
  // Appends an id to the list StartList(row, field) began; no other list may be appended to in
  // between (a list's ids are contiguous).
  void AddToList(int row, int field, uint64_t k, double weight = 1.0) {
    const size_t i = Cell(row, field);
    list_key.push_back(k);
    list_weight.push_back(weight);
    ++list_size[i];
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
    if (!list_begin.empty()) {
      // The last row's lists are the last ids appended.
      size_t keep = list_key.size();
      for (size_t i = present.size() - num_fields; i < present.size(); ++i) {
        if (list_size[i] > 0) keep = std::min<size_t>(keep, list_begin[i]);
      }
      list_key.resize(keep);
      list_weight.resize(keep);
      list_begin.resize(present.size() - num_fields);
      list_size.resize(present.size() - num_fields);
    }
    labels.pop_back();
    present.resize(present.size() - num_fields);
    key.resize(key.size() - num_fields);
    value.resize(value.size() - num_fields);
  }
};

}  // namespace pstrain
