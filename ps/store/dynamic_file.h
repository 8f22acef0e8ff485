// A dynamic table's snapshot (DynamicSnapshot, ps/store/dynamic_store.h) in a block file
// (checkpoint/block_file.h: magic, format version, a CRC per block, an end block): the files of a
// dynamic table in checkpoints, full or delta. Byte layout in docs/CHECKPOINT.md "Dynamic
// tables"; in short (integers little-endian), one group of blocks per snapshot:
//
//   DYNM  the meta, 112 bytes then the table's name:
//         uint32 layout version (1) | int32 dim | uint32 optimizer | int32 state_floats
//         | uint32 changed_since | int32 pass | int64 last_step | int64 rows | int64 deleted
//         | int64 sketch_width | int32 sketch_depth | uint32 reserved
//         | int64 admitted, rejected, evicted_ttl, evicted_capacity, seen
//         | uint32 name length | uint32 reserved | name bytes
//   DYNR  rows, at most kDynamicRowsPerBlock a block: uint32 n | uint32 reserved
//         | uint64 keys[n] | uint32 counts[n] | int32 last_pass[n] | int64 last_step[n]
//         | float weights[n x dim] | float state[n x state_floats]
//   DYND  tombstones (a delta's evicted keys): uint32 n | uint32 reserved | uint64 keys[n]
//   DYNS  the admission sketch's counters, row-major, in pieces: uint32 n | uint32 reserved
//         | uint32 counters[n]
//
// Why its own tags rather than EMBM / EMBR: a dynamic row is keyed by a 64-bit hash, carries
// per-row metadata (count, last pass and step: TTL, LRU and LFU survive a restore) and a delta
// carries deletions, none of which the fixed tables' blocks can say. The rows and the deletions
// of a snapshot are ascending and unique across blocks; the reader checks it, and every count
// against the file's size before it allocates (a hostile header cannot make it allocate more
// than the file could hold).
//
// Thread-safety: as BlockWriter and BlockReader (not thread-safe).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/block_file.h"
#include "ps/store/dynamic_store.h"

namespace pstrain {

constexpr char kDynamicMetaTag[] = "DYNM";
constexpr char kDynamicRowsTag[] = "DYNR";
constexpr char kDynamicDeletedTag[] = "DYND";
constexpr char kDynamicSketchTag[] = "DYNS";
constexpr uint32_t kDynamicLayoutVersion = 1;  // DYNM's first word; newer: FAILED_PRECONDITION
constexpr int kDynamicRowsPerBlock = 65536;
constexpr int kDynamicKeysPerBlock = 1 << 20;      // DYND and DYNS pieces

// Appends the snapshot of table `name` as one group of blocks (DYNM, then DYNR, DYND and DYNS
// blocks) to `writer`.
absl::Status WriteDynamicSnapshot(const std::string& name, const DynamicSnapshot& snapshot,
                                  BlockWriter* writer);

struct NamedDynamicSnapshot {
  std::string name;
  DynamicSnapshot snapshot;
};

// Reads the next group (the next block must be DYNM). DATA_LOSS naming the file, the block and
// what is wrong for a corrupt or inconsistent group (counts that differ from the meta's, keys not
// ascending and unique, a count larger than the file can hold, an unknown optimizer);
// FAILED_PRECONDITION for a newer layout version.
absl::StatusOr<NamedDynamicSnapshot> ReadDynamicSnapshot(BlockReader* reader);

// One snapshot in a file of its own (written atomically: BlockWriter), and its reading, which
// also requires the file to end after the group.
absl::Status WriteDynamicFile(const std::string& path, const std::string& name,
                              const DynamicSnapshot& snapshot);
absl::StatusOr<NamedDynamicSnapshot> ReadDynamicFile(const std::string& path);

}  // namespace pstrain
