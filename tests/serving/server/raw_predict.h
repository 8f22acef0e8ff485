// Test helper: a Predict call of raw bytes (not a PredictRequest), as a hostile client sends it,
// through gRPC's generic stub; bounded by a 30 s deadline and wait.
#pragma once

#include <chrono>
#include <memory>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace pstrain {
namespace testing_serving {

inline grpc::Status RawPredict(const std::shared_ptr<grpc::Channel>& channel,
                               absl::string_view bytes) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer send(&slice, 1), recv;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(&ctx, "/pstrain.Predictor/Predict", grpc::StubOptions(), &send, &recv,
                    [&](grpc::Status s) {
                      status = s;
                      done.Notify();
                    });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer within 60 s");
  }
  return status;
}

}  // namespace testing_serving
}  // namespace pstrain
