// Tables in the stores (FeatureConfig.table, docs/CONFIG.md "Tables"): the initial value of a
// named table's row, the one rule every mode uses (the trainer's stores, the PS shards, allreduce's
// replicas, and serving's rows that were never trained).
//
// This file is the subset of h/tables' ps/store/table_rows.h that serving needs (InitTableRow,
// copied with the same signature and body): when both branches merge, h/tables' file replaces
// this one whole.
#pragma once

#include <cstdint>

#include "pstrain/config.pb.h"

namespace pstrain {

// The initial value of row `row` of a named table, over `stride` floats: w = 0, v_j drawn from
// the initializer by an Rng seeded with HashKey(row, seed) (Model::InitRow's seeding, so a table
// is a pure function of (seed, row) like the default one), zeros from 1 + dim to stride.
void InitTableRow(const TableInitializer& init, int dim, int stride, int64_t row, uint64_t seed,
                  float* out);

}  // namespace pstrain
