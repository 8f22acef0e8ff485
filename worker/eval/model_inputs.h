// What Model::Create needs to know of a FeatureSpec's fields (worker/model does not depend on
// worker/data; this is the first layer above both).
#pragma once

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ps/store/partition.h"
#include "ps/store/table_rows.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"

namespace pstrain {

// The field count, the DENSE numeric fields, the target-attention fields
// (ListSpec.attention_target) and, when the config names tables, each field's dim and whether it
// stays out of the FM term (its table's fm_join). A spec without named tables leaves field_dims
// and fm_excluded empty: every field has model.embedding_dim, the model of before tables.
inline ModelInputs ModelInputsOf(const FeatureSpec& spec) {
  ModelInputs inputs;
  inputs.num_fields = spec.num_fields();
  inputs.dense_fields = spec.DenseNumericFields();
  for (int f = 0; f < spec.num_fields(); ++f) {
    const FeatureSpec::Field& field = spec.field(f);
    if (field.attention_target >= 0) {
      inputs.attention.push_back({f, field.attention_target, field.attention_hidden});
    }
    if (spec.has_named_tables()) {
      inputs.field_dims.push_back(field.dim);
      inputs.fm_excluded.push_back(field.fm_excluded ? 1 : 0);
    }
  }
  return inputs;
}

// The tables' fixed-size partitions on `shards` PS shards (PartitionMap's TableSplit, in row
// order): a named table's TableConfig.partitions, or cluster.num_partitions' rule (4 x shards when
// 0) for it and for the default table, and its rows' width 1 + dim (compact widths). Empty when
// the spec names no tables: the one-table map of before tables. Every worker and shard derives
// the same from the same config.
inline std::vector<PartitionMap::TableSplit> TableSplitsOf(const FeatureSpec& spec,
                                                           const ClusterConfig& cluster,
                                                           int shards) {
  std::vector<PartitionMap::TableSplit> splits;
  if (!spec.has_named_tables()) return splits;
  for (const FeatureSpec::Table& t : spec.tables()) {
    splits.push_back({static_cast<int64_t>(t.rows),
                      t.partitions > 0 ? t.partitions : NumPartitions(cluster, shards),
                      1 + t.dim});
  }
  return splits;
}

// The tables as the stores take them (ps/store/table_rows.h): THE row initializer of every mode
// (LocalParams in train and allreduce, the PS shards, serving's untrained rows) - the default
// table's rows by model.InitRow(row, seed), exactly as before tables; a named table's by its
// initializer (InitTableRow) over the stride model.row_dim() - and the optimizers of the named
// tables whose optimizer overrides the job's `sparse` settings. `model` must outlive the
// returned row_init. A spec without named tables gives row_init = model.InitRow and no
// optimizers.
inline absl::StatusOr<StoreTables> StoreTablesOf(const FeatureSpec& spec, const Model& model,
                                                 const OptimizerConfig& sparse, uint64_t seed) {
  const Model* m = &model;
  RowInit default_init = [m, seed](int64_t row, float* out) { m->InitRow(row, seed, out); };
  std::vector<TableRows> named;
  StoreTables tables;
  for (const FeatureSpec::Table& t : spec.tables()) {
    if (spec.has_named_tables() && t.rows > 0) {
      TableRows w;
      w.begin = static_cast<int64_t>(t.offset);
      w.end = static_cast<int64_t>(t.offset + t.rows);
      w.dim = std::min(1 + t.dim, model.row_dim());
      tables.widths.push_back(w);
    }
    if (t.is_default) continue;
    const int64_t begin = static_cast<int64_t>(t.offset);
    const int64_t end = static_cast<int64_t>(t.offset + t.rows);
    named.push_back({begin, end, t.dim, t.initializer});
    if (t.optimizer.ByteSizeLong() > 0) {
      absl::StatusOr<std::unique_ptr<Optimizer>> o =
          Optimizer::Create(TableOptimizerConfig(sparse, t.optimizer));
      if (!o.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("table '", t.name, "' optimizer: ",
                                                       o.status().message()));
      }
      tables.optimizers.push_back({begin, end, std::shared_ptr<const Optimizer>(std::move(*o))});
    }
  }
  tables.row_init = TablesRowInit(std::move(named), std::move(default_init), model.row_dim(), seed);
  return tables;
}

}  // namespace pstrain
