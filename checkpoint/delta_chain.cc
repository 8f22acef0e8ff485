#include "checkpoint/delta_chain.h"

namespace pstrain {

void DeltaChain::Committed(const CheckpointManifest& manifest) {
  CheckpointDelta next;
  next.set_parent_step(manifest.step());
  if (manifest.has_delta()) {
    next.set_base_step(manifest.delta().base_step());
    next.set_depth(manifest.delta().depth() + 1);
  } else {
    next.set_base_step(manifest.step());
    next.set_depth(1);
  }
  next_ = next;
}

std::optional<CheckpointDelta> DeltaChain::Next() const {
  if (every_ <= 1 || !next_ || next_->depth() > every_ - 1) return std::nullopt;
  return next_;
}

}  // namespace pstrain
