// Raw calls to a shard, for the hostile-input tests: a call that sends its headers and never its
// message (how a shard treats a call before it has read a byte of its message: issue 26 item 2),
// and concurrent pulls (how a shard bounds the answers in flight: issue 26 item 7).
#pragma once

#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>

#include <string>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "pstrain/ps_service.grpc.pb.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/security.h"

namespace pstrain {
namespace testing {

// Starts `method` ("/pstrain.ParameterServer/Push") on `address` with `security`'s channel (TLS
// if it has it) but the secret `secret` ("" = none), sends no message, and returns how the call
// ended (it waits at most `deadline`).
inline grpc::Status HeadersOnly(const std::string& address, RpcSecurity security,
                                const std::string& method, const std::string& secret,
                                absl::Duration deadline) {
  security.secret = secret;
  grpc::GenericStub stub(MakeChannel(address, security, grpc::ChannelArguments()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* const started = reinterpret_cast<void*>(1);
  void* const finished = reinterpret_cast<void*>(2);
  call->StartCall(started);
  grpc::Status status;
  call->Finish(&status, finished);
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok) && tag != finished) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Sends `n` copies of `pull` through `stub` at once (each with `deadline`) and waits for all;
// their answers and statuses, in order.
struct PullResults {
  std::vector<PullResponse> answers;
  std::vector<grpc::Status> status;
};
inline PullResults ConcurrentPulls(ParameterServer::Stub* stub, const PullRequest& pull, int n,
                                   absl::Duration deadline) {
  PullResults r;
  r.answers.resize(n);
  r.status.resize(n);
  std::vector<grpc::ClientContext> ctx(n);
  absl::BlockingCounter done(n);
  for (int i = 0; i < n; ++i) {
    ctx[i].set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    stub->async()->Pull(&ctx[i], &pull, &r.answers[i], [&r, &done, i](grpc::Status s) {
      r.status[i] = std::move(s);
      done.DecrementCount();
    });
  }
  done.Wait();
  return r;
}

}  // namespace testing
}  // namespace pstrain
