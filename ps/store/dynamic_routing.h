// Which PS shard owns a dynamic table's row (issue 28; docs/ARCHITECTURE.md "Dynamic tables").
// A dynamic row has no place in the PartitionMap's row range: it travels as a negative id
// (common/dynamic_rows.h) and its shard is a hash of its key mixed with its table, mod S. The
// worker's client (worker/ps_client/shard_router.cc) sends it there and the shard
// (ps/server/shard.cc) refuses it anywhere else, so both must use this one function.
#pragma once

#include <cstdint>

#include "common/dynamic_rows.h"
#include "common/hash.h"

namespace pstrain {

// The shard in [0, num_shards) that owns dynamic row `id` (IsDynamicRow(id)). Why a hash of the
// key and not the key's bits: the key is already a hash of the raw id, but the missing row (key
// 0) and small test keys would pile onto shard 0. Why mixed with the table: two tables' missing
// rows, and one id shared by two tables, spread over the shards. The mix differs from the
// store's stripe hash (Fmix64(key) >> 54, ps/store/dynamic_store.cc), so that a shard's keys
// still fill all of its store's stripes.
inline int DynamicShardOf(int64_t id, int num_shards) {
  const uint64_t h = HashKey(DynamicKeyOf(id), 0x64796e616d6963ull + DynamicTableOf(id));
  return static_cast<int>(h % static_cast<uint64_t>(num_shards));
}

}  // namespace pstrain
