// The PS shard of a training job, shaped and initialized like single-process training: V rows
// from the FeatureSpec, row_dim and dense_size from the model, rows and the dense vector
// initialized with Model::InitRow / Model::InitDense and train.seed, so `pstrain ps`,
// `pstrain host` and `pstrain train` start from the same parameters.
#pragma once

#include <cstdint>

#include <optional>

#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "ps/server/shard_server.h"
#include "pstrain/config.pb.h"

namespace pstrain {

// Overrides of the job's shape (tests and benchmarks of the PS alone): 0 / -1 = the job's.
// When row_dim or dense_size differ from the model's, each row (the dense vector) is initialized
// with the model's values where they fit and zeros beyond.
struct ShardShape {
  int64_t rows = 0;
  int row_dim = 0;
  int64_t dense_size = -1;
};

// ShardServer::OptionsFromConfig for shard `shard` of `num_shards` with the job's shape and
// initializers (which keep the model alive), and the sparse learning rates scaled to a worker's
// share of the global batch for `num_workers` workers (0 = num_shards; common/config.h
// SparseLrShareFactor). INVALID_ARGUMENT for a bad features/model config.
absl::StatusOr<ShardServer::Options> ShardOptionsForJob(const Config& config, int shard,
                                                        int num_shards, ShardShape shape = {},
                                                        int num_workers = 0);

// The checkpoint a PS job resumes from: ChooseCheckpoint of JobCheckpointDir(config), refused
// (FAILED_PRECONDITION naming the field) when its MANIFEST describes another model than `config`
// (checkpoint/layout.h CheckCheckpointModel). Every process of the job (shards and workers)
// chooses with it, so they all pick, or all refuse, the same checkpoint.
absl::StatusOr<std::optional<CheckpointChoice>> ChooseJobCheckpoint(const Config& config);

// Before shard `shard` serves: restores `choice` (the job's own checkpoint), or, when there is
// none and the config has train.warm_start, copies the warm-start checkpoint's rows and dense
// slice it owns (any shard count or mode; worker/train/checkpoint.h RestoreOrWarmStart,
// ShardServer::WarmStart). Says on stderr what it did. Errors name the checkpoint.
absl::Status RestoreShard(const Config& config, const std::optional<CheckpointChoice>& choice,
                          int shard, ShardServer* server);

}  // namespace pstrain
