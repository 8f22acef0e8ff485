// Shared by the fuzz targets that drive a shard: the options of a small SYNC shard of 2 workers
// (64 rows in 2 partitions, row_dim 3, a dense slice of 5), whose inputs reach every check.
#pragma once

#include "ps/server/shard_server.h"

namespace pstrain {
namespace fuzz {

inline ShardServer::Options SmallSyncShard(OptimizerType sparse, OptimizerType dense) {
  ShardServer::Options o;
  o.data.rows = 64;
  o.data.partitions = 2;
  o.data.row_dim = 3;
  o.data.dense_size = 5;
  o.data.sparse_optimizer.set_type(sparse);
  o.data.dense_optimizer.set_type(dense);
  o.consistency = SYNC;
  o.num_workers = 2;
  return o;
}

}  // namespace fuzz
}  // namespace pstrain
