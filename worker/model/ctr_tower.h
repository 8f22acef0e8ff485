// The one tower behind every model type (model.h Tower): the sparse kernels (fm.h) on the
// rows, then the MLP (mlp.h) or the grammar's dense blocks (dense_blocks.h), DIN's target
// attention (target_attention.h), the loss, and the backward of each. CtrModel (deepfm.cc) builds
// the parts from the model's shapes; the tower only runs them.
#pragma once

#include <memory>

#include "worker/model/dense_blocks.h"
#include "worker/model/fm.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"
#include "worker/model/target_attention.h"

namespace pstrain {

// A tower for slices of up to max_batch examples on `threads` OpenMP threads. shape: the sparse
// part (fields, k, FM term, x0 for a dense part, per-field layout); l2: ModelConfig.embedding_l2.
// At most one of mlp and blocks (the MLP on x0, or the cross network / dot interaction with
// theirs); attention: null, or the list fields pooled by target attention.
std::unique_ptr<Tower> NewCtrTower(const SparseShape& shape, float l2, int max_batch, int threads,
                                   std::unique_ptr<Mlp> mlp, std::unique_ptr<DenseBlocks> blocks,
                                   std::unique_ptr<TargetAttention> attention);

}  // namespace pstrain
