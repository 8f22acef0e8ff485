// Which kind the next checkpoint of a job is (checkpoint.incremental_every): every K-th
// checkpoint is full, the K - 1 between are deltas (docs/CHECKPOINT.md "Incremental
// checkpoints"). The writer of a job's checkpoints (the single trainer, the allreduce rank 0, the
// PS chief) keeps one DeltaChain: it learns each checkpoint the job restored or committed, and
// says what the next one builds on. Only steps live here; which rows changed is the stores'
// business (EmbeddingStore generations).
//
// A delta always builds on the checkpoint the job holds as committed: a failed write changes
// nothing, so the next delta still builds on the last good checkpoint.
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>

#include "pstrain/state.pb.h"

namespace pstrain {

class DeltaChain {
 public:
  // every <= 1: every checkpoint is full.
  explicit DeltaChain(int every) : every_(every) {}

  // The job restored, or committed, the checkpoint of `manifest` (full or delta).
  void Committed(const CheckpointManifest& manifest);

  // nullopt: the next checkpoint is full (deltas are off, nothing is committed yet, or the chain
  // already holds every - 1 deltas); else the delta's MANIFEST field (base, parent, depth).
  std::optional<CheckpointDelta> Next() const;

 private:
  const int every_;
  // What a delta after the last committed checkpoint would be: its base, the last committed
  // step as parent and its depth.
  std::optional<CheckpointDelta> next_;
};

}  // namespace pstrain
