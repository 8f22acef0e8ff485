// ShardRpc: blocking calls to one PS shard's control RPCs (Info, Report, Coordinate, SaveShard)
// for the end-of-job and checkpoint protocols (docs/PS.md, docs/CHECKPOINT.md). Training traffic
// (Pull/Push) goes through PsClient instead.
//
// Every call follows the one retry policy (common/rpc/retry.h): an overall `timeout`, capped by
// the `rpc_budget` of the constructor (a dead shard must fail a call in that time, whatever the
// caller is prepared to wait for the others); attempts of at most 10 s that wait for the channel
// to be ready; UNAVAILABLE and DEADLINE_EXCEEDED retried with jittered exponential backoff
// (100 ms .. 2 s) within it. A SaveShard WRITE writes a whole file and frees the shard's copy, so
// it is a single attempt with the whole `timeout` (RetryPolicy::SingleAttempt).
//
// Waiting on shard 0's job state is a long-poll, never a poll (proto/pstrain/ps_service.proto):
// WaitForInfo, WaitForArrivals and WaitForReports loop on calls that the shard holds until its
// job version changes (or at most 10 s), with no sleep between them, for their whole timeout.
// Messages are capped by security.max_message_bytes (worker states hold the pipeline's buffered
// records: cluster.max_message_mb raises it). Errors name the shard's address.
//
// Thread-safety: every method may be called concurrently. Cancel() ends the calls in progress
// (their held calls too) with CANCELLED, and every later call at once.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/retry.h"
#include "common/rpc/security.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

class ShardRpc {
 public:
  // `security`: the cluster secret every call carries, TLS, the message cap. `worker`: the
  // calling worker (>= 0), named in Info calls so that shard 0 renews its lease; -1 = none.
  explicit ShardRpc(const std::string& address, RpcSecurity security = RpcSecurity(),
                    int worker = -1, absl::Duration rpc_budget = absl::Seconds(30));

  absl::StatusOr<InfoResponse> Info(absl::Duration timeout);
  absl::Status Report(const ReportRequest& request, absl::Duration timeout);
  absl::StatusOr<CoordinateResponse> Coordinate(const CoordinateRequest& request,
                                                absl::Duration timeout);
  absl::StatusOr<SaveShardResponse> SaveShard(const SaveShardRequest& request,
                                              absl::Duration timeout);

  // One long-poll: Info, held by the shard while its job version is `version`, for at most
  // `hold` (and at most 10 s); answered with the state then, changed or not.
  absl::StatusOr<InfoResponse> WatchInfo(int64_t version, absl::Duration hold,
                                         absl::Duration timeout);
  // Long-polls Info until `done(info)` or `timeout`; DEADLINE_EXCEEDED with
  // "shard <address>: <what> did not happen within <timeout>" then. `unreachable_after` (e.g.
  // the lease): when the shard has not answered for that long (since the wait began or its last
  // answer), UNAVAILABLE "shard <address> not reached for <d> ... while waiting for <what>" at
  // once, instead of waiting out `timeout` for a shard that is down or cut off.
  absl::StatusOr<InfoResponse> WaitForInfo(
      const std::function<bool(const InfoResponse&)>& done, absl::Duration timeout,
      const std::string& what, absl::Duration unreachable_after = absl::InfiniteDuration());
  // Shard 0: long-polls Coordinate COLLECT until every worker 0..n-1 has a state in checkpoint
  // `round` (returns them by worker), or REPORTS until workers 0..n-1 all reported `phase`
  // (returns the reports by worker). DEADLINE_EXCEEDED naming the missing workers.
  absl::StatusOr<std::map<int, std::string>> WaitForArrivals(int64_t round, int n,
                                                             absl::Duration timeout);
  absl::StatusOr<std::vector<ReportRequest>> WaitForReports(JobPhase phase, int n,
                                                            absl::Duration timeout);

  // Ends the calls in progress with CANCELLED and makes every later call fail so at once.
  void Cancel();
  // Waits `d` (a caller's pause after an error), ended early by Cancel(); false if cancelled.
  bool Pause(absl::Duration d) { return clock_.WaitUntil(clock_.Now() + d); }

  const std::string& address() const { return address_; }

 private:
  // The policy of a call with `timeout` (capped by the budget) and attempts of `attempt`.
  RetryPolicy Policy(absl::Duration timeout, absl::Duration attempt) const;
  // Runs `f` under `policy`, each attempt on a fresh context with its deadline, wait_for_ready,
  // and registered for Cancel(). Errors are annotated with the shard's address.
  absl::Status Call(const RetryPolicy& policy,
                    const std::function<grpc::Status(grpc::ClientContext*)>& f);
  // Coordinate `request` held while the job version is `version`, for at most `hold`.
  absl::StatusOr<CoordinateResponse> WatchCoordinate(CoordinateRequest request, int64_t version,
                                                     absl::Duration hold, absl::Duration timeout);
  // Loops on held Coordinate calls of `request` until `missing` finds none missing in the answer,
  // or `timeout` (DEADLINE_EXCEEDED "<what>: workers [...] missing after <timeout>").
  absl::StatusOr<CoordinateResponse> WaitForCoordinate(
      const CoordinateRequest& request,
      const std::function<std::vector<int>(const CoordinateResponse&)>& missing,
      absl::Duration timeout, const std::string& what);

  std::unique_ptr<ParameterServer::Stub> stub_;
  const std::string address_;
  const int worker_;
  const absl::Duration rpc_budget_;
  CancellableClock clock_;  // the backoff waits, interrupted by Cancel()
  absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);  // attempts in progress
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain
