// ShardEndpoint: one PS shard as PsClient reaches it. PsClient routes a step's ids to the shards
// that own them and scatters the answers back (worker/ps_client/ps_client.h); an endpoint carries
// one shard's part of a pull or a push there and back. Two implementations:
//   - RemoteShard (MakeRemoteShard): the ParameterServer service over a gRPC channel (TCP, or the
//     in-process channel of a shard this process serves), every call under the one retry policy
//     (common/rpc/retry.h): a deadline per attempt, UNAVAILABLE and DEADLINE_EXCEEDED retried with
//     jittered exponential backoff (on a Timer: no thread waits) within the call's budget, then
//     an error naming the shard, its address, the method, the attempts and the time, e.g.
//       "shard 1 (127.0.0.1:5001): Pull failed after 6 attempts over 3.1 s: UNAVAILABLE: ...".
//     Answers are checked against the request (row bytes, version bytes, the dense slice) before
//     the caller sees them.
//   - InProcessShard (MakeInProcessShard): ASYNC's fast path to the shard this process serves
//     (`pstrain host`): pulls and pushes are direct calls on the caller's thread (LocalShard::
//     PullDirect / PushDirect: no messages), its other calls go to a RemoteShard over the
//     in-process channel.
// Both answer a part the same way (PullPart's answer fields), so that what PsClient does with an
// answer (versions, fingerprints, scatter) is written once.
//
// Push order: a shard applies each (worker, incarnation, sequence) push at most once and needs one
// client's pushes in sequence order. The client takes a ticket per push with ReservePush() while
// it holds the lock that orders its sequences, then calls Push() with it outside that lock: a
// RemoteShard sends its pushes one at a time, in ticket order, whatever order Push() is called
// in. Every ticket must be used exactly once.
//
// Thread-safety: every method may be called concurrently. `done` runs exactly once, on a gRPC or
// timer thread, or inline on the caller's thread (InProcessShard, a refused request), never while
// the endpoint holds a lock. Abort() and Shutdown() end the calls in progress (and every later
// one): Abort with its reason, Shutdown with CANCELLED ("the PS client is shutting down"). The
// destructor must not run before every `done` has.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "common/rpc/retry.h"
#include "common/rpc/security.h"
#include "pstrain/ps_service.pb.h"
#include "worker/ps_client/local_shard.h"
#include "worker/ps_client/shard_router.h"

namespace grpc {
class Channel;
}

namespace pstrain {

class Timer;  // common/rpc/timer.h

using ShardDone = std::function<void(absl::Status)>;

// One shard's part of a pull: the request, where its dense slice lands, and the answer.
struct PullPart {
  PullRequest request;         // ids (packed int64), want_dense, worker_id, step
  float* dense_out = nullptr;  // want_dense: the shard's slice of the caller's dense vector
  // The answer, valid when `done` reports OK (the dense slice is then in dense_out already):
  // The rows in the ids' order, each at its table's width (Shard::RowFloats: row_dim without
  // tables), packed; rows_bytes their size as answered, or -1 (in-process: the shard wrote them).
  const char* rows = nullptr;
  int64_t rows_bytes = -1;
  const char* row_versions = nullptr;  // request ids x uint32, or null (no per-row versions)
  int64_t dense_version = -1;          // want_dense: the slice's version
  int64_t staleness = 0;               // PullResponse.staleness
  uint64_t incarnation = 0;            // the shard's incarnation; 0 = not told (in-process)
  const JobState* job = nullptr;       // shard 0's job state, when it sent one
  // The answer's storage.
  PullResponse response;
  std::vector<float> scratch_rows;
  std::vector<uint32_t> scratch_versions;
};

// One shard's part of a push. `dense_grad` is the caller's slice, read during Push() only.
struct PushPart {
  PushRequest request;  // worker_id, incarnation, step, sequence, ids, row_grads, row_versions,
                        // dense_version
  const float* dense_grad = nullptr;
  int64_t dense_len = 0;
  uint64_t incarnation = 0;  // the answer: the shard's incarnation; 0 = not told
  PushResponse response;     // the answer's storage
};

// Client-side counters of a shard's calls.
struct ShardTraffic {
  int64_t rpcs = 0;            // attempts started
  int64_t retries = 0;         // attempts after the first of a call
  int64_t bytes_sent = 0;      // serialized request sizes
  int64_t bytes_received = 0;  // serialized response sizes
};

class ShardEndpoint {
 public:
  virtual ~ShardEndpoint() = default;

