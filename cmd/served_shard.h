// ServedShard: the shard a process serves (ps/server), as that process's own worker reaches it
// (worker/ps_client/local_shard.h). The composition root's adapter between the two layers, which
// do not know each other (`pstrain host`, and tests that run a worker beside a shard).
#pragma once

#include <memory>

#include "ps/server/shard_server.h"
#include "worker/ps_client/local_shard.h"

namespace pstrain {

class ServedShard final : public LocalShard {
 public:
  explicit ServedShard(ShardServer* server) : server_(server) {}
  std::shared_ptr<grpc::Channel> InProcessChannel() override { return server_->InProcessChannel(); }
  absl::Status PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows, float* dense,
                          int64_t* staleness, int64_t* dense_version,
                          uint32_t* row_versions) override {
    return server_->PullDirect(ids, step, rows, dense, staleness, dense_version, row_versions);
  }
  absl::Status PushDirect(int32_t worker_id, int64_t step, absl::Span<const int64_t> ids,
                          const float* row_grads, const float* dense_grad,
                          int64_t dense_version, const uint32_t* row_versions) override {
    return server_->PushDirect(worker_id, step, ids, row_grads, dense_grad, dense_version,
                               row_versions);
  }
  bool row_versions() const override { return server_->row_versions(); }

 private:
  ShardServer* const server_;
};

}  // namespace pstrain
