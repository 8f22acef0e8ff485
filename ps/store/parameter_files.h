// Reading the parameters of a checkpoint whatever wrote it: every shard file its MANIFEST lists,
// a PS job's (`shard-<i>-of-<S>`: SHRD, CONS, store blocks) or an in-process replica's
// (`shard-0-of-1`: store blocks only), into stores of any layout, and for an incremental
// checkpoint the whole chain it builds on. The one restore loop behind every resume (`pstrain
// train`, allreduce, a PS shard: ps/server/shard_checkpoint.cc), a warm start in every mode
// (docs/CHECKPOINT.md "Warm start") and the serving model (serving/serving_model.h).
//
// Thread-safety: as safe as the stores given (they are thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "checkpoint/block_file.h"
#include "checkpoint/layout.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/store_blocks.h"
#include "pstrain/state.pb.h"

namespace pstrain {

struct ParameterLoadCounts {
  int64_t rows = 0;          // embedding rows given to `stores` (a row of several links: each time)
  int64_t dense_floats = 0;  // dense floats copied into `dense`
};

// Called, positioned at a block that is neither EMBM nor DNSE of file `path`, with the reader;
// must consume exactly that block (reader->Next) or return an error.
using OtherBlockFn = std::function<absl::Status(const std::string& path, BlockReader* reader)>;

// Reads the checkpoint `chain` (checkpoint/layout.h VerifyCheckpointChain: a full checkpoint,
// then the deltas after it, up to the one restored), link by link in that order: of each link,
// every file its MANIFEST lists whose name is a shard file name (IsShardFileName). Each embedding
// row goes to the store among `stores` that owns it (rows none owns are skipped), so a row a
// later delta holds overwrites the older value. Of the last link only (every checkpoint holds the
// whole dense state and its own bookkeeping), each dense slice's overlap with `dense` (null: no
// dense slice here) is copied and other blocks go to `other` (null: skipped); the earlier links'
// are skipped. The files must have been verified by the caller (VerifyCheckpointChain); a damaged
// one still fails cleanly (DATA_LOSS naming the file and block).
absl::StatusOr<ParameterLoadCounts> LoadParameterFiles(absl::Span<const CheckpointLink> chain,
                                                       absl::Span<EmbeddingStore* const> stores,
                                                       DenseStore* dense, ParameterLoadMode mode,
                                                       const OtherBlockFn& other = nullptr);

}  // namespace pstrain
