// Tables in the stores (FeatureConfig.table, docs/ARCHITECTURE.md "Tables"): what an
// EmbeddingStore needs of the tables that share its global row space, without knowing the
// FeatureSpec (ps/store sits below worker/): each named table's row range, dimension,
// initializer and optimizer. worker/eval/model_inputs.h (StoreTablesOf) builds it from a
// FeatureSpec; LocalParams, the PS shards, allreduce's replicas and serving all take it, so that
// a row starts with the same values and moves by the same optimizer in every mode.
//
// Widths (docs/ARCHITECTURE.md "Tables"): the model sees every row at one stride
// (Model::row_dim() = 1 + max dim): a row of a table of dim d is [w, v_0 .. v_{d-1}] and zeros
// after them, which the model never reads and whose gradients are 0. With named tables a store
// holds one table's rows at the table's width 1 + d (LocalParams' store per table, a PS shard's
// partition store; StoreTables::widths, PartitionMap::TableSplit::row_dim): the helpers below
// expand a row to the stride (zeros after the width), cut a gradient to its width, and resize a
// saved row to a store of another width.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
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
  // With named tables: every table of the row space (the default one too when it has rows), in
  // row order, with its width 1 + dim (TableRows::dim is the width here; initializer unused): a
  // store that keeps each table at its width (LocalParams) makes one store per entry. Empty: one
  // store of the whole row space at the stride, as before tables.
  std::vector<TableRows> widths;
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

// Rows packed at `width` floats each (rows[0, n x width)) spread in place to `stride` floats each
// (rows[0, n x stride)), zeros from width to stride. Requires width <= stride.
void ExpandRowsInPlace(float* rows, int64_t n, int width, int stride);
// out[i x width, (i + 1) x width) = the first `width` floats of wide[i x stride, ...), i < n.
void NarrowRows(const float* wide, int64_t n, int stride, int width, float* out);
// A row initializer writing `width` floats: `init`'s first `width` of `stride` floats (it writes
// stride). `init` itself when width == stride or init is null.
RowInit NarrowRowInit(RowInit init, int stride, int width);

// One row's weights and optimizer state at another width, for a checkpoint written at another
// width than the store it loads into (a PS partition store at its table's width, a stride-wide
// store, a checkpoint written before compact widths): weights keep their first min(from, to)
// floats and are zero after them; each of the optimizer's state slots likewise, its floats after
// `from` starting as InitState starts them; the extras are kept. `from_state` may be null
// (out_state is then InitState's). INVALID_ARGUMENT when from_state_floats is not `opt`'s
// StateFloats(from).
absl::Status ResizeRow(const Optimizer& opt, int from, const float* from_weights,
                       int from_state_floats, const float* from_state, int to, float* out_weights,
                       float* out_state);

// `base` with the table's overrides (TableConfig.optimizer) applied: the type and schedule stay.
OptimizerConfig TableOptimizerConfig(const OptimizerConfig& base, const TableOptimizer& overrides);

}  // namespace pstrain
