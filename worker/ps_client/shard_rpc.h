// ShardRpc: blocking calls to one PS shard's control RPCs (Info, Report, Coordinate, SaveShard)
// for the end-of-job and checkpoint protocols (docs/PS.md, docs/CHECKPOINT.md). Training traffic
// (Pull/Push) goes through PsClient instead. The waits on shard 0's job state are polls (the
// shard never holds a call open).
//
// Every call has an overall `timeout`, capped by the `rpc_budget` of the constructor (a dead
// shard must fail a call in that time, whatever the caller is prepared to wait for the others);
// each attempt has a deadline of at most 10 s (longer for SaveShard WRITE, which writes a file),
// waits for the channel to be ready, and UNAVAILABLE / DEADLINE_EXCEEDED are retried with
// exponential backoff (100 ms .. 2 s) until then. The polls (PollInfo, WaitFor*) run for their
// whole timeout, each call within the budget. Messages have no size limit (worker states hold
// the pipeline's buffered records). Errors name the shard's address. Thread-safe.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "pstrain/ps_service.grpc.pb.h"

namespace pstrain {

class ShardRpc {
 public:
  explicit ShardRpc(const std::string& address, absl::Duration rpc_budget = absl::Seconds(30));

  absl::StatusOr<InfoResponse> Info(absl::Duration timeout);
  absl::Status Report(const ReportRequest& request, absl::Duration timeout);
  absl::StatusOr<CoordinateResponse> Coordinate(const CoordinateRequest& request,
                                                absl::Duration timeout);
  // Shard 0: polls Coordinate COLLECT until every worker 0..n-1 has a state in checkpoint
  // `round` (returns them by worker), or REPORTS until workers 0..n-1 all reported `phase`
  // (returns the reports by worker). DEADLINE_EXCEEDED naming the missing workers.
  absl::StatusOr<std::map<int, std::string>> WaitForArrivals(int64_t round, int n,
                                                             absl::Duration timeout);
  absl::StatusOr<std::vector<ReportRequest>> WaitForReports(JobPhase phase, int n,
                                                            absl::Duration timeout);
  absl::StatusOr<SaveShardResponse> SaveShard(const SaveShardRequest& request,
                                              absl::Duration timeout);

  // Polls Info with backoff (50 ms .. 250 ms) until `done(info)` or `timeout`; DEADLINE_EXCEEDED
  // with "<address>: <what> did not happen within <timeout>" then.
  template <typename Pred>
  absl::StatusOr<InfoResponse> PollInfo(Pred done, absl::Duration timeout, const std::string& what);

  const std::string& address() const { return address_; }

 private:
  template <typename F>
  absl::Status Call(absl::Duration timeout, absl::Duration attempt, F f);

  std::unique_ptr<ParameterServer::Stub> stub_;
  const std::string address_;
  const absl::Duration rpc_budget_;
};

// ---- implementation of the template ----

template <typename Pred>
absl::StatusOr<InfoResponse> ShardRpc::PollInfo(Pred done, absl::Duration timeout,
                                                const std::string& what) {
  const absl::Time end = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    absl::StatusOr<InfoResponse> info = Info(end - absl::Now());
    if (info.ok() && done(*info)) return info;
    if (!info.ok() && info.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return info.status();
    }
    if (absl::Now() + backoff >= end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "shard ", address_, ": ", what, " did not happen within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(250));
  }
}

}  // namespace pstrain
