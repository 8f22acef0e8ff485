// LocalShard: a PS shard served by this process (`pstrain host`), as the client reaches it. The
// client depends on this narrow interface, not on the server: the host command (cmd/host.cc)
// implements it over its ShardServer, so worker/ps_client never links the gRPC server.
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pstrain {

class LocalShard {
 public:
  virtual ~LocalShard() = default;

  // A channel to the shard that stays in the process (no TCP; messages are still serialized):
  // every call but ASYNC's pulls and pushes, and every call in BOUNDED / SYNC, goes through it.
  virtual std::shared_ptr<grpc::Channel> InProcessChannel() = 0;

  // ASYNC's fast path, on the caller's buffers, without messages (ShardServer::PullDirect /
  // PushDirect have the contract): rows in ids' order, each at its table's width as on the wire
  // (at most ids.size() x row_dim floats) and, when dense is
  // not null, the shard's dense slice and its version; *staleness as PullResponse.staleness.
  // A dense gradient names the version it was computed from (-1: unknown). With row_versions()
  // (per-row staleness), row_versions[ids.size()] likewise (pull: filled if not null; push: the
  // pulled ones, or null).
  virtual absl::Status PullDirect(absl::Span<const int64_t> ids, int64_t step, float* rows,
                                  float* dense, int64_t* staleness, int64_t* dense_version,
                                  uint32_t* row_versions) = 0;
  virtual absl::Status PushDirect(int32_t worker_id, int64_t step, absl::Span<const int64_t> ids,
                                  const float* row_grads, const float* dense_grad,
                                  int64_t dense_version, const uint32_t* row_versions) = 0;
  virtual bool row_versions() const = 0;
};

}  // namespace pstrain
