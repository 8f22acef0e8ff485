#include "worker/ps_client/shard_rpc.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "common/status.h"

namespace pstrain {

namespace {

std::shared_ptr<grpc::Channel> ControlChannel(const std::string& address) {
  grpc::ChannelArguments args;
  // Worker states carry the data pipeline's held records (a window shuffle buffer): megabytes.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

ShardRpc::ShardRpc(const std::string& address, absl::Duration rpc_budget)
    : stub_(ParameterServer::NewStub(ControlChannel(address))),
      address_(address),
      rpc_budget_(rpc_budget) {}

template <typename F>
absl::Status ShardRpc::Call(absl::Duration timeout, absl::Duration attempt, F f) {
  // A WRITE's single attempt may take as long as the caller allows (it writes a whole file).
  const absl::Time end = absl::Now() + (attempt >= timeout ? timeout : std::min(timeout, rpc_budget_));
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(end, absl::Now() + attempt)));
    ctx.set_wait_for_ready(true);
    grpc::Status g = f(&ctx);
    if (g.ok()) return absl::OkStatus();
    const bool retry = g.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       g.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retry || absl::Now() + backoff >= end) {
      return Annotate(FromGrpcStatus(g), absl::StrCat("shard ", address_));
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
}

absl::StatusOr<InfoResponse> ShardRpc::Info(absl::Duration timeout) {
  InfoResponse info;
  RETURN_IF_ERROR(Call(timeout, absl::Seconds(10), [&](grpc::ClientContext* ctx) {
    return stub_->Info(ctx, InfoRequest(), &info);
  }));
  return info;
}

absl::Status ShardRpc::Report(const ReportRequest& request, absl::Duration timeout) {
  ReportResponse response;
  return Call(timeout, absl::Seconds(10), [&](grpc::ClientContext* ctx) {
    return stub_->Report(ctx, request, &response);
  });
}

absl::StatusOr<CoordinateResponse> ShardRpc::Coordinate(const CoordinateRequest& request,
                                                        absl::Duration timeout) {
  CoordinateResponse response;
  RETURN_IF_ERROR(Call(timeout, absl::Seconds(10), [&](grpc::ClientContext* ctx) {
    response.Clear();
    return stub_->Coordinate(ctx, request, &response);
  }));
  return response;
}

namespace {

// Polls `once` (which sets *missing) with backoff 20 ms .. 250 ms until nothing is missing.
template <typename F>
absl::Status PollUntilNoneMissing(F once, absl::Duration timeout, const std::string& what) {
  const absl::Time end = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    std::vector<int> missing;
    RETURN_IF_ERROR(once(&missing));
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() + backoff >= end) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": workers [",
                                                      absl::StrJoin(missing, ", "),
                                                      "] missing after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(250));
  }
}

}  // namespace

absl::StatusOr<std::map<int, std::string>> ShardRpc::WaitForArrivals(int64_t round, int n,
                                                                     absl::Duration timeout) {
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::COLLECT);
  req.set_round(round);
  req.set_num_workers(n);
  CoordinateResponse got;
  const absl::Time end = absl::Now() + timeout;
  RETURN_IF_ERROR(PollUntilNoneMissing(
      [&](std::vector<int>* missing) -> absl::Status {
        ASSIGN_OR_RETURN(got, Coordinate(req, end - absl::Now()));
        missing->assign(got.missing().begin(), got.missing().end());
        return absl::OkStatus();
      },
      timeout, absl::StrCat("checkpoint round ", round)));
  return std::map<int, std::string>(got.worker_states().begin(), got.worker_states().end());
}

absl::StatusOr<std::vector<ReportRequest>> ShardRpc::WaitForReports(JobPhase phase, int n,
                                                                    absl::Duration timeout) {
  CoordinateRequest req;
  req.set_kind(CoordinateRequest::REPORTS);
  req.set_phase(phase);
  std::vector<ReportRequest> by_worker(n);
  const absl::Time end = absl::Now() + timeout;
  RETURN_IF_ERROR(PollUntilNoneMissing(
      [&](std::vector<int>* missing) -> absl::Status {
        ASSIGN_OR_RETURN(CoordinateResponse got, Coordinate(req, end - absl::Now()));
        std::vector<bool> seen(n, false);
        for (const ReportRequest& r : got.reports()) {
          if (r.worker_id() >= 0 && r.worker_id() < n) {
            by_worker[r.worker_id()] = r;
            seen[r.worker_id()] = true;
          }
        }
        for (int w = 0; w < n; ++w) {
          if (!seen[w]) missing->push_back(w);
        }
        return absl::OkStatus();
      },
      timeout, absl::StrCat("waiting for ", JobPhase_Name(phase), " reports")));
  return by_worker;
}

absl::StatusOr<SaveShardResponse> ShardRpc::SaveShard(const SaveShardRequest& request,
                                                      absl::Duration timeout) {
  SaveShardResponse response;
  // A WRITE is a whole file: give one attempt the whole budget (a retry would write it again).
  const absl::Duration attempt =
      request.phase() == SaveShardRequest::WRITE ? timeout : absl::Seconds(10);
  RETURN_IF_ERROR(Call(timeout, attempt, [&](grpc::ClientContext* ctx) {
    return stub_->SaveShard(ctx, request, &response);
  }));
  return response;
}

}  // namespace pstrain
