// The PS shards' load balance, as the chief prints it at the end of a job.
#pragma once

#include <string>
#include <vector>

#include "pstrain/ps_service.pb.h"
#include "worker/train/progress.h"

namespace pstrain {

// A table of per-shard stats (PsClient::GetStats) and the max/mean imbalance of rows, bytes,
// pulled rows and traffic, for the user to see a skewed shard at a glance. Several lines, no
// trailing newline.
std::string FormatShardBalance(const std::vector<ShardStats>& stats);

// Each dynamic table's counters summed over the shards (each shard holds the keys it owns, so
// rows, counters and bytes add up), in the order of the first shard that names a table: what the
// chief writes to summary.json's dynamic_tables. new_ids_last_step sums each shard's rows created
// at its own last step (in SYNC every shard's last step is the job's).
std::vector<DynamicTableMetrics> SumDynamicTables(const std::vector<ShardStats>& stats);

}  // namespace pstrain
