#include "worker/ps_client/shard_rpc.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "common/random.h"
#include "common/rpc/grpc_status.h"
#include "common/status.h"

namespace pstrain {

namespace {

// The longest a shard holds a watched call (ShardServer::kMaxWatch).
constexpr absl::Duration kMaxHold = absl::Seconds(10);
// An attempt of a held call may last its hold plus this (the answer's way back, a busy shard).
constexpr absl::Duration kHoldSlack = absl::Seconds(5);
// The deadline of one attempt of a call that is not held.
constexpr absl::Duration kAttempt = absl::Seconds(10);

std::shared_ptr<grpc::Channel> ControlChannel(const std::string& address,
                                              const RpcSecurity& security) {
  // Worker states carry the data pipeline's held records (a window shuffle buffer): megabytes,
  // within the security's message cap.
  return MakeChannel(address, security, grpc::ChannelArguments());
}

uint64_t CallSeed() {
  static std::atomic<uint64_t> calls{0};
  return SplitMix64(calls.fetch_add(1) ^
                    static_cast<uint64_t>(absl::ToUnixNanos(Env::Default()->Now())));
}

// How long to ask a shard to hold a call when `left` remains of the wait: all of it but the
// answer's way back (a fifth, at most 500 ms), at most kMaxHold. `last`: this hold reaches the
// end of the wait, so an unchanged answer means the wait timed out.
absl::Duration HoldFor(absl::Duration left, bool* last) {
  const absl::Duration usable = left - std::min(left / 5, absl::Milliseconds(500));
  *last = usable <= kMaxHold;
  return std::min(usable, kMaxHold);
}

}  // namespace

ShardRpc::ShardRpc(const std::string& address, RpcSecurity security, int worker,
                   absl::Duration rpc_budget)
    : stub_(ParameterServer::NewStub(ControlChannel(address, security))),
      address_(address),
      worker_(worker),
      rpc_budget_(rpc_budget) {}

RetryPolicy ShardRpc::Policy(absl::Duration timeout, absl::Duration attempt) const {
  RetryPolicy p;
  p.budget = std::max(std::min(timeout, rpc_budget_), absl::Milliseconds(1));
  p.attempt_timeout = std::max(attempt, absl::Milliseconds(1));
  p.initial_backoff = absl::Milliseconds(100);
  p.max_backoff = absl::Seconds(2);
  return p;
}

absl::Status ShardRpc::Call(const RetryPolicy& policy,
                            const std::function<grpc::Status(grpc::ClientContext*)>& f) {
  const absl::Status status =
      CallWithRetry(policy, CallSeed(), &clock_, [&](absl::Time deadline) -> absl::Status {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(deadline));
        ctx.set_wait_for_ready(true);
        {
          absl::MutexLock lock(&mu_);
          if (cancelled_) return absl::CancelledError("the call was cancelled");
          calls_.insert(&ctx);
        }
        const grpc::Status g = f(&ctx);
        absl::MutexLock lock(&mu_);
        calls_.erase(&ctx);
        return FromGrpcStatus(g);
      });
  return Annotate(status, absl::StrCat("shard ", address_));
}

void ShardRpc::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  }
  clock_.Cancel();
}

absl::StatusOr<InfoResponse> ShardRpc::Info(absl::Duration timeout) {
  InfoResponse info;
  InfoRequest request;
  if (worker_ >= 0) request.set_worker_id(worker_);
  RETURN_IF_ERROR(Call(Policy(timeout, kAttempt), [&](grpc::ClientContext* ctx) {
    return stub_->Info(ctx, request, &info);
  }));
  return info;
}

absl::StatusOr<InfoResponse> ShardRpc::WatchInfo(int64_t version, absl::Duration hold,
                                                 absl::Duration timeout) {
  InfoRequest request;
  if (worker_ >= 0) request.set_worker_id(worker_);
  request.set_watch_version(version);
  request.set_watch_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(hold)));
  InfoResponse info;
  RETURN_IF_ERROR(Call(Policy(timeout, hold + kHoldSlack), [&](grpc::ClientContext* ctx) {
    return stub_->Info(ctx, request, &info);
  }));
  return info;
}

absl::Status ShardRpc::Report(const ReportRequest& request, absl::Duration timeout) {
  ReportResponse response;
  return Call(Policy(timeout, kAttempt), [&](grpc::ClientContext* ctx) {
    return stub_->Report(ctx, request, &response);
  });
}

absl::StatusOr<CoordinateResponse> ShardRpc::Coordinate(const CoordinateRequest& request,
                                                        absl::Duration timeout) {
  CoordinateResponse response;
  RETURN_IF_ERROR(Call(Policy(timeout, kAttempt), [&](grpc::ClientContext* ctx) {
    response.Clear();
    return stub_->Coordinate(ctx, request, &response);
  }));
  return response;
}

absl::StatusOr<CoordinateResponse> ShardRpc::WatchCoordinate(CoordinateRequest request,
                                                             int64_t version, absl::Duration hold,
                                                             absl::Duration timeout) {
  request.set_watch_version(version);
  request.set_watch_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(hold)));
  CoordinateResponse response;
  RETURN_IF_ERROR(Call(Policy(timeout, hold + kHoldSlack), [&](grpc::ClientContext* ctx) {
    response.Clear();
    return stub_->Coordinate(ctx, request, &response);
  }));
  return response;
}

