#include "common/rpc/callback_queue.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>

namespace pstrain {

void HoldCallbackQueue() {
  // Never destroyed, and reachable from here for the process's life (see the header).
  static std::shared_ptr<grpc::Channel>* const channel = [] {
    // Null credentials make a lame channel: its calls fail with INVALID_ARGUMENT, without a
    // resolver, a connection or a log line.
    auto* held = new std::shared_ptr<grpc::Channel>(grpc::CreateChannel("", nullptr));
    // A callback call takes the channel's reference on the callback queue as it starts; what it
    // uses is freed by its completion.
    auto* ctx = new grpc::ClientContext;
    grpc::Slice empty("", 0);
    auto* request = new grpc::ByteBuffer(&empty, 1);
    auto* response = new grpc::ByteBuffer;
    grpc::GenericStub(*held).UnaryCall(ctx, "/pstrain.HoldCallbackQueue/None",
                                       grpc::StubOptions(), request, response,
                                       [ctx, request, response](grpc::Status) {
                                         delete response;
                                         delete request;
                                         delete ctx;
                                       });
    return held;
  }();
  (void)channel;
}

}  // namespace pstrain
