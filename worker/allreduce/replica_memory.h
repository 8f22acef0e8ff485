// How much memory an allreduce rank's replica will take, estimated before training: every rank
// holds every row that ANY rank trains (the replicas stay identical), plus the dense vector, each
// with its optimizer slots. `pstrain allreduce` compares the estimate with the memory the rank
// may still take (common/memory.h) and refuses to start when it does not fit, instead of being
// killed by the OOM killer hours later; AllreduceOptions::replica_budget_bytes then guards each
// step (worker/allreduce/allreduce_params.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pstrain/config.pb.h"
#include "worker/data/feature_spec.h"

namespace pstrain {

// What the training data says about its ids: distinct values per field name and its row count.
struct DataCardinality {
  int64_t rows = 0;                         // examples in the data (0: unknown)
  std::map<std::string, uint64_t> distinct;  // field name -> distinct values
  std::string source;                       // the file it came from
};

// `pstrain datagen`'s teacher.json next to the first file of `train_files` ("rows" and
// "cardinalities": {"C1": n, ...}); nullopt when there is none. INVALID_ARGUMENT naming the file
// when it is there but not such an object.
absl::StatusOr<std::optional<DataCardinality>> ReadDataCardinality(
    const std::vector<std::string>& train_files);

struct ReplicaEstimate {
  double rows = 0;        // rows expected to be trained (stored), over all the fields
  int64_t bytes = 0;      // their weights and slots, the row index, the dense vector and slots
  std::string basis;      // how the rows were counted, for messages
};

// Rows of a field of R hashed rows (plus its "missing" row) that D distinct values touch: the
// expected number of distinct hash buckets R (1 - exp(-D / R)), plus 1. Without D (unknown), all
// R + 1. The data's row count caps D when known.
//
// Bytes: rows x (row_dim + sparse optimizer floats per row) x 4, plus the row index (4 bytes a
// table row at most: min(table rows, 4096 x rows) x 4), plus dense_size x (1 + the dense
// optimizer's floats) x 4.
absl::StatusOr<ReplicaEstimate> EstimateReplica(const Config& config, const FeatureSpec& spec,
                                                int row_dim, int64_t dense_size,
                                                const std::optional<DataCardinality>& data);

}  // namespace pstrain