  // "shard 1 (127.0.0.1:5001)": how errors name this shard.
  virtual const std::string& name() const = 0;

  // Pulls `part` (its request and dense_out filled in); the answer is in `part` when `done`
  // reports OK. `part` must stay valid until then.
  virtual void Pull(PullPart* part, ShardDone done) = 0;
  // A ticket for the next push (see Push order above).
  virtual uint64_t ReservePush() = 0;
  // Pushes `part` under `ticket`; `part` must stay valid until `done` runs.
  virtual void Push(uint64_t ticket, PushPart* part, ShardDone done) = 0;

  // Control calls, over the channel in both implementations, with `budget` for the whole call.
  // Info waits for the channel to be ready with `wait_for_ready` (a shard still starting).
  virtual void Info(const InfoRequest* request, InfoResponse* response, bool wait_for_ready,
                    absl::Duration budget, ShardDone done) = 0;
  virtual void Stats(const StatsRequest* request, ShardStats* response, absl::Duration budget,
                     ShardDone done) = 0;
  // A push outside the push order (PushRequest.worker_done).
  virtual void PushOutOfOrder(const PushRequest* request, PushResponse* response,
                              absl::Duration budget, ShardDone done) = 0;

  virtual void Abort(absl::Status reason) = 0;
  virtual void Shutdown() = 0;
  virtual ShardTraffic traffic() const = 0;
};

// How a client reaches its shards (ConnectShards).
struct ShardConnections {
  std::vector<std::string> addresses;  // shard s's "host:port"
  RpcSecurity security;                // every channel's (common/rpc/security.h)
  RetryPolicy policy;                  // a pull's and a push's; its backoffs bound reconnects too
  Timer* timer = nullptr;              // required, outliving the endpoints
  Env* env = nullptr;                  // the timer's clock (required)
  uint64_t seed = 0;                   // the backoffs' jitter
  int row_dim = 0;
  const ShardRouter* router = nullptr;  // required: the dense slices
  // The shard this process serves (-1: none): its channel is local->InProcessChannel(), and
  // with `direct` its pulls and pushes are direct calls (an InProcessShard).
  int local_shard = -1;
  LocalShard* local = nullptr;
  bool direct = false;
};

// An endpoint per address: a RemoteShard with connections of its own (clients in one process do
// not share them), reconnecting within the policy's backoff (not gRPC's default 1 s growing to
// 120 s), and the local shard's as said above. INVALID_ARGUMENT when the local shard has no
// channel (its server is not started).
absl::StatusOr<std::vector<std::unique_ptr<ShardEndpoint>>> ConnectShards(
    const ShardConnections& connections);

struct RemoteShardOptions {
  int shard = 0;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;  // required
  int row_dim = 0;                         // > 0: checks the pulled row bytes
  int64_t dense_begin = 0;                 // the shard's dense slice: checks a pulled slice
  int64_t dense_size = 0;
  RetryPolicy policy;                // of a pull, a push (its budget: the call budget)
  Timer* timer = nullptr;            // required: the retries' backoff; outlives the endpoint
  Env* env = nullptr;                // required: the timer's clock, of the attempts' deadlines
  uint64_t seed = 0;                 // the backoffs' jitter
};
std::unique_ptr<ShardEndpoint> MakeRemoteShard(RemoteShardOptions options);

// ASYNC's direct path to shard `shard`, served by `local` (not owned, outliving the endpoint);
// `channel` (a RemoteShard over local->InProcessChannel()) takes the control calls. Pulls and
// pushes complete inline; their errors name "shard <shard> (in this process)".
std::unique_ptr<ShardEndpoint> MakeInProcessShard(int shard, LocalShard* local, int row_dim,
                                                  std::unique_ptr<ShardEndpoint> channel);

}  // namespace pstrain