absl::StatusOr<SaveShardResponse> ShardRpc::SaveShard(const SaveShardRequest& request,
                                                      absl::Duration timeout) {
  RetryPolicy policy = Policy(timeout, kAttempt);
  if (request.phase() == SaveShardRequest::WRITE) {
    // A WRITE is a whole file and frees the shard's copy: one attempt, all of the caller's time.
    policy.budget = std::max(timeout, absl::Milliseconds(1));
    policy = policy.SingleAttempt();
  }
  SaveShardResponse response;
  RETURN_IF_ERROR(Call(policy, [&](grpc::ClientContext* ctx) {
    return stub_->SaveShard(ctx, request, &response);
  }));
  return response;
}

absl::StatusOr<InfoResponse> ShardRpc::WaitForInfo(
    const std::function<bool(const InfoResponse&)>& done, absl::Duration timeout,
    const std::string& what, absl::Duration unreachable_after) {
  const absl::Time end = clock_.Now() + timeout;
  absl::Time heard = clock_.Now();
  int64_t version = 0;  // job versions start at 1: the first call is answered at once
  while (true) {
    const absl::Duration left = end - clock_.Now();
    if (left <= absl::ZeroDuration()) break;
    bool last = false;
    // Held at most a third of `unreachable_after`, so that a live shard answers well within it.
    absl::Duration hold = HoldFor(left, &last);
    if (hold > unreachable_after / 3) {
      hold = unreachable_after / 3;
      last = false;  // a shorter hold does not reach the end of the wait
    }
    absl::StatusOr<InfoResponse> info =
        WatchInfo(version, hold, std::min(left, unreachable_after));
    if (!info.ok()) {
      const absl::Duration silent = clock_.Now() - heard;
      if (silent > unreachable_after) {
        return absl::UnavailableError(absl::StrCat(
            "shard ", address_, " not reached for ",
            absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
            ", longer than ", absl::FormatDuration(unreachable_after), ", while waiting for ",
            what, ": ", info.status().message()));
      }
      if (info.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      return info.status();
    }
    heard = clock_.Now();
    if (done(*info)) return info;
    if (!info->job_error().empty()) {
      return absl::AbortedError(absl::StrCat("waiting for ", what, ": the job failed: ",
                                             info->job_error()));
    }
    const bool unchanged = info->job_version() == version;
    version = info->job_version();
    if (unchanged && last) break;
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "shard ", address_, ": ", what, " did not happen within ", absl::FormatDuration(timeout)));
}

absl::StatusOr<CoordinateResponse> ShardRpc::WaitForCoordinate(
    const CoordinateRequest& request,
    const std::function<std::vector<int>(const CoordinateResponse&)>& missing,
    absl::Duration timeout, const std::string& what) {
  const absl::Time end = clock_.Now() + timeout;
  int64_t version = 0;  // the first call is answered at once
  std::vector<int> still;
  while (true) {
    const absl::Duration left = end - clock_.Now();
    if (left <= absl::ZeroDuration() && version != 0) break;
    bool last = false;
    const absl::Duration hold = HoldFor(std::max(left, absl::Milliseconds(1)), &last);
    absl::StatusOr<CoordinateResponse> got = WatchCoordinate(request, version, hold, left);
    if (!got.ok()) {
      // The end of the wait, after an answer: report what was missing.
      if (got.status().code() == absl::StatusCode::kDeadlineExceeded && version != 0) break;
      return got.status();
    }
    still = missing(*got);
    if (still.empty()) return got;
    // A missing worker whose lease expired will not come: say so now, not at the timeout.
    for (int w : got->lost()) {
      if (std::find(still.begin(), still.end(), w) != still.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " aborted: ", got->lost_detail()));
      }
    }
    const bool unchanged = got->job_version() == version;
    version = got->job_version();
    if (unchanged && last) break;
  }
  return absl::DeadlineExceededError(absl::StrCat(what, ": workers [", absl::StrJoin(still, ", "),
                                                  "] missing after ",
                                                  absl::FormatDuration(timeout)));
}

absl::StatusOr<std::map<int, std::string>> ShardRpc::WaitForArrivals(int64_t round, int n,
                                                                     absl::Duration timeout) {
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::COLLECT);
  req.set_round(round);
  req.set_num_workers(n);
  ASSIGN_OR_RETURN(
      CoordinateResponse got,
      WaitForCoordinate(
          req,
          [](const CoordinateResponse& r) {
            return std::vector<int>(r.missing().begin(), r.missing().end());
          },
          timeout, absl::StrCat("checkpoint round ", round)));
  return std::map<int, std::string>(got.worker_states().begin(), got.worker_states().end());
}

absl::StatusOr<std::vector<ReportRequest>> ShardRpc::WaitForReports(JobPhase phase, int n,
                                                                    absl::Duration timeout) {
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::REPORTS);
  req.set_phase(phase);
  auto missing = [n](const CoordinateResponse& got) {
    std::vector<bool> seen(n, false);
    for (const ReportRequest& r : got.reports()) {
      if (r.worker_id() >= 0 && r.worker_id() < n) seen[r.worker_id()] = true;
    }
    std::vector<int> out;
    for (int w = 0; w < n; ++w) {
      if (!seen[w]) out.push_back(w);
    }
    return out;
  };
  ASSIGN_OR_RETURN(CoordinateResponse got,
                   WaitForCoordinate(req, missing, timeout,
                                     absl::StrCat("waiting for ", JobPhase_Name(phase), " reports")));
  std::vector<ReportRequest> by_worker(n);
  for (const ReportRequest& r : got.reports()) {
    if (r.worker_id() >= 0 && r.worker_id() < n) by_worker[r.worker_id()] = r;
  }
  return by_worker;
}

}  // namespace pstrain
