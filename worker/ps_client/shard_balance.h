// The PS shards' load balance, as the chief prints it at the end of a job.
#pragma once

#include <string>
#include <vector>

#include "pstrain/ps_service.pb.h"

namespace pstrain {

// A table of per-shard stats (PsClient::GetStats) and the max/mean imbalance of rows, bytes,
// pulled rows and traffic, for the user to see a skewed shard at a glance. Several lines, no
// trailing newline.
std::string FormatShardBalance(const std::vector<ShardStats>& stats);

}  // namespace pstrain
