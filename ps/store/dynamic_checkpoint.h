// Reading the dynamic tables' rows (DYNM groups, ps/store/dynamic_file.h) of a checkpoint,
// whatever wrote it (a PS job of any shard count), into DynamicEmbeddingStores: the restore of a
// PS shard (ps/server/shard_checkpoint.cc, re-sharding included) and the serving model
// (serving/serving_model.cc).
//
// Thread-safety: as the stores given (thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "checkpoint/layout.h"
#include "ps/store/dynamic_store.h"
#include "ps/store/store_blocks.h"

namespace pstrain {

// Whether key `key` of dynamic table `table` (its dynamic index) is kept; null keeps every key.
using DynamicKeyFilter = std::function<bool(int table, uint64_t key)>;

// Reads `chain` (VerifyCheckpointChain's: the full checkpoint, then its deltas) link by link: of
// each link, the DYNM groups of every shard file (a PS job's) and dynamic-<table> file (`pstrain
// train`'s) its MANIFEST lists, each given to the store of
// `stores` whose name in `names` (the config's table names, by dynamic index) it has, with the
// keys `owns` rejects dropped. A link's groups of one table (one per old shard) are merged and
// restored at once: a full link replaces the store, a delta deletes its tombstones and writes
// its rows (DynamicEmbeddingStore::Restore). The sketch and the cumulative counters are those of
// the group in the file named `own_file` (a shard restoring its own layout: exact); without one
// (re-sharding, serving, a warm start) the sketch is the parts' sum (saturating: it never
// undercounts, as a count-min sketch must not) and the counters restart at 0, except with
// `carry_counters` on a resume (mode.keep_step): then they are the parts' sums (the re-sharded
// job's shard 0 carries the old shards' counters, so that the shards' counters still sum to the
// job's; the other shards' restart at 0). `mode`: !keep_step
// (a warm start) zeroes the steps and passes and ignores `own_file`, !keep_optimizer_state gives
// the rows the store's optimizer's fresh slots, skip_unknown_dynamic skips the groups of tables
// not in `names`. A store without an admission sketch takes none. FAILED_PRECONDITION naming the
// file for a table the config does not have (unless skipped) or of another width; DATA_LOSS naming the file for a malformed group or
// parts of different shapes; the store's Restore errors naming the checkpoint and table.
absl::Status LoadDynamicTables(absl::Span<const CheckpointLink> chain,
                               absl::Span<DynamicEmbeddingStore* const> stores,
                               absl::Span<const std::string> names, const DynamicKeyFilter& owns,
                               const std::string& own_file, ParameterLoadMode mode,
                               bool carry_counters = false);

}  // namespace pstrain
