// Choosing the checkpoint a warm start copies (train.warm_start, --warm_start_from;
// docs/CHECKPOINT.md "Warm start"). What is copied, and into what, is each mode's restore code:
// ps/store/parameter_files.h LoadParameterFiles reads any mode's and shard count's files.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "common/env.h"
#include "pstrain/config.pb.h"
#include "pstrain/state.pb.h"

namespace pstrain {

// The checkpoint `warm_start.from()` names, verified completely with the chain of a delta
// (VerifyCheckpointChain; CheckpointChoice::chain is what a loader reads): a model dir
// (ChooseCheckpoint: LATEST, falling back past a corrupt checkpoint) or one of its ckpt-<step>
// directories (that one, no fallback). Its MANIFEST's model description is compared with
// `wanted` (CompareModelDescriptions: FAILED_PRECONDITION naming the field, e.g.
// model.embedding_dim); without reset_optimizer the optimizer types must match too. A version-1
// MANIFEST (no description) is accepted with a warning: the restore's shape check (rows, row
// size, dense size) is then all that guards it. Errors name the source: NOT_FOUND for a missing
// directory or a model dir without a checkpoint, DATA_LOSS for one whose checkpoints are all
// corrupt. `env` checks that the source is a directory (or a symlink to one).
absl::StatusOr<CheckpointChoice> ChooseWarmStartCheckpoint(const WarmStart& warm_start,
                                                           const ModelDescription& wanted,
                                                           Env* env = Env::Default());

}  // namespace pstrain
