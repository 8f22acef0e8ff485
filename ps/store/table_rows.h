// Tables in the stores (FeatureConfig.table, docs/ARCHITECTURE.md "Tables"): what an
// EmbeddingStore needs of the tables that share its global row space, without knowing the
// FeatureSpec (ps/store sits below worker/): each named table's row range, dimension,
// initializer and optimizer. worker/eval/model_inputs.h (StoreTablesOf) builds it from a
// FeatureSpec; LocalParams, the PS shards, allreduce's replicas and serving all take it, so that
// a row starts with the same values and moves by the same optimizer in every mode.
//
// Storage is still one stride for every row (Model::row_dim() = 1 + max dim): a row of a table
// of dim d holds [w, v_0 .. v_{d-1}] and zeros after them, which its gradients (0 there) never
// move. Compact per-table widths in the stores, on the wire and in checkpoints are not built yet
// (docs/ARCHITECTURE.md "Tables", "Not done").
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ps/store/embedding_store.h"
#include "ps/store/optimizer.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// One named table's rows in the global row space.
struct TableRows {
  int64_t begin = 0;  // [begin, end): the table's global rows
  int64_t end = 0;
  int dim = 0;  // a row is [w, v_0 .. v_{dim-1}]
  // Resolved (FeatureSpec::Table::initializer: stddev set, limit set for UNIFORM).
  TableInitializer initializer;
};

// What the stores take of the tables: the one row initializer of every mode, and the optimizers
// of the tables with their own settings (EmbeddingStore::Options::range_optimizers).
struct StoreTables {
  RowInit row_init;  // null: the caller's default (Model::InitRow)
  std::vector<EmbeddingStore::Options::RangeOptimizer> optimizers;
};

// The initial value of row `row` of a named table, over `stride` floats: w = 0, v_j drawn from
// the initializer by an Rng seeded with HashKey(row, seed) (Model::InitRow's seeding, so a table
// is a pure function of (seed, row) like the default one), zeros from 1 + dim to stride.
void InitTableRow(const TableInitializer& init, int dim, int stride, int64_t row, uint64_t seed,
                  float* out);

// The RowInit of a row space whose named tables are `tables` (ascending, disjoint) and whose
// other rows (the default table) start with `default_init`. Rows of a named table:
// InitTableRow(..., stride, row, seed).
RowInit TablesRowInit(std::vector<TableRows> tables, RowInit default_init, int stride,
                      uint64_t seed);

// `base` with the table's overrides (TableConfig.optimizer) applied: the type and schedule stay.
OptimizerConfig TableOptimizerConfig(const OptimizerConfig& base, const TableOptimizer& overrides);

}  // namespace pstrain
