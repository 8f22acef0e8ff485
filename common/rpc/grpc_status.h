// The one conversion between absl::Status and grpc::Status. The two code enums share their
// numbering (both follow google.rpc.Code), so codes map one to one; anything outside the range is
// UNKNOWN.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace pstrain {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(s.code());
  return grpc::Status(
      code > 0 && code <= 16 ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN,
      std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  const int code = static_cast<int>(s.error_code());
  return absl::Status(
      code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
      s.error_message());
}

}  // namespace pstrain
