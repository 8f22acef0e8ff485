// Test helper: a Predictor call of raw bytes (not its request message), as a hostile client
// sends it, through gRPC's generic stub; bounded by a 30 s deadline and wait.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace pstrain {
namespace testing_serving {

// `method`: "Predict", "GetModelInfo" or "Reload" of pstrain.Predictor; `authorization`, if not
// empty, is sent as that metadata (Reload's admin token: "Bearer <token>").
inline grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel,
                            absl::string_view method, absl::string_view bytes,
                            const std::string& authorization = "") {
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer send(&slice, 1), recv;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(&ctx, absl::StrCat("/pstrain.Predictor/", method), grpc::StubOptions(), &send,
                    &recv,
                    [&](grpc::Status s) {
                      status = s;
                      done.Notify();
                    });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer within 60 s");
  }
  return status;
}

inline grpc::Status RawPredict(const std::shared_ptr<grpc::Channel>& channel,
                               absl::string_view bytes) {
  return RawCall(channel, "Predict", bytes);
}

}  // namespace testing_serving
}  // namespace pstrain
