// Reading the parameters of a checkpoint whatever wrote it: every shard file its MANIFEST lists,
// a PS job's (`shard-<i>-of-<S>`: SHRD, CONS, store blocks) or an in-process replica's
// (`shard-0-of-1`: store blocks only), into stores of any layout. The one restore loop behind a
// PS shard's resume (ps/server/shard_checkpoint.cc) and a warm start in every mode
// (docs/CHECKPOINT.md "Warm start").
//
// Thread-safety: as safe as the stores given (they are thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "checkpoint/block_file.h"
#include "ps/store/dense_store.h"
#include "ps/store/embedding_store.h"
#include "ps/store/store_blocks.h"
#include "pstrain/state.pb.h"

namespace pstrain {

struct ParameterLoadCounts {
  int64_t rows = 0;          // embedding rows given to `stores`
  int64_t dense_floats = 0;  // dense floats copied into `dense`
};

// Called, positioned at a block that is neither EMBM nor DNSE of file `path`, with the reader;
// must consume exactly that block (reader->Next) or return an error.
using OtherBlockFn = std::function<absl::Status(const std::string& path, BlockReader* reader)>;

// Reads every file `manifest` lists whose name is a shard file name (checkpoint/layout.h
// IsShardFileName) under `ckpt_dir`: each embedding row goes to the store among `stores` that
// owns it (rows none owns are skipped), each dense slice's overlap with `dense` (null: no dense
// slice here) is copied. Other blocks go to `other` (null: skipped). The files must have been
// verified by the caller (VerifyCheckpoint); a damaged one still fails cleanly (DATA_LOSS naming
// the file and block).
absl::StatusOr<ParameterLoadCounts> LoadParameterFiles(const std::string& ckpt_dir,
                                                       const CheckpointManifest& manifest,
                                                       absl::Span<EmbeddingStore* const> stores,
                                                       DenseStore* dense, ParameterLoadMode mode,
                                                       const OtherBlockFn& other = nullptr);

}  // namespace pstrain
