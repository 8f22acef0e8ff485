// What Model::Create needs to know of a FeatureSpec's fields (worker/model does not depend on
// worker/data; this is the first layer above both).
#pragma once

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/dynamic_rows.h"
#include "common/hash.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/partition.h"
#include "ps/store/table_rows.h"
#include "worker/data/feature_spec.h"
#include "worker/model/model.h"
#include "worker/params/local_params.h"

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
    if (t.is_dynamic()) continue;  // no global rows: the shards own its keys by hash
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
    if (spec.has_named_tables() && t.rows > 0) {  // a dynamic table has no global rows
      TableRows w;
      w.begin = static_cast<int64_t>(t.offset);
      w.end = static_cast<int64_t>(t.offset + t.rows);
      w.dim = std::min(1 + t.dim, model.row_dim());
      tables.widths.push_back(w);
    }
    if (t.is_default || t.is_dynamic()) continue;  // dynamic: DynamicStoreOptionsOf
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

// The options of the DynamicEmbeddingStore of dynamic table `table` (FeatureSpec::dynamic_table):
// width 1 + dim, the job's sparse optimizer with the table's overrides, the admission and
// eviction of its DynamicTableConfig (max_*_per_shard: this store's caps), and the row
// initializer of the contract: the table's initializer as for a fixed named table
// (InitTableRow over 1 + dim floats), called with the row's negative id DynamicRow(index, key).
// `seed` is the job's init seed (train.seed); the sketch and the admission coin use it mixed
// with the table's index. threads and chunk_rows keep their defaults.
inline absl::StatusOr<DynamicEmbeddingStore::Options> DynamicStoreOptionsOf(
    const FeatureSpec::Table& table, const OptimizerConfig& sparse, uint64_t seed) {
  if (!table.is_dynamic()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", table.name, "' is not dynamic"));
  }
  DynamicEmbeddingStore::Options o;
  o.dim = 1 + table.dim;
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      Optimizer::Create(TableOptimizerConfig(sparse, table.optimizer));
  if (!opt.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", table.name, "' optimizer: ", opt.status().message()));
  }
  o.optimizer = std::shared_ptr<const Optimizer>(std::move(*opt));
  const int index = table.dynamic_index;
  const int dim = table.dim;
  const TableInitializer init = table.initializer;
  o.row_init = [init, dim, index, seed](int64_t key, float* out) {
    InitTableRow(init, dim, 1 + dim, DynamicRow(index, static_cast<uint64_t>(key)), seed, out);
  };
  const DynamicTableConfig& d = table.dynamic;
  switch (d.admission()) {
    case DynamicTableConfig::COUNT:
      o.admission = DynamicEmbeddingStore::Admission::kCount;
      break;
    case DynamicTableConfig::PROBABILITY:
      o.admission = DynamicEmbeddingStore::Admission::kProbability;
      break;
    default:
      o.admission = DynamicEmbeddingStore::Admission::kAlways;
  }
  o.admit_count = d.admit_count();
  o.sketch_width = d.sketch_width();
  o.sketch_depth = d.sketch_depth();
  o.admit_probability = d.admit_probability();
  o.seed = HashKey(seed, 0x64796e0000ull + static_cast<uint64_t>(index));
  o.ttl_steps = d.ttl_steps();
  o.ttl_passes = d.ttl_passes();
  o.max_rows = d.max_rows_per_shard();
  o.max_bytes = d.max_bytes_per_shard();
  o.capacity_policy = d.capacity_policy() == DynamicTableConfig::LFU
                          ? DynamicEmbeddingStore::CapacityPolicy::kLfu
                          : DynamicEmbeddingStore::CapacityPolicy::kLru;
  return o;
}

// A store per dynamic table of `spec` (DynamicStoreOptionsOf with the job's sparse optimizer and
// train.seed, splitting each call over `threads`) given to `params`: `pstrain train`'s and the
// benchmarks' in-process parameters. No-op without dynamic tables.
inline absl::Status AddDynamicTablesOf(const FeatureSpec& spec, const Config& config, int threads,
                                       LocalParams* params) {
  if (!spec.has_dynamic_tables()) return absl::OkStatus();
  std::vector<LocalParams::DynamicTable> dynamic;
  for (int d = 0; d < spec.num_dynamic_tables(); ++d) {
    const FeatureSpec::Table& t = spec.dynamic_table(d);
    absl::StatusOr<DynamicEmbeddingStore::Options> o =
        DynamicStoreOptionsOf(t, config.sparse_optimizer(), config.train().seed());
    if (!o.ok()) return o.status();
    o->threads = threads;
    absl::StatusOr<std::unique_ptr<DynamicEmbeddingStore>> store =
        DynamicEmbeddingStore::Create(*std::move(o));
    if (!store.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", t.name, "': ", store.status().message()));
    }
    dynamic.push_back({t.name, *std::move(store)});
  }
  return params->AddDynamicTables(std::move(dynamic));
}

}  // namespace pstrain
