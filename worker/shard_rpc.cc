#include "worker/shard_rpc.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "ps/grpc_status.h"

namespace pstrain {

ShardRpc::ShardRpc(const std::string& address)
    : stub_(ParameterServer::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
      address_(address) {}

template <typename F>
absl::Status ShardRpc::Call(absl::Duration timeout, absl::Duration attempt, F f) {
  const absl::Time end = absl::Now() + timeout;
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

absl::StatusOr<CheckpointResponse> ShardRpc::Checkpoint(const CheckpointRequest& request,
                                                        absl::Duration timeout) {
  CheckpointResponse response;
  RETURN_IF_ERROR(Call(timeout, absl::Seconds(10), [&](grpc::ClientContext* ctx) {
    return stub_->Checkpoint(ctx, request, &response);
  }));
  return response;
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
